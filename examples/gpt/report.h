// What the gpt example prints and records: the banner describing the run, the progress lines
// and metrics CSV rows of the training loop, and the closing summary with its text sample.
// Only the process whose layout reports() prints or writes anything.
//
//   Report report(flags, layout->reports());
//   report.banner(*layout, text);
//   report.validation(0, val);                   // before training
//   report.step(step, lr, loss, seconds, norm);    // every step; prints every --log-interval
//   report.finish(peakBytes, sample);
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "data/text.h"
#include "examples/common/metrics.h"

#include "flags.h"
#include "layout.h"

namespace weft::examples::gpt {

// `text` with every byte other than printable ASCII, newline and tab written as \xNN, so that a
// sample cannot send control sequences to a terminal; `escaped` counts them.
inline std::string printable(const std::string& text, int64_t& escaped) {
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

class Report {
 public:
  Report(const Flags& flags, bool reports) : flags_(flags), reports_(reports) {
    if (reports_) csv_.open(flags.metrics, "step,lr,loss,seconds,tokens_per_second,val_loss,val_bpb,grad_norm");
  }

  void banner(const Layout& layout, const data::TextDataset& text) const {
    if (!reports_) return;
    const Flags& f = flags_;
    app::say("model: GPT, %lld parameters (%lld layers, %lld heads, width %lld, context %lld, dropout %g, "
             "checkpointing %s); %s\n",
             static_cast<long long>(layout.numParameters()), static_cast<long long>(f.layers),
             static_cast<long long>(f.heads), static_cast<long long>(f.width), static_cast<long long>(f.block),
             f.dropout, f.checkpoint.c_str(), layout.describe().c_str());
    if (!f.load.empty()) app::say("initial weights: %s\n", f.load.c_str());
    app::say("data: %lld training and %lld validation bytes from %s\n",
             static_cast<long long>(text.size(data::TextSplit::Train)),
             static_cast<long long>(text.size(data::TextSplit::Validation)), f.dataDir.c_str());
    app::say("training: %lld steps of %lld x %lld tokens, AdamW lr %g (warm-up %lld steps, cosine to %g), "
             "weight decay %g, gradient clip %g\n",
             static_cast<long long>(f.steps), static_cast<long long>(f.batchSize), static_cast<long long>(f.block),
             f.lr, static_cast<long long>(f.warmup), f.minLr, f.weightDecay, f.gradClip);
  }

  // The validation loss `val` (nats per byte) at `step`; at step 0, before training.
  void validation(int64_t step, double val) {
    if (step == 0) firstVal_ = val;
    lastVal_ = val;
    if (!reports_) return;
    if (step == 0) csv_.row(0, "", "", "", "", val, bits(val), "");
    app::say("step %5lld  validation loss %.4f  %.3f bits per byte\n", static_cast<long long>(step), val, bits(val));
  }

  // A training step's figures: `gradNorm` the gradient's norm before clipping (NaN: not
  // clipped), `val` >= 0 when the step was followed by a validation.
  void step(int64_t step, double lr, double loss, double seconds, double gradNorm, double val = -1) {
    trainSeconds_ += seconds;
    windowSeconds_ += seconds;
    windowLoss_ += loss;
    ++windowSteps_;
    if (!reports_) return;
    const double tokens = static_cast<double>(flags_.batchSize * flags_.block);
    // Nine significant digits for the norm: comparable across layouts to float rounding.
    char norm[32] = "";
    if (!std::isnan(gradNorm)) std::snprintf(norm, sizeof norm, "%.9g", gradNorm);
    if (val >= 0) {
      csv_.row(step, lr, loss, seconds, tokens / seconds, val, bits(val), norm);
    } else {
      csv_.row(step, lr, loss, seconds, tokens / seconds, "", "", norm);
    }
    if (step % flags_.logInterval == 0 || step == flags_.steps) {
      app::say("step %5lld  loss %.4f  lr %.2e  %.0f tokens/s\n", static_cast<long long>(step),
               windowLoss_ / static_cast<double>(windowSteps_), lr,
               tokens * static_cast<double>(windowSteps_) / windowSeconds_);
      windowSeconds_ = windowLoss_ = 0;
      windowSteps_ = 0;
    }
  }

  // The line saying where the trained model went (--save).
  void saved(const std::string& path) const {
    if (reports_) app::say("saved the trained model to %s\n", path.c_str());
  }

  // The closing lines: `peakBytes` held by tensors during training, then the sample.
  void finish(size_t peakBytes, const std::string& sample) {
    if (!reports_) return;
    csv_.close();
    const double tokens = static_cast<double>(flags_.batchSize * flags_.block * flags_.steps);
    app::say("final validation loss %.4f (%.3f bits per byte; %.3f at step 0) after %lld steps, %.1f s of training, "
             "%.0f tokens/s; metrics in %s\n",
             lastVal_, bits(lastVal_), bits(firstVal_), static_cast<long long>(flags_.steps), trainSeconds_,
             tokens / trainSeconds_, flags_.metrics.c_str());
    app::say("peak memory held by tensors during training: %.1f MiB\n",
             static_cast<double>(peakBytes) / (1024.0 * 1024.0));
    int64_t escaped = 0;
    const std::string shown = printable(sample, escaped);
    app::say("sample (temperature %g, top-k %lld, %lld new bytes, %lld not printable):\n%s\n", flags_.temperature,
             static_cast<long long>(flags_.topK), static_cast<long long>(flags_.sampleTokens),
             static_cast<long long>(escaped), shown.c_str());
  }

 private:
  static double bits(double nats) { return nats / std::log(2.0); }

  const Flags& flags_;
  bool reports_;
  app::CsvFile csv_;
  double firstVal_ = 0, lastVal_ = 0, trainSeconds_ = 0, windowSeconds_ = 0, windowLoss_ = 0;
  int64_t windowSteps_ = 0;
};

}  // namespace weft::examples::gpt
