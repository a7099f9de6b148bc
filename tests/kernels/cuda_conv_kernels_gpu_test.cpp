// The CUDA conv2d, max-pooling and LSTM kernels (kernels/cuda/{conv,pool,lstm}.h)
// called directly on device buffers, against the CPU kernels of the same
// names on the same inputs: every output and gradient, float64 to rounding,
// float32 to the reassociation of sums; argmax exactly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/lstm.h"
#include "kernels/cpu/pool.h"
#include "kernels/device.h"
#include "weft_test.h"

#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/conv.h"
#include "kernels/cuda/lstm.h"
#include "kernels/cuda/pool.h"
#include "kernels/cuda/runtime.h"
#endif

using namespace weft;

#ifdef WEFT_HAVE_CUDA
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

// A host array and its device copy.
template <class T>
struct Buf {
  std::vector<T> host;
  void* dev = nullptr;
  explicit Buf(size_t n, uint64_t seed = 0) : host(n) {
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    for (T& v : host) v = static_cast<T>(u(g));
    dev = kernels::deviceAlloc(std::max<size_t>(n, 1) * sizeof(T), 0);
    kernels::deviceMemcpy(dev, host.data(), n * sizeof(T), 0);
  }
  ~Buf() { kernels::deviceFree(dev, 0); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* h() { return host.data(); }
  std::vector<T> fromDevice() const {
    std::vector<T> out(host.size());
    kernels::deviceMemcpy(out.data(), dev, out.size() * sizeof(T), 0);
    return out;
  }
};

template <class T>
void expectNear(const std::string& what, const std::vector<T>& gpu, const std::vector<T>& cpuRef) {
  const double rtol = sizeof(T) == 8 ? 1e-10 : 2e-4, atol = sizeof(T) == 8 ? 1e-12 : 2e-5;
  REQUIRE(gpu.size() == cpuRef.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double a = gpu[i], e = cpuRef[i];
    const bool ok = (std::isnan(a) && std::isnan(e)) || std::abs(a - e) <= atol + rtol * std::abs(e);
    if (!ok && bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << gpu.size() << " elements differ; first at " << first << ": "
            << (bad ? gpu[first] : T(0)) << " vs " << (bad ? cpuRef[first] : T(0)));
  CHECK(bad == 0);
}

template <class T>
constexpr DType dtypeOf() {
  return sizeof(T) == 8 ? DType::Float64 : DType::Float32;
}

template <class T>
void checkConv(cpu::Conv2dGeometry g, bool bias, const std::string& name) {
  g.outH = (g.height + 2 * g.padH - g.kernelH) / g.strideH + 1;
  g.outW = (g.width + 2 * g.padW - g.kernelW) / g.strideW + 1;
  const size_t nx = g.batch * g.inChannels * g.height * g.width;
  const size_t nw = g.outChannels * g.inChannels * g.kernelH * g.kernelW;
  const size_t no = g.batch * g.outChannels * g.outH * g.outW;
  Buf<T> x(nx, 1), w(nw, 2), b(g.outChannels, 3), out(no), grad(no, 4), gx(nx), gw(nw), gb(g.outChannels);
  const DType t = dtypeOf<T>();
  cpu::conv2dForward(t, g, x.h(), w.h(), bias ? b.h() : nullptr, out.h());
  cpu::conv2dBackward(t, g, x.h(), w.h(), grad.h(), gx.h(), gw.h(), gb.h());
  {
    cuda::DeviceGuard dg(0);
    cuda::conv2dForward(t, g, x.dev, w.dev, bias ? b.dev : nullptr, out.dev);
    cuda::conv2dBackward(t, g, x.dev, w.dev, grad.dev, gx.dev, gw.dev, gb.dev);
  }
  expectNear(name + " out", out.fromDevice(), out.host);
  expectNear(name + " gradX", gx.fromDevice(), gx.host);
  expectNear(name + " gradWeight", gw.fromDevice(), gw.host);
  expectNear(name + " gradBias", gb.fromDevice(), gb.host);
}

template <class T>
void checkPool(cpu::Pool2dGeometry g, const std::string& name, bool ties) {
  g.outH = (g.height + 2 * g.padH - g.kernelH) / g.strideH + 1;
  g.outW = (g.width + 2 * g.padW - g.kernelW) / g.strideW + 1;
  const size_t nx = g.planes * g.height * g.width, no = g.planes * g.outH * g.outW;
  Buf<T> x(nx, 5), out(no), grad(no, 6), gx(nx);
  if (ties) {
    for (size_t i = 0; i < nx; ++i) x.host[i] = static_cast<T>((i * 7 + i / 5) % 3);
    if (nx > 20) x.host[3] = x.host[20] = NAN;
    kernels::deviceMemcpy(x.dev, x.host.data(), nx * sizeof(T), 0);
  }
  Buf<int64_t> am(no);
  const DType t = dtypeOf<T>();
  cpu::maxPool2dForward(t, g, x.h(), out.h(), am.host.data());
  cpu::maxPool2dBackward(t, g, grad.h(), am.host.data(), gx.h());
  {
    cuda::DeviceGuard dg(0);
    cuda::maxPool2dForward(t, g, x.dev, out.dev, static_cast<int64_t*>(am.dev));
    cuda::maxPool2dBackward(t, g, grad.dev, static_cast<const int64_t*>(am.dev), gx.dev);
  }
  expectNear(name + " out", out.fromDevice(), out.host);
  CHECK_MESSAGE(am.fromDevice() == am.host, (name + " argmax"));
  expectNear(name + " gradX", gx.fromDevice(), gx.host);
}

template <class T>
void checkLstmLayer(cpu::LstmLayerGeometry g, bool bias, bool stateGrads, const std::string& name) {
  const size_t TN = g.steps * g.batch, G = 4 * g.hidden, state = g.batch * g.hidden;
  Buf<T> x(TN * g.input, 7), h0(state, 8), c0(state, 9), wIh(G * g.input, 10), wHh(G * g.hidden, 11), b(G, 12);
  Buf<T> gates(TN * G), hs(TN * g.hidden), cs(TN * g.hidden);
  Buf<T> gOut(TN * g.hidden, 13), ghT(state, 14), gcT(state, 15), dGates(TN * G);
  Buf<T> dx(TN * g.input), dh0(state), dc0(state), dwIh(G * g.input), dwHh(G * g.hidden), db(G);
  const DType t = dtypeOf<T>();
  cpu::lstmLayerForward(t, g, x.h(), h0.h(), c0.h(), wIh.h(), wHh.h(), bias ? b.h() : nullptr, gates.h(), hs.h(),
                        cs.h());
  cpu::lstmLayerBackward(
      t, g, {x.h(), h0.h(), c0.h(), wIh.h(), wHh.h(), gates.h(), hs.h(), cs.h()},
      {gOut.h(), stateGrads ? ghT.h() : nullptr, stateGrads ? gcT.h() : nullptr}, dGates.h(),
      {dx.h(), dh0.h(), dc0.h(), dwIh.h(), dwHh.h(), db.h()});
  {
    cuda::DeviceGuard dg(0);
    cuda::lstmLayerForward(t, g, x.dev, h0.dev, c0.dev, wIh.dev, wHh.dev, bias ? b.dev : nullptr, gates.dev, hs.dev,
                           cs.dev);
    cuda::lstmLayerBackward(t, g, {x.dev, h0.dev, c0.dev, wIh.dev, wHh.dev, gates.dev, hs.dev, cs.dev},
                            {gOut.dev, stateGrads ? ghT.dev : nullptr, stateGrads ? gcT.dev : nullptr}, dGates.dev,
                            {dx.dev, dh0.dev, dc0.dev, dwIh.dev, dwHh.dev, db.dev});
  }
  expectNear(name + " gates", gates.fromDevice(), gates.host);
  expectNear(name + " hs", hs.fromDevice(), hs.host);
  expectNear(name + " cs", cs.fromDevice(), cs.host);
  expectNear(name + " dx", dx.fromDevice(), dx.host);
  expectNear(name + " dh0", dh0.fromDevice(), dh0.host);
  expectNear(name + " dc0", dc0.fromDevice(), dc0.host);
  expectNear(name + " dwIh", dwIh.fromDevice(), dwIh.host);
  expectNear(name + " dwHh", dwHh.fromDevice(), dwHh.host);
  expectNear(name + " dbias", db.fromDevice(), db.host);
}

template <class T>
void checkLstmCell(int64_t n, int64_t H, const std::string& name) {
  const size_t state = n * H;
  Buf<T> gates(state * 4, 16), c(state, 17), cNew(state), hNew(state), gh(state, 18), gc(state, 19);
  Buf<T> dGates(state * 4), dc(state);
  const DType t = dtypeOf<T>();
  cpu::lstmCellForward(t, n, H, gates.h(), c.h(), cNew.h(), hNew.h());  // gates become the activations
  cpu::lstmCellBackward(t, n, H, gates.h(), c.h(), cNew.h(), gh.h(), gc.h(), dGates.h(), dc.h());
  {
    cuda::DeviceGuard dg(0);
    cuda::lstmCellForward(t, n, H, gates.dev, c.dev, cNew.dev, hNew.dev);
  }
  expectNear(name + " activations", gates.fromDevice(), gates.host);
  expectNear(name + " cNew", cNew.fromDevice(), cNew.host);
  expectNear(name + " hNew", hNew.fromDevice(), hNew.host);
  {
    cuda::DeviceGuard dg(0);  // backward from the CPU's activations, so each kernel is compared alone
    kernels::deviceMemcpy(gates.dev, gates.host.data(), gates.host.size() * sizeof(T), 0);
    kernels::deviceMemcpy(cNew.dev, cNew.host.data(), cNew.host.size() * sizeof(T), 0);
    cuda::lstmCellBackward(t, n, H, gates.dev, c.dev, cNew.dev, gh.dev, gc.dev, dGates.dev, dc.dev);
  }
  expectNear(name + " dGates", dGates.fromDevice(), dGates.host);
  expectNear(name + " dc", dc.fromDevice(), dc.host);
}

template <class T>
void convCases() {
  const std::string ty = sizeof(T) == 8 ? "float64" : "float32";
  using G = cpu::Conv2dGeometry;
  checkConv<T>(G{.batch = 2, .inChannels = 3, .height = 9, .width = 11, .outChannels = 4, .kernelH = 3, .kernelW = 3,
                 .padH = 1, .padW = 1},
               true, ty + " 3x3 same");
  checkConv<T>(G{.batch = 3, .inChannels = 1, .height = 8, .width = 7, .outChannels = 5, .kernelH = 2, .kernelW = 3,
                 .strideH = 2, .strideW = 1, .padH = 0, .padW = 1},
               false, ty + " 1 channel rectangular");
  checkConv<T>(G{.batch = 2, .inChannels = 16, .height = 7, .width = 7, .outChannels = 16, .kernelH = 3, .kernelW = 3,
                 .strideH = 2, .strideW = 2, .padH = 1, .padW = 1},
               true, ty + " 16 channels strided");
  checkConv<T>(G{.batch = 4, .inChannels = 16, .height = 5, .width = 6, .outChannels = 8, .kernelH = 1, .kernelW = 1},
               true, ty + " pointwise");
  checkConv<T>(G{.batch = 5, .inChannels = 2, .height = 4, .width = 9, .outChannels = 3, .kernelH = 3, .kernelW = 2,
                 .strideH = 3, .strideW = 2, .padH = 2, .padW = 1},
               true, ty + " wide padding stride 3");
  checkConv<T>(G{.batch = 0, .inChannels = 3, .height = 6, .width = 6, .outChannels = 4, .kernelH = 3, .kernelW = 3},
               true, ty + " empty batch");
}

}  // namespace
#endif

TEST_CASE("CUDA conv2d kernels match the CPU kernels: output and the input, weight and bias gradients") {
  WEFT_SKIP_WITHOUT_CUDA();
#ifdef WEFT_HAVE_CUDA
  convCases<double>();
  convCases<float>();
#endif
}

TEST_CASE("CUDA conv2d kernels split a batch past the scratch budget into chunks and sum the weight gradient") {
  WEFT_SKIP_WITHOUT_CUDA();
#ifdef WEFT_HAVE_CUDA
  // 400 x 9216 unfolded entries per image (about 28 MiB in float64, and the
  // permuted gradient besides in backward): 256 MiB holds 9 images forward
  // and 8 backward, so 20 images run as 3 chunks each way.
  checkConv<double>(cpu::Conv2dGeometry{.batch = 20, .inChannels = 16, .height = 96, .width = 96, .outChannels = 8,
                                        .kernelH = 5, .kernelW = 5, .padH = 2, .padW = 2},
                    true, "float64 chunked");
#endif
}

TEST_CASE("CUDA max-pooling kernels match the CPU kernels, argmax included, with ties and NaN") {
  WEFT_SKIP_WITHOUT_CUDA();
#ifdef WEFT_HAVE_CUDA
  using P = cpu::Pool2dGeometry;
  for (bool ties : {false, true}) {
    const std::string s = ties ? " ties" : "";
    checkPool<double>(P{.planes = 6, .height = 8, .width = 8, .kernelH = 2, .kernelW = 2, .strideH = 2, .strideW = 2},
                      "2x2" + s, ties);
    checkPool<float>(P{.planes = 6, .height = 9, .width = 7, .kernelH = 2, .kernelW = 2, .strideH = 2, .strideW = 2},
                     "2x2 odd" + s, ties);
    checkPool<double>(P{.planes = 4, .height = 11, .width = 10, .kernelH = 3, .kernelW = 3, .strideH = 2, .strideW = 2,
                        .padH = 1, .padW = 1},
                      "3x3 s2 p1" + s, ties);
    checkPool<float>(P{.planes = 5, .height = 7, .width = 9, .kernelH = 3, .kernelW = 3, .strideH = 1, .strideW = 1,
                       .padH = 1, .padW = 1},
                     "3x3 s1 p1" + s, ties);
    checkPool<double>(P{.planes = 16, .height = 6, .width = 13, .kernelH = 4, .kernelW = 4, .strideH = 3, .strideW = 3,
                        .padH = 2, .padW = 2},
                      "4x4 s3 p2" + s, ties);
  }
#endif
}

TEST_CASE("CUDA LSTM kernels match the CPU kernels: the cell and the layer, forward and backward") {
  WEFT_SKIP_WITHOUT_CUDA();
#ifdef WEFT_HAVE_CUDA
  checkLstmCell<double>(5, 7, "cell float64");
  checkLstmCell<float>(3, 33, "cell float32");
  for (int64_t T : {1, 7}) {
    for (int64_t N : {1, 5}) {
      const std::string s = " T=" + std::to_string(T) + " N=" + std::to_string(N);
      checkLstmLayer<double>({.steps = T, .batch = N, .input = 6, .hidden = 9}, true, true, "layer float64" + s);
      checkLstmLayer<float>({.steps = T, .batch = N, .input = 6, .hidden = 9}, N == 5, T == 7, "layer float32" + s);
    }
  }
  checkLstmLayer<double>({.steps = 3, .batch = 0, .input = 4, .hidden = 5}, true, true, "layer empty batch");
#endif
}
