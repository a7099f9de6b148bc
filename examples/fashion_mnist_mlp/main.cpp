// fashion_mnist_mlp: an MLP (784-256-128-10, ReLU) trained with SGD on Fashion-MNIST in one
// process. Prints per-epoch loss, accuracy and time with a progress indicator, writes
// per-iteration metrics to a CSV file, and ends with the line "final test accuracy: A".
//
//   ./build/examples/fashion_mnist_mlp/fashion_mnist_mlp [--epochs 2] [--batch-size 64] [--lr 0.01]
//       [--momentum 0.9] [--seed 0] [--data-dir DIR] [--csv PATH] [--max-batches N] [--save PATH]
//
// The model, its defaults, the data and the test accuracy are in mlp.h, shared with the
// data-parallel version of this program, examples/fashion_mnist.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "data/data.h"
#include "nn/nn.h"
#include "examples/common/metrics.h"

#include "flags.h"
#include "mlp.h"

using namespace weft;
using namespace weft::examples::fashion_mnist_mlp;
namespace app = weft::examples::app;

int main(int argc, char** argv) {
  const Flags flags = parseFlags(argc, argv);
  try {
    manualSeed(flags.seed);
    auto train = std::make_shared<data::TensorDataset>(loadSplit(flags.dataDir, data::Split::Train));
    data::TensorDataset test = loadSplit(flags.dataDir, data::Split::Test);
    std::printf("Fashion-MNIST: %lld training and %lld test images; MLP 784-256-128-10, SGD lr %g momentum %g, batch %lld\n",
                static_cast<long long>(train->size()), static_cast<long long>(test.size()), flags.lr, flags.momentum,
                static_cast<long long>(flags.batchSize));

    const Device device = Device::parse(flags.device);
    auto model = makeModel();
    model->to(device);  // initialised on the CPU, so every device starts from the same weights
    nn::optim::SGD opt(model->parameters(), {.lr = flags.lr, .momentum = flags.momentum});
    data::DataLoader loader(train, {.batchSize = flags.batchSize, .shuffle = true, .seed = flags.seed});
    app::CsvFile csv(flags.csv, "iteration,epoch,loss,seconds");

    const bool tty = isatty(STDOUT_FILENO);
    int64_t perEpoch = (train->size() + flags.batchSize - 1) / flags.batchSize;
    if (flags.maxBatches >= 0) perEpoch = std::min(perEpoch, flags.maxBatches);
    int64_t iteration = 0;
    double testAcc = 0;
    for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
      const auto start = app::Clock::now();
      double lossSum = 0;
      int64_t correct = 0, seen = 0, batches = 0;
      for (const data::Example& batch : loader) {
        if (batches == perEpoch) break;
        const auto t0 = app::Clock::now();
        const Tensor target = batch.target.to(device);
        Tensor logits = model->forward(batch.data.to(device));
        Tensor loss = crossEntropy(logits, target);
        opt.zeroGrad();
        loss.backward();
        opt.step();
        const double l = loss.item<float>();
        const double secs = app::secondsSince(t0);
        {
          NoGradGuard ng;
          correct += eq(argmax(logits, 1), target).sum().item<int64_t>();
        }
        seen += batch.target.numel();
        lossSum += l;
        ++batches;
        ++iteration;
        csv.row(iteration, epoch, l, secs);
        if (tty && (batches % 20 == 0 || batches == perEpoch)) {
          app::printProgressBar(epoch, batches, perEpoch, lossSum / static_cast<double>(batches));
        }
      }
      const double secs = app::secondsSince(start);
      testAcc = evaluate(*model, test);
      if (tty) app::clearProgressBar();
      std::printf("epoch %lld: loss %.4f  train accuracy %.4f  test accuracy %.4f  time %.2f s (%.0f samples/s)\n",
                  static_cast<long long>(epoch), lossSum / std::max<int64_t>(batches, 1),
                  static_cast<double>(correct) / std::max<int64_t>(seen, 1), testAcc, secs, seen / secs);
      std::fflush(stdout);
    }
    if (!flags.save.empty()) {
      model->save(flags.save);
      std::printf("saved the model to %s\n", flags.save.c_str());
    }
    csv.close();
    std::printf("metrics written to %s\n", flags.csv.c_str());
    std::printf("final test accuracy: %.4f\n", testAcc);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
