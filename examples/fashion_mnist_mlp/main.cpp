// fashion_mnist_mlp: an MLP (784-256-128-10, ReLU) trained with SGD on
// Fashion-MNIST in one process. Prints per-epoch loss, accuracy and time with
// a progress indicator, writes per-iteration metrics to a CSV file, and ends
// with the line "final test accuracy: A".
//
//   ./build/examples/fashion_mnist_mlp/fashion_mnist_mlp [--epochs 2] [--batch-size 64] [--lr 0.01]
//       [--momentum 0.9] [--seed 0] [--data-dir DIR] [--csv PATH] [--max-batches N] [--save PATH]
//
// The data-parallel version of this program is the collectives issue's
// examples/fashion_mnist.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "data/data.h"
#include "examples/fashion_mnist_mlp/mlp.h"
#include "nn/nn.h"

using namespace weft;
using weft::examples::fashion_mnist_mlp::evaluate;
using weft::examples::fashion_mnist_mlp::kDefaults;
using weft::examples::fashion_mnist_mlp::loadSplit;
using weft::examples::fashion_mnist_mlp::makeModel;

namespace {

struct Flags {
  int64_t epochs = kDefaults.epochs;
  int64_t batchSize = kDefaults.batchSize;
  double lr = kDefaults.lr;
  double momentum = kDefaults.momentum;
  uint64_t seed = 0;
  std::string dataDir = data::kFashionMnistDir;
  std::string csv = "fashion_mnist_mlp.csv";
  int64_t maxBatches = -1;  // per epoch; -1 = all
  std::string save;
};

[[noreturn]] void usage(const char* prog, const std::string& err) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s [--epochs N] [--batch-size N] [--lr X] [--momentum X] [--seed N] [--data-dir DIR]\n"
               "          [--csv PATH] [--max-batches N] [--save PATH]\n",
               prog, err.c_str(), prog);
  std::exit(2);
}

Flags parseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") usage(argv[0], "help");
    if (i + 1 >= argc) usage(argv[0], "missing value for " + a);
    std::string v = argv[++i];
    char* end = nullptr;
    auto num = [&](auto parse) {
      auto x = parse(v.c_str(), &end);
      if (end == v.c_str() || *end) usage(argv[0], "invalid value '" + v + "' for " + a);
      return x;
    };
    auto toLL = [](const char* s, char** e) { return std::strtoll(s, e, 10); };
    auto toD = [](const char* s, char** e) { return std::strtod(s, e); };
    if (a == "--epochs") f.epochs = num(toLL);
    else if (a == "--batch-size") f.batchSize = num(toLL);
    else if (a == "--lr") f.lr = num(toD);
    else if (a == "--momentum") f.momentum = num(toD);
    else if (a == "--seed") f.seed = static_cast<uint64_t>(num(toLL));
    else if (a == "--data-dir") f.dataDir = v;
    else if (a == "--csv") f.csv = v;
    else if (a == "--max-batches") f.maxBatches = num(toLL);
    else if (a == "--save") f.save = v;
    else usage(argv[0], "unknown flag " + a);
  }
  if (f.epochs < 1 || f.batchSize < 1) usage(argv[0], "--epochs and --batch-size must be positive");
  return f;
}

void progress(bool tty, int64_t epoch, int64_t done, int64_t total, double loss) {
  if (!tty) return;
  const int width = 30;
  int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::printf("\repoch %lld [%.*s%*s] %3lld%% loss %.4f", static_cast<long long>(epoch), filled,
              "##############################", width - filled, "", static_cast<long long>(100 * done / total), loss);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parseFlags(argc, argv);
  try {
    manualSeed(flags.seed);
    auto train = std::make_shared<data::TensorDataset>(loadSplit(flags.dataDir, data::Split::Train));
    data::TensorDataset test = loadSplit(flags.dataDir, data::Split::Test);
    std::printf("Fashion-MNIST: %lld training and %lld test images; MLP 784-256-128-10, SGD lr %g momentum %g, batch %lld\n",
                static_cast<long long>(train->size()), static_cast<long long>(test.size()), flags.lr, flags.momentum,
                static_cast<long long>(flags.batchSize));

    auto model = makeModel();
    nn::optim::SGD opt(model->parameters(), {.lr = flags.lr, .momentum = flags.momentum});
    data::DataLoader loader(train, {.batchSize = flags.batchSize, .shuffle = true, .seed = flags.seed});

    std::ofstream csv(flags.csv);
    if (!csv) throw Error("cannot write the metrics file '" + flags.csv + "'");
    csv << "iteration,epoch,loss,seconds\n";

    const bool tty = isatty(STDOUT_FILENO);
    int64_t perEpoch = (train->size() + flags.batchSize - 1) / flags.batchSize;
    if (flags.maxBatches >= 0) perEpoch = std::min(perEpoch, flags.maxBatches);
    int64_t iteration = 0;
    double testAcc = 0;
    for (int64_t epoch = 1; epoch <= flags.epochs; ++epoch) {
      auto start = std::chrono::steady_clock::now();
      double lossSum = 0;
      int64_t correct = 0, seen = 0, batches = 0;
      for (const data::Example& batch : loader) {
        if (batches == perEpoch) break;
        auto t0 = std::chrono::steady_clock::now();
        Tensor logits = model->forward(batch.data);
        Tensor loss = crossEntropy(logits, batch.target);
        opt.zeroGrad();
        loss.backward();
        opt.step();
        double l = loss.item<float>();
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        {
          NoGradGuard ng;
          correct += eq(argmax(logits, 1), batch.target).sum().item<int64_t>();
        }
        seen += batch.target.numel();
        lossSum += l;
        ++batches;
        ++iteration;
        csv << iteration << ',' << epoch << ',' << l << ',' << secs << '\n';
        if (batches % 20 == 0 || batches == perEpoch) progress(tty, epoch, batches, perEpoch, lossSum / batches);
      }
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      testAcc = evaluate(*model, test);
      if (tty) std::printf("\r%*s\r", 70, "");
      std::printf("epoch %lld: loss %.4f  train accuracy %.4f  test accuracy %.4f  time %.2f s (%.0f samples/s)\n",
                  static_cast<long long>(epoch), lossSum / std::max<int64_t>(batches, 1),
                  static_cast<double>(correct) / std::max<int64_t>(seen, 1), testAcc, secs, seen / secs);
      std::fflush(stdout);
    }
    if (!flags.save.empty()) {
      model->save(flags.save);
      std::printf("saved the model to %s\n", flags.save.c_str());
    }
    std::printf("metrics written to %s\n", flags.csv.c_str());
    std::printf("final test accuracy: %.4f\n", testAcc);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist_mlp: %s\n", e.what());
    return 1;
  }
}
