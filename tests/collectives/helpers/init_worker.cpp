// A program for the multiprocess tests of collectives::init and the object collectives
// (tests/collectives/init_mp_test.cpp): one rank of a job, which joins it with nothing but
// collectives::init (or an Agent and collectives::init(agent)) and plays the part of its rank in
// the scenario it is given. It prints one line per event ("rank R <phrase> ...").
//
//   collectives_init_worker lone          # no launcher, no environment: a world of 1
//   WEFT_RANK=0 WEFT_WORLD_SIZE=3 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 collectives_init_worker job
//
// Scenarios:
//   lone   collectives::init() must give rank 0 of a world of 1; every collective and both object
//          collectives run and leave their values as one rank's (checked); prints "rank 0 world 1"
//          and "rank 0 lone ok".
//   job    collectives::init() from the environment; an allReduce, allGatherObject of a string, a
//          vector, a WEFT_CODEC_FIELDS struct and a tensor, broadcastObject of a map from the last
//          rank and of a struct from rank 0, each checked against the values every rank computes
//          for itself; then allGatherObject with rank 1 passing an int64 where the others pass a
//          string ("rank R mismatch <ErrorType>: <message>") followed by a matching one ("rank R
//          after mismatch ok"). Each rank then destroys its group and leaves: no other set-up or
//          exit handshake.
//   agent  an Agent from the environment and collectives::init(agent): init before start()
//          ("rank R before_start <ErrorType>: <message>"), then after it an allReduce, an RPC call
//          to the next rank (when there is one), allGatherObject of the agents' names checked
//          against agent.workers(); prints "rank R store shared" when the group's keys are in the
//          agent's store; destroys the group, then agent.shutdown().
//   end K  collectives::init() and one allReduce; then the last rank, instead of destroying its
//          group, dies (K = die: SIGKILL to itself) or stalls (K = stall: sleeps 8 s, then destroys
//          it); every other rank destroys its group at once, timing it ("rank R end took N ms").
// Every rank ends with "rank R done"; a wrong result throws: one line on stderr, exit status 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collectives/init.h"
#include "collectives/object_collectives.h"
#include "common/error.h"
#include "rpc/agent.h"
#include "rpc/codec.h"
#include "rpc/store.h"
#include "mp_worker.h"

namespace demo {
struct Stats {
  int64_t seen = 0;
  double loss = 0;
  std::string host;
  std::vector<double> history;
};
WEFT_CODEC_FIELDS(Stats, seen, loss, host, history);
}  // namespace demo

namespace {

using namespace std::chrono_literals;
using weft::DType;
using weft::Tensor;
using weft::collectives::ReduceOp;

int gRank = 0;

void say(const std::string& line) {
  std::string s = "rank " + std::to_string(gRank) + " " + line + "\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("rank " + std::to_string(gRank) + ": " + what); }

void expectValues(const Tensor& x, const std::vector<double>& want, const std::string& what) {
  if (x.numel() != static_cast<int64_t>(want.size())) fail(what + ": " + std::to_string(x.numel()) + " elements");
  for (size_t i = 0; i < want.size(); ++i) {
    const double got = x.dtype() == DType::Int64 ? static_cast<double>(x.data<int64_t>()[i])
                                                  : static_cast<double>(x.data<float>()[i]);
    if (got != want[i]) fail(what + ": element " + std::to_string(i) + " is " + std::to_string(got) +
                             ", expected " + std::to_string(want[i]));
  }
}

Tensor vec(const std::vector<float>& v) {
  Tensor t = weft::empty({static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = v[i];
  return t;
}

demo::Stats statsOf(int r) {
  return {10 * r + 1, 0.5 * r, "host-" + std::to_string(r), std::vector<double>(static_cast<size_t>(r), 1.25 * r)};
}

bool same(const demo::Stats& a, const demo::Stats& b) {
  return a.seen == b.seen && a.loss == b.loss && a.host == b.host && a.history == b.history;
}

void runLone() {
  auto pg = weft::collectives::init();
  if (pg->rank() != 0 || pg->size() != 1) fail("lone process is rank " + std::to_string(pg->rank()) + " of " +
                                               std::to_string(pg->size()));
  say("world " + std::to_string(pg->size()));
  const std::vector<double> v = {1, -2, 3.5};
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max}) {
    Tensor x = vec({1, -2, 3.5});
    pg->allReduce(x, op).wait(30s);
    expectValues(x, v, std::string("allReduce ") + weft::collectives::reduceOpName(op));
    Tensor y = vec({1, -2, 3.5});
    pg->reduce(y, 0, op).wait(30s);
    expectValues(y, v, std::string("reduce ") + weft::collectives::reduceOpName(op));
  }
  Tensor b = vec({1, -2, 3.5});
  pg->broadcast(b, 0).wait(30s);
  expectValues(b, v, "broadcast");
  std::vector<Tensor> parts;
  pg->allGather(parts, vec({1, -2, 3.5})).wait(30s);
  if (parts.size() != 1) fail("allGather gave " + std::to_string(parts.size()) + " tensors");
  expectValues(parts[0], v, "allGather");
  Tensor flat = weft::empty({3});
  pg->allGatherInto(flat, vec({1, -2, 3.5})).wait(30s);
  expectValues(flat, v, "allGatherInto");
  std::vector<Tensor> gathered;
  pg->gather(gathered, vec({1, -2, 3.5}), 0).wait(30s);
  expectValues(gathered.at(0), v, "gather");
  Tensor scattered = weft::empty({3});
  pg->scatter(scattered, {vec({1, -2, 3.5})}, 0).wait(30s);
  expectValues(scattered, v, "scatter");
  Tensor rs = weft::empty({3});
  pg->reduceScatter(rs, {vec({1, -2, 3.5})}).wait(30s);
  expectValues(rs, v, "reduceScatter");
  Tensor a2a = weft::empty({3});
  pg->allToAll(a2a, vec({1, -2, 3.5})).wait(30s);
  expectValues(a2a, v, "allToAll");
  pg->barrier().wait(30s);
  std::vector<demo::Stats> all = weft::collectives::allGatherObject(*pg, statsOf(3));
  if (all.size() != 1 || !same(all[0], statsOf(3))) fail("allGatherObject on one rank");
  std::string s = "only";
  weft::collectives::broadcastObject(*pg, s, 0);
  if (s != "only") fail("broadcastObject on one rank gave '" + s + "'");
  say("lone ok");
}

void runJob() {
  auto pg = weft::collectives::init();
  const int W = pg->size();
  const int me = pg->rank();
  gRank = me;
  say("world " + std::to_string(W));

  Tensor x = vec({static_cast<float>(me + 1), 2});
  pg->allReduce(x).wait(30s);
  expectValues(x, {static_cast<double>(W * (W + 1) / 2), 2.0 * W}, "allReduce");

  std::vector<std::string> names = weft::collectives::allGatherObject(*pg, "host-" + std::to_string(me));
  std::vector<std::vector<int64_t>> lists =
      weft::collectives::allGatherObject(*pg, std::vector<int64_t>(static_cast<size_t>(me + 1), me * 7));
  std::vector<demo::Stats> stats = weft::collectives::allGatherObject(*pg, statsOf(me));
  std::vector<Tensor> tensors = weft::collectives::allGatherObject(*pg, vec({static_cast<float>(me), -1.5f}));
  if (names.size() != static_cast<size_t>(W) || lists.size() != names.size() || stats.size() != names.size() ||
      tensors.size() != names.size()) {
    fail("allGatherObject gave the wrong count");
  }
  for (int r = 0; r < W; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (names[i] != "host-" + std::to_string(r)) fail("allGatherObject string from rank " + std::to_string(r));
    if (lists[i] != std::vector<int64_t>(i + 1, r * 7)) fail("allGatherObject vector from rank " + std::to_string(r));
    if (!same(stats[i], statsOf(r))) fail("allGatherObject struct from rank " + std::to_string(r));
    expectValues(tensors[i], {static_cast<double>(r), -1.5}, "allGatherObject tensor from rank " + std::to_string(r));
  }
  say("allGatherObject ok");

  std::map<std::string, int64_t> config;
  if (me == W - 1) config = {{"epochs", 3}, {"batch", 64}};
  else config = {{"stale", -1}};
  weft::collectives::broadcastObject(*pg, config, W - 1);
  if (config != std::map<std::string, int64_t>{{"epochs", 3}, {"batch", 64}}) fail("broadcastObject map");
  demo::Stats st = me == 0 ? statsOf(5) : demo::Stats{};
  weft::collectives::broadcastObject(*pg, st, 0);
  if (!same(st, statsOf(5))) fail("broadcastObject struct");
  say("broadcastObject ok");

  try {
    if (me == 1) {
      weft::collectives::allGatherObject(*pg, int64_t{42});
    } else {
      weft::collectives::allGatherObject(*pg, std::string("text"));
    }
    say("mismatch unexpected success");
  } catch (const std::exception&) {
    say("mismatch " + weft::testing::describe(std::current_exception()));
  }
  std::vector<int64_t> ranks = weft::collectives::allGatherObject(*pg, int64_t{me});
  for (int r = 0; r < W; ++r) {
    if (ranks[static_cast<size_t>(r)] != r) fail("allGatherObject after the mismatch");
  }
  say("after mismatch ok");
}

void runEnd(const std::string& kind) {
  auto pg = weft::collectives::init();
  gRank = pg->rank();
  Tensor x = vec({1});
  pg->allReduce(x).wait(30s);
  expectValues(x, {static_cast<double>(pg->size())}, "allReduce");
  if (pg->rank() == pg->size() - 1) {
    if (kind == "die") {
      ::kill(::getpid(), SIGKILL);
    } else if (kind == "stall") {
      std::this_thread::sleep_for(8s);
    } else {
      fail("unknown end kind " + kind);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  pg.reset();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  say("end took " + std::to_string(took.count()) + " ms");
}

const weft::Function<int64_t(int64_t)> twice{"init_worker.twice"};

void runAgent() {
  weft::rpc::Agent agent(weft::rpc::Options::fromEnv());
  gRank = agent.rank();
  agent.registry().impl(twice, [](int64_t v) { return 2 * v; });
  try {
    weft::collectives::init(agent);
    say("before_start unexpected success");
  } catch (const std::exception&) {
    say("before_start " + weft::testing::describe(std::current_exception()));
  }
  agent.start();
  const int W = agent.worldSize();
  const int me = agent.rank();
  {
    auto pg = weft::collectives::init(agent, {.timeout = 30s});
    if (pg->rank() != me || pg->size() != W) fail("the group's place differs from the agent's");
    Tensor x = vec({1});
    pg->allReduce(x).wait(30s);
    expectValues(x, {static_cast<double>(W)}, "allReduce");
    if (W > 1) {
      const int next = (me + 1) % W;
      const int64_t got = agent.call(next, twice, int64_t{me + 10});
      if (got != 2 * (me + 10)) fail("RPC to rank " + std::to_string(next) + " gave " + std::to_string(got));
    }
    std::vector<std::string> names = weft::collectives::allGatherObject(*pg, agent.name());
    const auto workers = agent.workers();
    for (int r = 0; r < W; ++r) {
      if (names[static_cast<size_t>(r)] != workers[static_cast<size_t>(r)].name) fail("agent names by rank");
    }
    // The group rendezvoused through the agent's store.
    if (agent.store().check({"weft/pg/default/joined/" + std::to_string(me)})) say("store shared");
    say("agent ok");
  }
  agent.shutdown();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: collectives_init_worker lone|job|agent|end die|stall\n");
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    if (scenario == "lone") runLone();
    else if (scenario == "job") runJob();
    else if (scenario == "agent") runAgent();
    else if (scenario == "end" && argc > 2) runEnd(argv[2]);
    else fail("unknown scenario " + scenario);
    say("done");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", gRank, e.what());
    return 1;
  }
}
