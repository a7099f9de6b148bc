// gpt: a small GPT (nanoGPT's model, byte vocabulary) trained on the fortune cookie corpus in one
// process, or under weftrun as a pipeline (--pp), on a process mesh (--dp, --tp, --sp) or fully
// sharded (--fsdp, alone or with --dp and --pp, --tp or --sp). Prints the training loss and tokens/s
// every --log-interval steps, the validation loss
// in bits per byte every --eval-interval steps, writes per-step metrics to a CSV file, and ends
// with a text sample continuing a fixed prompt. --save PATH writes the trained model (the whole of
// it, whatever the layout: nn::GPT's state dict) and --load PATH starts from such a file.
//
//   ./build/examples/gpt/gpt [--layers 4] [--heads 4] [--width 128] [--block 128] [--steps 1500]
//       [--batch-size 16] [--lr 1e-3] [--checkpoint none] [--precision float32] [--seed 0]
//       [--metrics gpt_metrics.csv] ...
//   ./build/tools/weftrun/weftrun -n 4 ./build/examples/gpt/gpt --dp 2 --tp 2 ...
//
// The flags are in flags.h; where the model lives and how a step runs there is the Layout of
// layout.h, so that this loop is the same for every placement of the model; what is printed and
// recorded is report.h.
#include <cstdio>
#include <string>

#include "data/text.h"
#include "examples/common/metrics.h"
#include "examples/common/seed.h"
#include "nn/lr_schedule.h"
#include "nn/serialize.h"
#include "tensor/generator.h"
#include "tensor/storage.h"

#include "flags.h"
#include "layout.h"
#include "report.h"

using namespace weft;
using namespace weft::examples::gpt;
namespace app = weft::examples::app;

namespace {

// Streams of the run's seed (examples/common/seed.h); kInitStream (1) is the layout's.
constexpr uint64_t kDropoutStream = 2;
constexpr uint64_t kDataStream = 3;
constexpr uint64_t kValidationStream = 4;
constexpr uint64_t kSampleStream = 5;

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parseFlags(argc, argv);
  try {
    manualSeed(app::streamSeed(flags.seed, kDropoutStream));
    const data::TextDataset text = data::TextDataset::fromDirectory(flags.dataDir);
    // The model, its optimizer and where they live (layout.h).
    std::unique_ptr<Layout> layout = makeLayout(flags);
    Report report(flags, layout->reports());
    report.banner(*layout, text);
    const nn::optim::WarmupCosine schedule{.warmupSteps = flags.warmup,
                                           .totalSteps = flags.steps,
                                           .maxLr = flags.lr,
                                           .minLr = flags.minLr,
                                           .startFactor = flags.warmup > 0 ? 1.0 / static_cast<double>(flags.warmup) : 1.0};

    // The validation loss: the mean over the same evalBatches batches of windows every time, each
    // of the job's batch size (every process evaluates the whole of it).
    auto validate = [&]() {
      Generator g(app::streamSeed(flags.seed, kValidationStream));
      double sum = 0;
      for (int64_t i = 0; i < flags.evalBatches; ++i) {
        auto [x, y] = text.batch(data::TextSplit::Validation, flags.batchSize * layout->dataWorld(), flags.block, g);
        sum += layout->evaluate(x, y);
      }
      return sum / static_cast<double>(flags.evalBatches);
    };

    report.validation(0, validate());
    Generator dataGen(app::streamSeed(flags.seed, kDataStream));
    Storage::resetPeakBytes();
    for (int64_t step = 1; step <= flags.steps; ++step) {
      // This process's share of the job's batch, one optimizer step, and now and then a validation.
      const double lr = schedule(step - 1);
      auto [x, y] = text.batch(data::TextSplit::Train, flags.batchSize, flags.block, dataGen, layout->dataRank(),
                               layout->dataWorld());
      const auto t0 = app::Clock::now();
      const double loss = layout->step(x, y, lr);
      const double seconds = app::secondsSince(t0);
      const bool evalNow = step % flags.evalInterval == 0 || step == flags.steps;
      const double val = evalNow ? validate() : -1;
      report.step(step, lr, loss, seconds, layout->gradNorm(), val);
      if (evalNow) report.validation(step, val);
    }

    const size_t peakBytes = Storage::memoryStats().peakBytes;
    if (!flags.save.empty()) {
      // The whole model, gathered by every process and written by the reporting one.
      const nn::StateDict whole = layout->fullStateDict();
      if (layout->reports()) nn::saveStateDict(whole, flags.save);
      report.saved(flags.save);
    }
    Generator sampleGen(app::streamSeed(flags.seed, kSampleStream));
    report.finish(peakBytes, layout->sample(flags.prompt, flags.sampleTokens, flags.temperature, flags.topK, sampleGen));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
