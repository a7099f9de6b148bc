// allreduce_algorithms: every allreduce algorithm of the gloo backend (collectives/gloo/
// process_group_gloo.h, "Allreduce algorithms") on N processes on 127.0.0.1, for N = 2, 3, 4, 8
// and float32 tensors of 4 KiB to 64 MiB: the median time per allReduce, the communication steps
// (data messages each rank sends per allReduce: sends of more than 64 bytes) and the bytes each
// rank sends and receives per allReduce, as the group counts them at its transport
// (ProcessGroup::trafficStats), in multiples of the tensor's size S. Then a parameter-server
// round: N trainers each push a gradient of S bytes to one server and pull its S bytes of weights
// back by RPC, and the bytes the server's agent writes and reads per step (AgentStats).
//
//   allreduce_algorithms [--worlds 2,3,4,8] [--sizes 4K,64K,1M,64M] [--quick] [--ps-only]
//
// The bench re-executes itself as the other ranks (`/proc/self/exe --rank R PORT WORLD MODE`).
// Groups run with checkCalls off, so the counts are the algorithm's alone. naive and parallel
// keep (N-1) x S of scratch per rank and are skipped where N x S exceeds 256 MiB. More
// processes than CPUs time-share them: the counts hold, the times then measure the machine.
// A cell is timed for at least 5 iterations and about 0.4 s, once when its warm-up alone took
// longer. --quick: N = 2, 3 and 4 KiB, 64 KiB, 1 MiB, few iterations (a smoke run);
// --ps-only: the parameter-server round alone.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/flags.h"
#include "bench/two_process.h"
#include "collectives/gloo/detail/group.h"
#include "collectives/gloo/process_group_gloo.h"
#include "rpc/agent.h"
#include "rpc/store.h"
#include "tensor/tensor.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using weft::Tensor;
using weft::collectives::AllreduceAlgorithm;
using weft::collectives::ProcessGroupGloo;
using weft::bench::fail;

struct Config {
  std::vector<int> worlds = {2, 3, 4, 8};
  std::vector<uint64_t> sizes = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  bool quick = false;
  bool psOnly = false;  // only the parameter-server round
  std::chrono::milliseconds cellBudget{400};
  int minIters = 5;
  int maxIters = 50;
  uint64_t psBytes = 1 << 20;
  int psSteps = 10;
};

constexpr uint64_t kScratchCap = uint64_t{256} << 20;

const std::vector<AllreduceAlgorithm> kAlgorithms = {
    AllreduceAlgorithm::Ring,  AllreduceAlgorithm::RingChunked, AllreduceAlgorithm::HalvingDoubling,
    AllreduceAlgorithm::Bcube, AllreduceAlgorithm::Naive,       AllreduceAlgorithm::Parallel,
    AllreduceAlgorithm::Auto};

std::vector<int> parseWorlds(const std::string& list) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    out.push_back(static_cast<int>(weft::bench::intFlag("--worlds", list.substr(pos, comma - pos), 2, 16)));
    pos = comma + 1;
  }
  return out;
}

bool skipped(AllreduceAlgorithm a, int world, uint64_t bytes) {
  return (a == AllreduceAlgorithm::Naive || a == AllreduceAlgorithm::Parallel) &&
         static_cast<uint64_t>(world) * bytes > kScratchCap;
}

// One rank of the collective part: every size and algorithm; rank 0 prints the rows.
int runCollectives(int rank, int world, uint16_t port, const Config& cfg) {
  std::unique_ptr<weft::rpc::StoreServer> server;
  if (rank == 0) {
    weft::rpc::StoreServer::Config sc;
    sc.port = port;
    server = std::make_unique<weft::rpc::StoreServer>(sc);
  }
  weft::rpc::StoreClient::Config cc;
  cc.port = port;
  cc.timeout = 60s;
  weft::rpc::StoreClient store(cc);
  {
    ProcessGroupGloo pg(store, rank, world, {.timeout = 600s, .checkCalls = false, .name = "bench"});
    for (uint64_t bytes : cfg.sizes) {
      const int64_t n = static_cast<int64_t>(bytes / 4);
      Tensor x = weft::full({n}, 1.0);
      for (AllreduceAlgorithm a : kAlgorithms) {
        if (skipped(a, world, bytes)) {
          if (rank == 0) {
            std::printf("%2d %9s %-16s %s\n", world, weft::bench::formatBytes(bytes).c_str(),
                        weft::collectives::allreduceAlgorithmName(a), "skipped: N x S of scratch over 256 MiB");
          }
          continue;
        }
        const auto warmStart = Clock::now();
        pg.allReduce(x, weft::collectives::ReduceOp::Sum, a).wait();  // warm-up
        // A cell whose warm-up alone overran the budget is timed once (each rank decides from its
        // own clock; rank 0's decision below is what counts).
        const bool slow = Clock::now() - warmStart > cfg.cellBudget;
        pg.barrier().wait();
        // Every rank runs the same number of iterations: rank 0 decides, by its clock, and
        // broadcasts "go on" (1) or "stop" (0) before each.
        Tensor goOn = weft::empty({1}, {.dtype = weft::DType::Int64});
        std::vector<double> times;
        const auto began = Clock::now();
        pg.resetTrafficStats();
        weft::collectives::TrafficStats control;
        for (;;) {
          const int minIters = slow ? 1 : cfg.minIters;
          goOn.data<int64_t>()[0] =
              static_cast<int64_t>(times.size()) < minIters ||
              (Clock::now() - began < cfg.cellBudget && static_cast<int>(times.size()) < cfg.maxIters);
          const auto before = pg.trafficStats();
          pg.broadcast(goOn, 0).wait();
          const auto after = pg.trafficStats();
          control.bytesSent += after.bytesSent - before.bytesSent;
          control.bytesReceived += after.bytesReceived - before.bytesReceived;
          control.messagesSent += after.messagesSent - before.messagesSent;
          control.dataMessagesSent += after.dataMessagesSent - before.dataMessagesSent;
          if (goOn.data<int64_t>()[0] == 0) break;
          const auto t0 = Clock::now();
          pg.allReduce(x, weft::collectives::ReduceOp::Sum, a).wait();
          times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
          if (times.size() % 8 == 0) x.fill_(1.0);  // values stay finite
        }
        const auto s = pg.trafficStats();
        const int64_t iters = static_cast<int64_t>(times.size());
        std::sort(times.begin(), times.end());
        // Per allReduce, this rank: sent, received, data messages, messages; and its median time.
        Tensor mine = weft::empty({5}, {.dtype = weft::DType::Int64});
        int64_t* m = mine.data<int64_t>();
        m[0] = (s.bytesSent - control.bytesSent) / iters;
        m[1] = (s.bytesReceived - control.bytesReceived) / iters;
        m[2] = (s.dataMessagesSent - control.dataMessagesSent) / iters;
        m[3] = (s.messagesSent - control.messagesSent) / iters;
        m[4] = static_cast<int64_t>(times[times.size() / 2] * 1000.0);
        Tensor all = weft::empty({5 * world}, {.dtype = weft::DType::Int64});
        pg.allGatherInto(all, mine).wait();
        if (rank != 0) continue;
        const int64_t* v = all.data<int64_t>();
        const double S = static_cast<double>(bytes);
        double othersSent = 0, othersRecv = 0;
        int64_t steps = 0, msgs = 0, sumSent = 0, sumRecv = 0;
        for (int r = 0; r < world; ++r) {
          steps = std::max(steps, v[5 * r + 2]);
          msgs = std::max(msgs, v[5 * r + 3]);
          sumSent += v[5 * r + 0];
          sumRecv += v[5 * r + 1];
          if (r > 0) {
            othersSent = std::max(othersSent, static_cast<double>(v[5 * r + 0]) / S);
            othersRecv = std::max(othersRecv, static_cast<double>(v[5 * r + 1]) / S);
          }
        }
        std::printf("%2d %9s %-16s %10.3f %5lld %6lld %6lld | %7.3f %7.3f | %7.3f %7.3f | %7.3f %s\n", world,
                    weft::bench::formatBytes(bytes).c_str(), weft::collectives::allreduceAlgorithmName(a),
                    static_cast<double>(m[4]) / 1000.0, static_cast<long long>(iters), static_cast<long long>(steps),
                    static_cast<long long>(msgs), static_cast<double>(v[0]) / S, static_cast<double>(v[1]) / S,
                    othersSent, othersRecv, 2.0 * (world - 1) / world,
                    sumSent == sumRecv ? "" : ("(sent-received over ranks: " + std::to_string(sumSent - sumRecv) + " B)").c_str());
        std::fflush(stdout);
      }
    }
    pg.barrier().wait();
  }
  store.barrier("bench/exit", world, 60s);
  if (rank == 0) {
    std::vector<std::string> left;
    for (int r = 1; r < world; ++r) left.push_back("bench/left/" + std::to_string(r));
    store.wait(left, 60s);
  } else {
    store.set("bench/left/" + std::to_string(rank), "1");
  }
  return 0;
}

// ---- the parameter-server round ------------------------------------------------------------

inline const weft::Function<bool(Tensor)> pushGradient{"allreduce_algorithms.push"};
inline const weft::Function<Tensor()> pullWeights{"allreduce_algorithms.pull"};

// Rank 0 serves (it accumulates the gradients into its weights); ranks 1..N train.
int runParameterServer(int rank, int world, uint16_t port, const Config& cfg) {
  weft::rpc::Options o;
  o.rank = rank;
  o.worldSize = world;
  o.masterAddr = "127.0.0.1";
  o.masterPort = port;
  o.rpcTimeout = std::chrono::seconds(120);
  o.storeTimeout = std::chrono::seconds(60);
  o.shutdownTimeout = std::chrono::seconds(30);
  o.validate();
  weft::rpc::Agent agent(o);
  const int64_t n = static_cast<int64_t>(cfg.psBytes / 4);
  Tensor weights = weft::zeros({n});
  std::mutex mutex;
  agent.registry().impl(pushGradient, [&](Tensor g) {
    std::lock_guard<std::mutex> lock(mutex);
    weights.add_(g, -1.0);
    return true;
  });
  agent.registry().impl(pullWeights, [&] {
    std::lock_guard<std::mutex> lock(mutex);
    return weights.clone();
  });
  agent.start();
  weft::rpc::StoreClient& store = agent.store();
  // The server's counts start before any trainer can push.
  const auto before = agent.stats();
  store.barrier("ps/ready", world, 60s);
  const auto t0 = Clock::now();
  if (rank > 0) {
    Tensor grad = weft::full({n}, 0.001);
    for (int step = 0; step < cfg.psSteps; ++step) {
      agent.call(0, pushGradient, grad);
      Tensor w = agent.call(0, pullWeights);
      if (w.numel() != n) fail("pull: wrong size");
      store.barrier("ps/step/" + std::to_string(step), world - 1, 60s);
    }
  }
  store.barrier("ps/done", world, 120s);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto after = agent.stats();
  if (rank == 0) {
    const double S = static_cast<double>(cfg.psBytes);
    const double sent = static_cast<double>(after.bytesSent - before.bytesSent) / cfg.psSteps;
    const double recv = static_cast<double>(after.bytesReceived - before.bytesReceived) / cfg.psSteps;
    std::printf("%2d %9s %10.3f | %8.3f %8.3f | %8.3f\n", world - 1, weft::bench::formatBytes(cfg.psBytes).c_str(),
                secs * 1000.0 / cfg.psSteps, sent / S, recv / S, (sent + recv) / S);
    std::fflush(stdout);
  }
  agent.shutdown();
  return 0;
}

int runRank(int rank, int world, uint16_t port, const std::string& mode, const Config& cfg) {
  return mode == "ps" ? runParameterServer(rank, world, port, cfg) : runCollectives(rank, world, port, cfg);
}

// Rank 0 here, ranks 1..world-1 re-executed.
int runJob(int world, const std::string& mode, const Config& cfg, int argc, char** argv) {
  const uint16_t port = weft::bench::freePort();
  std::vector<std::unique_ptr<weft::bench::ServerProcess>> others;
  for (int r = 1; r < world; ++r) {
    std::vector<std::string> args = {"allreduce_algorithms", "--rank", std::to_string(r), std::to_string(port),
                                     std::to_string(world), mode};
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    others.push_back(std::make_unique<weft::bench::ServerProcess>(std::move(args)));
  }
  const int rc = runRank(0, world, port, mode, cfg);
  for (auto& p : others) p->waitForExit(std::chrono::seconds(120));
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Config cfg;
    // Ranks > 0 get "--rank R PORT WORLD MODE" before rank 0's own arguments.
    const bool isOther = argc >= 6 && std::string(argv[1]) == "--rank";
    bool sizesGiven = false, worldsGiven = false;
    weft::bench::Flags flags;
    flags.onValue("--sizes", [&](const std::string& v) {
      cfg.sizes = weft::bench::parseSizeList(v);
      sizesGiven = true;
    });
    flags.onValue("--worlds", [&](const std::string& v) {
      cfg.worlds = parseWorlds(v);
      worldsGiven = true;
    });
    flags.onSwitch("--quick", [&] { cfg.quick = true; });
    flags.onSwitch("--ps-only", [&] { cfg.psOnly = true; });
    if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "allreduce_algorithms",
                                        "usage: allreduce_algorithms [--worlds 2,3,4,8] [--sizes 4K,64K,1M,64M] "
                                        "[--quick] [--ps-only]\n",
                                        isOther ? 6 : 1)) {
      return 2;
    }
    if (cfg.quick) {
      if (!worldsGiven) cfg.worlds = {2, 3};
      if (!sizesGiven) cfg.sizes = {4 << 10, 64 << 10, 1 << 20};
      cfg.cellBudget = 50ms;
      cfg.minIters = 2;
      cfg.psSteps = 3;
      cfg.psBytes = 64 << 10;
    }
    if (isOther) {
      return runRank(std::stoi(argv[2]), std::stoi(argv[4]), static_cast<uint16_t>(std::stoi(argv[3])), argv[5], cfg);
    }
    std::printf("allreduce_algorithms: float32 sum on N processes on 127.0.0.1 (%u CPUs; N above that "
                "time-share them), checkCalls off, load %s\n",
                std::thread::hardware_concurrency(), weft::bench::loadAverage().c_str());
    std::printf("per allReduce, as counted by the group (ProcessGroup::trafficStats); bytes in multiples of S; "
                "steps: data messages a rank sends (max over ranks)\n");
    std::printf("%2s %9s %-16s %10s %5s %6s %6s | %7s %7s | %7s %7s | %7s\n", "N", "S", "algorithm", "median_ms",
                "iters", "steps", "msgs", "r0_sent", "r0_recv", "oth_snt", "oth_rcv", "2(N-1)/N");
    for (int world : cfg.worlds) {
      if (!cfg.psOnly && runJob(world, "coll", cfg, argc, argv) != 0) return 1;
    }
    std::printf("\nparameter server: N trainers push S bytes of gradient to rank 0 and pull S bytes of weights, "
                "per step; the server's agent's bytes (AgentStats, framing included) in multiples of S\n");
    std::printf("%2s %9s %10s | %8s %8s | %8s\n", "N", "S", "step_ms", "srv_sent", "srv_recv", "srv_total");
    for (int world : cfg.worlds) {
      if (runJob(world + 1, "ps", cfg, argc, argv) != 0) return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_algorithms: %s\n", e.what());
    return 1;
  }
}
