// CUDA layer normalisation (see layer_norm.h).
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda {
namespace {

constexpr int kMaxRowThreads = 512;

// Threads per row block: about four elements each, rounded up to a warp,
// 32 to kMaxRowThreads (short rows keep more blocks resident).
int rowThreads(int64_t n) {
  const int64_t quarter = (n + 3) / 4;
  return static_cast<int>(std::min<int64_t>(kMaxRowThreads, std::max<int64_t>(32, (quarter + 31) / 32 * 32)));
}

unsigned rowBlocks(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, 0x7fffffff));
}

// The block's sums of a and b, returned to all threads. `shared` holds 2 * 32.
template <class A>
__device__ void blockSum2(A& a, A& b, A* shared) {
  for (int s = 16; s > 0; s >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, s);
    b += __shfl_down_sync(0xffffffffu, b, s);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // shared may still be read for the previous row
  if (lane == 0) {
    shared[warp] = a;
    shared[32 + warp] = b;
  }
  __syncthreads();
  a = 0;
  b = 0;
  for (int k = 0; k < warps; ++k) {
    a += shared[k];
    b += shared[32 + k];
  }
}

// Each row's moments come from sums of d = x - x[0] and d^2 in float64 (the
// CPU's shifted sums): the shift keeps E[d^2] - E[d]^2 from cancelling when
// the mean is large against the spread.
template <class T>
__global__ void forwardKernel(const T* x, int64_t rows, int64_t n, const T* weight, const T* bias, double eps, T* y,
                              T* mean, T* rstd) {
  using A = Acc<T>;
  __shared__ double shared[2 * 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    const double shift = static_cast<double>(xr[0]);
    double s1 = 0, s2 = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const double d = static_cast<double>(xr[i]) - shift;
      s1 += d;
      s2 += d * d;
    }
    blockSum2(s1, s2, shared);
    const double md = s1 / static_cast<double>(n);
    const double var = fmax(s2 / static_cast<double>(n) - md * md, 0.0);
    const A mu = static_cast<A>(shift + md);
    const A rs = static_cast<A>(1.0 / sqrt(var + eps));
    if (threadIdx.x == 0) {
      mean[r] = static_cast<T>(mu);
      rstd[r] = static_cast<T>(rs);
    }
    T* yr = y + r * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      A v = (static_cast<A>(xr[i]) - mu) * rs;
      if (weight) v *= static_cast<A>(weight[i]);
      if (bias) v += static_cast<A>(bias[i]);
      yr[i] = static_cast<T>(v);
    }
  }
}

// gradX = rstd * (ĝ - mean_n(ĝ) - x̂ * mean_n(ĝ * x̂)) with ĝ = g * weight.
template <class T>
__global__ void backwardXKernel(const T* g, const T* x, const T* mean, const T* rstd, const T* weight, int64_t rows,
                                int64_t n, T* gradX) {
  using A = Acc<T>;
  __shared__ A shared[2 * 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * n;
    const T* xr = x + r * n;
    const A mu = mean[r], rs = rstd[r];
    A sg = 0, sgx = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A gh = static_cast<A>(gr[i]) * (weight ? static_cast<A>(weight[i]) : A(1));
      sg += gh;
      sgx += gh * (static_cast<A>(xr[i]) - mu) * rs;
    }
    blockSum2(sg, sgx, shared);
    const A mg = sg / static_cast<A>(n), mgx = sgx / static_cast<A>(n);
    T* out = gradX + r * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A gh = static_cast<A>(gr[i]) * (weight ? static_cast<A>(weight[i]) : A(1));
      const A xh = (static_cast<A>(xr[i]) - mu) * rs;
      out[i] = static_cast<T>(rs * (gh - mg - xh * mgx));
    }
  }
}

constexpr int kColThreads = 32;  // columns per block
constexpr int kRowThreads = 8;   // rows walked at once per block

// Per chunk of rows (blockIdx.y): partial[c, i] = sum over the chunk's rows
// of g * x̂ (first n) and of g (next n), for columns i of this block.
template <class T>
__global__ void paramPartialKernel(const T* g, const T* x, const T* mean, const T* rstd, int64_t rows, int64_t n,
                                   int64_t rowsPerChunk, bool wantW, bool wantB, Acc<T>* partial) {
  using A = Acc<T>;
  __shared__ A sw[kRowThreads][kColThreads + 1];
  __shared__ A sb[kRowThreads][kColThreads + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rowsPerChunk;
  const int64_t end = min(rows, begin + rowsPerChunk);
  A aw = 0, ab = 0;
  if (col < n) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowThreads) {
      const A gv = static_cast<A>(g[r * n + col]);
      if (wantW) aw += gv * (static_cast<A>(x[r * n + col]) - static_cast<A>(mean[r])) * static_cast<A>(rstd[r]);
      ab += gv;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    A tw = 0, tb = 0;
    for (int k = 0; k < kRowThreads; ++k) {
      tw += sw[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    A* p = partial + static_cast<int64_t>(blockIdx.y) * 2 * n;
    if (wantW) p[col] = tw;
    if (wantB) p[n + col] = tb;
  }
}

template <class T>
__global__ void paramSumKernel(const Acc<T>* partial, int64_t chunks, int64_t n, T* gradWeight, T* gradBias) {
  using A = Acc<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A w = 0, b = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      if (gradWeight) w += partial[c * 2 * n + i];
      if (gradBias) b += partial[c * 2 * n + n + i];
    }
    if (gradWeight) gradWeight[i] = static_cast<T>(w);
    if (gradBias) gradBias[i] = static_cast<T>(b);
  }
}

}  // namespace

void layerNormForward(DType type, const void* x, int64_t rows, int64_t n, const void* weight, const void* bias,
                      double eps, void* y, void* mean, void* rstd) {
  if (rows <= 0 || n <= 0) return;
  WEFT_DISPATCH_FLOATING(type, "layerNorm", [&]<class T>() {
    forwardKernel<T><<<rowBlocks(rows), rowThreads(n), 0, stream()>>>(
        static_cast<const T*>(x), rows, n, static_cast<const T*>(weight), static_cast<const T*>(bias), eps,
        static_cast<T*>(y), static_cast<T*>(mean), static_cast<T*>(rstd));
    checkLaunch("layerNorm");
  });
}

void layerNormBackward(DType type, const void* g, const void* x, const void* mean, const void* rstd,
                       const void* weight, int64_t rows, int64_t n, void* gradX, void* gradWeight, void* gradBias) {
  if (n <= 0) return;
  WEFT_DISPATCH_FLOATING(type, "layerNorm backward", [&]<class T>() {
    using A = Acc<T>;
    if (gradX && rows > 0) {
      backwardXKernel<T><<<rowBlocks(rows), rowThreads(n), 0, stream()>>>(
          static_cast<const T*>(g), static_cast<const T*>(x), static_cast<const T*>(mean),
          static_cast<const T*>(rstd), static_cast<const T*>(weight), rows, n, static_cast<T*>(gradX));
      checkLaunch("layerNorm backward");
    }
    if (!gradWeight && !gradBias) return;
    if (rows <= 0) {  // sums over no rows
      if (gradWeight) WEFT_CUDA_CHECK(cudaMemsetAsync(gradWeight, 0, n * sizeof(T), stream()));
      if (gradBias) WEFT_CUDA_CHECK(cudaMemsetAsync(gradBias, 0, n * sizeof(T), stream()));
      return;
    }
    // Enough chunks to fill the device; each walks at least 32 rows.
    const int64_t colBlocks = (n + kColThreads - 1) / kColThreads;
    const int64_t target = std::max<int64_t>(1, properties(currentDevice()).multiprocessors * 8 / colBlocks);
    const int64_t chunks = std::min<int64_t>({target, (rows + 31) / 32, 65535});
    const int64_t rowsPerChunk = (rows + chunks - 1) / chunks;
    const int device = currentDevice();
    auto* partial = static_cast<A*>(allocate(static_cast<size_t>(chunks * 2 * n) * sizeof(A), device));
    dim3 grid(static_cast<unsigned>(colBlocks), static_cast<unsigned>(chunks));
    dim3 block(kColThreads, kRowThreads);
    paramPartialKernel<T><<<grid, block, 0, stream()>>>(static_cast<const T*>(g), static_cast<const T*>(x),
                                                        static_cast<const T*>(mean), static_cast<const T*>(rstd),
                                                        rows, n, rowsPerChunk, gradWeight != nullptr,
                                                        gradBias != nullptr, partial);
    checkLaunch("layerNorm backward");
    paramSumKernel<T><<<blocksFor(n), kThreads, 0, stream()>>>(partial, chunks, n, static_cast<T*>(gradWeight),
                                                               static_cast<T*>(gradBias));
    checkLaunch("layerNorm backward");
    deallocate(partial, device);  // reuse is ordered by the stream
  });
}

}  // namespace weft::kernels::cuda
