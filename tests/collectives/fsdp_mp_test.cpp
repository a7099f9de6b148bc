// FullyShardedDataParallel across real processes on 127.0.0.1 (tests/collectives/zero_helpers/
// fsdp_worker.cpp, one process per rank, Gloo): a tiny GPT trained 10 AdamW steps under DDP with the
// plain optimizer and under FSDP (ZeRO-3) with AdamW over the shards, on 2, 3 and 4 ranks. Final
// parameters (FSDP's full state dict) against DDP's; the bytes each rank holds after training
// (Storage::memoryStats, counted from before the model was built) against ZeRO-3's 16Ψ/N for
// float32 AdamW (shards 4Ψ/N, gradients 4Ψ/N, state 8Ψ/N), plus the padding (16 bytes per padding
// element); a rank killed mid-step. Every wait is bounded and every process is checked to be gone.
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
  MpJob job({FSDP_WORKER_PATH, "gpt"}, world, [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(90s);
  job.checkAllGone();
  REQUIRE(allClean(results));
  const double n = world;
  for (int r = 0; r < world; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO("rank " << r << "\n" << out);
    const double psi = static_cast<double>(numberAfter(out, rankPrefix(r) + "numel "));
    REQUIRE(psi == weft::testing::zero::kTinyGptParameters);
    const double held = static_cast<double>(rankField(out, r, "mem fsdp", "held"));
    const double padding = static_cast<double>(rankField(out, r, "mem fsdp", "padding"));
    MESSAGE("N=" << world << " rank " << r << " held " << held << " (" << held / psi << " B/param; 16/N = " << 16 / n
                 << "), padding elements " << padding);
    CHECK(padding >= 0);
    CHECK(padding <= 3 * (n - 1));  // 3 units
    const double shards = 4 * (psi + padding) / n;
    CHECK(static_cast<double>(rankField(out, r, "mem fsdp", "shards")) == shards);
    CHECK(static_cast<double>(rankField(out, r, "mem fsdp", "grads")) == shards);
    CHECK(static_cast<double>(rankField(out, r, "mem fsdp", "state")) == 2 * shards);
    CHECK(held == doctest::Approx(16 * psi / n + 16 * padding / n).epsilon(0.10));
  }
  // Two ranks: the reduce-scatter adds the two values as DDP's allreduce does, and AdamW over a
  // flat shard is AdamW element by element: the same bits. More ranks add in another order (see
  // zero_mp_test.cpp): within 1e-5 of the largest parameter.
  const std::string& out = results[0].out;
  CHECK(rankField(out, 0, "eq fsdp", "maxdiff_ppb") >= 0);
  CHECK(rankField(out, 0, "eq fsdp", "maxdiff_ppb") <= 10000);
  if (world == 2) CHECK(rankField(out, 0, "eq fsdp", "bitwise") == 1);
}

}  // namespace

TEST_SUITE_BEGIN("fsdp");

TEST_CASE("fsdp on 2 processes: ZeRO-3 trains the GPT as DDP does and holds 16 bytes per parameter / N") {
  checkWorld(2);
}

TEST_CASE("fsdp on 3 processes: ZeRO-3 trains the GPT as DDP does and holds 16 bytes per parameter / N") {
  checkWorld(3);
}

TEST_CASE("fsdp on 4 processes: ZeRO-3 trains the GPT as DDP does and holds 16 bytes per parameter / N") {
  checkWorld(4);
}

TEST_CASE("a rank that dies in the middle of an FSDP step fails the other's backward with DisconnectedError, "
          "well within the group timeout") {
  MpJob job({FSDP_WORKER_PATH, "kill"}, 2, [](int) { return weft::testing::fastFailureSettings(4); });
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
  CHECK(contains(line, "DisconnectedError: FullyShardedDataParallel: "));
}

TEST_SUITE_END();
