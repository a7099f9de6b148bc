// The ZeRO wrappers across real processes on 127.0.0.1 (tests/collectives/zero_helpers/zero_worker.cpp,
// one process per rank, Gloo): a tiny GPT trained 5 AdamW steps under DDP with the plain optimizer,
// DDP with ZeroRedundancyOptimizer (ZeRO-1) and ShardedDataParallel (ZeRO-2), on 2, 3 and 4 ranks.
// Final parameters against DDP's; the bytes each rank holds after training (Storage::memoryStats)
// against the accounting for float32 AdamW, Ψ parameters and N ranks, beyond the parameters:
//   DDP     16Ψ      .grad 4Ψ, DDP's bucket buffers 4Ψ, exp_avg + exp_avg_sq 8Ψ
//   ZeRO-1  8Ψ + 8Ψ/N (the state of the rank's shard)
//   ZeRO-2  12Ψ/N    gradient shard 4Ψ/N + state 8Ψ/N, plus ≤ N−1 padding elements per bucket
// each within 10%. Every wait is bounded and every process is checked to be gone at the end.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "captured_text.h"
#include "collectives/zero_helpers/tiny_gpt_job.h"
#include "mp_job.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::allClean;
using weft::testing::MpJob;
using weft::testing::rankField;
using weft::testing::numberAfter;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;

namespace {

void checkWorld(int world) {
  MpJob job({ZERO_WORKER_PATH, "gpt"}, world, [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(60s);
  job.checkAllGone();
  REQUIRE(allClean(results));
  const double n = world;
  for (int r = 0; r < world; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO("rank " << r << "\n" << out);
    const double psi = static_cast<double>(numberAfter(out, rankPrefix(r) + "numel "));
    REQUIRE(psi == weft::testing::zero::kTinyGptParameters);
    const double ddp = static_cast<double>(rankField(out, r, "mem", "held"));
    const double zero1 = static_cast<double>(rankField(out, r, "mem zero1", "held"));
    const double zero2 = static_cast<double>(rankField(out, r, "mem zero2", "held"));
    MESSAGE("N=" << world << " rank " << r << " held beyond the parameters: ddp " << ddp << " (" << ddp / psi
                 << " B/param), zero1 " << zero1 << " (" << zero1 / psi << "), zero2 " << zero2 << " ("
                 << zero2 / psi << ")");
    CHECK(rankField(out, r, "mem", "state") == static_cast<long long>(8 * psi));
    CHECK(ddp == doctest::Approx(16 * psi).epsilon(0.10));
    CHECK(zero1 == doctest::Approx(8 * psi + 8 * psi / n).epsilon(0.10));
    CHECK(zero2 == doctest::Approx(12 * psi / n).epsilon(0.10));
    CHECK(static_cast<double>(rankField(out, r, "mem zero1", "state")) == doctest::Approx(8 * psi / n).epsilon(0.10));
    CHECK(static_cast<double>(rankField(out, r, "mem zero2", "state")) == doctest::Approx(8 * psi / n).epsilon(0.01));
    CHECK(static_cast<double>(rankField(out, r, "mem zero2", "grads")) == doctest::Approx(4 * psi / n).epsilon(0.01));
    // ZeRO-1: the same per-parameter arithmetic on the same gradients as DDP + AdamW.
    CHECK(rankField(out, r, "eq zero1", "bitwise") == 1);
    // ZeRO-2: to the bit on 2 ranks. On more, its reduce-scatter adds the ranks' values in another
    // order than DDP's allreduce: the averaged gradients agree to a few float32 roundings of the
    // largest gradient. Adam then divides each element by its own gradient scale, so where the
    // ranks' gradients nearly cancel a rounding difference becomes a step difference of order lr:
    // the parameters after 5 steps agree to 1e-5 of the largest parameter.
    const long long grad1 = rankField(out, r, "grad1 zero2", "maxdiff_ppb");
    CHECK(grad1 >= 0);
    CHECK(grad1 <= 1000);
    CHECK(rankField(out, r, "eq zero2", "maxdiff_ppb") <= 10000);
    if (world == 2) {
      CHECK(rankField(out, r, "grad1 zero2", "bitwise") == 1);
      CHECK(rankField(out, r, "eq zero2", "bitwise") == 1);
    }
  }
}

}  // namespace

TEST_SUITE_BEGIN("zero");

TEST_CASE("zero on 2 processes: ZeRO-1 and ZeRO-2 train the GPT as DDP does and hold the bytes the formulas say") {
  checkWorld(2);
}

TEST_CASE("zero on 3 processes: ZeRO-1 and ZeRO-2 train the GPT as DDP does and hold the bytes the formulas say") {
  checkWorld(3);
}

TEST_CASE("zero on 4 processes: ZeRO-1 and ZeRO-2 train the GPT as DDP does and hold the bytes the formulas say") {
  checkWorld(4);
}

TEST_CASE("a rank that dies in the middle of a ZeRO-1 or ZeRO-2 step fails the other's step or backward with "
          "DisconnectedError, well within the group timeout") {
  for (const char* scenario : {"kill1", "kill2"}) {
    INFO(scenario);
    MpJob job({ZERO_WORKER_PATH, scenario}, 2, [](int) { return weft::testing::fastFailureSettings(4); });
    auto results = job.finish(40s);
    job.checkAllGone();
    const std::string& out = results[0].out;
    INFO(out);
    CHECK(results[0].exitCode == 0);
    CHECK(results[1].exitCode == 3);
    const long long ms = numberAfter(out, "rank 0 failed in_ms ");
    CHECK(ms >= 0);
    CHECK(ms < 10000);  // the group timeout is 20 s: the lost connection was noticed, not waited out
    const std::string line = restOfLine(out, "rank 0 failed in_ms ");
    CHECK(contains(line, "DisconnectedError: "));
    if (std::string(scenario) == "kill1") {
      CHECK(contains(line, "ZeroRedundancyOptimizer::step: broadcasting the parameters updated by rank"));
    } else {
      CHECK(contains(line, "ShardedDataParallel: backward pass #2: the reduce-scatter of bucket 0"));
    }
  }
}

TEST_SUITE_END();
