#include "kernels/cuda/attention.h"

#include <cmath>
#include <limits>

#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda {
namespace {

constexpr int kTile = 32;                  // queries and keys of a tile: one per lane
constexpr int kWarps = 8;                  // of a block
constexpr int kRows = kTile / kWarps;      // tile rows each warp owns
constexpr int kBlockThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;

// What every attention kernel reads besides its pointers.
template <class T>
struct Args {
  int64_t batchHeads, sq, sk, d;
  T scale;
  bool causal;
  int64_t shift;  // queryOffset - keyOffset: query i sees key j iff j <= i + shift
  bool dropout;
  uint64_t seed;
  uint64_t threshold;  // kept iff bits >> 11 >= threshold
  T keep;              // the scale of a kept probability
};

// kernels/cpu/attention.h's attentionDropoutBits, bit for bit.
__device__ __forceinline__ uint64_t dropoutBits(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + (counter + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The dropout scale of element (bh, i, j): keep or 0.
template <class T>
__device__ __forceinline__ T dropoutScale(const Args<T>& a, int64_t bh, int64_t i, int64_t j) {
  const auto counter = static_cast<uint64_t>((bh * a.sq + i) * a.sk + j);
  return (dropoutBits(a.seed, counter) >> 11) >= a.threshold ? a.keep : T(0);
}

template <class T>
__device__ __forceinline__ bool visible(const Args<T>& a, int64_t i, int64_t j) {
  return i < a.sq && j < a.sk && (!a.causal || j <= i + a.shift);
}

template <class T>
__device__ __forceinline__ T expOf(T x) {
  if constexpr (std::is_same_v<T, float>) return expf(x);
  else return exp(x);
}

// The butterfly leaves the same sum, bit for bit, in every lane.
template <class T>
__device__ __forceinline__ T warpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// 16 bytes of T: the unit of the shared-memory reads of the inner loops.
template <class T> struct Vec;
template <> struct Vec<float> {
  using type = float4;
  static constexpr int n = 4;
};
template <> struct Vec<double> {
  using type = double2;
  static constexpr int n = 2;
};

// Row stride of a tile in shared memory: the bucket plus 16 bytes, so that
// the lanes of a quarter warp, each reading 16 bytes of its own row at one
// column, hit different banks.
template <class T, int DB>
constexpr int kLd = DB + Vec<T>::n;

template <class T, int DB>
constexpr size_t kTileBytes = sizeof(T) * kTile * kLd<T, DB>;

// Probabilities (or dS) of a block in shared memory: kRows rows of 32 per warp.
template <class T>
constexpr size_t kProbBytes = sizeof(T) * kWarps * kRows * kTile;

// Element w of a vector (w a constant once the caller's loop is unrolled).
__device__ __forceinline__ float component(const float4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}
__device__ __forceinline__ double component(const double2& v, int w) { return w == 0 ? v.x : v.y; }

// acc[r] += rows[r * LD + d] * lane[d] for d < dEnd (a multiple of the
// vector width): `rows` are the warp's rows (the same address in every lane),
// `lane` the lane's own row.
template <class T, int LD>
__device__ __forceinline__ void dotRows(T (&acc)[kRows], const T* rows, const T* lane, int dEnd) {
  using V = typename Vec<T>::type;
  for (int d = 0; d < dEnd; d += Vec<T>::n) {
    const V b = *reinterpret_cast<const V*>(lane + d);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const V a = *reinterpret_cast<const V*>(rows + r * LD + d);
      if constexpr (Vec<T>::n == 4) {
        acc[r] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      } else {
        acc[r] += a.x * b.x + a.y * b.y;
      }
    }
  }
}

// acc[r][x] += sum over c < cEnd of p[r * 32 + c] * b[c * LD + lane + 32 x]:
// p holds the warp's kRows rows of probabilities (read the same in every
// lane), b a tile; cEnd is a multiple of the vector width.
template <class T, int J, int LD>
__device__ __forceinline__ void accumulateRows(T (&acc)[kRows][J], const T* p, const T* b, int cEnd, int lane) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::n;
  for (int c = 0; c < cEnd; c += W) {
    V pv[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) pv[r] = *reinterpret_cast<const V*>(p + r * kTile + c);
#pragma unroll
    for (int w = 0; w < W; ++w) {
#pragma unroll
      for (int x = 0; x < J; ++x) {
        const T bv = b[(c + w) * LD + lane + 32 * x];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][x] += component(pv[r], w) * bv;
      }
    }
  }
}

// n rounded up to the vector width of T.
template <class T>
__device__ __forceinline__ int roundToVec(int64_t n) {
  return static_cast<int>((n + Vec<T>::n - 1) / Vec<T>::n * Vec<T>::n);
}

// tile[r][c] = g[r * D + c] for r < rows and c < D, zeros elsewhere
// (consecutive threads read consecutive elements of a row).
template <class T, int DB>
__device__ __forceinline__ void loadTile(T* tile, const T* __restrict__ g, int64_t rows, int64_t D) {
  for (int e = threadIdx.x; e < kTile * DB; e += kBlockThreads) {
    const int r = e / DB, c = e % DB;
    tile[r * kLd<T, DB> + c] = (r < rows && c < D) ? g[r * D + c] : T(0);
  }
}

// One past the last key the queries [i0, i0 + rows) see.
template <class T>
__device__ __forceinline__ int64_t keysSeen(const Args<T>& a, int64_t i0, int64_t rows) {
  if (!a.causal) return a.sk;
  return min(max(i0 + rows + a.shift, int64_t(0)), a.sk);
}

// ---- forward -------------------------------------------------------------------

// Block: batch-head bh, queries [i0, i0 + 32). Warp w owns queries
// i0 + w * kRows + r; lane l owns key j0 + l of each key tile and output
// columns l, l + 32, ... of the warp's rows.
template <class T, int DB>
__global__ void __launch_bounds__(kBlockThreads) forwardKernel(Args<T> a, const T* __restrict__ q,
                                                               const T* __restrict__ k, const T* __restrict__ v,
                                                               T* __restrict__ out, T* __restrict__ lse) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int J = DB / 32, LD = kLd<T, DB>;
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kTile * LD;
  T* vs = ks + kTile * LD;
  T* ps = vs + kTile * LD + (threadIdx.x >> 5) * kRows * kTile;  // this warp's rows
  const int64_t qBlocks = (a.sq + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / qBlocks, i0 = (blockIdx.x % qBlocks) * kTile;
  const int64_t rows = min(static_cast<int64_t>(kTile), a.sq - i0), D = a.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T inf = std::numeric_limits<T>::infinity();
  loadTile<T, DB>(qs, q + (bh * a.sq + i0) * D, rows, D);

  T m[kRows], l[kRows], acc[kRows][J];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -inf;
    l[r] = 0;
#pragma unroll
    for (int c = 0; c < J; ++c) acc[r][c] = 0;
  }
  const int64_t kEnd = keysSeen(a, i0, rows);
  for (int64_t j0 = 0; j0 < kEnd; j0 += kTile) {
    const int64_t cols = min(static_cast<int64_t>(kTile), a.sk - j0);
    __syncthreads();  // every thread is done with the previous key tile
    loadTile<T, DB>(ks, k + (bh * a.sk + j0) * D, cols, D);
    loadTile<T, DB>(vs, v + (bh * a.sk + j0) * D, cols, D);
    __syncthreads();
    T s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = 0;
    dotRows<T, LD>(s, qs + warp * kRows * LD, ks + lane * LD, roundToVec<T>(D));
    // The rows' reductions interleave (one shuffle of each row per step).
    const int64_t j = j0 + lane;
    bool vis[kRows];
    T mx[kRows], p[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      vis[r] = visible(a, i0 + warp * kRows + r, j);
      s[r] = vis[r] ? s[r] * a.scale : -inf;
      mx[r] = s[r];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) mx[r] = fmax(mx[r], __shfl_xor_sync(kFull, mx[r], o));
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      mx[r] = fmax(m[r], mx[r]);  // the new running maximum, the same in every lane
      p[r] = vis[r] ? expOf(s[r] - mx[r]) : T(0);
      s[r] = p[r];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] += __shfl_xor_sync(kFull, s[r], o);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // What was accumulated against the old maximum shrinks by
      // exp(old - new) (0 when nothing was seen yet, 1 while nothing is).
      const T alpha = mx[r] == -inf ? T(1) : expOf(m[r] - mx[r]);
      l[r] = l[r] * alpha + s[r];
#pragma unroll
      for (int c = 0; c < J; ++c) acc[r][c] *= alpha;
      m[r] = mx[r];
      if (a.dropout && vis[r]) p[r] *= dropoutScale(a, bh, i0 + warp * kRows + r, j);
      ps[r * kTile + lane] = p[r];
    }
    __syncwarp();
    // acc += P V (P of keys past the end is 0, V's rows there zeros).
    accumulateRows<T, J, LD>(acc, ps, vs, roundToVec<T>(cols), lane);
    __syncwarp();  // ps is rewritten for the next key tile
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    if (i >= a.sq) continue;
    const T inv = l[r] == T(0) ? T(0) : T(1) / l[r];
    T* o = out + (bh * a.sq + i) * D;
#pragma unroll
    for (int x = 0; x < J; ++x) {
      const int d = lane + 32 * x;
      if (d < D) o[d] = acc[r][x] * inv;
    }
    if (lane == 0) lse[bh * a.sq + i] = l[r] == T(0) ? -inf : m[r] + log(l[r]);
  }
}

// ---- backward ------------------------------------------------------------------

// delta[r] = gradOut[r] · out[r] - gradLse[r], one warp per row, summed in
// float64 as on the CPU.
template <class T>
__global__ void deltaKernel(int64_t rows, int64_t D, const T* __restrict__ out, const T* __restrict__ gradOut,
                            const T* __restrict__ gradLse, T* __restrict__ delta) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += warps) {
    double s = 0;
    for (int64_t d = lane; d < D; d += 32) s += static_cast<double>(gradOut[r * D + d]) * out[r * D + d];
    s = warpSum(s);
    if (lane == 0) delta[r] = static_cast<T>(s - (gradLse ? static_cast<double>(gradLse[r]) : 0.0));
  }
}

// P ∘ Z and dS = P ∘ (dP ∘ Z - delta) of element (bh, i, j) from its score
// dot product s = q_i · k_j and dp = dO_i · v_j.
template <class T>
__device__ __forceinline__ void elementGradient(const Args<T>& a, int64_t bh, int64_t i, int64_t j, T s, T dp,
                                                T lseI, T deltaI, T& pz, T& ds) {
  const bool vis = visible(a, i, j) && lseI != -std::numeric_limits<T>::infinity();
  if (!vis) {
    pz = 0;
    ds = 0;
    return;
  }
  const T p = expOf(s * a.scale - lseI);
  const T z = a.dropout ? dropoutScale(a, bh, i, j) : T(1);
  pz = p * z;
  ds = p * (dp * z - deltaI);
}

// Block: batch-head bh, keys [j0, j0 + 32); writes their dK and dV rows.
// Warp w owns keys j0 + w * kRows + r; lane l owns query i0 + l of each
// query tile and gradient columns l, l + 32, ... of the warp's keys.
template <class T, int DB>
__global__ void __launch_bounds__(kBlockThreads) gradKVKernel(Args<T> a, const T* __restrict__ q,
                                                              const T* __restrict__ k, const T* __restrict__ v,
                                                              const T* __restrict__ lse, const T* __restrict__ delta,
                                                              const T* __restrict__ gradOut, T* __restrict__ gradK,
                                                              T* __restrict__ gradV) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int J = DB / 32, LD = kLd<T, DB>;
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kTile * LD;
  T* qs = vs + kTile * LD;
  T* dos = qs + kTile * LD;
  T* pzs = dos + kTile * LD;                // [warp][kRows keys][32 queries]
  T* dss = pzs + kWarps * kRows * kTile;    // likewise
  T* lses = dss + kWarps * kRows * kTile;
  T* deltas = lses + kTile;
  const int64_t kBlocks = (a.sk + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / kBlocks, j0 = (blockIdx.x % kBlocks) * kTile;
  const int64_t cols = min(static_cast<int64_t>(kTile), a.sk - j0), D = a.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T inf = std::numeric_limits<T>::infinity();
  loadTile<T, DB>(ks, k + (bh * a.sk + j0) * D, cols, D);
  loadTile<T, DB>(vs, v + (bh * a.sk + j0) * D, cols, D);

  T dk[kRows][J], dv[kRows][J];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int c = 0; c < J; ++c) dk[r][c] = dv[r][c] = 0;
  }
  // The first query tile with a query that sees key j0.
  const int64_t iStart = a.causal ? min(max(j0 - a.shift, int64_t(0)), a.sq) / kTile * kTile : 0;
  for (int64_t i0 = iStart; i0 < a.sq; i0 += kTile) {
    const int64_t rows = min(static_cast<int64_t>(kTile), a.sq - i0);
    __syncthreads();  // every thread is done with the previous query tile
    loadTile<T, DB>(qs, q + (bh * a.sq + i0) * D, rows, D);
    loadTile<T, DB>(dos, gradOut + (bh * a.sq + i0) * D, rows, D);
    if (threadIdx.x < kTile) {
      const int t = threadIdx.x;
      lses[t] = t < rows ? lse[bh * a.sq + i0 + t] : -inf;
      deltas[t] = t < rows ? delta[bh * a.sq + i0 + t] : T(0);
    }
    __syncthreads();
    T s[kRows], dp[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = dp[r] = 0;
    const int dEnd = roundToVec<T>(D);
    dotRows<T, LD>(s, ks + warp * kRows * LD, qs + lane * LD, dEnd);
    dotRows<T, LD>(dp, vs + warp * kRows * LD, dos + lane * LD, dEnd);
    const int64_t i = i0 + lane;
    T* pzw = pzs + warp * kRows * kTile;
    T* dsw = dss + warp * kRows * kTile;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      T pz, ds;
      elementGradient(a, bh, i, j0 + warp * kRows + r, s[r], dp[r], lses[lane], deltas[lane], pz, ds);
      pzw[r * kTile + lane] = pz;
      dsw[r * kTile + lane] = ds;
    }
    __syncwarp();
    // dV += (P ∘ Z)^T dO, dK += dS^T Q (queries past the end have P = dS = 0).
    const int cEnd = roundToVec<T>(rows);
    accumulateRows<T, J, LD>(dv, pzw, dos, cEnd, lane);
    accumulateRows<T, J, LD>(dk, dsw, qs, cEnd, lane);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t j = j0 + warp * kRows + r;
    if (j >= a.sk) continue;
#pragma unroll
    for (int x = 0; x < J; ++x) {
      const int d = lane + 32 * x;
      if (d < D) {
        gradK[(bh * a.sk + j) * D + d] = dk[r][x] * a.scale;
        gradV[(bh * a.sk + j) * D + d] = dv[r][x];
      }
    }
  }
}

// Block: batch-head bh, queries [i0, i0 + 32); writes their dQ rows. Warp w
// owns queries i0 + w * kRows + r; lane l owns key j0 + l of each key tile
// and gradient columns l, l + 32, ... of the warp's queries.
template <class T, int DB>
__global__ void __launch_bounds__(kBlockThreads) gradQKernel(Args<T> a, const T* __restrict__ q,
                                                             const T* __restrict__ k, const T* __restrict__ v,
                                                             const T* __restrict__ lse, const T* __restrict__ delta,
                                                             const T* __restrict__ gradOut, T* __restrict__ gradQ) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int J = DB / 32, LD = kLd<T, DB>;
  T* qs = reinterpret_cast<T*>(smem);
  T* dos = qs + kTile * LD;
  T* ks = dos + kTile * LD;
  T* vs = ks + kTile * LD;
  T* dsw = vs + kTile * LD + (threadIdx.x >> 5) * kRows * kTile;  // this warp's rows
  const int64_t qBlocks = (a.sq + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / qBlocks, i0 = (blockIdx.x % qBlocks) * kTile;
  const int64_t rows = min(static_cast<int64_t>(kTile), a.sq - i0), D = a.d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T inf = std::numeric_limits<T>::infinity();
  loadTile<T, DB>(qs, q + (bh * a.sq + i0) * D, rows, D);
  loadTile<T, DB>(dos, gradOut + (bh * a.sq + i0) * D, rows, D);

  T lseR[kRows], deltaR[kRows], dq[kRows][J];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    lseR[r] = i < a.sq ? lse[bh * a.sq + i] : -inf;
    deltaR[r] = i < a.sq ? delta[bh * a.sq + i] : T(0);
#pragma unroll
    for (int c = 0; c < J; ++c) dq[r][c] = 0;
  }
  const int64_t kEnd = keysSeen(a, i0, rows);
  for (int64_t j0 = 0; j0 < kEnd; j0 += kTile) {
    const int64_t cols = min(static_cast<int64_t>(kTile), a.sk - j0);
    __syncthreads();  // every thread is done with the previous key tile
    loadTile<T, DB>(ks, k + (bh * a.sk + j0) * D, cols, D);
    loadTile<T, DB>(vs, v + (bh * a.sk + j0) * D, cols, D);
    __syncthreads();
    T s[kRows], dp[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = dp[r] = 0;
    const int dEnd = roundToVec<T>(D);
    dotRows<T, LD>(s, qs + warp * kRows * LD, ks + lane * LD, dEnd);
    dotRows<T, LD>(dp, dos + warp * kRows * LD, vs + lane * LD, dEnd);
    const int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      T pz, ds;
      elementGradient(a, bh, i0 + warp * kRows + r, j, s[r], dp[r], lseR[r], deltaR[r], pz, ds);
      dsw[r * kTile + lane] = ds;
    }
    __syncwarp();
    // dQ += dS K (keys past the end have dS = 0, K's rows there zeros).
    accumulateRows<T, J, LD>(dq, dsw, ks, roundToVec<T>(cols), lane);
    __syncwarp();  // dsw is rewritten for the next key tile
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + warp * kRows + r;
    if (i >= a.sq) continue;
#pragma unroll
    for (int x = 0; x < J; ++x) {
      const int d = lane + 32 * x;
      if (d < D) gradQ[(bh * a.sq + i) * D + d] = dq[r][x] * a.scale;
    }
  }
}

// ---- launchers -----------------------------------------------------------------

// Shared memory of the kernels for bucket DB: the largest (the dK/dV one)
// decides whether a head dimension fits, so that a forward never succeeds
// where its backward cannot run.
template <class T, int DB>
constexpr size_t kForwardSmem = 3 * kTileBytes<T, DB> + kProbBytes<T>;
template <class T, int DB>
constexpr size_t kGradKVSmem = 4 * kTileBytes<T, DB> + 2 * kProbBytes<T> + 2 * kTile * sizeof(T);
template <class T, int DB>
constexpr size_t kGradQSmem = 4 * kTileBytes<T, DB> + kProbBytes<T>;

// Launches `kernel` on `blocks` blocks with `smem` bytes of dynamic shared
// memory, raising the kernel's limit past the default 48 KiB when needed.
template <class Kernel, class... A>
void launch(Kernel kernel, int64_t blocks, size_t smem, cudaStream_t s, const char* op, A... args) {
  if (blocks <= 0) return;
  if (smem > 48 * 1024) {
    WEFT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<static_cast<unsigned>(blocks), kBlockThreads, smem, s>>>(args...);
  checkLaunch(op);
}

template <class T>
Args<T> argsOf(const AttentionGeometry& g) {
  Args<T> a{};
  a.batchHeads = g.batchHeads;
  a.sq = g.queries;
  a.sk = g.keys;
  a.d = g.headDim;
  a.scale = static_cast<T>(g.scale);
  a.causal = g.causal;
  a.shift = g.queryOffset - g.keyOffset;
  a.dropout = g.dropout > 0.0;
  a.seed = g.seed;
  a.threshold = static_cast<uint64_t>(std::ceil(g.dropout * 0x1.0p53));
  a.keep = g.dropout >= 1.0 ? T(0) : static_cast<T>(1.0 / (1.0 - g.dropout));
  return a;
}

// Calls f.operator()<DB>() with the head-dimension bucket of g, after
// checking the geometry and that the bucket's tiles fit the device.
template <class T, class F>
void withBucket(const char* op, const AttentionGeometry& g, F&& f) {
  WEFT_ENFORCE(g.batchHeads >= 0 && g.queries >= 0 && g.keys >= 0 && g.headDim > 0, InvalidArgumentError, op,
               ": bad geometry (batch-heads ", g.batchHeads, ", queries ", g.queries, ", keys ", g.keys,
               ", head dimension ", g.headDim, ")");
  const int64_t tiles = g.batchHeads * std::max((g.queries + kTile - 1) / kTile, (g.keys + kTile - 1) / kTile);
  WEFT_ENFORCE(tiles <= std::numeric_limits<int32_t>::max(), InvalidArgumentError, op, ": ", g.batchHeads,
               " batch-heads of ", g.queries, " queries and ", g.keys, " keys exceed the grid of one launch");
  const size_t optin = properties(currentDevice()).sharedMemPerBlockOptin;
  auto fits = [&](size_t bytes) {
    WEFT_ENFORCE(bytes <= optin, InvalidArgumentError, op, ": head dimension ", g.headDim, " of ", kDTypeOf<T>,
                 " needs ", bytes, " bytes of shared memory per block, the device has ", optin);
  };
  const int64_t D = g.headDim;
  WEFT_ENFORCE(D <= 256, InvalidArgumentError, op, ": head dimension ", D, " is above 256, the largest on CUDA");
  if (D <= 32) {
    fits(kGradKVSmem<T, 32>);
    f.template operator()<32>();
  } else if (D <= 64) {
    fits(kGradKVSmem<T, 64>);
    f.template operator()<64>();
  } else if (D <= 128) {
    fits(kGradKVSmem<T, 128>);
    f.template operator()<128>();
  } else {
    fits(kGradKVSmem<T, 256>);
    f.template operator()<256>();
  }
}

// ---- merge ---------------------------------------------------------------------

// The weights of the two attentions of a row, as the CPU computes them;
// false when both are empty (lse -inf).
__device__ __forceinline__ bool mergeWeights(double la, double lb, double& a, double& b, double& m, double& s) {
  m = fmax(la, lb);
  if (m == -INFINITY) {
    a = b = 0;
    return false;
  }
  const double ea = exp(la - m), eb = exp(lb - m);
  s = ea + eb;
  a = ea / s;
  b = eb / s;
  return true;
}

// One warp per row.
template <class T>
__global__ void mergeForwardKernel(int64_t rows, int64_t D, const T* __restrict__ oA, const T* __restrict__ lA,
                                   const T* __restrict__ oB, const T* __restrict__ lB, T* __restrict__ out,
                                   T* __restrict__ lse) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += warps) {
    double a, b, m, s;
    const bool any = mergeWeights(lA[r], lB[r], a, b, m, s);
    for (int64_t d = lane; d < D; d += 32) {
      out[r * D + d] = any ? static_cast<T>(a * oA[r * D + d] + b * oB[r * D + d]) : T(0);
    }
    if (lane == 0) lse[r] = any ? static_cast<T>(m + log(s)) : -std::numeric_limits<T>::infinity();
  }
}

template <class T>
__global__ void mergeBackwardKernel(int64_t rows, int64_t D, const T* __restrict__ oA, const T* __restrict__ lA,
                                    const T* __restrict__ oB, const T* __restrict__ lB, const T* __restrict__ out,
                                    const T* __restrict__ lse, const T* __restrict__ gOut,
                                    const T* __restrict__ gLse, T* __restrict__ gOA, T* __restrict__ gLA,
                                    T* __restrict__ gOB, T* __restrict__ gLB) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += warps) {
    // The weights as the forward computed them (exp(lseX - lse) would round
    // lse's float32 value again).
    const double l = lse[r];
    double a = 0, b = 0, m, s;
    if (!(isinf(l) && l < 0)) mergeWeights(lA[r], lB[r], a, b, m, s);
    double dotA = 0, dotB = 0;
    for (int64_t d = lane; d < D; d += 32) {
      const double g = gOut[r * D + d], o = out[r * D + d];
      dotA += g * (static_cast<double>(oA[r * D + d]) - o);
      dotB += g * (static_cast<double>(oB[r * D + d]) - o);
      if (gOA) gOA[r * D + d] = static_cast<T>(a * g);
      if (gOB) gOB[r * D + d] = static_cast<T>(b * g);
    }
    dotA = warpSum(dotA);
    dotB = warpSum(dotB);
    if (lane == 0) {
      if (gLA) gLA[r] = static_cast<T>(a == 0 ? 0.0 : a * (gLse[r] + dotA));
      if (gLB) gLB[r] = static_cast<T>(b == 0 ? 0.0 : b * (gLse[r] + dotB));
    }
  }
}

// Blocks of kWarps rows for a warp-per-row kernel.
unsigned rowBlocks(int64_t rows) { return blocksFor(rows, kWarps); }

}  // namespace

void attentionForward(DType type, const AttentionGeometry& g, const void* q, const void* k, const void* v, void* out,
                      void* lse) {
  const char* op = "scaledDotProductAttention";
  WEFT_DISPATCH_FLOATING(type, op, [&]<class T>() {
    withBucket<T>(op, g, [&]<int DB>() {
      const int64_t blocks = g.batchHeads * ((g.queries + kTile - 1) / kTile);
      launch(forwardKernel<T, DB>, blocks, kForwardSmem<T, DB>, stream(), op, argsOf<T>(g),
             static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
             static_cast<T*>(lse));
    });
  });
}

void attentionBackward(DType type, const AttentionGeometry& g, const void* q, const void* k, const void* v,
                       const void* out, const void* lse, const void* gradOut, const void* gradLse, void* gradQ,
                       void* gradK, void* gradV) {
  const char* op = "scaledDotProductAttention backward";
  WEFT_ENFORCE((gradK == nullptr) == (gradV == nullptr), InvalidArgumentError, op,
               ": gradK and gradV must be both given or both null");
  WEFT_DISPATCH_FLOATING(type, op, [&]<class T>() {
    withBucket<T>(op, g, [&]<int DB>() {
      const int64_t rows = g.batchHeads * g.queries;
      const int device = currentDevice();
      cudaStream_t s = stream();
      // delta lives until the kernels reading it are enqueued: the caching
      // allocator hands the block out again only to later work on this stream.
      T* delta = rows > 0 ? static_cast<T*>(allocate(static_cast<size_t>(rows) * sizeof(T), device)) : nullptr;
      try {
        if (rows > 0) {
          deltaKernel<T><<<rowBlocks(rows), kBlockThreads, 0, s>>>(
              rows, g.headDim, static_cast<const T*>(out), static_cast<const T*>(gradOut),
              static_cast<const T*>(gradLse), delta);
          checkLaunch(op);
        }
        const Args<T> a = argsOf<T>(g);
        if (gradK) {
          launch(gradKVKernel<T, DB>, g.batchHeads * ((g.keys + kTile - 1) / kTile), kGradKVSmem<T, DB>, s, op, a,
                 static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                 static_cast<const T*>(lse), static_cast<const T*>(delta), static_cast<const T*>(gradOut),
                 static_cast<T*>(gradK), static_cast<T*>(gradV));
        }
        if (gradQ) {
          launch(gradQKernel<T, DB>, g.batchHeads * ((g.queries + kTile - 1) / kTile), kGradQSmem<T, DB>, s, op, a,
                 static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                 static_cast<const T*>(lse), static_cast<const T*>(delta), static_cast<const T*>(gradOut),
                 static_cast<T*>(gradQ));
        }
      } catch (...) {
        if (delta) deallocate(delta, device);
        throw;
      }
      if (delta) deallocate(delta, device);
    });
  });
}

void mergeAttentionForward(DType type, int64_t rows, int64_t headDim, const void* outA, const void* lseA,
                           const void* outB, const void* lseB, void* out, void* lse) {
  const char* op = "mergeAttention";
  WEFT_DISPATCH_FLOATING(type, op, [&]<class T>() {
    if (rows <= 0) return;
    mergeForwardKernel<T><<<rowBlocks(rows), kBlockThreads, 0, stream()>>>(
        rows, headDim, static_cast<const T*>(outA), static_cast<const T*>(lseA), static_cast<const T*>(outB),
        static_cast<const T*>(lseB), static_cast<T*>(out), static_cast<T*>(lse));
    checkLaunch(op);
  });
}

void mergeAttentionBackward(DType type, int64_t rows, int64_t headDim, const void* outA, const void* lseA,
                            const void* outB, const void* lseB, const void* out, const void* lse,
                            const void* gradOut, const void* gradLse, void* gradOutA, void* gradLseA, void* gradOutB,
                            void* gradLseB) {
  const char* op = "mergeAttention backward";
  WEFT_DISPATCH_FLOATING(type, op, [&]<class T>() {
    if (rows <= 0) return;
    mergeBackwardKernel<T><<<rowBlocks(rows), kBlockThreads, 0, stream()>>>(
        rows, headDim, static_cast<const T*>(outA), static_cast<const T*>(lseA), static_cast<const T*>(outB),
        static_cast<const T*>(lseB), static_cast<const T*>(out), static_cast<const T*>(lse),
        static_cast<const T*>(gradOut), static_cast<const T*>(gradLse), static_cast<T*>(gradOutA),
        static_cast<T*>(gradLseA), static_cast<T*>(gradOutB), static_cast<T*>(gradLseB));
    checkLaunch(op);
  });
}

}  // namespace weft::kernels::cuda
