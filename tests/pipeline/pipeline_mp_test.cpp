// The pipeline executor across real processes on 127.0.0.1 (tests/pipeline/helpers/pipeline_worker.cpp,
// one process per stage, Gloo): for P = 2, 3 and 4 stages, both schedules, a Sequential MLP and the
// tiny GPT (uneven layer counts per stage, M not divisible by P), and interleaved 1F1B with 2 chunks
// per stage for P = 2 and 4 (M a multiple of P and not), the pipelined loss and every
// stage's gradients equal those of one single-process step on the whole batch, and after three
// optimizer steps each stage's parameters equal the single-process model's; the peak of live
// micro-batches is the schedule's and the step's trace holds every forward, backward and receive;
// likewise 2 data-parallel replicas of a 2-stage pipeline (dp x pp) on half the batch each, and a
// 2-stage pipeline of tensor-parallel GPT stages (pp x tp on 4 processes) against its shards of the
// single-process model. A stage dying mid-step gives the others a DisconnectedError
// naming it, within the group timeout, and the executors refuse further steps. Every wait is bounded and every process is checked to be
// gone at the end.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "captured_text.h"
#include "mp_job.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::allClean;
using weft::testing::MpJob;
using weft::testing::numberAfter;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;

namespace {

// Settings of rank r beyond the job's own (WEFT_PIPELINE_SHM=0, PIPELINE_WORKER_RING_BYTES=N).
using ExtraEnv = std::function<std::vector<std::string>(int rank)>;

std::vector<weft::testing::Subprocess::Result> runJob(const std::vector<std::string>& argv, int world,
                                                      std::chrono::milliseconds timeout, const ExtraEnv& extra = {}) {
  std::vector<std::string> full{PIPELINE_WORKER_PATH};
  full.insert(full.end(), argv.begin(), argv.end());
  MpJob job(full, world, [&extra](int r) {
    auto env = weft::testing::fastFailureSettings(2);
    if (extra) {
      for (auto& e : extra(r)) env.push_back(e);
    }
    return env;
  });
  auto results = job.finish(timeout);
  job.checkAllGone();
  return results;
}

long long field(const std::string& line, const std::string& key) { return numberAfter(" " + line, " " + key + " "); }

// Runs `model` (mlp|gpt) on `world` stages under `schedule` with `m` micro-batches and checks every
// stage against the single-process reference.
// How a job's stages are linked: through shared memory (the default on one machine), or through
// the process group, as `extra` makes them.
enum class Links { Rings, Group };

std::vector<weft::testing::Subprocess::Result> checkTraining(const std::string& model, int world,
                                                             const std::string& schedule, int m, int replicas = 1,
                                                             Links links = Links::Rings, const ExtraEnv& extra = {}) {
  auto results = runJob({replicas > 1 ? model + "dp" : model, schedule, std::to_string(m)}, world, 40s, extra);
  REQUIRE(allClean(results));
  const int stages = world / replicas;
  const int chunks = schedule == "interleaved" ? 2 : 1;
  long long params = 0;
  for (int rank = 0; rank < world; ++rank) {
    const int r = rank % stages;  // the stage
    const std::string& out = results[static_cast<size_t>(rank)].out;
    const std::string prefix = rankPrefix(rank);
    INFO(out);
    for (int step = 0; step < 3; ++step) {
      const std::string line = restOfLine(out, prefix + "step " + std::to_string(step) + " ");
      REQUIRE(!line.empty());
      // float32 sums in a different order: a few ulps of the gradients' size.
      CHECK(field(line, "grad_maxdiff_ppb") >= 0);
      CHECK(field(line, "grad_maxdiff_ppb") <= 20000);
      if (r == stages - 1) {
        CHECK(field(line, "loss_diff_ppb") >= 0);
        CHECK(field(line, "loss_diff_ppb") <= 20000);
      } else {
        CHECK(field(line, "loss_diff_ppb") == -1);
      }
      const long long peak = field(line, "peak");
      if (chunks > 1) {
        // (micro-batch, chunk) pairs: the warm-up plus one (pipeline/schedule.h).
        const int group = m < stages ? m : stages + m % stages;
        CHECK(peak == std::min((stages - r - 1) * 2 + (chunks - 1) * group + 1, chunks * m));
      } else {
        CHECK(peak == (schedule.rfind("gpipe", 0) == 0 ? m : std::min(stages - r, m)));
      }
      CHECK(field(line, "params") > 0);
      CHECK(field(line, "forwards") == chunks * m);
      CHECK(field(line, "backwards") == chunks * m);
      // Per chunk, as the stage c·P + r of chunks·P would.
      long long receives = 0;
      for (int c = 0; c < chunks; ++c) {
        const int k = c * stages + r;
        receives += m * ((k > 0 ? 1 : 0) + (k < chunks * stages - 1 ? 1 : 0));
      }
      CHECK(field(line, "receives") == receives);
      // Each receive is answered by a send the other way: a received activation by its gradient, a
      // received gradient by the activation sent before it.
      CHECK(field(line, "sends") == receives);
      CHECK(field(line, "transfers") == 2 * receives);
      CHECK(field(line, "accounted") == 1);
      CHECK(field(line, "ordered") == 1);
      // The mlp's stages send nothing through the group once the rings are set up (the first
      // step's set-up messages aside); through the group, at least their activations or
      // gradients: M messages of 2 rows of at least 4 floats per link.
      const long long groupBytes = field(line, "group_bytes");
      if (model == "mlp" && replicas == 1 && step > 0) {
        if (links == Links::Rings) {
          CHECK(groupBytes == 0);
        } else {
          CHECK(groupBytes >= static_cast<long long>(m) * 2 * 4 * 4);
        }
      }
      if (step == 0 && rank < stages) params += field(line, "params");
    }
    const long long final = numberAfter(out, prefix + "final param_maxdiff_ppb ");
    CHECK(final >= 0);
    CHECK(final <= 50000);
  }
  // Every parameter lives on some stage: the MLP's 12*24+24 + 24*16+16 + 16*16+16 + 16*4+4 = 1052;
  // the GPT's per the GPT-2 formula, wte counted on the first and the last stage.
  if (model == "mlp") CHECK(params == 1052);
  if (model == "gpt") {
    const long long v = 32, c = 16, t = 8, l = chunks > 1 ? 6 : 3;
    CHECK(params == v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c + (stages > 1 ? v * c : 0));
  }
  return results;
}

}  // namespace

TEST_SUITE_BEGIN("pipeline");

TEST_CASE("a 2-stage MLP pipeline equals the single-process step, 1F1B and GPipe, M = 3 and 4") {
  checkTraining("mlp", 2, "1f1b", 3);
  checkTraining("mlp", 2, "gpipe", 4);
}

TEST_CASE("a 3-stage MLP pipeline equals the single-process step, 1F1B M = 5 and GPipe M = 2") {
  checkTraining("mlp", 3, "1f1b", 5);
  checkTraining("mlp", 3, "gpipe", 2);
}

TEST_CASE("a 4-stage pipeline equals the single-process step: the MLP under 1F1B (M = 6) and GPipe (M = 5), "
          "the GPT under 1F1B (M = 5)") {
  checkTraining("mlp", 4, "1f1b", 6);
  checkTraining("mlp", 4, "gpipe", 5);
  checkTraining("gpt", 4, "1f1b", 5);
}

TEST_CASE("the tiny GPT pipelined on 2 and 3 stages, wte tied across the ends, equals the single-process step") {
  checkTraining("gpt", 2, "1f1b", 3);
  checkTraining("gpt", 3, "gpipe", 4);
  checkTraining("gpt", 3, "1f1b", 4);
}

TEST_CASE("interleaved 1F1B, 2 chunks per stage, equals the single-process step: 2 stages (the MLP in 4 pieces, "
          "M = 1, 2 and 3, the GPT in 4, M = 4) and 4 stages (the GPT in 8 pieces, M = 4 and 6)") {
  // M = 1: fewer micro-batches than stages, and fewer than the set-up's messages per link.
  checkTraining("mlp", 2, "interleaved", 1);
  checkTraining("mlp", 2, "interleaved", 2);
  checkTraining("mlp", 2, "interleaved", 3);
  checkTraining("gpt", 2, "interleaved", 4);
  checkTraining("gpt", 4, "interleaved", 4);
  checkTraining("gpt", 4, "interleaved", 6);
}

TEST_CASE("stages whose links go through the process group train as through shared memory: shared memory off "
          "on every stage or on one, and rings too small for the step's messages") {
  const ExtraEnv off = [](int) { return std::vector<std::string>{"WEFT_PIPELINE_SHM=0"}; };
  checkTraining("mlp", 2, "1f1b", 4, 1, Links::Group, off);
  checkTraining("mlp", 2, "interleaved", 4, 1, Links::Group, off);
  checkTraining("gpt", 2, "1f1b", 3, 1, Links::Group, off);
  checkTraining("mlp", 4, "1f1b", 4, 2, Links::Group, off);  // dp x pp
  // One stage without shared memory: both its links go through the group, and they are all there are.
  checkTraining("mlp", 3, "gpipe", 2, 1, Links::Group,
                [](int r) { return r == 1 ? std::vector<std::string>{"WEFT_PIPELINE_SHM=0"} : std::vector<std::string>{}; });
  // Rings of 64 bytes cannot hold a step's messages (2 rows of 24, 16 or 16 floats each): the
  // rings carry the shapes, the group the data; so too when only one side's ring is that small.
  checkTraining("mlp", 2, "1f1b", 4, 1, Links::Group,
                [](int) { return std::vector<std::string>{"PIPELINE_WORKER_RING_BYTES=64"}; });
  checkTraining("mlp", 2, "interleaved", 4, 1, Links::Group, [](int r) {
    return r == 0 ? std::vector<std::string>{"PIPELINE_WORKER_RING_BYTES=64"} : std::vector<std::string>{};
  });
}

TEST_CASE("GPipe with activation checkpointing equals the single-process step and holds less activation "
          "memory on every stage") {
  auto plain = checkTraining("gpt", 2, "gpipe", 4);
  auto ckpt = checkTraining("gpt", 2, "gpipe-ckpt", 4);
  for (int r = 0; r < 2; ++r) {
    const std::string line = "step 2 ";
    const long long plainBytes =
        numberAfter(restOfLine(plain[static_cast<size_t>(r)].out, rankPrefix(r) + line), "act_bytes ");
    const long long ckptBytes =
        numberAfter(restOfLine(ckpt[static_cast<size_t>(r)].out, rankPrefix(r) + line), "act_bytes ");
    CAPTURE(plainBytes);
    CAPTURE(ckptBytes);
    CHECK(ckptBytes > 0);
    // Each micro-batch keeps only its stage's input and output: a few blocks' worth less.
    CHECK(ckptBytes * 2 < plainBytes);
  }
}

TEST_CASE("dp x pp: 2 replicas of a 2-stage pipeline on 4 processes, each on half the batch, equal the "
          "single-process step on the whole batch: 1F1B, GPipe and interleaved 1F1B") {
  checkTraining("mlp", 4, "1f1b", 3, 2);
  checkTraining("gpt", 4, "gpipe", 2, 2);
  checkTraining("gpt", 4, "interleaved", 2, 2);
}

// The tiny GPT as a 2-stage pipeline of tensor-parallel stages on the mesh {pp: 2, tp: 2} (rank 2s + t
// is tp rank t of stage s) under `schedule` with `m` micro-batches: every rank's loss, gradients and,
// after three steps, parameters equal its shards of the single-process model's.
void checkTensorParallelStages(const std::string& schedule, int m) {
  CAPTURE(schedule);
  auto results = runJob({"gpttp", schedule, std::to_string(m)}, 4, 40s);
  REQUIRE(allClean(results));
  const int chunks = schedule == "interleaved" ? 2 : 1;
  long long params = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const int stage = rank / 2;
    const std::string& out = results[static_cast<size_t>(rank)].out;
    const std::string prefix = rankPrefix(rank);
    INFO(out);
    for (int step = 0; step < 3; ++step) {
      const std::string line = restOfLine(out, prefix + "step " + std::to_string(step) + " ");
      REQUIRE(!line.empty());
      CHECK(field(line, "grad_maxdiff_ppb") >= 0);
      CHECK(field(line, "grad_maxdiff_ppb") <= 20000);
      if (stage == 1) {
        CHECK(field(line, "loss_diff_ppb") >= 0);
        CHECK(field(line, "loss_diff_ppb") <= 20000);
      } else {
        CHECK(field(line, "loss_diff_ppb") == -1);
      }
      CHECK(field(line, "forwards") == chunks * m);
      CHECK(field(line, "backwards") == chunks * m);
      CHECK(field(line, "ordered") == 1);
      if (step == 0 && rank % 2 == 0) params += field(line, "params");
    }
    const long long final = numberAfter(out, prefix + "final param_maxdiff_ppb ");
    CHECK(final >= 0);
    CHECK(final <= 50000);
  }
  // Tp rank 0's shards over both stages: wte (V/2 rows) on the first and the last stage, wpe, ln_f,
  // and per block 12·C²/2 matrix elements, the split biases (3C + 4C)/2 and 6C whole (the layer
  // norms and the row-parallel biases).
  const long long v = 32, c = 16, t = 8, l = chunks > 1 ? 6 : 3;
  CHECK(params == 2 * (v / 2) * c + t * c + l * (12 * c * c / 2 + 7 * c / 2 + 6 * c) + 2 * c);
}

TEST_CASE("pp x tp: a 2-stage pipeline of tensor-parallel GPT stages on 4 processes, wte's shards tied across the "
          "ends, equals the single-process step: 1F1B, GPipe with checkpointing and interleaved 1F1B") {
  checkTensorParallelStages("1f1b", 4);
  checkTensorParallelStages("gpipe-ckpt", 3);
  checkTensorParallelStages("interleaved", 4);
}

TEST_CASE("a stage dying mid-step gives the other stages a DisconnectedError naming it within the group timeout") {
  // Its neighbours wait on shared memory, or with WEFT_PIPELINE_SHM=0 on the group's transfers.
  for (const bool shared : {true, false}) {
    CAPTURE(shared);
    auto results = runJob({"die"}, 3, 30s, [shared](int) {
      return shared ? std::vector<std::string>{} : std::vector<std::string>{"WEFT_PIPELINE_SHM=0"};
    });
    INFO(weft::testing::resultsText(results));
    CHECK(results[1].exitCode == 3);
    CHECK(contains(results[1].out, "rank 1 dying"));
    for (int r : {0, 2}) {
      const std::string& out = results[static_cast<size_t>(r)].out;
      CHECK(results[static_cast<size_t>(r)].exitCode == 0);
      CHECK(contains(out, rankPrefix(r) + "first step done"));
      const std::string line = restOfLine(out, rankPrefix(r) + "failed in_ms ");
      REQUIRE(!line.empty());
      const long long ms = numberAfter(out, rankPrefix(r) + "failed in_ms ");
      CHECK(ms >= 0);
      CHECK(ms < 4000 + 3000);  // the 4 s group timeout, plus margin for a loaded machine
      // A ring's reader sees the writer's process end (pidfd), not the timeout.
      if (shared) CHECK(ms < 3000);
      CHECK(contains(line, "DisconnectedError: pipeline stage " + std::to_string(r) + ": receiving the "));
      CHECK(contains(line, "from stage 1"));
      CHECK(contains(line, "the connection to rank 1 was lost"));
      // The executor refuses to go on after a failed step.
      CHECK(contains(out, rankPrefix(r) + "again StateError: PipelineExecutor::step: stage " + std::to_string(r) +
                              ": an earlier step failed"));
      CHECK(contains(out, rankPrefix(r) + "done"));
    }
  }
}
