#include "kernels/cuda/reduce.h"

#include <cstring>

#include "kernels/cuda/reduce.cuh"

namespace weft::kernels::cuda {
namespace {

// Sums of float32 accumulate in float64 (as on the CPU), of the 16-bit types
// in float32, of the integers in their own type.
template <class T> struct SumAccOf { using type = Acc<T>; };
template <> struct SumAccOf<float> { using type = double; };
template <class T> using SumAcc = typename SumAccOf<T>::type;

template <class T>
struct SumOf : SumOp<SumAcc<T>> {
  using State = SumAcc<T>;
  static __device__ __forceinline__ State lift(T v, int64_t) { return static_cast<State>(toAcc(v)); }
};

// The extremum and its position. An empty state (i < 0) loses to everything;
// a NaN beats every number; among equals, and among NaNs, the first position
// wins. The order of combination therefore does not change the result.
template <class T, bool IsMax>
struct ExtremumOf {
  struct State {
    Acc<T> v;
    int64_t i;
  };
  static __device__ __forceinline__ State identity() { return {Acc<T>(0), -1}; }
  static __device__ __forceinline__ State lift(T v, int64_t r) { return {toAcc(v), r}; }
  static __device__ __forceinline__ State combine(State a, State b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool aNan = a.v != a.v, bNan = b.v != b.v;
    if (aNan || bNan) {
      if (aNan && bNan) return a.i < b.i ? a : b;
      return aNan ? a : b;
    }
    if (a.v == b.v) return a.i < b.i ? a : b;
    return (IsMax ? a.v > b.v : a.v < b.v) ? a : b;
  }
  static __device__ __forceinline__ State shuffleXor(State s, int m) {
    return {shuffleXorValue(s.v, m), shuffleXorValue(s.i, m)};
  }
};

// Where a reduced state goes: the final output in the element type...
template <class T>
struct SumSink {
  T* out;
  __device__ __forceinline__ void operator()(int64_t at, SumAcc<T> s) const { out[at] = roundTo<T>(s); }
};

template <class T, bool IsMax>
struct ExtremumSink {
  T* values;
  int64_t* indices;
  __device__ __forceinline__ void operator()(int64_t at, typename ExtremumOf<T, IsMax>::State s) const {
    if (values) values[at] = roundTo<T>(s.v);
    if (indices) indices[at] = s.i;
  }
};

// ...or a partial result for the second pass.
template <class S>
struct PartialSink {
  S* out;
  __device__ __forceinline__ void operator()(int64_t at, S s) const { out[at] = s; }
};

// Element `at` of the input as a state: an element at position r along the
// reduced axis, or (second pass) a partial state.
template <class Op, bool FromPartials, class In>
__device__ __forceinline__ typename Op::State liftAt(const In* p, int64_t at, int64_t r) {
  if constexpr (FromPartials) return p[at];
  else return Op::lift(p[at], r);
}

// Rows of a [rows, R] buffer, each cut into `splits` pieces of splitLen:
// item = row * splits + piece. A group of G threads (one warp, or the whole
// block when G == kThreads) reduces one item and passes it to sink(item).
template <class Op, bool FromPartials, int G, class In, class Sink>
__global__ void rowReduceKernel(const In* in, int64_t items, int64_t splits, int64_t R, int64_t splitLen, Sink sink) {
  using S = typename Op::State;
  constexpr int kGroups = kThreads / G;
  __shared__ S scratch[32];
  const int group = threadIdx.x / G, lane = threadIdx.x % G;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kGroups + group; item < items;
       item += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t row = item / splits, piece = item - row * splits;
    const int64_t begin = piece * splitLen, end = min(R, begin + splitLen);
    const int64_t base = row * R;
    // Four independent chains keep several loads in flight per thread.
    S a0 = Op::identity(), a1 = Op::identity(), a2 = Op::identity(), a3 = Op::identity();
    int64_t r = begin + lane;
    for (; r + 3 * G < end; r += 4 * G) {
      a0 = Op::combine(a0, liftAt<Op, FromPartials>(in, base + r, r));
      a1 = Op::combine(a1, liftAt<Op, FromPartials>(in, base + r + G, r + G));
      a2 = Op::combine(a2, liftAt<Op, FromPartials>(in, base + r + 2 * G, r + 2 * G));
      a3 = Op::combine(a3, liftAt<Op, FromPartials>(in, base + r + 3 * G, r + 3 * G));
    }
    for (; r < end; r += G) a0 = Op::combine(a0, liftAt<Op, FromPartials>(in, base + r, r));
    S s = Op::combine(Op::combine(a0, a1), Op::combine(a2, a3));
    if constexpr (G == 32) {
      s = warpReduce<Op>(s);
    } else {
      s = blockReduce<Op>(s, scratch);
    }
    if (lane == 0) sink(item, s);
  }
}

constexpr int kColTile = 32;  // adjacent columns per block (one warp's coalesced row)
constexpr int kColRows = 8;   // rows of the block, each walking every 8th row of the piece

// Columns of a contiguous [outer, R, inner] buffer: a block (32 x 8 threads)
// takes 32 adjacent columns of one outer index and piece blockIdx.y of R
// (splitLen rows); thread (x, y) walks rows y, y + 8, ... of column x, the
// 8 partial states meet in shared memory, and row 0 hands the result to
// sink(piece * outer * inner + o * inner + i).
template <class Op, bool FromPartials, class In, class Sink>
__global__ void colReduceKernel(const In* in, int64_t outer, int64_t R, int64_t inner, int64_t splitLen, Sink sink) {
  using S = typename Op::State;
  __shared__ S tile[kColRows][kColTile + 1];
  const int64_t tilesPerOuter = (inner + kColTile - 1) / kColTile;
  const int64_t tiles = outer * tilesPerOuter;
  const int64_t piece = blockIdx.y;
  const int64_t begin = piece * splitLen, end = min(R, begin + splitLen);
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t o = t / tilesPerOuter;
    const int64_t i = (t - o * tilesPerOuter) * kColTile + tx;
    S s = Op::identity();
    if (i < inner) {
      const int64_t base = o * R * inner + i;
      S s1 = Op::identity();
      int64_t r = begin + ty;
      for (; r + kColRows < end; r += 2 * kColRows) {
        s = Op::combine(s, liftAt<Op, FromPartials>(in, base + r * inner, r));
        s1 = Op::combine(s1, liftAt<Op, FromPartials>(in, base + (r + kColRows) * inner, r + kColRows));
      }
      if (r < end) s = Op::combine(s, liftAt<Op, FromPartials>(in, base + r * inner, r));
      s = Op::combine(s, s1);
    }
    tile[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && i < inner) {
#pragma unroll
      for (int y = 1; y < kColRows; ++y) s = Op::combine(s, tile[y][tx]);
      sink(piece * outer * inner + o * inner + i, s);
    }
    __syncthreads();
  }
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks that keep the device busy: a few per multiprocessor.
int64_t blocksWanted() { return static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 4; }

// Rows shorter than this are reduced by one warp each, longer ones by a block.
constexpr int64_t kWarpRowMax = 2048;

template <class Op, bool FromPartials, class In, class Sink>
void launchRows(const In* in, int64_t rows, int64_t splits, int64_t R, int64_t splitLen, Sink sink, const char* op) {
  const int64_t items = rows * splits;
  if (items == 0) return;
  const int64_t cap = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 32;
  if (splitLen <= kWarpRowMax) {
    const auto grid = static_cast<unsigned>(std::min(ceilDiv(items, kThreads / 32), cap));
    rowReduceKernel<Op, FromPartials, 32><<<grid, kThreads, 0, stream()>>>(in, items, splits, R, splitLen, sink);
  } else {
    const auto grid = static_cast<unsigned>(std::min(items, cap));
    rowReduceKernel<Op, FromPartials, kThreads><<<grid, kThreads, 0, stream()>>>(in, items, splits, R, splitLen, sink);
  }
  checkLaunch(op);
}

template <class Op, bool FromPartials, class In, class Sink>
void launchCols(const In* in, int64_t outer, int64_t R, int64_t inner, int64_t splits, int64_t splitLen, Sink sink,
                const char* op) {
  const int64_t tiles = outer * ceilDiv(inner, kColTile);
  if (tiles == 0) return;
  const int64_t cap = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 16;
  const dim3 grid(static_cast<unsigned>(std::min(tiles, cap)), static_cast<unsigned>(splits));
  colReduceKernel<Op, FromPartials><<<grid, dim3(kColTile, kColRows), 0, stream()>>>(in, outer, R, inner, splitLen,
                                                                                    sink);
  checkLaunch(op);
}

// Reduces the middle axis of a contiguous [outer, R, inner] buffer of T into
// sink(o * inner + i). When the outputs alone cannot fill the device, R is
// cut into pieces reduced in parallel, and a second pass combines the pieces.
template <class Op, class T, class Sink>
void reduceAxis(const T* in, int64_t outer, int64_t R, int64_t inner, Sink sink, const char* op) {
  using S = typename Op::State;
  if (outer == 0 || inner == 0) return;
  const int64_t wanted = blocksWanted();
  if (inner == 1) {
    int64_t splits = 1;
    if (R > kWarpRowMax && outer < wanted) {
      splits = std::clamp<int64_t>(ceilDiv(wanted, outer), 1, std::max<int64_t>(1, ceilDiv(R, 8192)));
    }
    const int64_t splitLen = std::max<int64_t>(1, ceilDiv(R, splits));
    splits = std::max<int64_t>(1, ceilDiv(R, splitLen));
    if (splits == 1) {
      launchRows<Op, false>(in, outer, 1, R, R, sink, op);
      return;
    }
    Scratch partial(static_cast<size_t>(outer * splits) * sizeof(S));
    launchRows<Op, false>(in, outer, splits, R, splitLen, PartialSink<S>{partial.as<S>()}, op);
    launchRows<Op, true>(partial.as<const S>(), outer, 1, splits, splits, sink, op);
    return;
  }
  const int64_t tiles = outer * ceilDiv(inner, kColTile);
  int64_t splits = 1;
  if (tiles < wanted) {
    splits = std::clamp<int64_t>(ceilDiv(wanted, tiles), 1, std::clamp<int64_t>(ceilDiv(R, 64), 1, 65535));
  }
  const int64_t splitLen = std::max<int64_t>(1, ceilDiv(R, splits));
  splits = std::max<int64_t>(1, ceilDiv(R, splitLen));
  if (splits == 1) {
    launchCols<Op, false>(in, outer, R, inner, 1, std::max<int64_t>(R, 1), sink, op);
    return;
  }
  const int64_t n = outer * inner;
  Scratch partial(static_cast<size_t>(n * splits) * sizeof(S));
  launchCols<Op, false>(in, outer, R, inner, splits, splitLen, PartialSink<S>{partial.as<S>()}, op);
  launchCols<Op, true>(partial.as<const S>(), 1, splits, n, 1, splits, sink, op);
}

// Leading-axis sums with 16-byte loads: thread (x, y) of a 32 x 8 block
// owns kVec adjacent columns of a tile of 32 * kVec, and walks rows y, y + 8,
// ... of piece blockIdx.y with one 16-byte load per row (rows and the buffer
// 16-byte aligned: inner a multiple of kVec). The 8 partial rows meet in
// shared memory, and every thread of the block then finishes columns of the
// tile: out[piece * outer * inner + o * inner + i], rounded to T unless
// Partial (then the float accumulation type, for the second pass).
template <class T, bool Partial>
__global__ void colSumVecKernel(const T* in, int64_t outer, int64_t R, int64_t inner, int64_t splitLen,
                                std::conditional_t<Partial, SumAcc<T>, T>* out) {
  using A = SumAcc<T>;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kTileCols = kColTile * kVec;
  __shared__ A tile[kColRows][kTileCols + 1];
  const int64_t tilesPerOuter = (inner + kTileCols - 1) / kTileCols;
  const int64_t tiles = outer * tilesPerOuter;
  const int64_t piece = blockIdx.y;
  const int64_t begin = piece * splitLen, end = min(R, begin + splitLen);
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kColTile + tx;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t o = t / tilesPerOuter;
    const int64_t tileStart = (t - o * tilesPerOuter) * kTileCols;
    const int64_t c0 = tileStart + static_cast<int64_t>(tx) * kVec;
    A acc[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] = A(0);
    if (c0 < inner) {
      const T* base = in + o * R * inner + c0;
      int64_t r = begin + ty;
      // Two rows per step keep two loads in flight per thread.
      for (; r + kColRows < end; r += 2 * kColRows) {
        const uint4 a = *reinterpret_cast<const uint4*>(base + r * inner);
        const uint4 b = *reinterpret_cast<const uint4*>(base + (r + kColRows) * inner);
        T va[kVec], vb[kVec];
        memcpy(va, &a, sizeof(a));
        memcpy(vb, &b, sizeof(b));
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] += static_cast<A>(toAcc(va[k])) + static_cast<A>(toAcc(vb[k]));
      }
      if (r < end) {
        const uint4 a = *reinterpret_cast<const uint4*>(base + r * inner);
        T va[kVec];
        memcpy(va, &a, sizeof(a));
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] += static_cast<A>(toAcc(va[k]));
      }
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) tile[ty][tx * kVec + k] = acc[k];
    __syncthreads();
    for (int col = tid; col < kTileCols; col += kColTile * kColRows) {
      const int64_t i = tileStart + col;
      if (i >= inner) continue;
      A s = tile[0][col];
#pragma unroll
      for (int y = 1; y < kColRows; ++y) s += tile[y][col];
      const int64_t at = piece * outer * inner + o * inner + i;
      if constexpr (Partial) {
        out[at] = s;
      } else {
        out[at] = roundTo<T>(s);
      }
    }
    __syncthreads();
  }
}

// The sum over the middle axis of [outer, R, inner] with colSumVecKernel,
// when its alignment holds (floating types, inner a multiple of the vector
// width, a 16-byte aligned buffer); false otherwise.
template <class T>
bool sumColumnsVectorized(const T* in, int64_t outer, int64_t R, int64_t inner, T* out, const char* op) {
  constexpr int kVec = 16 / sizeof(T);
  if constexpr (std::is_integral_v<T>) {
    return false;
  } else {
    if (inner % kVec != 0 || reinterpret_cast<uintptr_t>(in) % 16 != 0) return false;
    if (outer == 0 || inner == 0) return true;
    using A = SumAcc<T>;
    const int64_t tiles = outer * ceilDiv(inner, kColTile * kVec);
    const int64_t wanted = 2 * blocksWanted();
    int64_t splits = 1;
    if (tiles < wanted) {
      splits = std::clamp<int64_t>(ceilDiv(wanted, tiles), 1, std::clamp<int64_t>(ceilDiv(R, 64), 1, 65535));
    }
    const int64_t splitLen = std::max<int64_t>(1, ceilDiv(R, splits));
    splits = std::max<int64_t>(1, ceilDiv(R, splitLen));
    const int64_t cap = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 16;
    const dim3 grid(static_cast<unsigned>(std::min(tiles, cap)), static_cast<unsigned>(splits));
    const dim3 block(kColTile, kColRows);
    if (splits == 1) {
      colSumVecKernel<T, false><<<grid, block, 0, stream()>>>(in, outer, R, inner, std::max<int64_t>(R, 1), out);
      checkLaunch(op);
      return true;
    }
    const int64_t n = outer * inner;
    Scratch partial(static_cast<size_t>(n * splits) * sizeof(A));
    colSumVecKernel<T, true><<<grid, block, 0, stream()>>>(in, outer, R, inner, splitLen, partial.as<A>());
    checkLaunch(op);
    launchCols<SumOf<T>, true>(partial.as<const A>(), 1, splits, n, 1, splits, SumSink<T>{out}, op);
    return true;
  }
}

// Row sums with 16-byte loads: as rowReduceKernel for SumOf<T>, with every
// row and piece starting 16-byte aligned (R and splitLen multiples of kVec).
template <class T, int G, class Sink>
__global__ void rowSumVecKernel(const T* in, int64_t items, int64_t splits, int64_t R, int64_t splitLen, Sink sink) {
  using Op = SumOf<T>;
  using A = SumAcc<T>;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kGroups = kThreads / G;
  __shared__ A scratch[32];
  const int group = threadIdx.x / G, lane = threadIdx.x % G;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kGroups + group; item < items;
       item += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t row = item / splits, piece = item - row * splits;
    const int64_t begin = piece * splitLen, end = min(R, begin + splitLen);
    const uint4* base = reinterpret_cast<const uint4*>(in + row * R);
    A a0[kVec], a1[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) a0[k] = a1[k] = A(0);
    int64_t q = begin / kVec + lane;
    const int64_t qEnd = end / kVec;
    for (; q + G < qEnd; q += 2 * G) {
      const uint4 ra = base[q], rb = base[q + G];
      T va[kVec], vb[kVec];
      memcpy(va, &ra, sizeof(ra));
      memcpy(vb, &rb, sizeof(rb));
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        a0[k] += static_cast<A>(toAcc(va[k]));
        a1[k] += static_cast<A>(toAcc(vb[k]));
      }
    }
    if (q < qEnd) {
      const uint4 ra = base[q];
      T va[kVec];
      memcpy(va, &ra, sizeof(ra));
#pragma unroll
      for (int k = 0; k < kVec; ++k) a0[k] += static_cast<A>(toAcc(va[k]));
    }
    A s = A(0);
#pragma unroll
    for (int k = 0; k < kVec; ++k) s += a0[k] + a1[k];
    if constexpr (G == 32) {
      s = warpReduce<Op>(s);
    } else {
      s = blockReduce<Op>(s, scratch);
    }
    if (lane == 0) sink(item, s);
  }
}

// The row sums of a [K, R] buffer with rowSumVecKernel when its alignment
// holds (floating types, R a multiple of the vector width, a 16-byte aligned
// buffer); false otherwise.
template <class T>
bool sumRowsVectorized(const T* in, int64_t K, int64_t R, T* out, const char* op) {
  constexpr int kVec = 16 / sizeof(T);
  if constexpr (std::is_integral_v<T>) {
    return false;
  } else {
    if (R == 0 || R % kVec != 0 || reinterpret_cast<uintptr_t>(in) % 16 != 0) return false;
    if (K == 0) return true;
    using A = SumAcc<T>;
    const int64_t wanted = 2 * blocksWanted();
    int64_t splits = 1;
    if (R > kWarpRowMax && K < wanted) {
      splits = std::clamp<int64_t>(ceilDiv(wanted, K), 1, std::max<int64_t>(1, ceilDiv(R, 8192)));
    }
    const int64_t splitLen = ceilDiv(ceilDiv(R, splits), kVec) * kVec;
    splits = ceilDiv(R, splitLen);
    const int64_t cap = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 32;
    auto firstPass = [&](auto sink) {
      const int64_t items = K * splits;
      if (splitLen <= kWarpRowMax) {
        const auto grid = static_cast<unsigned>(std::min(ceilDiv(items, kThreads / 32), cap));
        rowSumVecKernel<T, 32><<<grid, kThreads, 0, stream()>>>(in, items, splits, R, splitLen, sink);
      } else {
        const auto grid = static_cast<unsigned>(std::min(items, cap));
        rowSumVecKernel<T, kThreads><<<grid, kThreads, 0, stream()>>>(in, items, splits, R, splitLen, sink);
      }
      checkLaunch(op);
    };
    if (splits == 1) {
      firstPass(SumSink<T>{out});
      return true;
    }
    Scratch partial(static_cast<size_t>(K * splits) * sizeof(A));
    firstPass(PartialSink<A>{partial.as<A>()});
    launchRows<SumOf<T>, true>(partial.as<const A>(), K, 1, splits, splits, SumSink<T>{out}, op);
    return true;
  }
}

template <class T>
__global__ void extremumBackwardKernel(const T* g, const int64_t* indices, int64_t outer, int64_t R, int64_t inner,
                                       T* gradIn) {
  const int64_t n = outer * inner;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = j / inner, i = j - o * inner;
    gradIn[(o * R + indices[j]) * inner + i] = g[j];
  }
}

}  // namespace

void sumRows(DType type, const void* in, int64_t K, int64_t R, void* out) {
  WEFT_ENFORCE(K >= 0 && R >= 0, InvalidArgumentError, "sum: negative size (K ", K, ", R ", R, ")");
  WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(type, "sum", [&]<class T>() {
    const T* p = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    if (!sumRowsVectorized(p, K, R, o, "sum")) reduceAxis<SumOf<T>>(p, K, R, 1, SumSink<T>{o}, "sum");
  });
}

void sumCols(DType type, const void* in, int64_t R, int64_t K, void* out) {
  WEFT_ENFORCE(K >= 0 && R >= 0, InvalidArgumentError, "sum: negative size (R ", R, ", K ", K, ")");
  WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(type, "sum", [&]<class T>() {
    const T* p = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    if (K == 1) {
      if (!sumRowsVectorized(p, 1, R, o, "sum")) reduceAxis<SumOf<T>>(p, 1, R, 1, SumSink<T>{o}, "sum");
    } else if (!sumColumnsVectorized(p, 1, R, K, o, "sum")) {
      reduceAxis<SumOf<T>>(p, 1, R, K, SumSink<T>{o}, "sum");
    }
  });
}

void extremumForward(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool isMax, void* values,
                     int64_t* indices) {
  const char* op = isMax ? "max" : "min";
  WEFT_ENFORCE(outer >= 0 && inner >= 0 && R >= 1, InvalidArgumentError, op, ": cannot reduce an axis of size ", R);
  WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(type, op, [&]<class T>() {
    const T* p = static_cast<const T*>(in);
    T* v = static_cast<T*>(values);
    if (isMax) {
      reduceAxis<ExtremumOf<T, true>>(p, outer, R, inner, ExtremumSink<T, true>{v, indices}, op);
    } else {
      reduceAxis<ExtremumOf<T, false>>(p, outer, R, inner, ExtremumSink<T, false>{v, indices}, op);
    }
  });
}

void extremumBackward(DType type, const void* g, const int64_t* indices, int64_t outer, int64_t R, int64_t inner,
                      void* gradIn) {
  WEFT_CUDA_DISPATCH_NUMERIC_AND_HALF(type, "max/min backward", [&]<class T>() {
    const int64_t total = outer * R * inner;
    if (total == 0) return;
    WEFT_CUDA_CHECK(cudaMemsetAsync(gradIn, 0, static_cast<size_t>(total) * sizeof(T), stream()));
    const int64_t n = outer * inner;
    extremumBackwardKernel<<<blocksFor(n), kThreads, 0, stream()>>>(static_cast<const T*>(g), indices, outer, R,
                                                                     inner, static_cast<T*>(gradIn));
    checkLaunch("max/min backward");
  });
}

}  // namespace weft::kernels::cuda
