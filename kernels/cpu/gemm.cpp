#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"

namespace weft::kernels::cpu {
namespace {

// Below this many multiply-adds (m * n * k) a product runs on one thread:
// the fork/join would cost more than it saves.
constexpr double kParallelGemmWork = 1 << 19;
// Column blocks handed to threads start on multiples of this many elements
// (a cache line of float32).
constexpr int64_t kBlockAlign = 16;

// BLAS runs each call on its calling thread; a large product is split into
// blocks across weft's kernel threads here (kernels/cpu/parallel.h), so that
// BLAS and the other kernels share one pool. OpenBLAS's OpenMP build sizes
// each call by the calling thread's OpenMP thread count (and opens a team
// of that many threads for it): the calling thread's count is set to 1
// before every call (a cheap check; a caller may have raised it since).
// weft itself does not use OpenMP.
void keepBlasOnThisThread() {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
}

// BLAS takes 32-bit sizes. Checked before any parallel region, which an
// exception must not leave.
void checkBlasRange(int64_t m, int64_t n, int64_t k, const MatrixOperand& a, const MatrixOperand& b, int64_t ldc) {
  for (int64_t v : {m, n, k, a.ld, b.ld, ldc}) {
    WEFT_ENFORCE(v <= static_cast<int64_t>(INT_MAX), InvalidArgumentError, "gemm: a [", m, ", ", k, "] x [", k, ", ", n,
                 "] product with leading dimensions (", a.ld, ", ", b.ld, ", ", ldc,
                 ") exceeds the 32-bit BLAS integer range");
  }
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
void blasGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc) {
  keepBlasOnThisThread();
  CBLAS_TRANSPOSE cta = ta ? CblasTrans : CblasNoTrans, ctb = tb ? CblasTrans : CblasNoTrans;
  auto bm = static_cast<blasint>(m), bn = static_cast<blasint>(n), bk = static_cast<blasint>(k);
  auto blda = static_cast<blasint>(lda), bldb = static_cast<blasint>(ldb), bldc = static_cast<blasint>(ldc);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, cta, ctb, bm, bn, bk, alpha, a, blda, b, bldb, beta, c, bldc);
  } else {
    cblas_dgemm(CblasRowMajor, cta, ctb, bm, bn, bk, alpha, a, blda, b, bldb, beta, c, bldc);
  }
}

// One product; `threads` > 1 splits the longer of C's two dimensions into
// that many blocks, one BLAS call per block, spread over the pool.
template <class T>
void gemmTyped(const MatrixOperand& a, const T* pa, const MatrixOperand& b, const T* pb, int64_t m, int64_t n,
               int64_t k, T alpha, T beta, T* c, int64_t ldc, int threads) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scaleMatrix(c, m, n, ldc, beta);
    return;
  }
  // Stored shapes: A is [m, k] or, transposed, [k, m]; B is [k, n] or [n, k].
  int64_t lda = a.trans ? normalizedLd(a, k, m) : normalizedLd(a, m, k);
  int64_t ldb = b.trans ? normalizedLd(b, n, k) : normalizedLd(b, k, n);
  ldc = std::max<int64_t>(ldc, std::max<int64_t>(n, 1));
  bool splitRows = m >= n;
  int64_t total = splitRows ? m : n;
  int64_t chunk = ((total + threads - 1) / threads + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  if (threads <= 1 || chunk >= total) {
    blasGemm<T>(a.trans, b.trans, m, n, k, alpha, pa, lda, pb, ldb, beta, c, ldc);
    return;
  }
  parallelRun((total + chunk - 1) / chunk, threads, [&](int64_t block, int) {
    int64_t lo = block * chunk, hi = std::min(total, lo + chunk);
    if (splitRows) {  // rows [lo, hi) of op(A) and of C
      const T* sa = a.trans ? pa + lo : pa + lo * lda;
      blasGemm<T>(a.trans, b.trans, hi - lo, n, k, alpha, sa, lda, pb, ldb, beta, c + lo * ldc, ldc);
    } else {  // columns [lo, hi) of op(B) and of C
      const T* sb = b.trans ? pb + lo * ldb : pb + lo;
      blasGemm<T>(a.trans, b.trans, m, hi - lo, k, alpha, pa, lda, sb, ldb, beta, c + lo, ldc);
    }
  });
}

// Threads worth using for `work` multiply-adds.
int gemmThreads(double work) {
  if (work < kParallelGemmWork) return 1;
  return threadsFor(numThreads(), numThreads());
}

}  // namespace

void gemm(DType type, MatrixOperand a, MatrixOperand b, int64_t m, int64_t n, int64_t k, double alpha, double beta,
          void* c, int64_t ldc) {
  checkBlasRange(m, n, k, a, b, ldc);
  int threads = gemmThreads(static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  WEFT_DISPATCH_FLOATING(type, "gemm", [&]<class T>() {
    gemmTyped<T>(a, static_cast<const T*>(a.data), b, static_cast<const T*>(b.data), m, n, k, static_cast<T>(alpha),
                 static_cast<T>(beta), static_cast<T*>(c), ldc, threads);
  });
}

void gemmBatched(DType type, std::span<const int64_t> batchShape, MatrixOperand a,
                 std::span<const int64_t> aBatchStrides, MatrixOperand b, std::span<const int64_t> bBatchStrides,
                 int64_t m, int64_t n, int64_t k, double alpha, double beta, void* c,
                 std::span<const int64_t> cBatchStrides, int64_t ldc) {
  checkBlasRange(m, n, k, a, b, ldc);
  const int nd = static_cast<int>(batchShape.size());
  int64_t count = 1;
  bool cAliases = false;  // some C matrix is written by several batch elements
  for (int d = 0; d < nd; ++d) {
    count *= batchShape[d];
    cAliases |= cBatchStrides[d] == 0 && batchShape[d] > 1;
  }
  double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  WEFT_DISPATCH_FLOATING(type, "gemm", [&]<class T>() {
    const T* pa = static_cast<const T*>(a.data);
    const T* pb = static_cast<const T*>(b.data);
    T* pc = static_cast<T*>(c);
    T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    if (!cAliases && count > 1 && work < kParallelGemmWork) {
      // Many small, independent products: one thread per slice of the batch.
      int64_t grain = static_cast<int64_t>(kParallelGemmWork / std::max(work, 1.0)) + 1;
      parallelFor(count, grain, [&](int64_t eb, int64_t ee) {
        for (int64_t e = eb; e < ee; ++e) {
          int64_t offA = 0, offB = 0, offC = 0, rem = e;
          for (int d = nd - 1; d >= 0; --d) {
            int64_t i = rem % batchShape[d];
            rem /= batchShape[d];
            offA += i * aBatchStrides[d];
            offB += i * bBatchStrides[d];
            offC += i * cBatchStrides[d];
          }
          gemmTyped<T>(a, pa + offA, b, pb + offB, m, n, k, al, be, pc + offC, ldc, 1);
        }
      });
      return;
    }
    // In order (aliased C matrices accumulate with beta = 1), each product
    // using the threads its own size warrants.
    int threads = gemmThreads(work);
    int64_t index[kMaxDims] = {};
    int64_t offA = 0, offB = 0, offC = 0;
    for (int64_t e = 0; e < count; ++e) {
      gemmTyped<T>(a, pa + offA, b, pb + offB, m, n, k, al, be, pc + offC, ldc, threads);
      for (int d = nd - 1; d >= 0; --d) {  // advance the batch index like an odometer
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
