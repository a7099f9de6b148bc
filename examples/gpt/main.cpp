// gpt: a small GPT (nanoGPT's model, byte vocabulary) trained on the fortune cookie corpus in one
// process. Prints the training loss and tokens/s every --log-interval steps, the validation loss
// in bits per byte every --eval-interval steps, writes per-step metrics to a CSV file, and ends
// with a text sample continuing a fixed prompt.
//
//   ./build/examples/gpt/gpt [--layers 4] [--heads 4] [--width 128] [--block 128] [--steps 600]
//       [--batch-size 16] [--lr 1e-3] [--checkpoint none] [--precision float32] [--seed 0]
//       [--metrics gpt_metrics.csv] ...
//
// The flags are in flags.h; where the model lives and how a step runs there is the Layout of
// layout.h, so that this loop is the same for every placement of the model.
#include <cmath>
#include <cstdio>
#include <string>

#include "data/text.h"
#include "examples/common/metrics.h"
#include "examples/common/seed.h"
#include "nn/lr_schedule.h"
#include "tensor/generator.h"
#include "tensor/storage.h"

#include "flags.h"
#include "layout.h"

using namespace weft;
using namespace weft::examples::gpt;
namespace app = weft::examples::app;

namespace {

// Streams of the run's seed (seed.h); kInitStream (1) is the layout's.
constexpr uint64_t kDropoutStream = 2;
constexpr uint64_t kDataStream = 3;
constexpr uint64_t kValidationStream = 4;
constexpr uint64_t kSampleStream = 5;

uint64_t streamSeed(uint64_t seed, uint64_t stream) { return app::splitmix64(seed ^ (stream * app::kGolden)); }

// `text` with every byte other than printable ASCII, newline and tab written as \xNN, so that a
// sample cannot send control sequences to a terminal; `escaped` counts them.
std::string printable(const std::string& text, int64_t& escaped) {
  std::string out;
  escaped = 0;
  for (unsigned char c : text) {
    if ((c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
      ++escaped;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parseFlags(argc, argv);
  try {
    manualSeed(streamSeed(flags.seed, kDropoutStream));
    const data::TextDataset text = data::TextDataset::fromDirectory(flags.dataDir);
    std::unique_ptr<Layout> layout = makeLayout(flags);
    const bool reports = layout->reports();
    const nn::optim::WarmupCosine schedule{.warmupSteps = flags.warmup,
                                           .totalSteps = flags.steps,
                                           .maxLr = flags.lr,
                                           .minLr = flags.minLr,
                                           .startFactor = flags.warmup > 0 ? 1.0 / static_cast<double>(flags.warmup) : 1.0};
    const int64_t tokensPerStep = flags.batchSize * flags.block;
    if (reports) {
      app::say("model: GPT, %lld parameters (%lld layers, %lld heads, width %lld, context %lld, dropout %g, "
               "checkpointing %s); %s\n",
               static_cast<long long>(layout->numParameters()), static_cast<long long>(flags.layers),
               static_cast<long long>(flags.heads), static_cast<long long>(flags.width),
               static_cast<long long>(flags.block), flags.dropout, flags.checkpoint.c_str(), layout->describe().c_str());
      app::say("data: %lld training and %lld validation bytes from %s\n",
               static_cast<long long>(text.size(data::TextSplit::Train)),
               static_cast<long long>(text.size(data::TextSplit::Validation)), flags.dataDir.c_str());
      app::say("training: %lld steps of %lld x %lld tokens, AdamW lr %g (warm-up %lld steps, cosine to %g), "
               "weight decay %g, gradient clip %g\n",
               static_cast<long long>(flags.steps), static_cast<long long>(flags.batchSize),
               static_cast<long long>(flags.block), flags.lr, static_cast<long long>(flags.warmup), flags.minLr,
               flags.weightDecay, flags.gradClip);
    }

    // The validation loss: the mean over the same evalBatches batches of windows every time.
    auto validate = [&]() {
      Generator g(streamSeed(flags.seed, kValidationStream));
      double sum = 0;
      for (int64_t i = 0; i < flags.evalBatches; ++i) {
        auto [x, y] = text.batch(data::TextSplit::Validation, flags.batchSize, flags.block, g);
        sum += layout->evaluate(x, y);
      }
      return sum / static_cast<double>(flags.evalBatches);
    };

    app::CsvFile csv;
    if (reports) csv.open(flags.metrics, "step,lr,loss,seconds,tokens_per_second,val_loss,val_bpb");
    const double firstVal = validate();
    if (reports) {
      csv.row(0, "", "", "", "", firstVal, firstVal / std::log(2.0));
      app::say("step %5d  validation loss %.4f  %.3f bits per byte\n", 0, firstVal, firstVal / std::log(2.0));
    }

    Generator dataGen(streamSeed(flags.seed, kDataStream));
    Storage::resetPeakBytes();
    double trainSeconds = 0, windowSeconds = 0, windowLoss = 0, lastVal = firstVal;
    int64_t windowSteps = 0;
    for (int64_t step = 1; step <= flags.steps; ++step) {
      const double lr = schedule(step - 1);
      auto [x, y] = text.batch(data::TextSplit::Train, flags.batchSize, flags.block, dataGen, layout->dataRank(),
                               layout->dataWorld());
      const auto t0 = app::Clock::now();
      const double loss = layout->step(x, y, lr);
      const double secs = app::secondsSince(t0);
      trainSeconds += secs;
      windowSeconds += secs;
      windowLoss += loss;
      ++windowSteps;
      const bool evalNow = step % flags.evalInterval == 0 || step == flags.steps;
      const double val = evalNow ? validate() : 0;
      if (!reports) continue;
      if (evalNow) {
        lastVal = val;
        csv.row(step, lr, loss, secs, tokensPerStep / secs, val, val / std::log(2.0));
      } else {
        csv.row(step, lr, loss, secs, tokensPerStep / secs, "", "");
      }
      if (step % flags.logInterval == 0 || step == flags.steps) {
        app::say("step %5lld  loss %.4f  lr %.2e  %.0f tokens/s\n", static_cast<long long>(step),
                 windowLoss / static_cast<double>(windowSteps), lr,
                 static_cast<double>(tokensPerStep * windowSteps) / windowSeconds);
        windowSeconds = windowLoss = 0;
        windowSteps = 0;
      }
      if (evalNow) {
        app::say("step %5lld  validation loss %.4f  %.3f bits per byte\n", static_cast<long long>(step), val,
                 val / std::log(2.0));
      }
    }

    const double peakMiB = static_cast<double>(Storage::memoryStats().peakBytes) / (1024.0 * 1024.0);
    Generator sampleGen(streamSeed(flags.seed, kSampleStream));
    const std::string sample = layout->sample(flags.prompt, flags.sampleTokens, flags.temperature, flags.topK, sampleGen);
    if (!reports) return 0;
    csv.close();
    app::say("final validation loss %.4f (%.3f bits per byte; %.3f at step 0) after %lld steps, %.1f s of training, "
             "%.0f tokens/s; metrics in %s\n",
             lastVal, lastVal / std::log(2.0), firstVal / std::log(2.0), static_cast<long long>(flags.steps),
             trainSeconds, static_cast<double>(tokensPerStep * flags.steps) / trainSeconds, flags.metrics.c_str());
    app::say("peak memory held by tensors during training: %.1f MiB\n", peakMiB);
    int64_t escaped = 0;
    const std::string shown = printable(sample, escaped);
    app::say("sample (temperature %g, top-k %lld, %lld new bytes, %lld not printable):\n%s\n", flags.temperature,
             static_cast<long long>(flags.topK), static_cast<long long>(flags.sampleTokens),
             static_cast<long long>(escaped), shown.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
