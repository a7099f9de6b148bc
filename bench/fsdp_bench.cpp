// fsdp_bench: one training step of a GPT (AdamW, float32) through DistributedDataParallel +
// nn::optim::AdamW, DDP + ZeroRedundancyOptimizer (ZeRO-1), ShardedDataParallel (ZeRO-2) and
// FullyShardedDataParallel (ZeRO-3, and with reshardAfterForward off), side by side in one job:
// the median step time of each, its ratio to DDP's, and per rank the bytes held by tensors after
// training and the peak during the steps (Storage::memoryStats, counted from before the model was
// built, so the parameters are included; the peak is reset once the method is built; the largest
// over the ranks), against the accounting for float32 AdamW: 20Ψ (DDP: parameters 4, .grad 4,
// bucket buffers 4, state 8), 12Ψ + 8Ψ/N, 4Ψ + 12Ψ/N and 16Ψ/N bytes. Then the same four in
// mixed precision (bfloat16 parameters and gradients, float32 reduction, float32 masters and
// AdamW state; forward under autocast::Scope(BFloat16)): DDP + nn::optim::MasterWeightOptimizer,
// DDP + ZeroRedundancyOptimizer with masterWeights, ShardedDataParallel with masterWeights, FSDP
// with its bfloat16 policy, against the ZeRO paper's 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and 16Ψ/N; DDP
// and ZeRO-2 also with a float16 reduction (rows -bf16h): the same bytes held, the reduction
// buffers in flight during backward half as large.
// Last, rank 0 runs bench/torch_fsdp_step.py (PyTorch's FullyShardedDataParallel on CPU over gloo,
// the same GPT, as many processes) while the other ranks wait, and prints its step time and
// peak memory beside weft's ZeRO-3, or why it does not run. --no-torch skips it.
// Run under the launcher, one process per rank:
//
//   weftrun -n 4 build/bench/fsdp_bench [--iters N] [--layers L] [--width C] [--batch B] [--checkpoint]
//                                      [--no-torch]
//
// --checkpoint: every method's GPT recomputes each block in backward (GPTConfig::checkpoint), so
// that activations, which no ZeRO stage shards, take less of the peak.
//
// The methods take turns, each for all its iterations (their memory must not overlap); each
// starts from the same initial model. On fewer cores than ranks the times include the ranks'
// competition for the cores.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "collectives/ddp.h"
#include "collectives/fsdp.h"
#include "collectives/init.h"
#include "collectives/sharded_ddp.h"
#include "collectives/zero.h"
#include "nn/functional.h"
#include "nn/master_weights.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

namespace {

using Clock = std::chrono::steady_clock;
using weft::Tensor;
using weft::collectives::DistributedDataParallel;
using weft::collectives::FullyShardedDataParallel;
using weft::collectives::ProcessGroup;
using weft::collectives::ReduceOp;
using weft::collectives::ShardedDataParallel;
using weft::collectives::ZeroRedundancyOptimizer;

constexpr const char* kUsage =
    "usage: fsdp_bench [--iters N] [--layers L] [--width C] [--batch B] [--checkpoint] [--no-torch]";

struct Config {
  int iters = 20;
  int64_t layers = 4;
  int64_t width = 128;
  int64_t batch = 8;
  int64_t vocab = 256;
  int64_t block = 64;
  bool checkpoint = false;  // every block, for every method
  bool torch = true;
};

std::shared_ptr<weft::nn::GPT> makeGpt(const Config& cfg) {
  weft::nn::GPTConfig c;
  c.vocabSize = cfg.vocab;
  c.blockSize = cfg.block;
  c.layers = cfg.layers;
  c.heads = 4;
  c.width = cfg.width;
  if (cfg.checkpoint) c.checkpoint = weft::nn::CheckpointPolicy::everyBlock();
  weft::Generator init(7);
  return std::make_shared<weft::nn::GPT>(c, &init);
}

weft::nn::optim::OptimizerOptions adamw() {
  return weft::nn::optim::AdamWOptions{.lr = 3e-4, .betas = {0.9, 0.95}, .eps = 1e-8, .weightDecay = 0.1};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The largest of the ranks' values.
double maxOverRanks(ProcessGroup& pg, double v) {
  Tensor t = weft::scalarTensor(v, weft::DType::Float64).reshape({1});
  pg.allReduce(t, ReduceOp::Max).wait();
  return t.item<double>();
}

size_t settledLive(ProcessGroup& pg) {
  pg.barrier().wait();
  return weft::Storage::memoryStats().liveBytes;
}

struct Result {
  double stepMs = 0;
  double heldBytes = 0;  // after training, parameters included (largest rank)
  double peakBytes = 0;  // during the steps, parameters included (largest rank)
};

// Runs `iters` steps of `step(s)` after building the method with `make()`; measures around them.
template <class Make>
Result run(ProcessGroup& pg, const Config& cfg, Make make) {
  const size_t before = settledLive(pg);
  auto net = makeGpt(cfg);
  auto step = make(net);
  settledLive(pg);
  weft::Storage::resetPeakBytes();  // the steps' peak, not the construction's
  std::vector<double> ms;
  for (int s = 0; s < cfg.iters; ++s) {
    weft::Generator gen(100 + static_cast<uint64_t>(pg.rank()) * 1000 + static_cast<uint64_t>(s));
    Tensor idx = weft::randint(0, cfg.vocab, {cfg.batch, cfg.block}, {.dtype = weft::DType::Int64}, &gen);
    Tensor targets = weft::randint(0, cfg.vocab, {cfg.batch, cfg.block}, {.dtype = weft::DType::Int64}, &gen);
    pg.barrier().wait();
    const auto t0 = Clock::now();
    step(idx, targets);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  Result r;
  r.stepMs = maxOverRanks(pg, median(ms));
  r.heldBytes = maxOverRanks(pg, static_cast<double>(settledLive(pg)) - static_cast<double>(before));
  r.peakBytes =
      maxOverRanks(pg, static_cast<double>(weft::Storage::memoryStats().peakBytes) - static_cast<double>(before));
  return r;
}

Tensor lossOf(const Tensor& logits, const Tensor& targets, int64_t vocab) {
  return weft::nn::functional::crossEntropy(logits.view({-1, vocab}), targets.view({-1}));
}

// The loss of a forward under autocast::Scope(BFloat16).
template <class Forward>
Tensor mixedLossOf(Forward&& forward, const Tensor& idx, const Tensor& targets, int64_t vocab) {
  weft::autocast::Scope amp(weft::DType::BFloat16);
  return lossOf(forward(idx), targets, vocab);
}

// What bench/torch_fsdp_step.py printed: its "import" and "run" lines, and the run's figures
// when it ran.
struct TorchFsdp {
  std::string versions, import, run;
  double stepMs = 0;
  double peakRssMb = 0;
  bool ok = false;
};

TorchFsdp torchFsdp(const Config& cfg, int world) {
  const std::string cmd = "/usr/bin/python3 " WEFT_BENCH_DIR "/torch_fsdp_step.py --world " + std::to_string(world) +
                          " --layers " + std::to_string(cfg.layers) + " --width " + std::to_string(cfg.width) +
                          " --block " + std::to_string(cfg.block) + " --batch " + std::to_string(cfg.batch) +
                          " --steps " + std::to_string(cfg.iters) + " 2>/dev/null";
  TorchFsdp r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    r.run = "run error: could not start /usr/bin/python3";
    return r;
  }
  char buf[2048] = {};
  while (std::fgets(buf, sizeof buf, p)) {
    std::string line(buf);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    if (line.rfind("versions ", 0) == 0) r.versions = line.substr(9);
    if (line.rfind("import ", 0) == 0) r.import = line;
    if (line.rfind("run ", 0) == 0) r.run = line;
  }
  const int status = pclose(p);
  if (r.run.empty()) {
    r.run = "run error: bench/torch_fsdp_step.py printed no result (status " + std::to_string(status) +
            "; is torch installed for /usr/bin/python3?)";
  }
  r.ok = r.run.find(" ok ") != std::string::npos;
  std::istringstream in(r.run);
  std::string key;
  while (in >> key) {
    if (key == "step_ms") in >> r.stepMs;
    if (key == "peak_rss_mb") in >> r.peakRssMb;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  weft::bench::Flags flags;
  flags.onValue("--iters", [&](const std::string& v) { cfg.iters = weft::bench::intFlag("--iters", v, 1, 100000); });
  flags.onValue("--layers", [&](const std::string& v) { cfg.layers = weft::bench::intFlag("--layers", v, 1, 64); });
  flags.onValue("--width", [&](const std::string& v) { cfg.width = weft::bench::intFlag("--width", v, 4, 4096); });
  flags.onValue("--batch", [&](const std::string& v) { cfg.batch = weft::bench::intFlag("--batch", v, 1, 4096); });
  flags.onSwitch("--checkpoint", [&] { cfg.checkpoint = true; });
  flags.onSwitch("--no-torch", [&] { cfg.torch = false; });
  if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "fsdp_bench", kUsage)) return 2;
  if (cfg.width % 4 != 0) {
    std::fprintf(stderr, "fsdp_bench: --width must be a multiple of 4 (the heads)\n%s\n", kUsage);
    return 2;
  }
  auto pg = weft::collectives::init();
  const int world = pg->size();
  const double psi = static_cast<double>(makeGpt(cfg)->numParameters());
  const int64_t vocab = cfg.vocab;

  Result ddp = run(*pg, cfg, [&](const std::shared_ptr<weft::nn::GPT>& net) {
    auto d = std::make_shared<DistributedDataParallel>(net, *pg);
    auto opt = std::make_shared<weft::nn::optim::AdamW>(weft::nn::optim::decayGroups(net->namedParameters(), adamw()));
    return [d, opt, vocab](const Tensor& idx, const Tensor& targets) {
      opt->zeroGrad();
      lossOf(d->forward(idx), targets, vocab).backward();
      opt->step();
    };
  });
  Result zero1 = run(*pg, cfg, [&](const std::shared_ptr<weft::nn::GPT>& net) {
    auto d = std::make_shared<DistributedDataParallel>(net, *pg);
    auto opt = std::make_shared<ZeroRedundancyOptimizer>(
        weft::nn::optim::decayGroups(net->namedParameters(), adamw()), *pg);
    return [d, opt, vocab](const Tensor& idx, const Tensor& targets) {
      opt->zeroGrad();
      lossOf(d->forward(idx), targets, vocab).backward();
      opt->step();
    };
  });
  Result zero2 = run(*pg, cfg, [&](const std::shared_ptr<weft::nn::GPT>& net) {
    auto s = std::make_shared<ShardedDataParallel>(net, weft::nn::optim::decayGroups(net->namedParameters(), adamw()),
                                                   *pg);
    return [s, vocab](const Tensor& idx, const Tensor& targets) {
      s->zeroGrad();
      lossOf(s->forward(idx), targets, vocab).backward();
      s->step();
    };
  });

  auto zero3 = [&](bool reshard) {
    return run(*pg, cfg, [&, reshard](const std::shared_ptr<weft::nn::GPT>& net) {
      auto f = std::make_shared<FullyShardedDataParallel>(
          net, *pg, FullyShardedDataParallel::Options{.reshardAfterForward = reshard});
      auto opt = std::make_shared<weft::nn::optim::AdamW>(
          f->parameters(), std::get<weft::nn::optim::AdamWOptions>(adamw()));
      return [f, opt, vocab](const Tensor& idx, const Tensor& targets) {
        opt->zeroGrad();
        lossOf(f->forward(idx), targets, vocab).backward();
        opt->step();
      };
    });
  };
  Result zero3Reshard = zero3(true);
  Result zero3Keep = zero3(false);

  // Mixed precision: the module in bfloat16, float32 reduction, float32 masters.
  const DistributedDataParallel::Options reduceF32{.reduceDtype = weft::DType::Float32};
  auto mpDdpWith = [&](weft::DType reduce) {
    return run(*pg, cfg, [&, reduce](const std::shared_ptr<weft::nn::GPT>& net) {
      net->to(weft::DType::BFloat16);
      auto d =
          std::make_shared<DistributedDataParallel>(net, *pg, DistributedDataParallel::Options{.reduceDtype = reduce});
      auto opt = std::make_shared<weft::nn::optim::MasterWeightOptimizer>(
          weft::nn::optim::decayGroups(net->namedParameters(), adamw()));
      return [d, opt, vocab](const Tensor& idx, const Tensor& targets) {
        opt->zeroGrad();
        mixedLossOf([&d](const Tensor& x) { return d->forward(x); }, idx, targets, vocab).backward();
        opt->step();
      };
    });
  };
  Result mpDdp = mpDdpWith(weft::DType::Float32);
  Result mpDdp16 = mpDdpWith(weft::DType::Float16);
  Result mpZero1 = run(*pg, cfg, [&](const std::shared_ptr<weft::nn::GPT>& net) {
    net->to(weft::DType::BFloat16);
    auto d = std::make_shared<DistributedDataParallel>(net, *pg, reduceF32);
    auto opt = std::make_shared<ZeroRedundancyOptimizer>(weft::nn::optim::decayGroups(net->namedParameters(), adamw()),
                                                         *pg, ZeroRedundancyOptimizer::Options{.masterWeights = true});
    return [d, opt, vocab](const Tensor& idx, const Tensor& targets) {
      opt->zeroGrad();
      mixedLossOf([&d](const Tensor& x) { return d->forward(x); }, idx, targets, vocab).backward();
      opt->step();
    };
  });
  auto mpZero2With = [&](weft::DType reduce) {
    return run(*pg, cfg, [&, reduce](const std::shared_ptr<weft::nn::GPT>& net) {
      net->to(weft::DType::BFloat16);
      auto s = std::make_shared<ShardedDataParallel>(
          net, weft::nn::optim::decayGroups(net->namedParameters(), adamw()), *pg,
          ShardedDataParallel::Options{.reduceDtype = reduce, .masterWeights = true});
      return [s, vocab](const Tensor& idx, const Tensor& targets) {
        s->zeroGrad();
        mixedLossOf([&s](const Tensor& x) { return s->forward(x); }, idx, targets, vocab).backward();
        s->step();
      };
    });
  };
  Result mpZero2 = mpZero2With(weft::DType::Float32);
  Result mpZero2r16 = mpZero2With(weft::DType::Float16);
  Result mpZero3 = run(*pg, cfg, [&](const std::shared_ptr<weft::nn::GPT>& net) {
    auto f = std::make_shared<FullyShardedDataParallel>(
        net, *pg,
        FullyShardedDataParallel::Options{
            .mixedPrecision = {.param = weft::DType::BFloat16, .reduce = weft::DType::Float32}});
    auto opt =
        std::make_shared<weft::nn::optim::AdamW>(f->parameters(), std::get<weft::nn::optim::AdamWOptions>(adamw()));
    return [f, opt, vocab](const Tensor& idx, const Tensor& targets) {
      opt->zeroGrad();
      lossOf(f->forward(idx), targets, vocab).backward();
      opt->step();
    };
  });

  // PyTorch's FSDP on the same cores: rank 0 runs it while the others wait.
  TorchFsdp torch;
  if (cfg.torch && pg->rank() == 0) torch = torchFsdp(cfg, world);
  pg->barrier().wait();

  if (pg->rank() == 0) {
    const double n = world;
    std::printf("fsdp_bench: GPT of %.0f parameters (layers %lld, width %lld, vocab %lld, block %lld), batch %lld per "
                "rank, %d ranks, %d steps each, AdamW float32%s\n",
                psi, static_cast<long long>(cfg.layers), static_cast<long long>(cfg.width),
                static_cast<long long>(cfg.vocab), static_cast<long long>(cfg.block), static_cast<long long>(cfg.batch),
                world, cfg.iters, cfg.checkpoint ? ", every block checkpointed" : "");
    std::printf("%-11s %10s %8s %14s %10s %14s %14s\n", "method", "step ms", "vs DDP", "held B/param", "formula",
                "peak B/param", "peak vs DDP");
    auto row = [&](const char* name, const Result& r, double formula) {
      std::printf("%-11s %10.2f %8.2f %14.2f %10.2f %14.2f %14.2f\n", name, r.stepMs, r.stepMs / ddp.stepMs,
                  r.heldBytes / psi, formula, r.peakBytes / psi, r.peakBytes / ddp.peakBytes);
    };
    row("ddp", ddp, 20);
    row("zero1", zero1, 12 + 8 / n);
    row("zero2", zero2, 4 + 12 / n);
    row("zero3", zero3Reshard, 16 / n);
    row("zero3-kf", zero3Keep, 16 / n);
    std::printf("(bytes per parameter, parameters included; peak includes activations and gathered units; "
                "zero3-kf: FSDP with reshardAfterForward off)\n");
    std::printf("mixed precision: bfloat16 parameters and gradients, float32 reduction (-bf16h: float16), float32 "
                "masters + AdamW state (the ZeRO paper's 2 + 2 + 12 bytes per parameter)\n");
    row("ddp-bf16", mpDdp, 16);
    row("ddp-bf16h", mpDdp16, 16);
    row("zero1-bf16", mpZero1, 4 + 12 / n);
    row("zero2-bf16", mpZero2, 2 + 14 / n);
    row("zero2-bf16h", mpZero2r16, 2 + 14 / n);
    row("zero3-bf16", mpZero3, 16 / n);
    if (cfg.torch) {
      std::printf("PyTorch FSDP (%s, gloo, %d processes, float32):\n", torch.versions.c_str(), world);
      if (torch.ok) {
        std::printf("%-11s %10.2f %8.2f %14s %10s %14s %14s   weft zero3 / PyTorch step time %.2f; peak RSS growth "
                    "%.1f MiB per rank (weft zero3 peak tensors %.1f MiB)\n",
                    "torch-fsdp", torch.stepMs, torch.stepMs / ddp.stepMs, "-", "-", "-", "-",
                    zero3Reshard.stepMs / torch.stepMs, torch.peakRssMb, zero3Reshard.peakBytes / (1 << 20));
      } else {
        std::printf("  does not run. %s\n  %s\n", torch.import.c_str(), torch.run.c_str());
      }
    }
  }
  pg->barrier().wait();
  return 0;
}
