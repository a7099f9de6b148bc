// Matrix products on cuBLAS, with the functions and operand conventions of
// kernels/cpu/gemm.h (same names, same signatures; every pointer is device
// memory of the current device, and the work is enqueued on its current
// stream, kernels/cuda/runtime.h).
//
//   // C[m, n] = A[m, k] · B[n, k]^T, all row-major and contiguous:
//   gemm(DType::Float32, {a, false, k}, {b, true, k}, m, n, k, 1.0, 0.0, c, n);
//
// Matrices are row-major as on the CPU. cuBLAS is column-major, and a
// row-major [r, c] matrix with leading dimension ld is the column-major
// [c, r] matrix with the same ld, so C = op(A)·op(B) is computed as
// C^T = op(B)^T · op(A)^T with the operands swapped: no copy is made, and a
// transposed or sliced operand reaches cuBLAS as a transpose flag and a
// leading dimension. Sizes and leading dimensions are 64-bit (the _64 entry
// points of cuBLAS).
//
// Types (cublasGemmEx / cublasGemmStridedBatchedEx):
//   Float64            CUDA_R_64F in and out, CUBLAS_COMPUTE_64F.
//   Float32            CUDA_R_32F in and out, CUBLAS_COMPUTE_32F; with TF32
//                      allowed, CUBLAS_COMPUTE_32F_FAST_TF32 (the inputs
//                      rounded to TF32's 10-bit mantissa inside the tensor
//                      cores, products accumulated in float32).
//   BFloat16, Float16  CUDA_R_16BF / CUDA_R_16F in and out, CUBLAS_COMPUTE_32F
//                      (float32 accumulation, alpha and beta in float32, one
//                      rounding to the 16-bit type at the end).
// Others throw InvalidArgumentError naming the dtype.
//
// TF32 is off by default, so float32 products agree with the CPU's to the
// reassociation of sums. WEFT_ALLOW_TF32=1 in the environment, or
// kernels::cuda::setAllowTF32(true) at run time (kernels/cuda/runtime.h),
// turns it on for the float32 products enqueued after: the operands keep 10
// of float32's 23 mantissa bits inside the products (sums stay float32), for
// the tensor cores' rate. Float64 and the 16-bit types are not affected.
//
// k == 0 scales C by beta (zeroing it when beta is 0, whatever C held); an
// empty C launches nothing. gemmBatched: one strided-batched cuBLAS call when
// the batch dimensions collapse to one (a broadcast operand has batch stride
// 0), else one such call per index of the other batch dimensions. When C
// matrices repeat (a zero C batch stride), the result is the CPU's in-order
// loop, C = beta * C + alpha * P_j for each repeated index j in row-major
// order: with beta = 1 and the repeated A and B matrices side by side along
// k, as one product with k times the repeats; else through a float32
// (float64 for Float64) workspace of the products, summed into C by one
// kernel, while that fits in 256 MiB; else in rounds, one per repeated index.
//
// Errors: a cuBLAS failure is a DeviceError naming the call and the device;
// CUDA builds only (tensor/ code reaches these through WEFT_CUDA_CALL).
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"
#include "kernels/cpu/gemm.h"

namespace weft::kernels::cuda {

using cpu::MatrixOperand;

// C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C, C row-major with
// leading dimension ldc.
void gemm(DType type, MatrixOperand a, MatrixOperand b, int64_t m, int64_t n, int64_t k, double alpha, double beta,
          void* c, int64_t ldc);

// One GEMM per element of `batchShape`, operand X of element (i0, i1, ...)
// at X.data + sum_d i_d * xBatchStrides[d] (element strides; 0 repeats a
// matrix). Repeated C matrices accumulate as described above.
void gemmBatched(DType type, std::span<const int64_t> batchShape, MatrixOperand a,
                 std::span<const int64_t> aBatchStrides, MatrixOperand b, std::span<const int64_t> bBatchStrides,
                 int64_t m, int64_t n, int64_t k, double alpha, double beta, void* c,
                 std::span<const int64_t> cBatchStrides, int64_t ldc);

// C[i, j] = row[j] for i < rows, j < cols (the bias pre-broadcast of a
// linear layer, before a GEMM with beta = 1). Any dtype.
void fillRows(DType type, const void* row, int64_t rows, int64_t cols, void* c, int64_t ldc);

}  // namespace weft::kernels::cuda
