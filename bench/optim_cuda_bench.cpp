// optim_cuda_bench: the fused CUDA optimizer steps, the loss scaler's
// unscale and gradient clipping against the device's copy bandwidth.
//
// The parameters are shaped as GPT-2 small's (124 M float32 values in 148
// tensors) on cuda:0. For each operation the median time of a call (the
// stream synchronised after it) and its effective bandwidth: the bytes the
// rule must read and write (AdamW reads p, g, m, v and writes p, m, v) over
// the time, next to a device-to-device copy of as many bytes (one read, one
// write per element) in the same run.
//
// Usage: optim_cuda_bench [--quick]   (--quick: a tenth of the parameters)
// Without a CUDA device it says so and exits 0.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/median_time.h"
#include "kernels/cuda/runtime.h"
#include "kernels/device.h"
#include "nn/amp.h"
#include "nn/optim.h"
#include "nn/utils.h"
#include "tensor/ops.h"

using namespace weft;
namespace optim = weft::nn::optim;

namespace {

#ifdef WEFT_HAVE_CUDA

// GPT-2 small: wte [50257, 768], wpe [1024, 768], 12 blocks of two
// LayerNorms, attention (c_attn [768, 2304] + bias, c_proj [768, 768] +
// bias) and MLP (c_fc [768, 3072] + bias, c_proj [3072, 768] + bias), a
// final LayerNorm.
std::vector<Shape> gpt2Shapes(int64_t divide) {
  const int64_t w = 768;
  std::vector<Shape> s = {{50257 / divide, w}, {1024 / divide, w}};
  const int blocks = divide > 1 ? 3 : 12;
  for (int b = 0; b < blocks; ++b) {
    for (Shape x : std::vector<Shape>{{w}, {w}, {w, 3 * w}, {3 * w}, {w, w}, {w}, {w}, {w},
                                      {w, 4 * w}, {4 * w}, {4 * w, w}, {w}}) {
      s.push_back(x);
    }
  }
  s.push_back({w});
  s.push_back({w});
  return s;
}

struct Model {
  std::vector<Tensor> params;
  int64_t numel = 0;
};

Model makeModel(const std::vector<Shape>& shapes) {
  Model m;
  Generator gen(1);
  for (const Shape& s : shapes) {
    Tensor p = uniform(s, -0.1, 0.1, {}, &gen).to(Device::cuda(0));
    p.setGrad(uniform(s, -0.01, 0.01, {}, &gen).to(Device::cuda(0)));
    m.numel += p.numel();
    m.params.push_back(p);
  }
  return m;
}

double timed(int reps, const std::function<void()>& fn) {
  return bench::medianSeconds(3, reps, [&] {
    fn();
    kernels::cuda::synchronize(0);
  });
}

void row(const char* what, double seconds, double bytes, double copyGBs) {
  const double gbs = bytes / seconds / 1e9;
  std::printf("%-34s %10.1f %10.0f %9.0f%%\n", what, seconds * 1e6, gbs, 100.0 * gbs / copyGBs);
}

void run(bool quick) {
  Model m = makeModel(gpt2Shapes(quick ? 10 : 1));
  const double n = static_cast<double>(m.numel);
  const double f = sizeof(float);
  std::printf("== %zu float32 tensors, %.1f M values on %s\n", m.params.size(), n / 1e6,
              kernels::cuda::properties(0).name);
  const int reps = quick ? 10 : 30;

  Tensor src = empty({m.numel}, {.device = Device::cuda(0)});
  Tensor dst = empty({m.numel}, {.device = Device::cuda(0)});
  src.fill_(1.0);
  const double copyS = timed(reps, [&] {
    kernels::cuda::copyDeviceToDevice(dst.rawData(), src.rawData(), static_cast<size_t>(m.numel) * sizeof(float), 0);
  });
  const double copyGBs = 2 * n * f / copyS / 1e9;
  std::printf("%-34s %10s %10s %10s\n", "operation", "us", "GB/s", "of copy");
  row("device-to-device copy", copyS, 2 * n * f, copyGBs);

  {
    optim::SGD opt(m.params, {.lr = 1e-3, .momentum = 0.9});
    opt.step();
    row("SGD momentum step", timed(reps, [&] { opt.step(); }), 5 * n * f, copyGBs);
  }
  {
    optim::AdamW opt(m.params, {.lr = 1e-4, .weightDecay = 0.1});
    opt.step();
    row("AdamW step", timed(reps, [&] { opt.step(); }), 7 * n * f, copyGBs);
  }
  {
    optim::Adam opt(m.params, {.lr = 1e-4, .amsgrad = true});
    opt.step();
    row("Adam amsgrad step", timed(reps, [&] { opt.step(); }), 9 * n * f, copyGBs);
  }
  {
    optim::RMSprop opt(m.params, {.lr = 1e-4, .momentum = 0.9, .centered = true});
    opt.step();
    row("RMSprop centered momentum step", timed(reps, [&] { opt.step(); }), 9 * n * f, copyGBs);
  }
  {
    // Scale 1: the gradients keep their values from one call to the next.
    nn::GradScaler scaler({.initScale = 1.0});
    row("GradScaler unscale_ (one read-back)", timed(reps, [&] {
          scaler.unscale_(m.params);
          scaler.update();
        }),
        2 * n * f, copyGBs);
  }
  row("clipGradNorm_ (no scaling needed)", timed(reps, [&] { nn::clipGradNorm_(m.params, 1e9); }), n * f, copyGBs);
}

#endif

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  bench::Flags flags;
  flags.onSwitch("--quick", [&] { quick = true; });
  if (!bench::parseFlagsOrUsage(flags, argc, argv, "optim_cuda_bench", "usage: optim_cuda_bench [--quick]\n")) {
    return 2;
  }
  if (kernels::cudaDeviceCount() == 0) {
    std::printf("optim_cuda_bench: no CUDA device (weft built %s CUDA)\n", kernels::cudaBuilt() ? "with" : "without");
    return 0;
  }
#ifdef WEFT_HAVE_CUDA
  run(quick);
#endif
  return 0;
}
