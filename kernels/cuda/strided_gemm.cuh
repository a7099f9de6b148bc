// Row-major (strided-batched) GEMM on cuBLAS for the kernels that chain
// GEMMs with their own kernels (conv, LSTM), and a stream-ordered scratch
// buffer from the caching allocator.
//
//   stridedGemm<float>({a, false, lda, strideA}, {b, true, ldb, strideB}, m, n, k, 1.0f, 0.0f,
//                      {c, ldc, strideC}, batch);
//
// C_i [m, n] = alpha * op(A_i) [m, k] · op(B_i) [k, n] + beta * C_i for i in
// [0, batch), every matrix row-major with its leading dimension (op(X) = X^T
// where `trans`). cuBLAS is column-major: a row-major C is a column-major C^T,
// so the call computes C^T = op(B)^T · op(A)^T. k == 0 scales C by beta (zeros
// when beta is 0) as BLAS defines it. Sizes must fit cuBLAS's int; callers
// check them (naming their op) first. Runs on cublasHandle(), the current
// stream of the current device; float32 follows allowTF32().
#pragma once

#include <climits>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda {

template <class T>
struct GemmIn {
  const T* p;
  bool trans;
  int64_t ld;
  int64_t stride = 0;  // elements between the batch's matrices (0: the same matrix for all)
};

template <class T>
struct GemmOut {
  T* p;
  int64_t ld;
  int64_t stride = 0;
};

template <class T>
void stridedGemm(GemmIn<T> a, GemmIn<T> b, int64_t m, int64_t n, int64_t k, T alpha, T beta, GemmOut<T> c,
                 int64_t batch = 1) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "stridedGemm: float or double");
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {
    if (beta != T(0)) return;  // only beta == 0 or 1 reach here: C stays as it is
    for (int64_t i = 0; i < batch; ++i) {
      WEFT_CUDA_CHECK(cudaMemset2DAsync(c.p + i * c.stride, static_cast<size_t>(c.ld) * sizeof(T), 0,
                                        static_cast<size_t>(n) * sizeof(T), static_cast<size_t>(m), stream()));
    }
    return;
  }
  const cublasOperation_t opA = b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opB = a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int lda = static_cast<int>(b.ld), ldb = static_cast<int>(a.ld), ldc = static_cast<int>(c.ld);
  cublasHandle_t h = cublasHandle();
  if (batch == 1) {
    if constexpr (std::is_same_v<T, float>) {
      checkCublas(cublasSgemm(h, opA, opB, M, N, K, &alpha, b.p, lda, a.p, ldb, &beta, c.p, ldc), "cublasSgemm");
    } else {
      checkCublas(cublasDgemm(h, opA, opB, M, N, K, &alpha, b.p, lda, a.p, ldb, &beta, c.p, ldc), "cublasDgemm");
    }
    return;
  }
  const int count = static_cast<int>(batch);
  if constexpr (std::is_same_v<T, float>) {
    checkCublas(cublasSgemmStridedBatched(h, opA, opB, M, N, K, &alpha, b.p, lda, b.stride, a.p, ldb, a.stride, &beta,
                                          c.p, ldc, c.stride, count),
                "cublasSgemmStridedBatched");
  } else {
    checkCublas(cublasDgemmStridedBatched(h, opA, opB, M, N, K, &alpha, b.p, lda, b.stride, a.p, ldb, a.stride, &beta,
                                          c.p, ldc, c.stride, count),
                "cublasDgemmStridedBatched");
  }
}

// Whether v fits cuBLAS's int sizes.
inline bool fitsBlasInt(int64_t v) { return v >= 0 && v <= static_cast<int64_t>(INT_MAX); }

}  // namespace weft::kernels::cuda
