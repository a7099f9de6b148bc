// What the example programs share for reporting a run: a clock, the per-iteration metrics CSV
// file, the progress window behind the periodic "loss ... accuracy ... per second" lines, a
// trainer's batch log that keeps both, the count of right predictions, the name of each
// process's metrics file, and a progress bar for a terminal.
//
//   app::CsvFile csv(app::taggedPath(flags.metrics, rank == 1 ? "" : ".trainer_2"),
//                    "iteration,epoch,loss,accuracy,seconds");
//   app::Window window;
//   for (...) {
//     const auto t0 = app::Clock::now();
//     ...  // one training step
//     csv.row(iteration, epoch, loss, accuracy, app::secondsSince(t0));
//     window.add(loss, correct, seen);
//     if (window.batches == logInterval) { say("loss %.4f ...", window.meanLoss(), ...); window.reset(); }
//   }
//   csv.close();  // throws if anything could not be written
//
// A trainer that writes "iteration,epoch,loss,accuracy,seconds" rows keeps them, its window and
// its totals in one BatchLog:
//
//   app::BatchLog log(path);             // app::BatchLog log; writes no file
//   log.add(epoch, loss, correct, seen, app::secondsSince(t0));
//   if (log.window.batches == logInterval) { say(...); log.window.reset(); }
//   log.close();
//
// Header-only; it needs common/error.h and the tensor library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::examples::app {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// `path` with `tag` inserted before its extension ("m.csv", ".trainer_2" -> "m.trainer_2.csv"),
// or appended where it has none; `path` itself for an empty tag.
inline std::string taggedPath(const std::string& path, const std::string& tag) {
  if (tag.empty()) return path;
  size_t slash = path.find_last_of('/');
  size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

// A metrics file: a header line, then one line of comma-separated values per row. Opening fails
// with Error "cannot write the metrics file 'P'", close() with Error "could not write the
// metrics file 'P'" when some line was lost. A default-constructed CsvFile is closed: a process
// that writes no metrics holds one and never writes to it.
class CsvFile {
 public:
  CsvFile() = default;
  CsvFile(const std::string& path, const std::string& header) { open(path, header); }

  void open(const std::string& path, const std::string& header) {
    path_ = path;
    out_.open(path);
    if (!out_) throw Error("cannot write the metrics file '" + path + "'");
    out_ << header << '\n';
  }

  // The values, each written with the stream's formatting (setPrecision), separated by commas.
  template <class First, class... Rest>
  void row(const First& first, const Rest&... rest) {
    out_ << first;
    ((out_ << ',' << rest), ...);
    out_ << '\n';
  }

  // Significant digits of the real numbers in the rows that follow (the stream's default: 6).
  void setPrecision(int digits) { out_.precision(digits); }

  void close() {
    out_.close();
    if (!out_) throw Error("could not write the metrics file '" + path_ + "'");
  }

  bool isOpen() const { return out_.is_open(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// The batches since the last progress line: their summed loss, correct predictions and examples,
// and the time since the window opened.
struct Window {
  double loss = 0;
  double correct = 0;
  double seen = 0;
  int64_t batches = 0;
  Clock::time_point start = Clock::now();

  void add(double batchLoss, double batchCorrect, double batchSeen) {
    loss += batchLoss;
    correct += batchCorrect;
    seen += batchSeen;
    ++batches;
  }
  double meanLoss() const { return loss / static_cast<double>(batches); }
  double accuracy() const { return correct / seen; }
  double batchesPerSecond() const { return static_cast<double>(batches) / secondsSince(start); }
  void reset() { *this = Window{}; }
};

// How many rows of `scores` (logits or log-probabilities, one row per example) have their
// largest entry at the class `target` names.
inline double correctPredictions(const Tensor& scores, const Tensor& target) {
  NoGradGuard noGrad;
  return static_cast<double>(eq(argmax(scores, 1), target).sum().item<int64_t>());
}

// One trainer's batches: the metrics rows "iteration,epoch,loss,accuracy,seconds" (none when
// default-constructed), the window since the last progress line, and the totals of the run.
struct BatchLog {
  static constexpr const char* kHeader = "iteration,epoch,loss,accuracy,seconds";

  BatchLog() = default;
  explicit BatchLog(const std::string& path) : csv(path, kHeader) {}

  // A batch of `seen` examples, `correct` of them classified right, that took `seconds`.
  void add(int64_t epoch, double loss, double correct, double seen, double seconds) {
    ++iterations;
    trainSeconds += seconds;
    if (csv.isOpen()) csv.row(iterations, epoch, loss, correct / seen, seconds);
    window.add(loss, correct, seen);
  }
  double secondsPerIteration() const { return trainSeconds / static_cast<double>(std::max<int64_t>(iterations, 1)); }
  void close() {
    if (csv.isOpen()) csv.close();
  }

  CsvFile csv;
  Window window;
  int64_t iterations = 0;
  double trainSeconds = 0;
};

// "\repoch E [#####     ]  40% loss L" on stdout, rewritten in place: for a terminal only (the
// caller checks isatty), and wiped with clearProgressBar() before the next whole line.
inline void printProgressBar(int64_t epoch, int64_t done, int64_t total, double loss) {
  const int width = 30;
  int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::printf("\repoch %lld [%.*s%*s] %3lld%% loss %.4f", static_cast<long long>(epoch), filled,
              "##############################", width - filled, "", static_cast<long long>(100 * done / total), loss);
  std::fflush(stdout);
}

inline void clearProgressBar() { std::printf("\r%*s\r", 70, ""); }

}  // namespace weft::examples::app
