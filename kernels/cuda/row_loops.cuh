// Row-parallel launch shapes shared by the gather/scatter, embedding and
// normalisation kernels: a block of (tx, ty) threads works on ty rows at a
// time, tx threads along each row, and blocks stride over the rows. Row
// indices are computed once per row, never per element.
//
//   RowLaunch l = rowLaunch(rows, width);
//   kernel<<<l.grid, l.block, 0, stream()>>>(rows, width, ...);
//   // in the kernel:
//   for (int64_t r = firstRow(); r < rows; r += rowStride()) {
//     for (int64_t c = threadIdx.x; c < width; c += blockDim.x) ...
//   }
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda {

struct RowLaunch {
  dim3 grid;
  dim3 block;
};

// tx: the row width rounded up to a warp, at most kThreads; ty = kThreads / tx.
inline RowLaunch rowLaunch(int64_t rows, int64_t width) {
  int64_t tx = std::min<int64_t>(kThreads, std::max<int64_t>(32, (width + 31) / 32 * 32));
  int64_t ty = kThreads / tx;
  RowLaunch l;
  l.block = dim3(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  l.grid = dim3(blocksFor((rows + ty - 1) / ty, 1));
  return l;
}

__device__ __forceinline__ int64_t firstRow() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
}
__device__ __forceinline__ int64_t rowStride() { return static_cast<int64_t>(gridDim.x) * blockDim.y; }

// The widest unit of 16, 8, 4, 2 or 1 bytes that divides every value given
// (byte counts, byte offsets and addresses): a kernel that only copies rows
// moves them in units of it, 16-byte loads where the layout allows.
inline size_t copyUnit(std::initializer_list<uint64_t> values) {
  size_t unit = 16;
  for (uint64_t v : values) {
    while (unit > 1 && v % unit != 0) unit /= 2;
  }
  return unit;
}

inline uint64_t addressOf(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Calls f.template operator()<U>() with U a plain type of `bytes` bytes (1,
// 2, 4, 8 or 16): kernels that only move elements dispatch on size.
template <class F>
void dispatchBySize(size_t bytes, const char* op, F&& f) {
  switch (bytes) {
    case 16: f.template operator()<uint4>(); break;
    case 1: f.template operator()<uint8_t>(); break;
    case 2: f.template operator()<uint16_t>(); break;
    case 4: f.template operator()<uint32_t>(); break;
    case 8: f.template operator()<uint64_t>(); break;
    default: throw InvalidArgumentError(::weft::detail::concat(op, ": no element type of ", bytes, " bytes"));
  }
}

}  // namespace weft::kernels::cuda
