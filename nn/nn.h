// weft's neural-network library in one include: modules, initialisation,
// state files, local optimizers and utilities.
//
//   #include "nn/nn.h"
//   using namespace weft;
//   auto net = nn::makeSequential({std::make_shared<nn::Linear>(784, 128), std::make_shared<nn::ReLU>(),
//                                  std::make_shared<nn::Linear>(128, 10)});
//   nn::optim::Adam opt(net->parameters(), {.lr = 1e-3});
//   Tensor loss = crossEntropy(net->forward(x), y);
//   opt.zeroGrad();
//   loss.backward();
//   opt.step();
//   net->save("net.weft");
#pragma once

#include "nn/amp.h"
#include "nn/conv.h"
#include "nn/data_parallel.h"
#include "nn/embedding.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/lr_schedule.h"
#include "nn/optim.h"
#include "nn/rnn.h"
#include "nn/sequential.h"
#include "nn/serialize.h"
#include "nn/transformer.h"
#include "nn/utils.h"
