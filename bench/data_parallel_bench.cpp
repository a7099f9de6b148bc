// data_parallel_bench: the training step of the Fashion-MNIST MLP (784-256-128-10) and of the
// parameter-server CNN (two convolutions, max pooling, two linear layers; no dropout) on one global
// batch, three ways on the same CPUs in the same run:
//  - one process, the plain module, its kernels on the pool (--threads threads);
//  - nn::DataParallel with 2 replicas in that process (each replica's forward on a thread of its
//    own, one kernel thread each; backward and the optimizer on the pool);
//  - DistributedDataParallel on 2 processes (Gloo, 127.0.0.1), half the batch each, one kernel
//    thread each.
// A step is zeroGrad, forward, cross-entropy, backward and an SGD update (momentum 0.9). The bench
// re-executes itself as rank 1 (`/proc/self/exe --rank1 PORT ...`); the paths run in alternating
// blocks of --block steps (the single-process paths interleaved step by step, rank 1 waiting in a
// barrier meanwhile), so drift in machine load hits them alike. Rank 0 prints median step times,
// their ratios, and DataParallel's step split into the coordinator's own work (scatter, replicate,
// gather), the replicas' forwards, backward and the optimizer.
//
//   data_parallel_bench [--model mlp|cnn|both] [--iters N] [--block N] [--batch B] [--threads T]
//
// Inputs are random with the dataset's shapes (the step time does not depend on the pixel values).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/two_process.h"
#include "collectives/ddp.h"
#include "collectives/gloo/process_group_gloo.h"
#include "kernels/cpu/parallel.h"
#include "nn/nn.h"
#include "rpc/store.h"
#include "tensor/ops.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using weft::Tensor;
namespace nn = weft::nn;

struct Config {
  std::string model = "both";
  int iters = 60;
  int block = 10;
  int64_t batch = 64;
  int threads = 2;
};

std::shared_ptr<nn::Module> makeMlp() {
  return nn::makeSequential({std::make_shared<nn::Linear>(784, 256), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::Linear>(256, 128), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::Linear>(128, 10)});
}

std::shared_ptr<nn::Module> makeCnn() {
  return nn::makeSequential({std::make_shared<nn::Conv2d>(1, 32, 3), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::Conv2d>(32, 64, 3), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Flatten>(),
                             std::make_shared<nn::Linear>(9216, 128), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::Linear>(128, 10)});
}

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// The phases of one step, in milliseconds.
struct StepTimes {
  double step = 0, forward = 0, backward = 0, update = 0;
};

StepTimes timedStep(nn::optim::SGD& opt, const std::function<Tensor(const Tensor&)>& forward, const Tensor& x,
                    const Tensor& y) {
  auto t0 = Clock::now();
  opt.zeroGrad();
  Tensor loss = weft::crossEntropy(forward(x), y);
  auto t1 = Clock::now();
  loss.backward();
  auto t2 = Clock::now();
  opt.step();
  auto t3 = Clock::now();
  return {ms(t0, t3), ms(t0, t1), ms(t1, t2), ms(t2, t3)};
}

void runModel(int rank, weft::collectives::ProcessGroup& pg, const Config& cfg, const std::string& name,
              const std::function<std::shared_ptr<nn::Module>()>& make, const weft::Shape& sample) {
  const nn::optim::SGDOptions sgd{.lr = 0.01, .momentum = 0.9};
  weft::manualSeed(1);
  auto ddpNet = make();
  weft::collectives::DistributedDataParallel ddp(ddpNet, pg);
  nn::optim::SGD ddpOpt(ddpNet->parameters(), sgd);
  std::shared_ptr<nn::Module> localNet, dpModule;
  std::unique_ptr<nn::DataParallel> dp;
  std::unique_ptr<nn::optim::SGD> localOpt, dpOpt;
  if (rank == 0) {
    weft::manualSeed(1);
    localNet = make();
    weft::manualSeed(1);
    dpModule = make();
    dp = std::make_unique<nn::DataParallel>(dpModule, make, 2);
    localOpt = std::make_unique<nn::optim::SGD>(localNet->parameters(), sgd);
    dpOpt = std::make_unique<nn::optim::SGD>(dpModule->parameters(), sgd);
  }
  auto viaLocal = [&](const Tensor& in) { return localNet->forward(in); };
  auto viaDp = [&](const Tensor& in) { return dp->forward(in); };
  auto viaDdp = [&](const Tensor& in) { return ddp.forward(in); };

  weft::Shape shape = {cfg.batch};
  shape.insert(shape.end(), sample.begin(), sample.end());
  weft::Generator gen(77);
  std::vector<StepTimes> local, viaDataParallel, distributed;
  std::vector<nn::DataParallelTimes> coordinator;
  const int warmup = std::min(cfg.block, 3);
  const std::string load0 = weft::bench::loadAverage();
  for (int done = -warmup; done < cfg.iters;) {
    const int steps = done < 0 ? warmup : std::min(cfg.block, cfg.iters - done);
    if (rank == 0) {
      weft::kernels::cpu::setNumThreads(cfg.threads);
      for (int s = 0; s < steps; ++s) {
        Tensor x = weft::randn(shape, {}, &gen);
        Tensor y = weft::randint(0, 10, {cfg.batch}, {.dtype = weft::DType::Int64}, &gen);
        StepTimes a = timedStep(*localOpt, viaLocal, x, y);
        StepTimes b = timedStep(*dpOpt, viaDp, x, y);
        if (done < 0) continue;
        local.push_back(a);
        viaDataParallel.push_back(b);
        coordinator.push_back(dp->lastForwardTimes());
      }
    }
    pg.barrier().wait();
    weft::kernels::cpu::setNumThreads(1);
    for (int s = 0; s < steps; ++s) {
      Tensor x = weft::randn(shape, {}, &gen);
      Tensor y = weft::randint(0, 10, {cfg.batch}, {.dtype = weft::DType::Int64}, &gen);
      const int64_t half = cfg.batch / 2;
      StepTimes c = timedStep(ddpOpt, viaDdp, x.narrow(0, rank * half, half), y.narrow(0, rank * half, half));
      if (done >= 0) distributed.push_back(c);
    }
    pg.barrier().wait();
    done += steps;
  }
  if (rank != 0) return;

  auto column = [](const std::vector<StepTimes>& v, double StepTimes::*field) {
    std::vector<double> out;
    for (const auto& t : v) out.push_back(t.*field);
    return out;
  };
  auto dpColumn = [&](const std::function<double(const nn::DataParallelTimes&)>& f) {
    std::vector<double> out;
    for (const auto& t : coordinator) out.push_back(1e3 * f(t));
    return out;
  };
  std::printf("\n%s: global batch %lld, %d steps per path; load average %s (start), %s (end)\n", name.c_str(),
              static_cast<long long>(cfg.batch), cfg.iters, load0.c_str(), weft::bench::loadAverage().c_str());
  std::printf("%-44s %10s %10s %10s\n", "path", "median_ms", "p10_ms", "p90_ms");
  auto row = [](const std::string& label, const std::vector<double>& t) {
    std::printf("%-44s %10.3f %10.3f %10.3f\n", label.c_str(), median(t), quantile(t, 0.1), quantile(t, 0.9));
  };
  const std::string threads = std::to_string(cfg.threads);
  row("one process (" + threads + " kernel threads)", column(local, &StepTimes::step));
  row("DataParallel, 2 replicas (" + threads + " kernel threads)", column(viaDataParallel, &StepTimes::step));
  row("DDP, 2 processes x 1 kernel thread (rank 0)", column(distributed, &StepTimes::step));
  const double tLocal = median(column(local, &StepTimes::step));
  const double tDp = median(column(viaDataParallel, &StepTimes::step));
  const double tDdp = median(column(distributed, &StepTimes::step));
  std::printf("ratios: DataParallel / one process %.2fx, DataParallel / DDP %.2fx, one process / DDP %.2fx\n",
              tDp / tLocal, tDp / tDdp, tLocal / tDdp);
  std::printf("one process step (medians, ms): forward %.3f (+ loss); backward %.3f; optimizer %.3f\n",
              median(column(local, &StepTimes::forward)), median(column(local, &StepTimes::backward)),
              median(column(local, &StepTimes::update)));
  std::printf("DataParallel step (medians, ms): forward %.3f = scatter %.3f + replicate %.3f + replicas %.3f + "
              "gather %.3f (+ loss); backward %.3f; optimizer %.3f\n",
              median(column(viaDataParallel, &StepTimes::forward)),
              median(dpColumn([](const nn::DataParallelTimes& t) { return t.scatter; })),
              median(dpColumn([](const nn::DataParallelTimes& t) { return t.replicate; })),
              median(dpColumn([](const nn::DataParallelTimes& t) { return t.run; })),
              median(dpColumn([](const nn::DataParallelTimes& t) { return t.gather; })),
              median(column(viaDataParallel, &StepTimes::backward)), median(column(viaDataParallel, &StepTimes::update)));
  std::vector<double> share;
  for (size_t i = 0; i < coordinator.size(); ++i) share.push_back(1e3 * coordinator[i].coordinator() / viaDataParallel[i].step);
  std::printf("coordinator's own work (scatter + replicate + gather): median %.3f ms, %.2f%% of the step; "
              "backward on the coordinating thread: %.1f%% of the step\n",
              median(dpColumn([](const nn::DataParallelTimes& t) { return t.coordinator(); })), 100 * median(share),
              100 * median(column(viaDataParallel, &StepTimes::backward)) / tDp);
  std::printf("DDP step, rank 0 (medians, ms): forward %.3f, backward with allreduce %.3f, optimizer %.3f\n",
              median(column(distributed, &StepTimes::forward)), median(column(distributed, &StepTimes::backward)),
              median(column(distributed, &StepTimes::update)));
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
  auto pg = weft::collectives::createGlooGroup(store, rank, 2, {.timeout = 300s});
  if (rank == 0) {
    std::printf("data_parallel_bench: one process vs DataParallel (2 replicas) vs DDP (2 processes); "
                "%d CPUs in this process's affinity mask at start\n",
                weft::kernels::cpu::numThreads());
  }
  if (cfg.model == "mlp" || cfg.model == "both") runModel(rank, *pg, cfg, "Fashion-MNIST MLP 784-256-128-10", makeMlp, {784});
  if (cfg.model == "cnn" || cfg.model == "both") {
    runModel(rank, *pg, cfg, "Fashion-MNIST CNN (2 conv, pool, 9216-128-10)", makeCnn, {1, 28, 28});
  }
  pg->barrier().wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Config cfg;
    const bool isRank1 = argc >= 3 && std::string(argv[1]) == "--rank1";
    weft::bench::Flags flags;
    flags.onValue("--model", [&](const std::string& v) {
      if (v != "mlp" && v != "cnn" && v != "both") weft::bench::fail("--model: expected mlp, cnn or both, got '" + v + "'");
      cfg.model = v;
    });
    flags.onValue("--iters", [&](const std::string& v) {
      cfg.iters = static_cast<int>(weft::bench::intFlag("--iters", v, 1, 1 << 20));
    });
    flags.onValue("--block", [&](const std::string& v) {
      cfg.block = static_cast<int>(weft::bench::intFlag("--block", v, 1, 1 << 20));
    });
    flags.onValue("--batch", [&](const std::string& v) {
      cfg.batch = weft::bench::intFlag("--batch", v, 2, 1 << 20);
      if (cfg.batch % 2) weft::bench::fail("--batch: must be even (DDP's two processes take half each)");
    });
    flags.onValue("--threads", [&](const std::string& v) {
      cfg.threads = static_cast<int>(weft::bench::intFlag("--threads", v, 1, 1024));
    });
    const char* usage =
        "usage: data_parallel_bench [--model mlp|cnn|both] [--iters N] [--block N] [--batch B] [--threads T]\n";
    if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "data_parallel_bench", usage, isRank1 ? 3 : 1)) return 2;
    if (isRank1) return runRank(1, static_cast<uint16_t>(std::stoi(argv[2])), cfg);
    const uint16_t port = weft::bench::freePort();
    std::vector<std::string> args = {"data_parallel_bench", "--rank1", std::to_string(port)};
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    weft::bench::ServerProcess rank1(std::move(args));
    int rc = runRank(0, port, cfg);
    rank1.waitForExit(std::chrono::seconds(60));
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_parallel_bench: %s\n", e.what());
    return 1;
  }
}
