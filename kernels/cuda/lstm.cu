#include "kernels/cuda/lstm.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/strided_gemm.cuh"

namespace weft::kernels::cuda {
namespace {

template <class T>
__device__ __forceinline__ T sigmoidOf(T x) {
  if constexpr (std::is_same_v<T, float>) return 1.0f / (1.0f + expf(-x));
  else return 1.0 / (1.0 + exp(-x));
}

template <class T>
__device__ __forceinline__ T tanhOf(T x) {
  if constexpr (std::is_same_v<T, float>) return tanhf(x);
  else return tanh(x);
}

// One thread per (row r, hidden unit j) of `total` = rows * H: the gate
// pre-activations of row r ([i | f | g | o], H each) become activations, and
// c' and h' are written. Consecutive threads touch consecutive j of each
// chunk: coalesced.
template <class T>
__global__ void cellForwardKernel(int64_t total, int64_t H, T* __restrict__ gates, const T* __restrict__ c,
                                  T* __restrict__ cNew, T* __restrict__ hNew) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / H, j = k - r * H;
    T* a = gates + r * 4 * H + j;
    const T i = sigmoidOf(a[0]), f = sigmoidOf(a[H]), g = tanhOf(a[2 * H]), o = sigmoidOf(a[3 * H]);
    a[0] = i;
    a[H] = f;
    a[2 * H] = g;
    a[3 * H] = o;
    const T cv = f * c[k] + i * g;
    cNew[k] = cv;
    hNew[k] = o * tanhOf(cv);
  }
}

// The cell's derivative, one thread per (row, unit): from the activations,
// c, c', the gradient of h' (gradH, plus gradOut where non-null) and of c',
// the gradients of the pre-activations and of c. gradCPrev may be gradC
// itself (each thread reads its element before writing it), so the pointers
// are not __restrict__.
template <class T>
__global__ void cellBackwardKernel(int64_t total, int64_t H, const T* gates, const T* c, const T* cNew,
                                   const T* gradH, const T* gradOut, const T* gradC, T* gradGates, T* gradCPrev) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / H, j = k - r * H;
    const T* a = gates + r * 4 * H + j;
    T* d = gradGates + r * 4 * H + j;
    const T i = a[0], f = a[H], g = a[2 * H], o = a[3 * H];
    const T tc = tanhOf(cNew[k]);
    const T gh = gradOut ? gradOut[k] + gradH[k] : gradH[k];
    // d/dc' collects the direct gradient and the path through h' = o * tanh(c').
    const T dc = gradC[k] + gh * o * (T(1) - tc * tc);
    d[0] = dc * g * i * (T(1) - i);
    d[H] = dc * c[k] * f * (T(1) - f);
    d[2 * H] = dc * i * (T(1) - g * g);
    d[3 * H] = gh * tc * o * (T(1) - o);
    gradCPrev[k] = dc * f;
  }
}

template <class T>
void launchCellForward(int64_t rows, int64_t H, T* gates, const T* c, T* cNew, T* hNew) {
  const int64_t total = rows * H;
  if (total <= 0) return;
  cellForwardKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(total, H, gates, c, cNew, hNew);
  checkLaunch("lstmCell");
}

template <class T>
void launchCellBackward(int64_t rows, int64_t H, const T* gates, const T* c, const T* cNew, const T* gradH,
                        const T* gradOut, const T* gradC, T* gradGates, T* gradCPrev) {
  const int64_t total = rows * H;
  if (total <= 0) return;
  cellBackwardKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(total, H, gates, c, cNew, gradH, gradOut, gradC,
                                                                     gradGates, gradCPrev);
  checkLaunch("lstmCell backward");
}

// gates[m, j] = bias[j] for `total` = rows * G elements.
template <class T>
__global__ void fillRowsKernel(const T* __restrict__ bias, int64_t total, int64_t G, T* __restrict__ gates) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    gates[i] = bias[i % G];
  }
}

// out[j] = the sum over rows of in[m, j], in float64: one thread per column
// (consecutive threads read consecutive elements of each row).
template <class T>
__global__ void sumColumnsKernel(const T* __restrict__ in, int64_t rows, int64_t cols, T* __restrict__ out) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0;
    for (int64_t m = 0; m < rows; ++m) acc += static_cast<double>(in[m * cols + j]);
    out[j] = static_cast<T>(acc);
  }
}

void checkLayerRange(const char* op, const LstmLayerGeometry& g) {
  const int64_t rows = g.steps * g.batch, G = 4 * g.hidden;
  WEFT_ENFORCE(fitsBlasInt(rows) && fitsBlasInt(G) && fitsBlasInt(g.input), InvalidArgumentError, op,
               ": a product of [", rows, ", ", g.input, "] x [", g.input, ", ", G,
               "] exceeds the 32-bit BLAS integer range");
}

}  // namespace

void lstmCellForward(DType type, int64_t n, int64_t hidden, void* gates, const void* c, void* cNew, void* hNew) {
  WEFT_DISPATCH_FLOATING(type, "lstmCell", [&]<class T>() {
    launchCellForward<T>(n, hidden, static_cast<T*>(gates), static_cast<const T*>(c), static_cast<T*>(cNew),
                         static_cast<T*>(hNew));
  });
}

void lstmCellBackward(DType type, int64_t n, int64_t hidden, const void* gates, const void* c, const void* cNew,
                      const void* gradH, const void* gradC, void* gradGates, void* gradCPrev) {
  WEFT_DISPATCH_FLOATING(type, "lstmCell backward", [&]<class T>() {
    launchCellBackward<T>(n, hidden, static_cast<const T*>(gates), static_cast<const T*>(c),
                          static_cast<const T*>(cNew), static_cast<const T*>(gradH), nullptr,
                          static_cast<const T*>(gradC), static_cast<T*>(gradGates), static_cast<T*>(gradCPrev));
  });
}

void lstmLayerForward(DType type, const LstmLayerGeometry& g, const void* x, const void* h0, const void* c0,
                      const void* wIh, const void* wHh, const void* bias, void* gates, void* hs, void* cs) {
  checkLayerRange("lstmLayer", g);
  WEFT_DISPATCH_FLOATING(type, "lstmLayer", [&]<class T>() {
    const int64_t N = g.batch, I = g.input, H = g.hidden, G = 4 * H, M = g.steps * N;
    T* pg = static_cast<T*>(gates);
    T* phs = static_cast<T*>(hs);
    T* pcs = static_cast<T*>(cs);
    if (M == 0 || H == 0) return;
    // The input projection of every step at once: gates = x · wIh^T + bias.
    if (bias) {
      const int64_t total = M * G;
      fillRowsKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(static_cast<const T*>(bias), total, G, pg);
      checkLaunch("lstmLayer bias");
    }
    stridedGemm<T>({static_cast<const T*>(x), false, I}, {static_cast<const T*>(wIh), true, I}, M, G, I, T(1),
                   bias ? T(1) : T(0), {pg, G});
    for (int64_t s = 0; s < g.steps; ++s) {
      T* gs = pg + s * N * G;
      const T* hPrev = s == 0 ? static_cast<const T*>(h0) : phs + (s - 1) * N * H;
      const T* cPrev = s == 0 ? static_cast<const T*>(c0) : pcs + (s - 1) * N * H;
      stridedGemm<T>({hPrev, false, H}, {static_cast<const T*>(wHh), true, H}, N, G, H, T(1), T(1), {gs, G});
      launchCellForward<T>(N, H, gs, cPrev, pcs + s * N * H, phs + s * N * H);
    }
  });
}

void lstmLayerBackward(DType type, const LstmLayerGeometry& g, const LstmLayerSaved& saved, const LstmLayerGrads& in,
                       void* gradGates, const LstmLayerGradOut& out) {
  checkLayerRange("lstmLayer backward", g);
  WEFT_DISPATCH_FLOATING(type, "lstmLayer backward", [&]<class T>() {
    const int64_t T_ = g.steps, N = g.batch, I = g.input, H = g.hidden, G = 4 * H, M = T_ * N, state = N * H;
    const T* pg = static_cast<const T*>(saved.gates);
    const T* pcs = static_cast<const T*>(saved.cs);
    const T* gOut = static_cast<const T*>(in.output);
    T* dg = static_cast<T*>(gradGates);
    // dh and dc: the gradients reaching h_s and c_s from step s + 1 (and from
    // hLast, cLast at the end); they end as the gradients of h0 and c0, so
    // they live in those outputs (scratch where an output is not wanted).
    Scratch dhScratch(out.h0 ? 0 : static_cast<size_t>(state) * sizeof(T));
    Scratch dcScratch(out.c0 ? 0 : static_cast<size_t>(state) * sizeof(T));
    T* dh = out.h0 ? static_cast<T*>(out.h0) : dhScratch.as<T>();
    T* dc = out.c0 ? static_cast<T*>(out.c0) : dcScratch.as<T>();
    if (state > 0) {
      const size_t bytes = static_cast<size_t>(state) * sizeof(T);
      if (in.hLast) WEFT_CUDA_CHECK(cudaMemcpyAsync(dh, in.hLast, bytes, cudaMemcpyDeviceToDevice, stream()));
      else WEFT_CUDA_CHECK(cudaMemsetAsync(dh, 0, bytes, stream()));
      if (in.cLast) WEFT_CUDA_CHECK(cudaMemcpyAsync(dc, in.cLast, bytes, cudaMemcpyDeviceToDevice, stream()));
      else WEFT_CUDA_CHECK(cudaMemsetAsync(dc, 0, bytes, stream()));
    }
    for (int64_t s = T_ - 1; s >= 0; --s) {
      const T* cPrev = s == 0 ? static_cast<const T*>(saved.c0) : pcs + (s - 1) * state;
      T* dgs = dg + s * N * G;
      launchCellBackward<T>(N, H, pg + s * N * G, cPrev, pcs + s * state, dh, gOut ? gOut + s * state : nullptr, dc,
                            dgs, dc);
      if (s > 0 || out.h0) {  // dh = dGates_s · wHh
        stridedGemm<T>({dgs, false, G}, {static_cast<const T*>(saved.wHh), false, H}, N, H, G, T(1), T(0), {dh, H});
      }
    }
    // The weights see every step at once.
    if (out.x) {
      stridedGemm<T>({dg, false, G}, {static_cast<const T*>(saved.wIh), false, I}, M, I, G, T(1), T(0),
                     {static_cast<T*>(out.x), I});
    }
    if (out.wIh) {
      stridedGemm<T>({dg, true, G}, {static_cast<const T*>(saved.x), false, I}, G, I, M, T(1), T(0),
                     {static_cast<T*>(out.wIh), I});
    }
    if (out.wHh) {  // step 0 reads h0, step s > 0 reads h_{s-1}
      T* dw = static_cast<T*>(out.wHh);
      stridedGemm<T>({dg, true, G}, {static_cast<const T*>(saved.h0), false, H}, G, H, N, T(1), T(0), {dw, H});
      if (T_ > 1) {
        stridedGemm<T>({dg + N * G, true, G}, {static_cast<const T*>(saved.hs), false, H}, G, H, (T_ - 1) * N, T(1),
                       T(1), {dw, H});
      }
    }
    if (out.bias && G > 0) {
      sumColumnsKernel<T><<<blocksFor(G), kThreads, 0, stream()>>>(dg, M, G, static_cast<T*>(out.bias));
      checkLaunch("lstmLayer backward bias");
    }
  });
}

}  // namespace weft::kernels::cuda
