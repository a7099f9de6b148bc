// The Fashion-MNIST MLP of examples/fashion_mnist_mlp (one process) and
// examples/fashion_mnist (the same training, data parallel): the model, its
// default hyper-parameters, the data and the test accuracy, so that both
// programs train exactly the same network on exactly the same inputs.
//
//   #include "examples/fashion_mnist_mlp/mlp.h"
//   namespace mlp = weft::examples::fashion_mnist_mlp;
//   manualSeed(seed);                                   // the initialisation comes from the default generator
//   auto model = mlp::makeModel();                      // 784-256-128-10, ReLU
//   auto train = mlp::loadSplit(dir, data::Split::Train);
//   nn::optim::SGD opt(model->parameters(), {.lr = mlp::kDefaults.lr, .momentum = mlp::kDefaults.momentum});
//   double acc = mlp::evaluate(*model, mlp::loadSplit(dir, data::Split::Test));
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "data/data.h"
#include "nn/nn.h"

namespace weft::examples::fashion_mnist_mlp {

struct Hyperparameters {
  int64_t epochs = 2;
  int64_t batchSize = 64;
  double lr = 0.01;
  double momentum = 0.9;
};
inline constexpr Hyperparameters kDefaults{};

// 784-256-128-10 with ReLU, initialised from the default generator (seed it
// with manualSeed first for a reproducible start).
inline std::shared_ptr<nn::Sequential> makeModel() {
  return nn::makeSequential({std::make_shared<nn::Linear>(784, 256), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::Linear>(256, 128), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::Linear>(128, 10)});
}

// One split of Fashion-MNIST from `dir`, normalised with the dataset's mean
// and std and flattened to [N, 784]. A missing file is a NotFoundError that
// names the Debian package.
inline data::TensorDataset loadSplit(const std::string& dir, data::Split split) {
  return data::loadFashionMnist(
      {.root = dir, .split = split, .normalize = data::kFashionMnistNormalization, .flatten = true});
}

// Correct predictions on examples [begin, begin + count) of `ds`, in eval
// mode and without recording (the model is back in train mode afterwards),
// on the device of the model's parameters.
inline int64_t countCorrect(nn::Module& model, const data::TensorDataset& ds, int64_t begin, int64_t count) {
  NoGradGuard ng;
  model.eval();
  const Device device = model.parameters().empty() ? Device::cpu() : model.parameters().front().device();
  const int64_t chunk = 1000;
  int64_t correct = 0;
  for (int64_t s = begin; s < begin + count; s += chunk) {
    const int64_t len = std::min(chunk, begin + count - s);
    Tensor pred = argmax(model.forward(ds.data().narrow(0, s, len).to(device)), 1);
    correct += eq(pred, ds.targets().narrow(0, s, len).to(device)).sum().item<int64_t>();
  }
  model.train();
  return correct;
}

// Fraction of correct predictions over the whole of `ds`.
inline double evaluate(nn::Module& model, const data::TensorDataset& ds) {
  return static_cast<double>(countCorrect(model, ds, 0, ds.size())) / static_cast<double>(std::max<int64_t>(ds.size(), 1));
}

}  // namespace weft::examples::fashion_mnist_mlp
