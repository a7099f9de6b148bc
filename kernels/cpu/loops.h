// Loop helpers shared by the CPU kernels: parallel flat loops and row-wise
// iteration over strided (possibly broadcast) operands.
//
// Threading: loops go parallel (kernels/cpu/parallel.h's pool) only above
// kParallelGrain elements, so small tensors never pay a fork/join.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "kernels/cpu/parallel.h"

namespace weft::kernels::cpu {

inline constexpr int64_t kParallelGrain = 32768;

// How many contiguous chunks parallelFor splits [0, n) into: 1 below `grain`
// or with one thread, else about four per thread (so that a descheduled
// thread holds up a small share), each at least `grain` long.
inline int64_t parallelChunkCount(int64_t n, int64_t grain) {
  const int threads = threadsFor(n / std::max<int64_t>(grain, 1), numThreads());
  if (n < grain || threads <= 1) return 1;
  return std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, 4 * static_cast<int64_t>(threads));
}

// Calls fn(chunk, begin, end, thread) for `chunks` chunks of [0, n) (chunk c
// covers [c * n / chunks, (c + 1) * n / chunks)), spread over the kernel
// threads one chunk at a time. Partial results indexed by `chunk` combine in
// order; compute the count once (e.g. parallelChunkCount(n, grain)) so that
// what is sized by it matches. `thread` is below threadsFor(chunks,
// numThreads()) and fixed for one thread, so it can index scratch memory.
template <class F>
void parallelForChunks(int64_t n, int64_t chunks, F&& fn) {
  if (n <= 0) return;
  if (chunks <= 1) {
    fn(int64_t{0}, int64_t{0}, n, 0);
    return;
  }
  parallelRun(chunks, numThreads(),
              [&](int64_t c, int thread) { fn(c, c * n / chunks, (c + 1) * n / chunks, thread); });
}

// Calls fn(begin, end) over [0, n), split across threads when n is large.
template <class F>
void parallelFor(int64_t n, int64_t grain, F&& fn) {
  parallelForChunks(n, parallelChunkCount(n, grain), [&](int64_t, int64_t b, int64_t e, int) { fn(b, e); });
}

// Splits a reduction over the middle axis of a contiguous [outer, R, inner]
// buffer into tasks of (outer index o, first column ib, column count n <= Block)
// and runs fn(o, ib, n) for each, in parallel when the work is large. Blocking
// the columns lets a task keep one running value per column on the stack.
template <int64_t Block, class F>
void forEachColumnBlock(int64_t outer, int64_t R, int64_t inner, F&& fn) {
  int64_t blocks = (inner + Block - 1) / Block;
  int64_t blockLen = inner < Block ? inner : Block;
  int64_t perTask = R * blockLen > 0 ? R * blockLen : 1;
  parallelFor(outer * blocks, kParallelGrain / perTask + 1, [&](int64_t tb, int64_t te) {
    for (int64_t task = tb; task < te; ++task) {
      int64_t o = task / blocks;
      int64_t ib = (task % blocks) * Block;
      fn(o, ib, inner - ib < Block ? inner - ib : Block);
    }
  });
}

// Row-wise iteration over an N-operand elementwise loop. `shape` is the output
// shape; strides[k] are operand k's strides in elements, already broadcast to
// `shape` (0 where the operand is broadcast). For each innermost row it calls
// fn(offsets, rowLength, innerStrides) where offsets[k] is operand k's element
// offset of the row start.
template <int N, class F>
void forEachRow(std::span<const int64_t> shape, const std::span<const int64_t> (&strides)[N], F&& fn) {
  const int nd = static_cast<int>(shape.size());
  int64_t inner = nd ? shape[nd - 1] : 1;
  int64_t innerStrides[N];
  for (int k = 0; k < N; ++k) innerStrides[k] = nd ? strides[k][nd - 1] : 0;
  int64_t rows = 1;
  for (int d = 0; d + 1 < nd; ++d) rows *= shape[d];
  if (inner == 0 || rows == 0) return;
  parallelFor(rows, kParallelGrain / (inner > 0 ? inner : 1) + 1, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      int64_t offsets[N] = {};
      int64_t rem = r;
      for (int d = nd - 2; d >= 0; --d) {
        int64_t i = rem % shape[d];
        rem /= shape[d];
        for (int k = 0; k < N; ++k) offsets[k] += i * strides[k][d];
      }
      fn(offsets, inner, innerStrides);
    }
  });
}

}  // namespace weft::kernels::cpu
