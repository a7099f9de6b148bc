// A program for the multi-machine test (tests/collectives/multinode_mp_test.cpp): one rank of a job
// started by weftrun on each of two "machines" (network namespaces), 2 ranks per machine. It finds
// its place and address through rpc::Options::fromEnv (WEFT_SOCKET_IFNAME or the default) and
// prints one line per event ("rank R <phrase> ...").
//
//   weftrun -n 2 --nnodes 2 --node-rank 1 --master-addr 10.213.1.1 --master-port 29500 multinode_worker job
//
// Scenarios (a world of 4, ranks 0 and 1 on node 0, 2 and 3 on node 1):
//   job   an Agent (rank 0 serves the store) and a gloo process group on its store: an allReduce of
//         rank + 1 (10 everywhere), a send/recv with the same local rank on the other node, an RPC
//         call to that rank (it answers with its node and address) and an RRef to an object built
//         on the next rank, read with rpcSync. Prints "rank R address A", "rank R allreduce V",
//         "rank R recv V", "rank R rpc <answer>", "rank R rref V", "rank R done" and the shutdown.
//   pg    the process group alone (rank 0 serves the store, no agent): an allReduce; prints
//         "rank R address A", "rank R allreduce V" and "rank R done".
// The group's timeout is 30 s, the agent's store timeout WEFT_STORE_TIMEOUT (the test sets 30 s).
// A failure prints "<program> <scenario>: <what>" on stderr and exits 1 (tests/mp_worker.h).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "collectives/gloo/process_group_gloo.h"
#include "common/error.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "rref/rref.h"
#include "tensor/tensor.h"

#include "mp_worker.h"

namespace multinode {

using namespace std::chrono_literals;
using weft::Tensor;
using weft::collectives::ProcessGroup;
using weft::rpc::Agent;
using weft::rpc::Options;
using namespace weft::testing;  // say, prefix, require, sayStarted, sayShutdown, workerMain

constexpr auto kGroupTimeout = 30s;
constexpr int kWorld = 4;
constexpr int kPerNode = 2;

class Box {
 public:
  explicit Box(int64_t value) : value_(value) {}
  int64_t get() const { return value_; }

 private:
  int64_t value_;
};
WEFT_REMOTE_CLASS(Box, WEFT_CONSTRUCTORS((int64_t)), get);

inline const weft::Function<std::string(int64_t)> whereAreYou{"multinode_worker.whereAreYou"};

int otherNodePeer(int rank) { return (rank + kPerNode) % kWorld; }

void allReduce(ProcessGroup& pg, int rank) {
  Tensor t = weft::full({3}, static_cast<double>(rank + 1));
  pg.allReduce(t).wait();
  const double expected = kWorld * (kWorld + 1) / 2.0;
  for (int64_t i = 0; i < 3; ++i) {
    require(t.data<float>()[i] == expected, "allReduce gave " + std::to_string(t.data<float>()[i]));
  }
  say(prefix(rank) + "allreduce " + std::to_string(static_cast<int>(t.data<float>()[0])));
}

int runJob() {
  Options opt = Options::fromEnv();
  require(opt.worldSize == kWorld, "this test runs a world of 4");
  const std::string address = opt.localAddress();
  Agent agent(opt);
  agent.registry().impl(whereAreYou, [&opt, address](int64_t from) {
    return "from " + std::to_string(from) + " to " + std::to_string(opt.rank) + " node " +
           std::to_string(opt.rank / kPerNode) + " at " + address;
  });
  agent.start();
  sayStarted(agent);
  const int rank = opt.rank;
  say(prefix(rank) + "address " + address);

  auto pg = weft::collectives::createGlooGroup(agent.store(), rank, kWorld, {.timeout = kGroupTimeout});
  allReduce(*pg, rank);

  const int peer = otherNodePeer(rank);
  Tensor out = weft::full({4}, static_cast<double>(100 + rank));
  Tensor in = weft::zeros({4});
  auto sent = pg->isend(out, peer);
  auto received = pg->irecv(in, peer);
  sent.wait();
  received.wait();
  require(in.data<float>()[3] == static_cast<float>(100 + peer), "recv gave " + std::to_string(in.data<float>()[3]));
  say(prefix(rank) + "recv " + std::to_string(static_cast<int>(in.data<float>()[3])));

  std::string answer = agent.call(peer, whereAreYou, int64_t{rank});
  say(prefix(rank) + "rpc " + answer);

  weft::RRef<Box> box = agent.remote<Box>((rank + 1) % kWorld, int64_t{1000 + rank});
  int64_t value = box.rpcSync(&Box::get);
  require(value == 1000 + rank, "the RRef's object holds " + std::to_string(value));
  say(prefix(rank) + "rref " + std::to_string(value));

  pg->barrier().wait();
  pg.reset();
  say(prefix(rank) + "done");
  sayShutdown(agent);
  return 0;
}

int runGroup() {
  Options opt = Options::fromEnv();
  require(opt.worldSize == kWorld, "this test runs a world of 4");
  say(prefix(opt.rank) + "address " + opt.localAddress());
  std::unique_ptr<weft::rpc::StoreServer> server;
  if (opt.rank == 0) server = std::make_unique<weft::rpc::StoreServer>(weft::rpc::StoreServer::configFor(opt));
  weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));
  auto pg = weft::collectives::createGlooGroup(store, opt.rank, kWorld, {.timeout = kGroupTimeout});
  allReduce(*pg, opt.rank);
  pg->barrier().wait();
  say(prefix(opt.rank) + "done");
  // Rank 0 serves the store: it leaves last.
  store.barrier("multinode/leave", kWorld, 10s);
  return 0;
}

}  // namespace multinode

int main(int argc, char** argv) {
  return weft::testing::workerMain("multinode_worker", {"job", "pg"}, argc, argv, [](const std::string& scenario) {
    return scenario == "job" ? multinode::runJob() : multinode::runGroup();
  });
}
