#include "tensor/batched_gemm.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "kernels/cuda/gemm.h"
#include "kernels/cuda_call.h"

namespace weft::detail {
namespace {

using kernels::cpu::MatrixOperand;

// Row-major ([rows, cols] with unit column stride) or the transpose of a
// row-major [cols, rows]; false when neither describes the strides.
bool blasLayout(int64_t rows, int64_t cols, int64_t rowStride, int64_t colStride, MatrixOperand& out) {
  if ((cols <= 1 || colStride == 1) && (rows <= 1 || rowStride >= std::max<int64_t>(cols, 1))) {
    out.trans = false;
    out.ld = rows <= 1 ? std::max<int64_t>(cols, 1) : rowStride;
    return true;
  }
  if ((rows <= 1 || rowStride == 1) && (cols <= 1 || colStride >= std::max<int64_t>(rows, 1))) {
    out.trans = true;
    out.ld = cols <= 1 ? std::max<int64_t>(rows, 1) : colStride;
    return true;
  }
  return false;
}

// t's strides over the leading (batch) dimensions, aligned to `batch` from
// the right; 0 where t has no such dimension or repeats a size-1 one.
Shape batchStrides(const Tensor& t, const Shape& batch) {
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  int64_t nb = static_cast<int64_t>(batch.size()), tb = static_cast<int64_t>(shape.size()) - 2;
  Shape st(nb, 0);
  for (int64_t i = nb - tb; i < nb; ++i) {
    int64_t d = i - (nb - tb);
    st[i] = shape[d] == 1 ? 0 : strides[d];
  }
  return st;
}

// The last two entries of a shape or strides vector (a matrix's rows, cols).
std::pair<int64_t, int64_t> lastTwo(const Shape& v) { return {v[v.size() - 2], v[v.size() - 1]}; }

}  // namespace

GemmInput gemmInput(const Tensor& t, const Shape& batch) {
  GemmInput in;
  in.keep = t;
  auto [rows, cols] = lastTwo(t.shape());
  auto [rowStride, colStride] = lastTwo(t.strides());
  if (!blasLayout(rows, cols, rowStride, colStride, in.mat)) {
    in.keep = t.detach().contiguous();
    std::tie(rowStride, colStride) = lastTwo(in.keep.strides());
    blasLayout(rows, cols, rowStride, colStride, in.mat);
  }
  in.mat.data = in.keep.rawData();
  if (!batch.empty()) in.strides = batchStrides(in.keep, batch);
  return in;
}

void gemmOn(Device device, DType type, MatrixOperand a, MatrixOperand b, int64_t m, int64_t n, int64_t k, double alpha,
            double beta, void* c, int64_t ldc) {
  if (device.isCuda()) {
    WEFT_CUDA_CALL(device.index, gemm(type, a, b, m, n, k, alpha, beta, c, ldc));
  } else {
    kernels::cpu::gemm(type, a, b, m, n, k, alpha, beta, c, ldc);
  }
}

Tensor batchedGemm(const Tensor& x, bool xT, const Tensor& y, bool yT, const Shape& batch, const Shape& resultShape) {
  size_t nd = resultShape.size();
  int64_t m = resultShape[nd - 2], n = resultShape[nd - 1];
  auto [xRows, xCols] = lastTwo(x.shape());
  int64_t k = xT ? xRows : xCols;
  DType dt = x.dtype();
  GemmInput gx = gemmInput(x, batch), gy = gemmInput(y, batch);
  Tensor r = empty(resultShape, {.dtype = dt, .device = x.device()});
  if (batch.empty()) {
    gemmOn(x.device(), dt, gx.maybeTransposed(xT), gy.maybeTransposed(yT), m, n, k, 1.0, 0.0, r.rawData(), n);
    return r;
  }
  Shape rStrides = batchStrides(r, batch);
  bool accumulates = false;
  for (size_t i = 0; i < batch.size(); ++i) accumulates |= rStrides[i] == 0 && batch[i] > 1;
  if (accumulates) r.zero_();
  const double beta = accumulates ? 1.0 : 0.0;
  if (x.device().isCuda()) {
    WEFT_CUDA_CALL(x.device().index, gemmBatched(dt, batch, gx.maybeTransposed(xT), gx.strides, gy.maybeTransposed(yT),
                                                 gy.strides, m, n, k, 1.0, beta, r.rawData(), rStrides, n));
  } else {
    kernels::cpu::gemmBatched(dt, batch, gx.maybeTransposed(xT), gx.strides, gy.maybeTransposed(yT), gy.strides, m,
                              n, k, 1.0, beta, r.rawData(), rStrides, n);
  }
  return r;
}

}  // namespace weft::detail
