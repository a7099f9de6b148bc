// Pipe over RPC across real processes on 127.0.0.1 (tests/pipeline/helpers/pipe_worker.cpp): a
// controller drives 2 and 3 remote stages with micro-batches (the last one smaller), backward runs
// through distributed autograd and a DistributedOptimizer steps the stages' parameters; loss and
// parameters after three steps equal a local twin's. No reference, context or optimizer state is
// left, every worker shuts down gracefully and every process is gone. A stage dying mid-step fails
// the controller's step with a DisconnectedError naming its worker.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "captured_text.h"
#include "mp_job.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::MpJob;
using weft::testing::numberAfter;
using weft::testing::rankPrefix;

namespace {

void checkPipe(int stages, int m) {
  const int world = stages + 1;
  MpJob job({PIPE_WORKER_PATH, "train", std::to_string(m)}, world,
            [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(40s);
  job.checkAllGone();
  INFO(weft::testing::resultsText(results));
  for (int r = 0; r < world; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    REQUIRE(!res.timedOut);
    CHECK(res.exitCode == 0);
    CHECK(contains(res.out, rankPrefix(r) + "state_empty 1 "));
    CHECK(contains(res.out, rankPrefix(r) + "shutdown graceful 1 missing - "));
    CHECK(contains(res.out, rankPrefix(r) + "done\n"));
  }
  const std::string& out = results[0].out;
  for (int step = 0; step < 3; ++step) {
    const std::string p = rankPrefix(0) + "step " + std::to_string(step) + " loss_diff_ppb ";
    const long long loss = numberAfter(out, p);
    CHECK(loss >= 0);
    CHECK(loss <= 20000);
    const long long params = numberAfter(out, rankPrefix(0) + "step " + std::to_string(step) + " loss_diff_ppb " +
                                                  std::to_string(loss) + " param_maxdiff_ppb ");
    CHECK(params >= 0);
    CHECK(params <= 20000);
  }
}

}  // namespace

TEST_SUITE_BEGIN("pipe");

TEST_CASE("a Pipe of 2 remote stages with 3 micro-batches trains as the local model does") { checkPipe(2, 3); }

TEST_CASE("a Pipe of 3 remote stages with 4 micro-batches trains as the local model does") { checkPipe(3, 4); }

TEST_CASE("a Pipe stage dying mid-step fails the controller's step with a DisconnectedError naming it") {
  MpJob job({PIPE_WORKER_PATH, "die", "2"}, 3, [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(40s);
  job.checkAllGone();
  INFO(weft::testing::resultsText(results));
  CHECK(results[1].exitCode == 3);
  CHECK(contains(results[1].out, "rank 1 dying"));
  const std::string& out = results[0].out;
  CHECK(contains(out, "rank 0 step 0 done"));
  const std::string line = weft::testing::restOfLine(out, "rank 0 failed in_ms ");
  REQUIRE(!line.empty());
  const long long ms = numberAfter(out, "rank 0 failed in_ms ");
  CHECK(ms >= 0);
  CHECK(ms < 5000);  // a closed connection is seen at once; margin for a loaded machine
  // Worded by whichever side saw the connection close first: the controller's call to worker1
  // ("rpc: ... worker 'worker1'"), or worker2 fetching worker1's activation through its RRef
  // ("... its owner (rank 1) is gone"); either names the dead stage.
  CHECK(contains(line, "DisconnectedError: "));
  CHECK((contains(line, "worker 'worker1'") || contains(line, "rank 1")));
  for (int r : {0, 2}) {
    CHECK(results[static_cast<size_t>(r)].exitCode == 0);
    CHECK(contains(results[static_cast<size_t>(r)].out, rankPrefix(r) + "done\n"));
  }
}
