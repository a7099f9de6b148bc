// Matrix products (weft's own float32 kernel, OpenBLAS's cblas_sgemm and
// cblas_dgemm), plus the small
// row/column helpers that surround a GEMM in linear layers.
//
//   // C[m, n] = A[m, k] · B[n, k]^T, all row-major and contiguous:
//   gemm(DType::Float32, {a, false, k}, {b, true, k}, m, n, k, 1.0, 0.0, c, n);
//
// Every matrix is row-major. A stored operand is described by a MatrixOperand:
// its data, whether the product uses it transposed, and its leading dimension
// (the element distance between consecutive stored rows). A transposed view of
// a row-major matrix is therefore passed as the stored matrix with `trans` set:
// no copy is made. Float32 goes to weft's own AVX-512 kernel where the CPU has
// AVX-512F (kernels/cpu/sgemm.h; products of at least 8 rows and 16 columns;
// WEFT_GEMM=blas turns it off), else to OpenBLAS; Float64 to OpenBLAS;
// BFloat16 and Float16 are converted to float32 in panels, multiplied as
// float32 (float32 accumulation) and rounded back once (alpha and beta
// applied in float32); others throw InvalidArgumentError naming the dtype.
//
// Threading: the own kernel spreads its packing and its tiles over weft's
// kernel threads itself (same bits on any thread count). OpenBLAS runs each
// call on the calling thread (that thread's OpenMP thread count is set to 1
// before each BLAS call); a large product is cut into row or column blocks,
// one BLAS call each, spread over weft's kernel threads
// (kernels/cpu/parallel.h) instead, so that BLAS and the other kernels share
// one pool rather than two pools spinning against each other. Called from
// inside a task, a product runs on the calling thread.
//
// Results are the same bits for any thread count: the blocks depend only on
// the product's shape (m, n, k), never on the threads. A BLAS kernel need not
// give a block called on its own the bits of the same rows inside a larger
// call, so the bits of a product are those of its blocks, and one product may
// differ in the last bits from a single cblas_sgemm of the same operands.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace weft::kernels::cpu {

struct MatrixOperand {
  const void* data = nullptr;
  bool trans = false;  // the product reads the stored matrix transposed
  int64_t ld = 1;      // leading dimension of the stored (row-major) matrix
};

// C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C, C row-major with
// leading dimension ldc. k == 0 scales C by beta (zeroing it when beta is 0).
void gemm(DType type, MatrixOperand a, MatrixOperand b, int64_t m, int64_t n, int64_t k, double alpha, double beta,
          void* c, int64_t ldc);

// One GEMM per element of `batchShape`: operand X of batch element (i0, i1, ...)
// starts at X.data + sum_d i_d * xBatchStrides[d] (element strides; 0 repeats
// a matrix across that dimension). When C matrices repeat (a zero C batch
// stride), the batch runs in row-major order of `batchShape`, so beta = 1
// accumulates; otherwise small products are spread across threads.
void gemmBatched(DType type, std::span<const int64_t> batchShape, MatrixOperand a,
                 std::span<const int64_t> aBatchStrides, MatrixOperand b, std::span<const int64_t> bBatchStrides,
                 int64_t m, int64_t n, int64_t k, double alpha, double beta, void* c,
                 std::span<const int64_t> cBatchStrides, int64_t ldc);

// C[i, j] = row[j] for i < rows, j < cols (the bias pre-broadcast of a
// linear layer, before a GEMM with beta = 1).
void fillRows(DType type, const void* row, int64_t rows, int64_t cols, void* c, int64_t ldc);

}  // namespace weft::kernels::cpu
