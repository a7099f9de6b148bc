// The allreduce algorithms, reduceScatter and allGatherInto of the gloo backend across real
// processes on 127.0.0.1 (tests/collectives/helpers/algorithms_worker.cpp, one process per rank):
// every algorithm against a rank-order reduction on 2, 3 and 4 ranks for every reducible dtype
// and op (integers exactly, naive and parallel to the bit, the rest within the reduction-order
// tolerance, every result the same bits on every rank) and the traffic the group counts for
// each; reduceScatter of even and uneven shards (one empty) to the bit of the ring's order, and
// the bytes it moves; allGatherInto of every dtype; bad arguments and mismatched calls; a rank
// killed during a reduceScatter. Every wait is bounded and every process is checked to be gone.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "captured_text.h"
#include "mp_job.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::MpJob;
using weft::testing::numberAfter;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;
using weft::testing::Subprocess;

namespace {

MpJob workerJob(const std::string& scenario, int world) {
  return MpJob({ALGORITHMS_WORKER_PATH, scenario}, world,
               [](int) { return std::vector<std::string>{"WEFT_STORE_TIMEOUT=20"}; });
}

std::vector<Subprocess::Result> finish(MpJob& job, std::chrono::milliseconds timeout) {
  auto results = job.finish(timeout);
  job.checkAllGone();
  return results;
}

void checkClean(const Subprocess::Result& res, int rank) {
  INFO("rank " << rank << " exit " << res.exitCode << " signal " << res.signal << "\nstdout:\n"
                << res.out << "\nstderr:\n" << res.err);
  CHECK_FALSE(res.timedOut);
  CHECK(res.exitCode == 0);
  CHECK(contains(res.out, rankPrefix(rank) + "done\n"));
}

// "traffic <algorithm> sent S received R messages M" of one rank.
long long trafficSent(const std::string& out, int rank, const std::string& algorithm) {
  return numberAfter(out, rankPrefix(rank) + "traffic " + algorithm + " sent ");
}

void runAlgorithms(int world) {
  MpJob job = workerJob("algorithms", world);
  auto results = finish(job, 240s);
  // 3 float dtypes x 5 ops + 3 integer dtypes x 4 ops, 4 sizes, 7 algorithms.
  const long long cases = (3 * 5 + 3 * 4) * 4 * 7;
  const long long bytes = 65536 * 4;  // the traffic case: 64 Ki float32
  for (int r = 0; r < world; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    CHECK(numberAfter(res.out, p + "checked ") == cases);
    CHECK(numberAfter(res.out, p + "same_everywhere ") == cases);
    CHECK(numberAfter(res.out, p + "half_checked ") == 2 * 7);
    MESSAGE("world " << world << " rank " << r << ": " << restOfLine(res.out, p + "checked "));
    // Counted by the group: ring about 2(N-1)/N of the tensor, parallel (N-1) times it, naive
    // (N-1) times it at rank 0 and once elsewhere; each plus call headers (< 1 KiB).
    const long long ring = trafficSent(res.out, r, "ring");
    CHECK(ring >= 2 * (world - 1) * bytes / world);
    CHECK(ring <= 2 * (world - 1) * bytes / world + 1024);
    const long long parallel = trafficSent(res.out, r, "parallel");
    CHECK(parallel >= (world - 1) * bytes);
    CHECK(parallel <= (world - 1) * bytes + 1024);
    const long long naive = trafficSent(res.out, r, "naive");
    const long long naiveWant = r == 0 ? (world - 1) * bytes : bytes;
    CHECK(naive >= naiveWant);
    CHECK(naive <= naiveWant + 1024);
  }
}

void runReduceScatter(int world) {
  MpJob job = workerJob("reduce_scatter", world);
  auto results = finish(job, 120s);
  for (int r = 0; r < world; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    // 3 float dtypes x 5 ops + 3 integer dtypes x 4 ops, even and uneven shards.
    CHECK(numberAfter(res.out, p + "rs_checked ") == (3 * 5 + 3 * 4) * 2);
    CHECK(numberAfter(res.out, p + "ag_checked ") == 8 * 3);
    const std::string line = restOfLine(res.out, p + "rs_traffic ");
    INFO(line);
    // Each rank sends every shard but its own and receives every shard but its left
    // neighbour's (the expected figures the worker prints are those sums plus the call headers).
    CHECK(numberAfter(line, "sent ") == numberAfter(line, "expected "));
    const std::string received = restOfLine(line, "received ");
    CHECK(numberAfter(line, "received ") == numberAfter(received, "expected "));
  }
}

}  // namespace

TEST_CASE("every allreduce algorithm gives the rank-order result on 2 processes, and moves the bytes it should") {
  runAlgorithms(2);
}
TEST_CASE("every allreduce algorithm gives the rank-order result on 3 processes, and moves the bytes it should") {
  runAlgorithms(3);
}
TEST_CASE("every allreduce algorithm gives the rank-order result on 4 processes, and moves the bytes it should") {
  runAlgorithms(4);
}

TEST_CASE("reduceScatter of even and uneven shards and allGatherInto of every dtype are exact on 2 processes, "
          "and reduceScatter sends each rank's shards once") {
  runReduceScatter(2);
}
TEST_CASE("reduceScatter of even and uneven shards and allGatherInto of every dtype are exact on 3 processes, "
          "and reduceScatter sends each rank's shards once") {
  runReduceScatter(3);
}
TEST_CASE("reduceScatter of even and uneven shards and allGatherInto of every dtype are exact on 4 processes, "
          "and reduceScatter sends each rank's shards once") {
  runReduceScatter(4);
}

TEST_CASE("bad arguments to reduceScatter and allGatherInto, mismatched algorithms or shard sizes and an unknown "
          "algorithm in WEFT_ALLREDUCE_ALGORITHM give InvalidArgumentError naming the problem") {
  MpJob job = workerJob("bad_args", 2);
  auto results = finish(job, 60s);
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    auto line = [&](const std::string& name) { return restOfLine(res.out, p + name + " "); };
    CHECK(contains(line("rs_output_size"), "InvalidArgumentError: reduceScatter: the output (shape [5], 5 elements) "
                                           "must hold this rank's shard"));
    CHECK(contains(line("rs_dtype"), "InvalidArgumentError: reduceScatter: inputs[1] is float64, the output float32"));
    CHECK(contains(line("rs_count"), "InvalidArgumentError: reduceScatter: expected 2 inputs"));
    CHECK(contains(line("ag_output_size"), "InvalidArgumentError: allGatherInto: output (float32, shape [9]) must hold 2 x 4"));
    CHECK(contains(line("ag_dtype"), "InvalidArgumentError: allGatherInto: output (float64"));
    CHECK(contains(line("unknown_name"), "InvalidArgumentError: test: unknown allreduce algorithm 'ringg' (known: auto, "
                                         "ring, ring-chunked, halving-doubling, bcube, naive, parallel)"));
    const std::string algo = line("algorithm_mismatch");
    CHECK(contains(algo, "InvalidArgumentError: allReduce #0 on group 'default': the ranks' calls do not match"));
    CHECK(contains(algo, "rank 0 called allReduce #0(float32, 1000 elements, op sum, algorithm ring)"));
    CHECK(contains(algo, "rank 1 called allReduce #0(float32, 1000 elements, op sum, algorithm naive)"));
    CHECK(contains(res.out, p + "after algorithm_mismatch ok\n"));
    const std::string split = line("split_mismatch");
    CHECK(contains(split, "InvalidArgumentError: reduceScatter #2 on group 'default': the ranks' calls do not match"));
    CHECK(contains(split, "shard sizes #"));
    CHECK(contains(res.out, p + "after split_mismatch ok\n"));
    CHECK(contains(line("env_unknown"), "InvalidArgumentError: ProcessGroupGloo: WEFT_ALLREDUCE_ALGORITHM: unknown "
                                        "allreduce algorithm 'halving_doubling'"));
    // WEFT_ALLREDUCE_ALGORITHM=naive: the group runs naive (rank 0 sends the sum back to rank 1:
    // 4000 bytes plus the call header; rank 1 sends its tensor).
    const std::string env = line("env_naive");
    CHECK(contains(env, "algorithm naive sum 2.000000"));
    CHECK(numberAfter(env, "sent ") == 4000 + 80);
  }
}

TEST_CASE("a rank killed with SIGKILL during a reduceScatter makes the others' fail with DisconnectedError naming "
          "it, well within the group timeout") {
  MpJob job = workerJob("kill", 3);
  auto results = finish(job, 60s);
  CHECK(results[2].signal == 9);
  CHECK(contains(results[2].out, "rank 2 dying"));
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    checkClean(res, r);
    const std::string p = rankPrefix(r);
    const long long ms = numberAfter(res.out, p + "failed in_ms ");
    CHECK(ms >= 0);
    CHECK(ms < 8000);  // the group timeout is 10 s
    const std::string line = restOfLine(res.out, p + "failed in_ms ");
    INFO(line);
    CHECK(contains(line, "DisconnectedError: reduceScatter #1 on group 'default'"));
    CHECK(contains(line, "the connection to rank 2 was lost"));
  }
}
