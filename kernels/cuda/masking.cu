#include "kernels/cuda/masking.h"

#include "kernels/cuda/loops.cuh"

namespace weft::kernels::cuda {
namespace {

template <class W>
void whereTyped(const bool* cond, const W* a, const W* b, W* out, const StridedOffsets<4>& off, int64_t n) {
  launchStrided<4>(n, off, [=] __device__(int64_t i, const int64_t* o) {
    out[o[0]] = cond[o[1]] ? a[o[2]] : b[o[3]];
  }, "where");
}

template <class W>
void triangleTyped(const W* in, int64_t total, int64_t R, int64_t C, int64_t diagonal, bool upper, W* out) {
  launchContiguous(total, [=] __device__(int64_t i) {
    const int64_t j = i % C;
    const int64_t r = (i / C) % R;
    const bool keep = upper ? j - r >= diagonal : j - r <= diagonal;
    out[i] = keep ? in[i] : W(0);
  }, "triangle");
}

template <class F>
void byWidth(DType type, const char* op, F f) {
  switch (elementSize(type)) {
    case 1: f.template operator()<uint8_t>(); break;
    case 2: f.template operator()<uint16_t>(); break;
    case 4: f.template operator()<uint32_t>(); break;
    case 8: f.template operator()<uint64_t>(); break;
    default: throwUnsupportedDType(op, type);
  }
}

}  // namespace

void where(DType type, const bool* cond, std::span<const int64_t> condStrides, const void* a,
           std::span<const int64_t> aStrides, const void* b, std::span<const int64_t> bStrides, void* out,
           std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n == 0) return;
  WEFT_ENFORCE(shape.size() <= static_cast<size_t>(kMaxDims), InvalidArgumentError, "where: ", shape.size(),
               " dimensions; CUDA kernels take at most ", kMaxDims);
  int64_t os[kMaxDims];
  contiguousStridesOf(shape, os);
  const std::span<const int64_t> strides[4] = {std::span<const int64_t>(os, shape.size()), condStrides, aStrides,
                                               bStrides};
  StridedOffsets<4> off(shape, strides);
  byWidth(type, "where", [&]<class W>() {
    whereTyped(cond, static_cast<const W*>(a), static_cast<const W*>(b), static_cast<W*>(out), off, n);
  });
}

void triangle(DType type, const void* in, int64_t batch, int64_t R, int64_t C, int64_t diagonal, bool upper,
              void* out) {
  const int64_t total = batch * R * C;
  if (total == 0) return;
  byWidth(type, "triangle", [&]<class W>() {
    triangleTyped(static_cast<const W*>(in), total, R, C, diagonal, upper, static_cast<W*>(out));
  });
}

}  // namespace weft::kernels::cuda
