// The chaos suite: each example app and a DDP job over Gloo, run many short times with one rank
// killed (SIGKILL), stopped (SIGSTOP past the heartbeat window, then SIGCONT) or cut off (its TCP
// connections shut down from outside) at a random moment. Every process must end without a crash
// and within the fault's bound, each survivor with a typed error naming the peer it lost (or the
// job finished), and nothing may be left behind. tests/chaos/chaos.h has the rules.
//
//   ctest --test-dir build -L chaos                              # 3 runs per test (CI)
//   WEFT_CHAOS_RUNS=200 ctest --test-dir build -L chaos           # long
//   WEFT_CHAOS_SEED=123456 WEFT_CHAOS_RUNS=7 ./build/tests/test_chaos_chaos -tc='*rnn*'   # replay
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "chaos/chaos.h"

using namespace weft::testing::chaos;

namespace {

std::string rankName(int r) { return "rank " + std::to_string(r); }

}  // namespace

TEST_SUITE_BEGIN("chaos");

TEST_CASE("parameter_server survivors fail naming the lost peer, or finish") {
  Scenario s;
  s.label = "parameter_server";
  s.argv = {WEFT_PARAMETER_SERVER, "--max-batches", "30", "--log-interval", "1000"};
  s.world = 3;
  s.nameOf = [](int r) { return r == 0 ? std::string("parameter_server") : "trainer_" + std::to_string(r); };
  s.faultWindow = 3.0;
  runMany(s);
}

TEST_CASE("ddp_rpc survivors fail naming the lost peer, or finish") {
  Scenario s;
  s.label = "ddp_rpc";
  // A trainer stalled inside the DDP allreduce fails the other at the group timeout, within the
  // bounds (one that dies or is cut off fails it at once).
  s.argv = {WEFT_DDP_RPC, "--batches", "20", "--log-interval", "1000", "--timeout", "10"};
  s.world = 4;
  s.nameOf = [](int r) {
    static const char* names[] = {"trainer0", "trainer1", "master", "ps"};
    return std::string(names[r]);
  };
  // The trainers' DDP group holds job ranks 0 and 1 as its ranks 0 and 1, and its errors name
  // them by group rank.
  s.names = [nameOf = s.nameOf](const std::string& text, int r) {
    return text.find(nameOf(r)) != std::string::npos || (r < 2 && namesRank(text, r));
  };
  s.faultWindow = 1.5;
  runMany(s);
}

TEST_CASE("rnn survivors fail naming the lost peer, or finish") {
  Scenario s;
  s.label = "rnn";
  s.argv = {WEFT_RNN, "--iterations", "300", "--log-interval", "1000"};
  s.world = 2;
  s.nameOf = [](int r) { return std::string(r == 0 ? "ps" : "trainer"); };
  s.faultWindow = 1.5;
  runMany(s);
}

TEST_CASE("rl survivors fail naming the lost peer, or finish") {
  Scenario s;
  s.label = "rl";
  s.argv = {WEFT_RL, "--max-episodes", "30", "--log-interval", "1000"};
  s.world = 3;
  s.nameOf = [](int r) { return r == 0 ? std::string("agent") : "observer" + std::to_string(r); };
  s.faultWindow = 1.5;
  runMany(s);
}

TEST_CASE("a DDP job over Gloo fails naming the lost rank, or finishes") {
  Scenario s;
  s.label = "fashion_mnist ddp";
  s.argv = {WEFT_FASHION_MNIST_DP, "--mode", "ddp", "--epochs", "1", "--batch-size", "60", "--max-batches", "120", "--log-interval", "1000",
            "--timeout", "3"};
  s.world = 3;
  s.nameOf = rankName;
  s.names = namesRank;
  s.faultWindow = 4.0;
  runMany(s);
}

TEST_SUITE_END();
