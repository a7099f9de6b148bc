// ddp_bench: the time of one data-parallel training step on 2 processes for a model of many small
// parameters (64 x Linear(64, 64): 128 parameters, 1.0 MiB), through DistributedDataParallel and
// through an unbucketed loop that allreduces every parameter's gradient on its own after backward
// (all issued at once, then awaited: the loop's best case), in the same run. A step is zeroGrad,
// forward, backward, gradient averaging and an SGD update. Also timed: DDP with small buckets
// (several allreduces overlapping backward) and the step with no communication at all (the floor).
// The bench re-executes itself as rank 1 (`/proc/self/exe --rank1 PORT ...`); rank 0 prints the
// median step time of each path and the ratio loop / DDP (goal: > 1, DDP faster).
//
//   ddp_bench [--iters N] [--batch B] [--no-check]
//
// --no-check builds the process group without the call check (the round of call headers in front
// of each collective larger than the group's fused limit; the per-parameter loop's small
// allreduces travel whole in that round either way). The paths alternate within each iteration,
// so that drift in machine load hits them alike.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/gloo/process_group_gloo.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "bench/two_process.h"
#include "rpc/store.h"
#include "tensor/ops.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using weft::Tensor;
using weft::collectives::DistributedDataParallel;
using weft::collectives::ReduceOp;
using weft::collectives::Work;

using weft::bench::fail;

constexpr int kLayers = 64;
constexpr int64_t kWidth = 64;

struct Config {
  int iters = 200;
  int64_t batch = 32;
  bool check = true;
};

// kLayers Linear(kWidth, kWidth) with tanh between, initialised from `seed`.
class Deep : public weft::nn::Module {
 public:
  explicit Deep(uint64_t seed) : Module("Deep") {
    weft::Generator gen(seed);
    for (int i = 0; i < kLayers; ++i) {
      std::string name = "l";
      name += std::to_string(i);
      auto l = registerModule(name, std::make_shared<weft::nn::Linear>(kWidth, kWidth));
      l->resetParameters(&gen);
      layers_.push_back(l);
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : layers_) h = weft::tanh(l->forward(h));
    return h;
  }

 private:
  std::vector<std::shared_ptr<weft::nn::Linear>> layers_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// One training step of one path; returns its time in milliseconds.
template <class Backward>
double timedStep(weft::nn::optim::SGD& opt, const Tensor& x,
                 const std::function<Tensor(const Tensor&)>& forward, Backward&& afterBackward) {
  auto t0 = Clock::now();
  opt.zeroGrad();
  Tensor loss = weft::square(forward(x)).mean();
  loss.backward();
  afterBackward();
  opt.step();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int runRank(int rank, uint16_t port, const Config& cfg) {
  std::unique_ptr<weft::rpc::StoreServer> server;
  if (rank == 0) {
    weft::rpc::StoreServer::Config sc;
    sc.port = port;
    server = std::make_unique<weft::rpc::StoreServer>(sc);
  }
  weft::rpc::StoreClient::Config cc;
  cc.port = port;
  cc.timeout = 30s;
  weft::rpc::StoreClient store(cc);
  auto pg = weft::collectives::createGlooGroup(store, rank, 2, {.timeout = 60s, .checkCalls = cfg.check});

  // Four replicas of the same model: DDP (default 25 MiB buckets: one bucket), DDP with 256 KiB
  // buckets (4 buckets), the per-parameter loop, and no communication.
  auto ddpNet = std::make_shared<Deep>(1);
  auto smallNet = std::make_shared<Deep>(1);
  auto loopNet = std::make_shared<Deep>(1);
  auto localNet = std::make_shared<Deep>(1);
  DistributedDataParallel ddp(ddpNet, *pg);
  DistributedDataParallel ddpSmall(smallNet, *pg, {.bucketCapBytes = 256 << 10});
  const double lr = 1e-3;
  weft::nn::optim::SGD ddpOpt(ddpNet->parameters(), {.lr = lr});
  weft::nn::optim::SGD smallOpt(smallNet->parameters(), {.lr = lr});
  weft::nn::optim::SGD loopOpt(loopNet->parameters(), {.lr = lr});
  weft::nn::optim::SGD localOpt(localNet->parameters(), {.lr = lr});
  const auto loopParams = loopNet->parameters();

  auto viaDdp = [&](const Tensor& in) { return ddp.forward(in); };
  auto viaSmall = [&](const Tensor& in) { return ddpSmall.forward(in); };
  auto viaLoop = [&](const Tensor& in) { return loopNet->forward(in); };
  auto viaLocal = [&](const Tensor& in) { return localNet->forward(in); };
  auto nothing = [] {};
  auto loopAllReduce = [&] {
    std::vector<Work> works;
    works.reserve(loopParams.size());
    for (const Tensor& p : loopParams) works.push_back(pg->allReduce(p.grad(), ReduceOp::Sum));
    for (Work& w : works) w.wait();
    weft::NoGradGuard noGrad;
    for (const Tensor& p : loopParams) p.grad().mul_(0.5);
  };

  std::vector<double> tDdp, tSmall, tLoop, tLocal;
  const int warmup = 10;
  weft::Generator gen(77 + static_cast<uint64_t>(rank));
  for (int it = 0; it < warmup + cfg.iters; ++it) {
    Tensor x = weft::randn({cfg.batch, kWidth}, {}, &gen);
    double a = timedStep(ddpOpt, x, viaDdp, nothing);
    double b = timedStep(smallOpt, x, viaSmall, nothing);
    double c = timedStep(loopOpt, x, viaLoop, loopAllReduce);
    double d = timedStep(localOpt, x, viaLocal, nothing);
    if (it < warmup) continue;
    tDdp.push_back(a);
    tSmall.push_back(b);
    tLoop.push_back(c);
    tLocal.push_back(d);
  }
  // The DDP replicas and the loop replica took the same steps: check they agree.
  double maxDiff = 0;
  auto pd = ddpNet->parameters();
  for (size_t i = 0; i < pd.size(); ++i) {
    maxDiff = std::max(maxDiff, weft::max(weft::abs(pd[i] - loopParams[i])).item<double>());
  }
  pg->barrier().wait();
  if (rank == 0) {
    std::printf("ddp_bench: %d x Linear(%lld, %lld) (%zu parameters, %.2f MiB of gradients), batch %lld, "
                "2 processes, %d steps per path, call check %s\n",
                kLayers, static_cast<long long>(kWidth), static_cast<long long>(kWidth), loopParams.size(),
                static_cast<double>(kLayers * (kWidth * kWidth + kWidth) * 4) / (1 << 20),
                static_cast<long long>(cfg.batch), cfg.iters, cfg.check ? "on" : "off");
    std::printf("%-34s %10s %10s %10s\n", "path", "median_ms", "p10_ms", "p90_ms");
    auto row = [](const char* name, const std::vector<double>& t) {
      std::printf("%-34s %10.3f %10.3f %10.3f\n", name, median(t), quantile(t, 0.1), quantile(t, 0.9));
    };
    row("ddp (25 MiB buckets: 1)", tDdp);
    row("ddp (256 KiB buckets: 4)", tSmall);
    row("per-parameter allreduce loop", tLoop);
    row("no communication (floor)", tLocal);
    std::printf("ratio loop / ddp: %.2fx (25 MiB buckets), %.2fx (256 KiB buckets)\n", median(tLoop) / median(tDdp),
                median(tLoop) / median(tSmall));
    std::printf("ddp vs loop parameters after the run: max |difference| %.3g\n", maxDiff);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Config cfg;
    // Rank 1 gets "--rank1 PORT" followed by rank 0's own arguments.
    const bool isRank1 = argc >= 3 && std::string(argv[1]) == "--rank1";
    weft::bench::Flags flags;
    flags.onValue("--iters", [&](const std::string& v) {
      cfg.iters = static_cast<int>(weft::bench::intFlag("--iters", v, 1, 1 << 30));
    });
    flags.onValue("--batch", [&](const std::string& v) {
      cfg.batch = static_cast<int>(weft::bench::intFlag("--batch", v, 1, 1 << 20));
    });
    flags.onSwitch("--no-check", [&] { cfg.check = false; });
    if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "ddp_bench",
                                        "usage: ddp_bench [--iters N] [--batch B] [--no-check]\n", isRank1 ? 3 : 1)) {
      return 2;
    }
    if (isRank1) return runRank(1, static_cast<uint16_t>(std::stoi(argv[2])), cfg);
    // Rank 1: this program again, with "--rank1 PORT" before rank 0's own arguments.
    const uint16_t port = weft::bench::freePort();
    std::vector<std::string> args = {"ddp_bench", "--rank1", std::to_string(port)};
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    weft::bench::ServerProcess rank1(std::move(args));
    int rc = runRank(0, port, cfg);
    rank1.waitForExit(std::chrono::seconds(60));
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_bench: %s\n", e.what());
    return 1;
  }
}
