// The GPT example on a process mesh (--dp, --zero, --tp, --sp, --sp-mode, and pipelines of tensor-
// and sequence-parallel stages: --pp with --tp, --sp and --dp) and fully sharded (--fsdp, alone or
// over the dp replicas of --pp, --tp, --sp and their combinations) run through weftrun as a user
// runs it, at tiny sizes: each layout trains the one-process model on the same windows, so its loss
// at every one of 20 steps equals the one-process run's to float rounding; bad combinations are
// usage errors naming the problem. A vocabulary the tp group does not divide is padded.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "examples/example_run.h"

#ifdef WEFT_GPT

using weft::testing::runShell;

namespace {

// 20 steps; the one-process run's batch is kBatch, a layout's --batch-size is kBatch / dp.
constexpr int kBatch = 8;
const std::string kTiny =
    " --layers 2 --heads 4 --width 32 --steps 20 --warmup 5 --lr 3e-3 --min-lr 3e-4 --log-interval 10"
    " --eval-interval 10 --eval-batches 2 --sample-tokens 20";

// The training loss of every step in a metrics file (the rows after step 0's).
std::vector<double> stepLosses(const std::string& csv) {
  std::ifstream in(csv);
  std::vector<double> losses;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::stringstream row(line);
    std::string step, lr, loss;
    std::getline(row, step, ',');
    std::getline(row, lr, ',');
    std::getline(row, loss, ',');
    if (step != "0") losses.push_back(std::atof(loss.c_str()));
  }
  return losses;
}

// The losses of the run of `args` (with `launch` in front: weftrun -n N, or nothing), whose
// output goes to `out`.
std::vector<double> train(const std::string& launch, const std::string& args, std::string& out) {
  // A name of this process's own: CTest runs the test cases as concurrent processes in one folder.
  static int runs = 0;
  const std::string csv = "gpt_layouts_test_metrics_" + std::to_string(::getpid()) + "_" + std::to_string(runs++) + ".csv";
  std::remove(csv.c_str());
  const int rc = runShell(launch + std::string(WEFT_GPT) + kTiny + args + " --metrics " + csv + " 2>&1", out);
  INFO(out);
  CHECK(rc == 0);
  std::vector<double> losses = stepLosses(csv);
  std::remove(csv.c_str());
  return losses;
}

std::string weftrun(int n) { return std::string(WEFT_GPT_WEFTRUN) + " -n " + std::to_string(n) + " "; }

// Each step's loss of `got` equals `want`'s up to float rounding (the metrics keep 6 digits).
void checkSameLosses(const std::vector<double>& want, const std::vector<double>& got) {
  REQUIRE(want.size() == 20);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i + 1);
    CHECK(std::fabs(got[i] - want[i]) <= 5e-5);
  }
  // The losses fall: the comparison is between runs that train.
  CHECK(want.back() < want.front() - 0.5);
}

}  // namespace

TEST_CASE("the GPT example's data-parallel layouts train as one process does") {
  std::string out;
  const std::vector<double> single = train("", " --block 32 --batch-size " + std::to_string(kBatch), out);
  const std::string half = " --block 32 --batch-size " + std::to_string(kBatch / 2);
  SUBCASE("DistributedDataParallel over 2 processes") {
    std::string dp;
    checkSameLosses(single, train(weftrun(2), half + " --dp 2", dp));
    CHECK(dp.find("mesh {dp: 2} over 2 processes") != std::string::npos);
    CHECK(dp.find("DistributedDataParallel") != std::string::npos);
    // World rank 0 alone reports; the job's validation batch is the one process's.
    CHECK(dp.find("model: GPT") == dp.rfind("model: GPT"));
    const std::string key = "final validation loss ";
    CHECK(dp.substr(dp.find(key), 30) == out.substr(out.find(key), 30));
  }
  SUBCASE("ZeroRedundancyOptimizer (--zero 1)") {
    std::string z;
    checkSameLosses(single, train(weftrun(2), half + " --dp 2 --zero 1", z));
    CHECK(z.find("ZeRO-1") != std::string::npos);
  }
  SUBCASE("ShardedDataParallel (--zero 2)") {
    std::string z;
    checkSameLosses(single, train(weftrun(2), half + " --dp 2 --zero 2", z));
    CHECK(z.find("ZeRO-2") != std::string::npos);
  }
}

TEST_CASE("the GPT example's tensor- and sequence-parallel layouts train as one process does") {
  std::string out;
  // 30 tokens: the zig-zag ring of 2 splits 32, so the sequence is padded and masked.
  const std::vector<double> single = train("", " --block 30 --batch-size " + std::to_string(kBatch), out);
  SUBCASE("dp 2 x tp 2") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), " --block 30 --batch-size 4 --dp 2 --tp 2", run));
    CHECK(run.find("mesh {dp: 2, tp: 2} over 4 processes") != std::string::npos);
  }
  SUBCASE("tp 2 x sp 2, Ulysses") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), " --block 30 --batch-size 8 --tp 2 --sp 2 --sp-mode ulysses", run));
    CHECK(run.find("mesh {sp: 2, tp: 2} over 4 processes") != std::string::npos);
  }
  SUBCASE("tp 2 x sp 2, zig-zag ring") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), " --block 30 --batch-size 8 --tp 2 --sp 2 --sp-mode ring", run));
    CHECK(run.find("ring attention (zig-zag)") != std::string::npos);
  }
  SUBCASE("sp 4, 2-D (Ulysses 2 x ring 2)") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), " --block 30 --batch-size 8 --sp 4 --sp-mode 2d", run));
    CHECK(run.find("mesh {ring: 2, ulysses: 2} over 4 processes") != std::string::npos);
  }
  SUBCASE("dp 2 x sp 2, zig-zag ring") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), " --block 30 --batch-size 4 --dp 2 --sp 2 --sp-mode ring", run));
    CHECK(run.find("mesh {dp: 2, sp: 2} over 4 processes") != std::string::npos);
  }
}

TEST_CASE("the GPT example's fully sharded layouts, alone and over the dp replicas of a pipeline or of tensor "
          "and sequence parallelism, train as one process does") {
  // Each clips the whole model's gradient norm and decays the matrices only, as the one-process
  // run does. The norm exceeds --grad-clip 2 in some of these steps and not in others, so the
  // losses depend on its value (a clip at every step scales Adam's inputs alike and nearly
  // cancels). 30 tokens: the zig-zag ring of 2 pads the sequence.
  std::string out;
  const std::string model = " --block 30 --grad-clip 2";
  const std::vector<double> single = train("", model + " --batch-size " + std::to_string(kBatch), out);
  const std::string half = model + " --batch-size " + std::to_string(kBatch / 2);
  // The trained model, gathered for the validation and the sample, is the one-process run's: the
  // same final validation loss and the same sampled text.
  auto sameEnd = [&out](const std::string& run) {
    const std::string validation = "final validation loss ", sample = "sample (";
    REQUIRE(run.find(validation) != std::string::npos);
    REQUIRE(run.find(sample) != std::string::npos);
    CHECK(run.substr(run.find(validation), 30) == out.substr(out.find(validation), 30));
    CHECK(run.substr(run.find(sample)) == out.substr(out.find(sample)));
  };
  SUBCASE("FSDP over 2 processes") {
    std::string run;
    checkSameLosses(single, train(weftrun(2), half + " --fsdp", run));
    CHECK(run.find("fully sharded data parallel (ZeRO-3) over 2 processes") != std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x pp 2, 1F1B") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), half + " --fsdp --dp 2 --pp 2 --microbatches 2", run));
    CHECK(run.find("fully sharded data parallel (ZeRO-3) over 2 replicas of a pipeline of 2 stages") !=
          std::string::npos);
    CHECK(run.find("model: GPT") == run.rfind("model: GPT"));
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x pp 2, interleaved: the tied wte in chunks 0 and 1") {
    std::string run;
    checkSameLosses(single,
                    train(weftrun(4), half + " --fsdp --dp 2 --pp 2 --schedule interleaved --microbatches 2", run));
    CHECK(run.find("interleaved with 2 micro-batches") != std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x tp 2") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), half + " --fsdp --dp 2 --tp 2", run));
    CHECK(run.find("mesh {dp: 2, tp: 2} over 4 processes") != std::string::npos);
    CHECK(run.find("FullyShardedDataParallel (ZeRO-3) over dp around TensorParallelGPT") != std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x sp 2, zig-zag ring") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), half + " --fsdp --dp 2 --sp 2 --sp-mode ring", run));
    CHECK(run.find("over dp around SequenceParallelGPT with ring attention (zig-zag)") != std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x sp 2 x tp 2, Ulysses") {
    std::string run;
    checkSameLosses(single, train(weftrun(8), half + " --fsdp --dp 2 --tp 2 --sp 2 --sp-mode ulysses", run));
    CHECK(run.find("mesh {dp: 2, sp: 2, tp: 2} over 8 processes") != std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x pp 2 x tp 2 (3-D), 1F1B, on 8 processes") {
    // Clipping counts the split parameters over tp, the replicated ones and the tied wte once.
    std::string run;
    checkSameLosses(single, train(weftrun(8), half + " --fsdp --dp 2 --pp 2 --tp 2 --microbatches 2", run));
    CHECK(run.find("fully sharded data parallel (ZeRO-3) over 2 replicas of a pipeline of 2 stages (each over 2 "
                   "processes: TensorParallelGPT layers, mesh {dp: 2, pp: 2, tp: 2}") != std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x pp 2 x tp 2, interleaved, checkpointed") {
    std::string run;
    checkSameLosses(single, train(weftrun(8),
                                  half + " --fsdp --dp 2 --pp 2 --tp 2 --schedule interleaved --microbatches 2"
                                         " --checkpoint every-block",
                                  run));
    CHECK(run.find("interleaved with 2 micro-batches") != std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x pp 2 x tp 2 with dropout: the masks of dp 2 x pp 2 x tp 2 without FSDP") {
    // Each replica draws its own masks, so the reference is the pipelined layout's run.
    std::string piped, run;
    const std::string args = half + " --dp 2 --pp 2 --tp 2 --microbatches 2 --dropout 0.2";
    checkSameLosses(train(weftrun(8), args, piped), train(weftrun(8), args + " --fsdp", run));
  }
  SUBCASE("FSDP over dp 2 x pp 2 x sp 2, zig-zag ring, on 8 processes") {
    std::string run;
    checkSameLosses(single,
                    train(weftrun(8), half + " --fsdp --dp 2 --pp 2 --sp 2 --sp-mode ring --microbatches 2", run));
    CHECK(run.find("(each over 2 processes: GPT layers with ring attention (zig-zag), mesh {dp: 2, pp: 2, sp: 2, "
                   "tp: 1}") != std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x pp 2 x sp 2 x tp 2, Ulysses, on 16 processes") {
    std::string run;
    checkSameLosses(single, train(weftrun(16),
                                  half + " --fsdp --dp 2 --pp 2 --tp 2 --sp 2 --sp-mode ulysses --microbatches 2",
                                  run));
    CHECK(run.find("TensorParallelGPT layers with Ulysses sequence parallelism, mesh {dp: 2, pp: 2, sp: 2, tp: 2}") !=
          std::string::npos);
    sameEnd(run);
  }
  SUBCASE("FSDP over dp 2 x tp 2, checkpointed, with dropout: the masks of DDP over dp 2 x tp 2") {
    // Each replica draws its own masks, so the reference is the DDP layout's run.
    std::string ddp, run;
    const std::string args = half + " --dp 2 --tp 2 --dropout 0.2 --checkpoint every-block";
    checkSameLosses(train(weftrun(4), args, ddp), train(weftrun(4), args + " --fsdp", run));
  }
}

TEST_CASE("the GPT example on tp 3 pads the 256-byte vocabulary to 258 and trains as one process does") {
  std::string out, run, piped;
  const std::string model = " --block 32 --batch-size 8 --heads 6 --width 48";
  const std::vector<double> single = train("", model, out);
  checkSameLosses(single, train(weftrun(3), model + " --tp 3", run));
  CHECK(run.find("mesh {tp: 3} over 3 processes") != std::string::npos);
  // The padded rows of wte live on the first and the last stage: the tie keeps them alike.
  checkSameLosses(single, train(weftrun(6), model + " --pp 2 --tp 3 --microbatches 2", piped));
  CHECK(piped.find("TensorParallelGPT layers, mesh {dp: 1, pp: 2, tp: 3}") != std::string::npos);
}

TEST_CASE("the GPT example's pipelines of tensor- and sequence-parallel stages, with data-parallel replicas, "
          "train as one process does") {
  std::string out;
  const std::vector<double> single = train("", " --block 32 --batch-size " + std::to_string(kBatch), out);
  SUBCASE("pp 2 x tp 2, 1F1B") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), " --block 32 --batch-size 8 --pp 2 --tp 2 --schedule 1f1b", run));
    CHECK(run.find("pipeline of 2 stages (each over 2 processes: TensorParallelGPT layers, mesh {dp: 1, pp: 2, "
                   "tp: 2}") != std::string::npos);
    // World rank 0 alone reports; the sample is the one-process model's.
    CHECK(run.find("model: GPT") == run.rfind("model: GPT"));
    const std::string key = "final validation loss ";
    CHECK(run.substr(run.find(key), 30) == out.substr(out.find(key), 30));
    const std::string sample = "sample (temperature";
    CHECK(run.substr(run.find(sample)) == out.substr(out.find(sample)));
  }
  SUBCASE("pp 2 x tp 2, interleaved 1F1B (2 chunks per stage)") {
    std::string run;
    checkSameLosses(single, train(weftrun(4), " --block 32 --batch-size 8 --pp 2 --tp 2 --schedule interleaved", run));
    CHECK(run.find("interleaved with 4 micro-batches") != std::string::npos);
  }
  SUBCASE("dp 2 x pp 2 x tp 2, GPipe, on 8 processes") {
    std::string run;
    checkSameLosses(single, train(weftrun(8),
                                  " --block 32 --batch-size 4 --dp 2 --pp 2 --tp 2 --schedule gpipe --microbatches 2",
                                  run));
    CHECK(run.find("2 data-parallel replicas of a pipeline of 2 stages (each over 2 processes: TensorParallelGPT "
                   "layers, mesh {dp: 2, pp: 2, tp: 2}") != std::string::npos);
  }
  SUBCASE("pp 2 x sp 2, zig-zag ring, 30 tokens padded to 32") {
    std::string out30, run;
    const std::vector<double> single30 = train("", " --block 30 --batch-size 8", out30);
    checkSameLosses(single30, train(weftrun(4), " --block 30 --batch-size 8 --pp 2 --sp 2 --sp-mode ring", run));
    CHECK(run.find("GPT layers with ring attention (zig-zag), mesh {dp: 1, pp: 2, sp: 2, tp: 1}") !=
          std::string::npos);
  }
  SUBCASE("pp 2 x sp 2 x tp 2, Ulysses, on 8 processes") {
    std::string run;
    checkSameLosses(single, train(weftrun(8), " --block 32 --batch-size 8 --pp 2 --tp 2 --sp 2", run));
    CHECK(run.find("TensorParallelGPT layers with Ulysses sequence parallelism, mesh {dp: 1, pp: 2, sp: 2, tp: 2}") !=
          std::string::npos);
  }
}

TEST_CASE("the GPT example's tensor- and sequence-parallel layouts with dropout draw the one-process run's masks "
          "and train as it does") {
  std::string out;
  const std::string model = " --block 32 --batch-size 8 --dropout 0.2";
  const std::vector<double> single = train("", model, out);
  for (const auto& [n, args] : std::vector<std::pair<int, std::string>>{
           {2, " --tp 2"},
           {2, " --sp 2 --sp-mode ulysses"},
           {2, " --sp 2 --sp-mode ring"},
           {4, " --sp 4 --sp-mode ulysses --checkpoint every-block"},
           {4, " --sp 4 --sp-mode 2d"},
           {4, " --tp 2 --sp 2 --sp-mode ulysses"},
           {4, " --tp 2 --sp 2 --sp-mode ring --checkpoint every-block"}}) {
    CAPTURE(args);
    std::string run;
    checkSameLosses(single, train(weftrun(n), model + args, run));
  }
  // Dropout changes the losses: the comparison is not one of dropout-free runs.
  std::string plain;
  const std::vector<double> noDropout = train("", " --block 32 --batch-size 8", plain);
  REQUIRE(noDropout.size() == single.size());
  CHECK(std::fabs(noDropout[0] - single[0]) > 1e-3);
}

TEST_CASE("the GPT example's tensor- and sequence-parallel layouts checkpoint every block: the same losses in "
          "less memory") {
  const std::string peak = "peak memory held by tensors during training: ";
  auto peakOf = [&](const std::string& out) {
    const auto at = out.find(peak);
    return at == std::string::npos ? std::nan("") : std::atof(out.c_str() + at + peak.size());
  };
  SUBCASE("tp 2 with dropout") {
    std::string out, plain, checkpointed;
    const std::string model = " --block 32 --batch-size 8 --dropout 0.2";
    const std::vector<double> single = train("", model, out);
    checkSameLosses(single, train(weftrun(2), model + " --tp 2", plain));
    checkSameLosses(single, train(weftrun(2), model + " --tp 2 --checkpoint every-block", checkpointed));
    CHECK(peakOf(checkpointed) < 0.9 * peakOf(plain));
  }
  SUBCASE("tp 2 x sp 2, zig-zag ring") {
    std::string out, plain, checkpointed;
    const std::string model = " --block 32 --batch-size 8 --tp 2 --sp 2 --sp-mode ring";
    const std::vector<double> single = train("", " --block 32 --batch-size 8", out);
    checkSameLosses(single, train(weftrun(4), model, plain));
    checkSameLosses(single, train(weftrun(4), model + " --checkpoint every-block", checkpointed));
    CHECK(peakOf(checkpointed) < 0.9 * peakOf(plain));
  }
  SUBCASE("sp 4, 2-D") {
    std::string out, checkpointed;
    const std::vector<double> single = train("", " --block 32 --batch-size 8", out);
    checkSameLosses(single,
                    train(weftrun(4), " --block 32 --batch-size 8 --sp 4 --sp-mode 2d --checkpoint every-block",
                          checkpointed));
  }
}

TEST_CASE("the GPT example rejects a mesh that does not fit the model or the job") {
  auto usageError = [](const std::string& args, const std::string& message) {
    std::string out;
    CHECK(runShell(std::string(WEFT_GPT) + kTiny + " --block 32" + args + " 2>&1", out) == 2);
    INFO(out);
    CHECK(out.find(message) != std::string::npos);
  };
  usageError(" --tp 3", "--tp 3 must divide --heads 4");
  usageError(" --sp 8 --sp-mode ulysses", "--sp 8 with --sp-mode ulysses must divide the heads of a tensor-parallel rank (4)");
  usageError(" --sp 2 --sp-mode 2d", "--sp 2 with --sp-mode 2d must be U x R");
  usageError(" --sp-mode zigzag", "invalid value 'zigzag' for --sp-mode");
  usageError(" --zero 1", "--zero needs --dp > 1");
  usageError(" --dp 2 --tp 2 --zero 2", "--zero needs --dp > 1 and no --tp, --sp or --pp");
  usageError(" --dp 2 --pp 2 --zero 1", "--zero needs --dp > 1 and no --tp, --sp or --pp");
  usageError(" --zero 3", "invalid value '3' for --zero");
  usageError(" --tp 3 --pp 2", "--tp 3 must divide --heads 4");
  usageError(" --pp 2 --tp 2 --precision bf16", "--precision bf16 trains in one process; --pp in float32");
  usageError(" --pp 2 --tp 2 --device cuda", "--device cuda trains in one process; --pp runs on CPUs");
  usageError(" --pp 2 --sp 8 --sp-mode ulysses",
             "--sp 8 with --sp-mode ulysses must divide the heads of a tensor-parallel rank (4)");
  usageError(" --pp 2 --tp 2 --sp 2 --sp-mode 2d", "--sp 2 with --sp-mode 2d must be U x R");
  usageError(" --dp 0", "--dp, --tp and --sp must be positive");
  const std::string needsDp = "--fsdp with --pp, --tp or --sp shards over the data-parallel replicas: it needs --dp > 1";
  usageError(" --fsdp --tp 2", needsDp);
  usageError(" --fsdp --pp 2", needsDp);
  usageError(" --fsdp --sp 2", needsDp);
  usageError(" --fsdp --pp 2 --tp 2", needsDp);
  usageError(" --fsdp --dp 2 --pp 2 --tp 2 --precision bf16", "--precision bf16 trains in one process; --pp in float32");
  usageError(" --fsdp --dp 2 --zero 1", "--fsdp does not combine with --zero");
  usageError(" --fsdp --device cuda", "--fsdp runs on CPUs");
  // The product must be the job's size.
  std::string out;
  CHECK(runShell(weftrun(3) + WEFT_GPT + kTiny + " --block 32 --dp 2 --tp 2 2>&1", out) != 0);
  INFO(out);
  CHECK(out.find("--dp 2 x --tp 2 x --sp 1 needs a job of 4 processes (weftrun -n 4), this one has 3") !=
        std::string::npos);
  CHECK(runShell(weftrun(4) + WEFT_GPT + kTiny + " --block 32 --pp 2 --tp 2 --sp 2 --dp 2 2>&1", out) != 0);
  CHECK(out.find("--pp 2 --tp 2 --sp 2 --dp 2 needs a job of 16 processes (weftrun -n 16), this one has 4") !=
        std::string::npos);
  // The size is checked before joining: rank 0 of a job of 3 whose other ranks never start fails at
  // once, without serving the store (its address, port 1, is never bound) or waiting for them.
  for (const std::string args : {" --dp 2 --tp 2", " --pp 2 --tp 2", " --fsdp --dp 2 --pp 2"}) {
    CAPTURE(args);
    std::string alone;
    CHECK(runShell("WEFT_RANK=0 WEFT_WORLD_SIZE=3 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=1 timeout 30 " +
                       std::string(WEFT_GPT) + kTiny + " --block 32" + args + " 2>&1",
                   alone) == 1);
    INFO(alone);
    CHECK(alone.find("needs a job of 4 processes (weftrun -n 4), this one has 3") != std::string::npos);
  }
  out.clear();
  CHECK(runShell(weftrun(2) + WEFT_GPT + kTiny + " --block 32 --fsdp --dp 2 --pp 2 2>&1", out) != 0);
  CHECK(out.find("--fsdp --dp 2 --pp 2 needs a job of 4 processes (weftrun -n 4), this one has 2") !=
        std::string::npos);
  out.clear();
  CHECK(runShell(weftrun(4) + WEFT_GPT + kTiny + " --block 32 --fsdp --dp 2 --pp 2 --tp 2 --sp 2 2>&1", out) != 0);
  CHECK(out.find("--fsdp --dp 2 --pp 2 --tp 2 --sp 2 needs a job of 16 processes (weftrun -n 16), this one has 4") !=
        std::string::npos);
  out.clear();
  CHECK(runShell(weftrun(2) + WEFT_GPT + kTiny + " --block 32 --fsdp --dp 3 2>&1", out) != 0);
  CHECK(out.find("--fsdp --dp 3 needs a job of 3 processes (weftrun -n 3), this one has 2") != std::string::npos);
}

#endif  // WEFT_GPT
