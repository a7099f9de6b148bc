// The GPT example's checkpoints and gradient clipping under every layout, run through weftrun as a
// user runs it, at tiny sizes: --save writes the whole model gathered on world rank 0, the same
// model whatever the layout (dp, tp, sp, pp, fsdp alone and over dp x pp, tp, sp and pp x tp,
// against the one-process run, to float rounding: the layouts sum the same gradients in other
// orders, so no file is bitwise the one-process run's; 2e-5 is about 10 times the largest
// difference seen and a tenth of what weight decay on the wrong parameters makes); each step's
// gradient norm before clipping, recorded in the metrics, is the one-process model's; --load
// starts any layout from such a file, where the saving run ended.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "examples/example_run.h"
#include "nn/serialize.h"
#include "tensor/ops.h"

#ifdef WEFT_GPT

using weft::testing::runShell;

namespace {

constexpr int kSteps = 12;
// --grad-clip 0.3 clips every step of this run (its norms lie between 1 and 3).
const std::string kTiny =
    " --layers 2 --heads 4 --width 32 --block 32 --steps 12 --warmup 3 --lr 3e-3 --min-lr 3e-4 --log-interval 6"
    " --eval-interval 6 --eval-batches 2 --sample-tokens 10 --grad-clip 0.3";

// A metrics file's columns by name, each a column of strings (row 0: the validation before
// training).
struct Metrics {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;

  std::vector<double> column(const std::string& name, bool training) const {
    const auto at = std::find(header.begin(), header.end(), name);
    REQUIRE(at != header.end());
    const size_t c = static_cast<size_t>(at - header.begin());
    std::vector<double> v;
    for (const auto& row : rows) {
      if (training && row[0] == "0") continue;
      v.push_back(c < row.size() && !row[c].empty() ? std::atof(row[c].c_str()) : std::nan(""));
    }
    return v;
  }
};

Metrics readMetrics(const std::string& csv) {
  std::ifstream in(csv);
  Metrics m;
  std::string line, cell;
  std::getline(in, line);
  for (std::stringstream h(line); std::getline(h, cell, ',');) m.header.push_back(cell);
  while (std::getline(in, line)) {
    std::vector<std::string> row;
    for (std::stringstream r(line); std::getline(r, cell, ',');) row.push_back(cell);
    m.rows.push_back(row);
  }
  return m;
}

// A file name of this process's own: CTest runs the test cases as concurrent processes in one folder.
std::string scratch(const std::string& what) {
  static int files = 0;
  return "gpt_checkpoint_test_" + std::to_string(::getpid()) + "_" + std::to_string(files++) + what;
}

// The metrics of the run of `args` (with `launch` in front: weftrun -n N, or nothing).
Metrics train(const std::string& launch, const std::string& args, std::string& out) {
  const std::string csv = scratch(".csv");
  const int rc = runShell(launch + std::string(WEFT_GPT) + kTiny + args + " --metrics " + csv + " 2>&1", out);
  INFO(out);
  CHECK(rc == 0);
  Metrics m = readMetrics(csv);
  std::remove(csv.c_str());
  return m;
}

std::string weftrun(int n) { return std::string(WEFT_GPT_WEFTRUN) + " -n " + std::to_string(n) + " "; }

// Each value of `got` equals `want`'s within `tolerance`, relative to the larger of 1 and |want|.
void checkClose(const std::vector<double>& want, const std::vector<double>& got, double tolerance) {
  REQUIRE(want.size() == kSteps);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i + 1);
    CAPTURE(want[i]);
    CAPTURE(got[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tolerance * std::max(1.0, std::fabs(want[i])));
  }
}

// The largest difference between two checkpoints' tensors, after checking that they hold the same
// names and shapes.
double maxDifference(const std::string& a, const std::string& b) {
  const weft::nn::StateDict x = weft::nn::loadStateDictFile(a), y = weft::nn::loadStateDictFile(b);
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (const auto& [name, t] : x) {
    CAPTURE(name);
    auto it = y.find(name);
    REQUIRE(it != y.end());
    REQUIRE(it->second.shape() == t.shape());
    const weft::Tensor diff = weft::abs(weft::sub(t.to(weft::DType::Float64), it->second.to(weft::DType::Float64)));
    worst = std::max(worst, weft::max(diff).item<double>());
  }
  return worst;
}

struct LayoutRun {
  int processes;
  std::string args;  // --batch-size is a data-parallel replica's: the job's batch is 8 in each
  std::string banner;
};

const std::vector<LayoutRun> kLayouts = {
    {2, " --batch-size 4 --dp 2", "DistributedDataParallel"},
    {2, " --batch-size 4 --dp 2 --zero 1", "ZeroRedundancyOptimizer (ZeRO-1)"},
    {2, " --batch-size 4 --dp 2 --zero 2", "ShardedDataParallel (ZeRO-2)"},
    {4, " --batch-size 4 --dp 2 --tp 2", "mesh {dp: 2, tp: 2}"},
    {2, " --batch-size 8 --tp 2", "TensorParallelGPT"},
    {2, " --batch-size 8 --sp 2 --sp-mode ulysses", "SequenceParallelGPT, Ulysses"},
    {2, " --batch-size 8 --sp 2 --sp-mode ring", "SequenceParallelGPT, ring attention (zig-zag)"},
    {2, " --batch-size 8 --pp 2 --microbatches 2", "pipeline of 2 stages"},
    {4, " --batch-size 8 --sp 4 --sp-mode 2d", "mesh {ring: 2, ulysses: 2}"},
    {4, " --batch-size 8 --tp 2 --sp 2 --sp-mode ring", "mesh {sp: 2, tp: 2}"},
    {4, " --batch-size 4 --dp 2 --pp 2 --microbatches 2", "2 data-parallel replicas of a pipeline"},
    {2, " --batch-size 4 --fsdp", "fully sharded data parallel (ZeRO-3) over 2 processes"},
    {4, " --batch-size 4 --fsdp --dp 2 --pp 2 --microbatches 2", "over 2 replicas of a pipeline of 2 stages"},
    {4, " --batch-size 4 --fsdp --dp 2 --tp 2", "over dp around TensorParallelGPT"},
    {4, " --batch-size 4 --fsdp --dp 2 --sp 2 --sp-mode ring", "over dp around SequenceParallelGPT"},
    {8, " --batch-size 4 --fsdp --dp 2 --pp 2 --tp 2 --microbatches 2",
     "TensorParallelGPT layers, mesh {dp: 2, pp: 2, tp: 2}"},
};

}  // namespace

TEST_CASE("the GPT example saves the same model and clips the same gradient norm whatever the layout, and resumes "
          "from the file under any layout") {
  std::string out;
  const std::string single = scratch(".weft");
  const Metrics one = train("", " --batch-size 8 --save " + single, out);
  CHECK(out.find("saved the trained model to " + single) != std::string::npos);
  const std::vector<double> norms = one.column("grad_norm", true);
  REQUIRE(norms.size() == kSteps);
  // Clipping is active on every step: the comparison is of clipped runs.
  for (double n : norms) CHECK(n > 0.3);
  const std::vector<double> losses = one.column("loss", true);
  CHECK(losses.back() < losses.front() - 0.5);

  std::vector<std::string> files;
  for (const LayoutRun& l : kLayouts) {
    CAPTURE(l.args);
    std::string run;
    const std::string file = scratch(".weft");
    const Metrics m = train(weftrun(l.processes), l.args + " --save " + file, run);
    CHECK(run.find(l.banner) != std::string::npos);
    // Only world rank 0 writes the file, and says so once.
    CHECK(run.find("saved the trained model") == run.rfind("saved the trained model"));
    checkClose(losses, m.column("loss", true), 1e-5);
    checkClose(norms, m.column("grad_norm", true), 1e-5);
    CHECK(maxDifference(single, file) <= 2e-5);
    files.push_back(file);
  }

  // Resuming: any layout started from any layout's file begins where the saving run ended (its
  // validation loss) and takes the same steps as the one process started from the one process's.
  const double ended = one.column("val_loss", false).back();
  std::string resumedOut;
  const Metrics resumed = train("", " --batch-size 8 --load " + single, resumedOut);
  CHECK(resumedOut.find("initial weights: " + single) != std::string::npos);
  CHECK(resumed.column("val_loss", false)[0] == doctest::Approx(ended).epsilon(1e-5));
  const std::vector<double> resumedLosses = resumed.column("loss", true);
  // The resumed run starts lower than the fresh one did: it continues the training.
  CHECK(resumedLosses.front() < losses.front() - 0.5);
  for (size_t i = 0; i < kLayouts.size(); ++i) {
    const LayoutRun& l = kLayouts[(i + 1) % kLayouts.size()];  // another layout's file
    CAPTURE(l.args);
    CAPTURE(files[i]);
    std::string run;
    const Metrics m = train(weftrun(l.processes), l.args + " --load " + files[i], run);
    CHECK(m.column("val_loss", false)[0] == doctest::Approx(ended).epsilon(1e-4));
    checkClose(resumedLosses, m.column("loss", true), 1e-5);
  }
  std::remove(single.c_str());
  for (const std::string& f : files) std::remove(f.c_str());
}

TEST_CASE("the GPT example refuses a checkpoint it cannot load, naming the file or the mismatch") {
  std::string missing;
  CHECK(runShell(std::string(WEFT_GPT) + kTiny + " --load /nonexistent-weft-checkpoint.weft --metrics /dev/null 2>&1",
                 missing) == 1);
  INFO(missing);
  CHECK(missing.find("/nonexistent-weft-checkpoint.weft") != std::string::npos);
  // A checkpoint of a wider model.
  std::string out, wrong;
  const std::string file = scratch(".weft");
  REQUIRE(runShell(std::string(WEFT_GPT) + kTiny + " --steps 1 --warmup 0 --width 48 --metrics /dev/null --save " +
                       file + " 2>&1",
                   out) == 0);
  CHECK(runShell(std::string(WEFT_GPT) + kTiny + " --load " + file + " --metrics /dev/null 2>&1", wrong) == 1);
  INFO(wrong);
  CHECK(wrong.find("shape") != std::string::npos);
  std::remove(file.c_str());
}

#endif  // WEFT_GPT
