// Tensors as GEMM operands (internal to tensor/): the layout a matrix
// reaches BLAS in, and the batched product that the matrix ops and their
// gradient rules share. A transposed view reaches BLAS (OpenBLAS on the CPU,
// cuBLAS on CUDA) as a transpose flag, and only a matrix whose strides BLAS
// cannot express (no unit-stride dimension) is copied first.
#pragma once

#include "kernels/cpu/gemm.h"
#include "tensor/tensor.h"

namespace weft::detail {

// A tensor [..., rows, cols] as GEMM reads it: one matrix per batch element.
struct GemmInput {
  Tensor keep;                      // owns the data: the tensor itself, or its contiguous copy
  kernels::cpu::MatrixOperand mat;  // the matrix of one batch element
  Shape strides;                    // batch strides over the product's batch shape
  kernels::cpu::MatrixOperand maybeTransposed(bool t) const { return {mat.data, mat.trans != t, mat.ld}; }
};

// t [..., rows, cols] as GEMM reads it, with batch strides over `batch`.
GemmInput gemmInput(const Tensor& t, const Shape& batch);

// kernels::cpu::gemm, or kernels::cuda::gemm with `device` current (the
// pointers are then that device's memory).
void gemmOn(Device device, DType type, kernels::cpu::MatrixOperand a, kernels::cpu::MatrixOperand b, int64_t m,
            int64_t n, int64_t k, double alpha, double beta, void* c, int64_t ldc);

// Returns r[resultShape] (on x's device) with r[i] = op(x[i]) · op(y[i]) for every i of
// `batch` (x, y broadcast over it); op transposes when xT / yT. A result
// batch dimension of size 1 (or missing) that `batch` stretches is summed
// over, which is how gradients reach broadcast operands.
Tensor batchedGemm(const Tensor& x, bool xT, const Tensor& y, bool yT, const Shape& batch, const Shape& resultShape);

}  // namespace weft::detail
