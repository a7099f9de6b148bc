// weft's data pipeline in one include: IDX files, Fashion-MNIST/MNIST,
// datasets, samplers, the DataLoader and byte-level text (data/text.h).
//
//   #include "data/data.h"
//   using namespace weft::data;
//   auto train = std::make_shared<TensorDataset>(
//       loadFashionMnist({.split = Split::Train, .normalize = kFashionMnistNormalization, .flatten = true}));
//   DataLoader loader(train, {.batchSize = 128, .shuffle = true, .seed = 0});
//   for (const Example& batch : loader) { /* batch.data [128, 784], batch.target [128] */ }
#pragma once

#include "data/data_loader.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "data/text.h"
#include "data/torch_randperm.h"
