// gpt_bench: training throughput of the gpt example's model, and what activation checkpointing
// costs and saves, in one run.
//
// 1. Tokens/s of one training step (forward, mean cross-entropy, backward, gradient clipping at
//    norm 1, AdamW with decay on the matrices only: the step of examples/gpt) on one fixed batch
//    of random bytes, for the example's default model (4 layers, 4 heads, width 128, context
//    128, batch 16) and a wider one (8 layers, 8 heads, width 256, context 256, batch 8). When
//    /usr/bin/python3 has torch, the same model and step in PyTorch (bench/torch_gpt_step.py,
//    same thread count), and the table gives weft/PyTorch. Each figure is batch * context / the
//    median step time; weft and PyTorch take turns for --rounds rounds and each side's best
//    round counts, so that both see the machine in the same states. PyTorch runs each round
//    twice, with its OpenMP threads' default wait policy and with OMP_WAIT_POLICY=PASSIVE: on a
//    machine whose cores other processes also use, threads that spin at every barrier lose most
//    of their time, and the better of the two is PyTorch's figure (the table names which).
// 2. Checkpointing (GPTConfig::checkpoint): for each model and policy, the bytes the step's
//    activations hold at the end of forward (Storage::memoryStats: live bytes after loss() minus
//    live bytes before it), the peak bytes above the step's start (resetPeakBytes at the start),
//    and the median step time (the policies take turns, best of the rounds), against no
//    checkpointing.
//
// PyTorch multiplies through Debian's OpenBLAS (DYNAMIC_ARCH), whose kernels OPENBLAS_CORETYPE in
// the environment picks (the bench prints it and the kernels OpenBLAS runs): e.g. with
// OPENBLAS_CORETYPE=Haswell on an AVX-512 machine it uses the AVX2 kernels, about 1.5x slower
// than the detected ones on the wide model. weft multiplies float32 with its own AVX-512 kernel
// where the CPU has AVX-512F (kernels/cpu/sgemm.h; printed), whatever that variable says, and
// through the same OpenBLAS otherwise or under WEFT_GEMM=blas. Compare ratios taken under the
// same settings.
//
// Usage: gpt_bench [--quick] [--threads N] [--steps N] [--rounds R] [--models default,wide] [--no-torch]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/median_time.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/sgemm.h"
#include "nn/nn.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "nn/utils.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

using namespace weft;

extern "C" char* openblas_get_corename(void);

namespace {

struct Model {
  const char* name;
  int64_t layers, heads, width, block, batch;
};

constexpr Model kModels[] = {
    {"default", 4, 4, 128, 128, 16},
    {"wide", 8, 8, 256, 256, 8},
};

// The example's training step over one fixed batch.
class Step {
 public:
  Step(const Model& m, nn::CheckpointPolicy policy)
      : model_(std::make_shared<nn::GPT>(nn::GPTConfig{.vocabSize = 256,
                                                       .blockSize = m.block,
                                                       .layers = m.layers,
                                                       .heads = m.heads,
                                                       .width = m.width,
                                                       .checkpoint = policy},
                                         &init_)),
        opt_(nn::optim::decayGroups(model_->namedParameters(),
                                    nn::optim::AdamWOptions{.lr = 1e-3, .betas = {0.9, 0.95}, .weightDecay = 0.1})) {
    Generator g(1);
    Tensor data = randint(0, 256, {m.batch, m.block + 1}, {.dtype = DType::Int64}, &g);
    x_ = data.narrow(1, 0, m.block).contiguous();
    y_ = data.narrow(1, 1, m.block).contiguous();
  }

  // One step; with `mem`, the activation bytes and the peak above the start into it.
  double run(Storage::MemoryStats* mem = nullptr) {
    opt_.zeroGrad(true);
    const size_t start = Storage::memoryStats().liveBytes;
    if (mem) Storage::resetPeakBytes();
    Tensor loss = model_->loss(x_, y_);
    if (mem) mem->liveBytes = Storage::memoryStats().liveBytes - start;
    loss.backward();
    nn::clipGradNorm_(model_->parameters(), 1.0);
    opt_.step();
    if (mem) mem->peakBytes = Storage::memoryStats().peakBytes - start;
    return loss.item<double>();
  }

  int64_t numParameters() const { return model_->numParameters(); }

 private:
  Generator init_{0};
  std::shared_ptr<nn::GPT> model_;
  nn::optim::AdamW opt_;
  Tensor x_, y_;
};

struct TorchResult {
  int64_t params = 0;
  double tokensPerSecond = 0;
  const char* waitPolicy = "";
};

// The PyTorch twin's figures; zero tokens/s when torch is unavailable or the script failed.
// `passive`: with OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads sleep instead of spinning).
TorchResult torchStep(const Model& m, int threads, int steps, int warmup, bool passive) {
  std::string cmd = std::string(passive ? "OMP_WAIT_POLICY=PASSIVE " : "") + "/usr/bin/python3 " WEFT_BENCH_DIR "/torch_gpt_step.py --layers " + std::to_string(m.layers) +
                    " --heads " + std::to_string(m.heads) + " --width " + std::to_string(m.width) + " --block " +
                    std::to_string(m.block) + " --batch " + std::to_string(m.batch) + " --steps " +
                    std::to_string(steps) + " --warmup " + std::to_string(warmup) + " --threads " +
                    std::to_string(threads) + " 2>/dev/null";
  TorchResult r;
  r.waitPolicy = passive ? "passive" : "default";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[512] = {};
  if (std::fgets(buf, sizeof buf, p)) {
    std::istringstream in(buf);
    std::string key;
    while (in >> key) {
      if (key == "params") in >> r.params;
      else if (key == "tokens_per_s") in >> r.tokensPerSecond;
      else in >> key;
    }
  }
  pclose(p);
  return r;
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, torch = true;
  int threads = kernels::cpu::numThreads();
  int steps = 0;
  int rounds = 0;
  std::string models = "default,wide";
  weft::bench::Flags flags;
  flags.onSwitch("--quick", [&] { quick = true; });
  flags.onSwitch("--no-torch", [&] { torch = false; });
  flags.onValue("--threads", [&](const std::string& v) { threads = static_cast<int>(bench::intFlag("--threads", v, 1, 256)); });
  flags.onValue("--steps", [&](const std::string& v) { steps = static_cast<int>(bench::intFlag("--steps", v, 1, 100000)); });
  flags.onValue("--rounds", [&](const std::string& v) { rounds = static_cast<int>(bench::intFlag("--rounds", v, 1, 100)); });
  flags.onValue("--models", [&](const std::string& v) { models = v; });
  if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "gpt_bench",
                                      "usage: gpt_bench [--quick] [--threads N] [--steps N] [--rounds R] "
                                      "[--models default,wide] [--no-torch]\n")) {
    return 2;
  }
  if (threads < 1) threads = 1;
  if (rounds < 1) rounds = quick ? 1 : 2;
  kernels::cpu::setNumThreads(threads);
  std::vector<const Model*> chosen;
  for (const Model& m : kModels) {
    if (("," + models + ",").find(std::string(",") + m.name + ",") != std::string::npos) chosen.push_back(&m);
  }
  std::printf("threads: %d (weft kernels; torch.set_num_threads for PyTorch); best of %d alternating rounds\n",
              threads, rounds);
  // PyTorch multiplies through OpenBLAS, whose kernels this variable picks (unset: the library's
  // detection of the CPU), and so does weft where it does not use its own float32 kernel: say
  // which, since the ratio depends on it.
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  std::printf("OpenBLAS kernels: %s, %s\n",
              core && *core ? (std::string("OPENBLAS_CORETYPE=") + core).c_str() : "detected (OPENBLAS_CORETYPE unset)",
              openblas_get_corename());
  std::printf("weft's float32 products: %s\n",
              weft::kernels::cpu::ownSgemmAvailable() ? "its own AVX-512 kernel (kernels/cpu/sgemm.h)"
                                                      : "OpenBLAS (no AVX-512F, or WEFT_GEMM=blas)");

  std::printf("\n== training step tokens/s (forward, cross-entropy, backward, clip, AdamW), median of steps\n");
  std::printf("%-8s %10s %8s %7s %12s %12s %12s  %s\n", "model", "params", "tokens", "steps", "weft", "pytorch",
              "weft/pytorch", "pytorch's OpenMP wait");
  for (const Model* m : chosen) {
    const bool wide = m->width > 128;
    const int n = steps > 0 ? steps : (quick ? 3 : (wide ? 3 : 10));
    const int warmup = wide || quick ? 1 : 2;
    Step step(*m, nn::CheckpointPolicy::none());
    const double tokens = static_cast<double>(m->batch * m->block);
    double w = 0;
    TorchResult t;
    for (int r = 0; r < rounds; ++r) {
      w = std::max(w, tokens / bench::medianSeconds(r == 0 ? warmup : 0, n, [&] { step.run(); }));
      if (!torch) continue;
      for (bool passive : {false, true}) {
        TorchResult round = torchStep(*m, threads, n, warmup, passive);
        if (round.tokensPerSecond > t.tokensPerSecond) t = round;
      }
    }
    if (t.tokensPerSecond > 0) {
      std::printf("%-8s %10lld %8.0f %7d %12.0f %12.0f %11.2fx  %s%s\n", m->name,
                  static_cast<long long>(step.numParameters()), tokens, n, w, t.tokensPerSecond, w / t.tokensPerSecond,
                  t.waitPolicy, t.params == step.numParameters() ? "" : "  (parameter counts differ)");
    } else {
      std::printf("%-8s %10lld %8.0f %7d %12.0f %12s %12s\n", m->name, static_cast<long long>(step.numParameters()),
                  tokens, n, w, "n/a", "n/a");
    }
    std::fflush(stdout);
  }

  std::printf("\n== activation checkpointing: bytes held at the end of forward, peak above the step's start, "
              "median step time\n");
  std::printf("%-8s %-12s %14s %8s %14s %8s %10s %8s\n", "model", "policy", "activations", "saved", "peak", "saved",
              "step s", "extra");
  struct Policy {
    const char* name;
    nn::CheckpointPolicy policy;
  };
  const Policy policies[] = {{"none", nn::CheckpointPolicy::none()},
                             {"every-block", nn::CheckpointPolicy::everyBlock()},
                             {"sqrt", nn::CheckpointPolicy::sqrtN()}};
  for (const Model* m : chosen) {
    const bool wide = m->width > 128;
    const int n = steps > 0 ? steps : (quick ? 3 : (wide ? 3 : 8));
    std::vector<std::unique_ptr<Step>> stepsOf;
    std::vector<Storage::MemoryStats> mem(std::size(policies));
    std::vector<double> secs(std::size(policies), 1e300);
    for (size_t i = 0; i < std::size(policies); ++i) {
      stepsOf.push_back(std::make_unique<Step>(*m, policies[i].policy));
      stepsOf[i]->run();  // the optimizer's state exists from here on
      stepsOf[i]->run(&mem[i]);
    }
    for (int r = 0; r < rounds; ++r) {
      for (size_t i = 0; i < std::size(policies); ++i) {
        secs[i] = std::min(secs[i], bench::medianSeconds(0, n, [&] { stepsOf[i]->run(); }));
      }
    }
    for (size_t i = 0; i < std::size(policies); ++i) {
      std::printf("%-8s %-12s %10.1f MiB %7.1f%% %10.1f MiB %7.1f%% %10.3f %7.1f%%\n", m->name, policies[i].name,
                  mib(mem[i].liveBytes), 100.0 * (1.0 - static_cast<double>(mem[i].liveBytes) / mem[0].liveBytes),
                  mib(mem[i].peakBytes), 100.0 * (1.0 - static_cast<double>(mem[i].peakBytes) / mem[0].peakBytes),
                  secs[i], 100.0 * (secs[i] / secs[0] - 1.0));
    }
    std::fflush(stdout);
  }
  return 0;
}
