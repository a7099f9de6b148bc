#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

blasint toBlasInt(int64_t v, const char* what) {
  WEFT_ENFORCE(v <= static_cast<int64_t>(INT_MAX), InvalidArgumentError, "gemm: ", what, " = ", v,
               " exceeds the BLAS integer range");
  return static_cast<blasint>(v);
}

// The stored matrix of an operand is [rows, cols] row-major; a single stored
// row makes the leading dimension irrelevant, and BLAS still wants it >= cols.
int64_t normalizedLd(const MatrixOperand& x, int64_t rows, int64_t cols) {
  int64_t minLd = std::max<int64_t>(cols, 1);
  if (rows <= 1) return std::max(x.ld, minLd);
  WEFT_CHECK(x.ld >= minLd) << "gemm: leading dimension " << x.ld << " below " << minLd;
  return x.ld;
}

template <class T>
void scaleMatrix(T* c, int64_t m, int64_t n, int64_t ldc, T beta) {
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      std::memset(row, 0, sizeof(T) * n);
    } else if (beta != T(1)) {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

template <class T>
void gemmTyped(const MatrixOperand& a, const T* pa, const MatrixOperand& b, const T* pb, int64_t m, int64_t n,
               int64_t k, T alpha, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scaleMatrix(c, m, n, ldc, beta);
    return;
  }
  // Stored shapes: A is [m, k] or, transposed, [k, m]; B is [k, n] or [n, k].
  int64_t lda = a.trans ? normalizedLd(a, k, m) : normalizedLd(a, m, k);
  int64_t ldb = b.trans ? normalizedLd(b, n, k) : normalizedLd(b, k, n);
  ldc = std::max<int64_t>(ldc, std::max<int64_t>(n, 1));
  CBLAS_TRANSPOSE ta = a.trans ? CblasTrans : CblasNoTrans;
  CBLAS_TRANSPOSE tb = b.trans ? CblasTrans : CblasNoTrans;
  blasint bm = toBlasInt(m, "m"), bn = toBlasInt(n, "n"), bk = toBlasInt(k, "k");
  blasint blda = toBlasInt(lda, "lda"), bldb = toBlasInt(ldb, "ldb"), bldc = toBlasInt(ldc, "ldc");
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, bm, bn, bk, alpha, pa, blda, pb, bldb, beta, c, bldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, bm, bn, bk, alpha, pa, blda, pb, bldb, beta, c, bldc);
  }
}

}  // namespace

void gemm(DType type, MatrixOperand a, MatrixOperand b, int64_t m, int64_t n, int64_t k, double alpha, double beta,
          void* c, int64_t ldc) {
  WEFT_DISPATCH_FLOATING(type, "gemm", [&]<class T>() {
    gemmTyped<T>(a, static_cast<const T*>(a.data), b, static_cast<const T*>(b.data), m, n, k, static_cast<T>(alpha),
                 static_cast<T>(beta), static_cast<T*>(c), ldc);
  });
}

void gemmBatched(DType type, std::span<const int64_t> batchShape, MatrixOperand a,
                 std::span<const int64_t> aBatchStrides, MatrixOperand b, std::span<const int64_t> bBatchStrides,
                 int64_t m, int64_t n, int64_t k, double alpha, double beta, void* c,
                 std::span<const int64_t> cBatchStrides, int64_t ldc) {
  WEFT_DISPATCH_FLOATING(type, "gemm", [&]<class T>() {
    const int nd = static_cast<int>(batchShape.size());
    int64_t count = 1;
    for (int64_t s : batchShape) count *= s;
    const T* pa = static_cast<const T*>(a.data);
    const T* pb = static_cast<const T*>(b.data);
    T* pc = static_cast<T*>(c);
    int64_t index[kMaxDims] = {};
    int64_t offA = 0, offB = 0, offC = 0;
    for (int64_t e = 0; e < count; ++e) {
      gemmTyped<T>(a, pa + offA, b, pb + offB, m, n, k, static_cast<T>(alpha), static_cast<T>(beta), pc + offC, ldc);
      // Advance the batch index like an odometer, updating the offsets.
      for (int d = nd - 1; d >= 0; --d) {
        offA += aBatchStrides[d];
        offB += bBatchStrides[d];
        offC += cBatchStrides[d];
        if (++index[d] < batchShape[d]) break;
        offA -= aBatchStrides[d] * batchShape[d];
        offB -= bBatchStrides[d] * batchShape[d];
        offC -= cBatchStrides[d] * batchShape[d];
        index[d] = 0;
      }
    }
  });
}

void fillRows(DType type, const void* row, int64_t rows, int64_t cols, void* c, int64_t ldc) {
  WEFT_DISPATCH_FLOATING(type, "fillRows", [&]<class T>() {
    const T* r = static_cast<const T*>(row);
    T* out = static_cast<T*>(c);
    parallelFor(rows, kParallelGrain / std::max<int64_t>(cols, 1) + 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) std::memcpy(out + i * ldc, r, sizeof(T) * cols);
    });
  });
}

}  // namespace weft::kernels::cpu
