// dist_autograd_bench: one training iteration of a 3-layer MLP split across two processes
// (distributed autograd + DistributedOptimizer) against the same model trained locally, measured
// in the same run, and the messages one distributed iteration costs.
//
//   dist_autograd_bench                      # the full run, placement split
//   dist_autograd_bench --quick              # a smoke run (a few seconds)
//   dist_autograd_bench --batch 64 --hidden 512 --placement same
//
// Processes. As in rpc_bench: this program re-executes itself (/proc/self/exe --serve) as the
// server, rank 0, which holds the middle layer; this process is rank 1, the trainer. Placement
// (--placement) pins the two processes (split: one CPU each; same: both on one CPU; none).
//
// The model: x [batch, 64] -> fc1 (64 -> hidden) -> relu -> fc2 (hidden -> hidden) -> relu ->
// fc3 (hidden -> 10) -> cross entropy; SGD with momentum 0.9, lr 0.01.
//   local        every layer on the trainer: loss.backward(), nn::optim::SGD::step().
//   distributed  fc2 is a RemoteModule on the server; inside a dist_autograd::Context:
//                forward, ctx.backward({loss}), DistributedOptimizer::step(ctx) over the
//                parameters of all three layers (two owners: the trainer and the server).
// Both run the same number of iterations in alternating blocks (drift hits both); the table
// shows the median, p10 and p90 per iteration, the overhead (distributed - local) and the ratio
// of the medians, with the spread of the per-block ratios.
//
// Messages. Then the distributed iteration runs alone for a fixed count, and the calls both
// agents sent (AgentStats::callsSent; each call is answered by one response) are shown per
// iteration next to the minimum the design allows: one forward RPC, one backward request per recv
// node (the trainer's recv node of fc2's output and the server's of its input: 2), one step RPC
// per owner other than the trainer (1; the trainer steps its own parameters without a message),
// so 4 calls and 4 responses. Context releases travel in batches
// (dist_autograd.h, "Release") and are shown separately. A count above the minimum is an error.
//
// The trainer checks that both runs learn (the loss falls) and that after graceful shutdown no
// distributed autograd state is left on either process.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/two_process.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/functional.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "rpc/store.h"
#include "rref/remote_module.h"
#include "tensor/ops.h"

using namespace std::chrono_literals;
using weft::Tensor;
namespace bench = weft::bench;
namespace rpc = weft::rpc;
namespace da = weft::dist_autograd;

namespace {

const char* const kUsage =
    "usage: dist_autograd_bench [--quick] [--batch N] [--hidden N] [--iters N] [--placement split|same|none]\n";

constexpr const char* kDoneKey = "dist_autograd_bench/done";
constexpr int64_t kIn = 64;
constexpr int64_t kClasses = 10;
constexpr auto kSetupTimeout = 30s;
const auto kBenchTimeout = std::chrono::milliseconds(std::chrono::hours(1));

inline const weft::Function<std::vector<uint64_t>()> serverCounters{"dist_autograd_bench.counters"};

struct Args {
  int64_t batch = 32;
  int64_t hidden = 256;
  int iters = 600;   // per run, in blocks
  int blocks = 6;
  int messageIters = 200;
  bench::Placement placement = bench::Placement::Split;
};

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) bench::fail(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--quick") {
      a.iters = 120;
      a.blocks = 3;
      a.messageIters = 50;
    } else if (arg == "--batch") {
      a.batch = std::stoll(next());
    } else if (arg == "--hidden") {
      a.hidden = std::stoll(next());
    } else if (arg == "--iters") {
      a.iters = std::stoi(next());
    } else if (arg == "--placement") {
      a.placement = bench::parsePlacement(next());
    } else {
      bench::fail("unknown argument " + arg);
    }
  }
  if (a.batch <= 0 || a.hidden <= 0 || a.iters < a.blocks) bench::fail("sizes and --iters must be positive");
  return a;
}

std::vector<uint64_t> counters(rpc::Agent& agent) {
  rpc::AgentStats s = agent.stats();
  da::MessageCounts m = da::messageCounts(agent);
  return {s.callsSent, s.callsServed, m.backwardRequests, m.releaseMessages};
}

int serve(uint16_t storePort, int cpu) {
  bench::pinTo(cpu);
  rpc::Agent agent(bench::agentOptions(0, storePort, kSetupTimeout));
  agent.registry().impl(serverCounters, [&agent] { return counters(agent); });
  agent.start();
  agent.store().get(kDoneKey, kBenchTimeout);
  rpc::ShutdownReport report = agent.shutdown();
  if (!report.clean()) bench::fail("server: shutdown did not hear from the trainer");
  da::DebugCounts left = da::debugCounts(agent);
  std::printf("  server (rank 0): distributed autograd state at close: %s\n", left.toString().c_str());
  std::fflush(stdout);
  return left.empty() ? 0 : 3;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

void copyInto(weft::nn::Module& m, const std::vector<Tensor>& values) {
  weft::NoGradGuard ng;
  auto params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values[i]);
}

int runClient(const Args& args) {
  bench::CpuPlan plan = bench::planCpus(args.placement);
  bench::pinTo(plan.clientCpu);
  uint16_t port = bench::freePort();
  bench::ServerProcess server("dist_autograd_bench", port, plan.serverCpu);
  rpc::Agent agent(bench::agentOptions(1, port, kSetupTimeout));
  agent.start();

  weft::manualSeed(7);
  Tensor x = weft::randn({args.batch, kIn});
  Tensor y = weft::randint(0, kClasses, {args.batch});

  // Local model.
  auto l1 = std::make_shared<weft::nn::Linear>(kIn, args.hidden);
  auto l2 = std::make_shared<weft::nn::Linear>(args.hidden, args.hidden);
  auto l3 = std::make_shared<weft::nn::Linear>(args.hidden, kClasses);
  std::vector<Tensor> localParams;
  for (auto* m : {l1.get(), l2.get(), l3.get()}) {
    for (auto& p : m->parameters()) localParams.push_back(p);
  }
  weft::nn::optim::SGDOptions sgd{.lr = 0.01, .momentum = 0.9};
  weft::nn::optim::SGD localOpt(localParams, sgd);

  // Distributed model: fc1 and fc3 here, starting from the local model's weights; fc2 is built on
  // the server with its own initial weights (the same distribution).
  auto d1 = std::make_shared<weft::nn::Linear>(kIn, args.hidden);
  auto d3 = std::make_shared<weft::nn::Linear>(args.hidden, kClasses);
  copyInto(*d1, l1->parameters());
  copyInto(*d3, l3->parameters());
  weft::RemoteModule<weft::nn::Linear> d2(agent, "worker0/cpu", args.hidden, args.hidden);
  std::vector<weft::RRef<Tensor>> remote = d2.remoteParameters();
  std::vector<weft::RRef<Tensor>> distParams;
  for (auto* m : {d1.get(), d3.get()}) {
    for (auto& p : m->parameters()) distParams.push_back(weft::makeRRef(agent, p));
  }
  for (auto& r : remote) distParams.push_back(r);
  weft::dist_optim::DistributedOptimizer distOpt(agent, sgd, distParams);

  auto localStep = [&]() -> double {
    localOpt.zeroGrad();
    Tensor h = weft::relu(l1->forward(x));
    h = weft::relu(l2->forward(h));
    Tensor loss = weft::crossEntropy(l3->forward(h), y);
    loss.backward();
    localOpt.step();
    return loss.item<double>();
  };
  auto distStep = [&]() -> double {
    da::Context ctx(agent);
    Tensor h = weft::relu(d1->forward(x));
    h = weft::relu(d2.forward(h));
    Tensor loss = weft::crossEntropy(d3->forward(h), y);
    ctx.backward({loss});
    distOpt.step(ctx);
    return loss.item<double>();
  };

  std::printf("dist_autograd_bench: batch %lld, MLP %lld -> %lld -> %lld -> %lld, SGD momentum; placement %s; "
              "load %s\n",
              static_cast<long long>(args.batch), static_cast<long long>(kIn), static_cast<long long>(args.hidden),
              static_cast<long long>(args.hidden), static_cast<long long>(kClasses),
              plan.description.c_str(), bench::loadAverage().c_str());

  // Warm-up, and the loss must fall in both.
  double first = 0, lastLocal = 0, lastDist = 0;
  for (int i = 0; i < 20; ++i) {
    double a = localStep();
    double b = distStep();
    if (i == 0) first = a;
    lastLocal = a;
    lastDist = b;
  }
  if (!(lastLocal < first && lastDist < first)) bench::fail("the loss did not fall during the warm-up");

  std::vector<double> localTimes, distTimes, blockRatios;
  int perBlock = args.iters / args.blocks;
  for (int b = 0; b < args.blocks; ++b) {
    std::vector<double> lt, dt;
    for (int order = 0; order < 2; ++order) {
      bool dist = (order == 0) == (b % 2 == 1);
      for (int i = 0; i < perBlock; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        dist ? distStep() : localStep();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        (dist ? dt : lt).push_back(s);
      }
    }
    blockRatios.push_back(percentile(dt, 0.5) / percentile(lt, 0.5));
    localTimes.insert(localTimes.end(), lt.begin(), lt.end());
    distTimes.insert(distTimes.end(), dt.begin(), dt.end());
  }
  double lm = percentile(localTimes, 0.5), dm = percentile(distTimes, 0.5);
  std::printf("  %-34s %10s %10s %10s\n", "iteration (forward+backward+step)", "median", "p10", "p90");
  std::printf("  %-34s %8.1f us %8.1f us %8.1f us\n", "local", lm * 1e6, percentile(localTimes, 0.1) * 1e6,
              percentile(localTimes, 0.9) * 1e6);
  std::printf("  %-34s %8.1f us %8.1f us %8.1f us\n", "distributed (fc2 on the server)", dm * 1e6,
              percentile(distTimes, 0.1) * 1e6, percentile(distTimes, 0.9) * 1e6);
  std::printf("  overhead of the distributed iteration: %.1f us (median), ratio %.2fx (blocks %.2f..%.2f)\n",
              (dm - lm) * 1e6, dm / lm, *std::min_element(blockRatios.begin(), blockRatios.end()),
              *std::max_element(blockRatios.begin(), blockRatios.end()));
  std::printf("  final losses: local %.4f, distributed %.4f (from %.4f)\n", lastLocal, lastDist, first);

  // Messages per distributed iteration.
  da::flushReleases(agent).get();
  std::vector<uint64_t> s0 = agent.sync(0, serverCounters), c0 = counters(agent);
  for (int i = 0; i < args.messageIters; ++i) distStep();
  std::vector<uint64_t> s1 = agent.sync(0, serverCounters), c1 = counters(agent);
  // The trainer's own serverCounters call is one of its calls sent.
  double n = args.messageIters;
  double calls = (static_cast<double>(c1[0] - c0[0]) - 1 + static_cast<double>(s1[0] - s0[0])) / n;
  double backward = static_cast<double>(c1[2] - c0[2] + s1[2] - s0[2]) / n;
  double releases = static_cast<double>(c1[3] - c0[3] + s1[3] - s0[3]) / n;
  double callsWithoutReleases = calls - releases;
  std::printf("  messages per distributed iteration (%d iterations, both processes):\n", args.messageIters);
  std::printf("    calls sent %.2f = forward+step %.2f + backward requests %.2f + release batches %.2f\n", calls,
              callsWithoutReleases - backward, backward, releases);
  std::printf("    minimum: 1 forward + 2 backward requests + 1 step (the server's) = 4 calls, each with one "
              "response; measured %.2f without releases: %s\n",
              callsWithoutReleases, callsWithoutReleases <= 4.0 + 1e-9 ? "at the minimum" : "ABOVE THE MINIMUM");

  agent.store().set(kDoneKey, "1");
  rpc::ShutdownReport report = agent.shutdown();
  if (!report.clean()) bench::fail("trainer: shutdown did not hear from the server");
  da::DebugCounts left = da::debugCounts(agent);
  std::printf("  trainer (rank 1): distributed autograd state at close: %s\n", left.toString().c_str());
  std::fflush(stdout);
  server.waitForExit(20s, {{3, "distributed autograd state left at close"}});
  if (!left.empty()) bench::fail("distributed autograd state left on the trainer");
  if (callsWithoutReleases > 4.0 + 1e-9) bench::fail("more messages per iteration than the minimum");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::twoProcessMain(argc, argv, "dist_autograd_bench", kUsage, serve, [](int n, char** arguments) {
    Args a = parseArgs(n, arguments);
    return std::function<int()>([a] { return runClient(a); });
  });
}
