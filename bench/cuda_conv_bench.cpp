// Times the CUDA conv2d, max-pooling and LSTM-layer kernels
// (kernels/cuda/{conv,pool,lstm}.h) on cuda:0 in float32, forward and
// backward, at sizes of a ResNet stage and a mid-sized LSTM. Prints the
// median milliseconds of each; bench/torch_cuda_conv_step.py prints PyTorch's
// (cuDNN) for the same shapes. Without a device (or CUDA) it says so and exits.
//
//   cuda_conv_bench [--reps 20]
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/median_time.h"
#include "kernels/device.h"

#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/conv.h"
#include "kernels/cuda/lstm.h"
#include "kernels/cuda/pool.h"
#include "kernels/cuda/runtime.h"
#endif

using namespace weft;

#ifdef WEFT_HAVE_CUDA
namespace {

namespace cuda = kernels::cuda;

// Device memory for `n` floats (all 0.01), freed at scope end.
struct DeviceFloats {
  void* p;
  explicit DeviceFloats(size_t n) : p(kernels::deviceAlloc(n * sizeof(float), 0)) {
    std::vector<float> fill(n, 0.01f);
    kernels::deviceMemcpy(p, fill.data(), n * sizeof(float), 0);
  }
  ~DeviceFloats() { kernels::deviceFree(p, 0); }
};

double timeMs(int reps, const std::function<void()>& fn) {
  return 1e3 * bench::medianSeconds(3, reps, [&] {
           fn();
           cuda::synchronize(0);
         });
}

void run(int reps) {
  cuda::DeviceGuard guard(0);
  {
    cuda::Conv2dGeometry g{.batch = 32, .inChannels = 64, .height = 56, .width = 56, .outChannels = 64, .kernelH = 3,
                           .kernelW = 3, .padH = 1, .padW = 1, .outH = 56, .outW = 56};
    DeviceFloats x(32 * 64 * 56 * 56), w(64 * 64 * 9), b(64), out(32 * 64 * 56 * 56), grad(32 * 64 * 56 * 56);
    DeviceFloats gx(32 * 64 * 56 * 56), gw(64 * 64 * 9), gb(64);
    std::printf("conv2d 3x3 [32,64,56,56]->64 forward   %8.3f ms\n",
                timeMs(reps, [&] { cuda::conv2dForward(DType::Float32, g, x.p, w.p, b.p, out.p); }));
    std::printf("conv2d 3x3 [32,64,56,56]->64 backward  %8.3f ms\n", timeMs(reps, [&] {
                  cuda::conv2dBackward(DType::Float32, g, x.p, w.p, grad.p, gx.p, gw.p, gb.p);
                }));
  }
  {
    cuda::Pool2dGeometry g{.planes = 32 * 64, .height = 112, .width = 112, .kernelH = 3, .kernelW = 3, .strideH = 2,
                           .strideW = 2, .padH = 1, .padW = 1, .outH = 56, .outW = 56};
    DeviceFloats x(32 * 64 * 112 * 112), out(32 * 64 * 56 * 56), grad(32 * 64 * 56 * 56), gx(32 * 64 * 112 * 112);
    void* am = kernels::deviceAlloc(sizeof(int64_t) * 32 * 64 * 56 * 56, 0);
    std::printf("maxPool2d 3x3/2 [32,64,112,112] forward  %8.3f ms\n", timeMs(reps, [&] {
                  cuda::maxPool2dForward(DType::Float32, g, x.p, out.p, static_cast<int64_t*>(am));
                }));
    std::printf("maxPool2d 3x3/2 [32,64,112,112] backward %8.3f ms\n", timeMs(reps, [&] {
                  cuda::maxPool2dBackward(DType::Float32, g, grad.p, static_cast<int64_t*>(am), gx.p);
                }));
    kernels::deviceFree(am, 0);
  }
  {
    const int64_t T = 32, N = 64, I = 256, H = 512, G = 4 * H;
    cuda::LstmLayerGeometry g{.steps = T, .batch = N, .input = I, .hidden = H};
    DeviceFloats x(T * N * I), h0(N * H), c0(N * H), wIh(G * I), wHh(G * H), b(G), gates(T * N * G), hs(T * N * H),
        cs(T * N * H), gOut(T * N * H), dg(T * N * G), dx(T * N * I), dh0(N * H), dc0(N * H), dwIh(G * I),
        dwHh(G * H), db(G);
    std::printf("lstmLayer T=32 N=64 in=256 H=512 forward   %8.3f ms\n", timeMs(reps, [&] {
                  cuda::lstmLayerForward(DType::Float32, g, x.p, h0.p, c0.p, wIh.p, wHh.p, b.p, gates.p, hs.p, cs.p);
                }));
    std::printf("lstmLayer T=32 N=64 in=256 H=512 backward  %8.3f ms\n", timeMs(reps, [&] {
                  cuda::lstmLayerBackward(DType::Float32, g, {x.p, h0.p, c0.p, wIh.p, wHh.p, gates.p, hs.p, cs.p},
                                          {gOut.p, nullptr, nullptr}, dg.p, {dx.p, dh0.p, dc0.p, dwIh.p, dwHh.p, db.p});
                }));
  }
}

}  // namespace
#endif

constexpr const char* kUsage = "usage: cuda_conv_bench [--reps N]\n";

int main(int argc, char** argv) {
  int reps = 20;
  bench::Flags flags;
  flags.onValue("--reps", [&](const std::string& v) { reps = static_cast<int>(bench::intFlag("--reps", v, 1, 10000)); });
  if (!bench::parseFlagsOrUsage(flags, argc, argv, "cuda_conv_bench", kUsage)) return 2;
  if (kernels::cudaDeviceCount() == 0) {
    std::printf("cuda_conv_bench: no CUDA device (weft built %s CUDA)\n", kernels::cudaBuilt() ? "with" : "without");
    return 0;
  }
#ifdef WEFT_HAVE_CUDA
  run(reps);
#endif
  (void)reps;
  return 0;
}
