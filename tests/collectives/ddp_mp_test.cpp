// DistributedDataParallel across real processes on 127.0.0.1 (tests/collectives/ddp_helpers/ddp_worker.cpp,
// one process per rank, Gloo): gradients equal the average of the ranks' local gradients, buckets
// launched during backward and in order, replicas bit-identical after many SGD steps on different
// data, noSync accumulation, findUnusedParameters, the bucket rebuild in rank 0's gradient order and
// rank 0's buffers at each forward, a rank running one pass more than the other
// (a timeout naming the allreduce and the rank, not a hang), DDP inside a distributed autograd
// context (gradients in the context, .grad untouched) and DDP over checkpointed segments. Every
// wait is bounded and every process is checked to be gone at the end.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "mp_job.h"
#include "captured_text.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::allClean;
using weft::testing::MpJob;
using weft::testing::rankField;
using weft::testing::numberAfter;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;

namespace {


// Exit status 0 and "rank R done"; dumps every rank's output otherwise.
// Every rank's result of ddp_worker playing `scenario` on `world` ranks, once all have ended
// cleanly (REQUIREd) within `timeout`; CHECKs that every process is gone.
std::vector<weft::testing::Subprocess::Result> runDdpJob(const std::string& scenario, int world,
                                                         std::chrono::milliseconds timeout) {
  MpJob job({DDP_WORKER_PATH, scenario}, world, [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(timeout);
  job.checkAllGone();
  REQUIRE(allClean(results));
  return results;
}

// The number after `key` among the "key value" pairs of rank `rank`'s line that starts with `first`
// ("rank R <first> v <key> v ..."); -1 when absent.
}  // namespace

TEST_SUITE_BEGIN("ddp");

TEST_CASE("ddp on 3 processes: averaged gradients, overlapping buckets, bit-identical replicas, noSync, "
          "findUnusedParameters") {
  constexpr int kWorld = 3;
  auto results = runDdpJob("train", kWorld, 25s);
  std::string hash0;
  for (int r = 0; r < kWorld; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    const std::string p = rankPrefix(r);
    INFO(out);
    // Against the average of the ranks' gradients computed separately, to 1e-6.
    CHECK(rankField(out, r, "grad_maxdiff_ppb", "grad_maxdiff_ppb") <= 1000);
    // 12 parameters (6 layers x weight, bias) in buckets of 1088 B (one layer): 6 buckets, the first
    // launched after 2 gradients of 12, before backward reached the input, in bucket order.
    CHECK(rankField(out, r, "overlap", "buckets") == 6);
    CHECK(rankField(out, r, "overlap", "first_launch_hooks") == 2);
    CHECK(rankField(out, r, "overlap", "params") == 12);
    CHECK(rankField(out, r, "overlap", "first_before_last_hook") == 1);
    CHECK(rankField(out, r, "overlap", "in_order") == 1);
    CHECK(rankField(out, r, "overlap", "launches") == 6);
    CHECK(rankField(out, r, "overlap", "first_before_input_grad") == 1);
    // Trained on different data, yet identical to the bit.
    std::string line = restOfLine(out, p + "params_hash ");
    CHECK(contains(line, " moved 1"));
    std::string hash = line.substr(0, line.find(' '));
    if (r == 0) hash0 = hash;
    CHECK(hash == hash0);
    // Two microbatches under noSync and a synced one: the averaged sum, no communication meanwhile.
    CHECK(rankField(out, r, "nosync_maxdiff_ppb", "nosync_maxdiff_ppb") <= 1000);
    CHECK(rankField(out, r, "nosync_maxdiff_ppb", "nosync_collectives") == 0);
    CHECK(rankField(out, r, "nosync_maxdiff_ppb", "grad_untouched") == 1);
    // Only rank 0 uses the extra layer: its 2 parameters are reduced as zeros on the others.
    CHECK(rankField(out, r, "unused_maxdiff_ppb", "unused_maxdiff_ppb") <= 1000);
    CHECK(rankField(out, r, "unused_maxdiff_ppb", "unused_count") == (r == 0 ? 0 : 2));
  }
}

TEST_CASE("ddp on 3 processes: after the first pass the buckets follow rank 0's gradient order, gradients stay "
          "the average, replicas stay bit-identical and each forward gives every rank rank 0's buffer") {
  constexpr int kWorld = 3;
  auto results = runDdpJob("rebuild", kWorld, 25s);
  std::string hash0;
  for (int r = 0; r < kWorld; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    const std::string p = rankPrefix(r);
    INFO(out);
    // Parameters: l3.weight, l3.bias (0, 1), l2 (2, 3), l1 (4, 5), l0 (6, 7); backward reaches l3 first.
    std::string line = restOfLine(out, p + "rebuild ");
    CHECK(contains(line, "before 6,7|4,5|2,3|0,1 after 0,1|2,3|4,5|6,7 "));
    CHECK(rankField(out, r, "rebuild", "first_launch_hooks") == 8);  // l0's bucket waited for the last gradient
    CHECK(rankField(out, r, "rebuild", "then") == 2);                // now l3's, the first to arrive
    CHECK(rankField(out, r, "rebuild", "rebuilds") == 1);
    CHECK(rankField(out, r, "rebuild_grad_maxdiff_ppb", "rebuild_grad_maxdiff_ppb") <= 1000);
    CHECK(contains(out, p + "buffer_after_forward 2.000000\n"));
    std::string hash = restOfLine(out, p + "rebuild_hash ");
    if (r == 0) hash0 = hash;
    CHECK(!hash.empty());
    CHECK(hash == hash0);
  }
}

TEST_CASE("a rank running one synced pass more than the other fails after the group timeout naming "
          "the allreduce and the missing rank") {
  auto results = runDdpJob("mismatch", 2, 20s);
  const std::string& out = results[0].out;
  INFO(out);
  long long ms = numberAfter(out, "rank 0 failed in_ms ");
  CHECK(ms >= 1400);        // the 1.5 s group timeout
  CHECK(ms < 1500 + 3000);  // plus the bounded diagnosis
  std::string line = restOfLine(out, "rank 0 failed in_ms ");
  CHECK(contains(line, "TimeoutError: DistributedDataParallel: synced backward pass #3: the allreduce of bucket 0"));
  CHECK(contains(line, "every rank must run the same number of synced backward passes"));
  // #0 construction, #1 pass 1, #2 the bucket rebuild, #3 pass 2, #4 rank 0's pass 3.
  CHECK(contains(line, "allReduce #4 on group 'default'"));
  CHECK(contains(line, "ranks [1] had not started it when last heard"));
  CHECK_FALSE(contains(results[1].out, "rank 1 failed"));
}

TEST_CASE("ddp inside a distributed autograd context: averaged gradients land in the context, .grad untouched") {
  auto results = runDdpJob("context", 2, 25s);
  for (int r = 0; r < 2; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    const std::string p = rankPrefix(r);
    INFO(out);
    long long diff = rankField(out, r, "ctx_maxdiff_ppb", "ctx_maxdiff_ppb");
    CHECK(diff >= 0);
    CHECK(diff <= 1000);
    CHECK(rankField(out, r, "ctx_maxdiff_ppb", "dotgrad") == 0);
    CHECK(rankField(out, r, "ctx_maxdiff_ppb", "input_grad") == 1);
    CHECK(rankField(out, r, "local_after_ctx_maxdiff_ppb", "local_after_ctx_maxdiff_ppb") <= 1000);
    CHECK(contains(out, p + "shutdown graceful 1"));
  }
}

TEST_CASE("ddp over checkpointed segments with dropout: DDP's hooks fire for every parameter and the gradients "
          "equal those of DDP without checkpointing bit for bit") {
  auto results = runDdpJob("checkpoint", 2, 25s);
  for (int r = 0; r < 2; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    long long diff = rankField(out, r, "ckpt_maxdiff_ppb", "ckpt_maxdiff_ppb");
    CHECK(diff >= 0);
    CHECK(diff <= 1000);
    CHECK(rankField(out, r, "ckpt_maxdiff_ppb", "ckpt_bitwise") == 1);
    // 8 parameters (4 layers x weight, bias) in 4 buckets of one layer.
    CHECK(rankField(out, r, "ckpt_hooks", "ckpt_hooks") == 8);
    CHECK(rankField(out, r, "ckpt_hooks", "launches") == 4);
  }
}

TEST_SUITE_END();
