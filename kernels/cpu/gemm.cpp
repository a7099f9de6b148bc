#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/sgemm.h"

namespace weft::kernels::cpu {
namespace {

// Below this many multiply-adds (m * n * k) a product is one BLAS call on one
// thread: the fork/join would cost more than it saves.
constexpr double kParallelGemmWork = 1 << 19;
// Larger products are cut into about kBlockLen rows or columns per block, at
// least 2 and at most kMaxBlocks blocks. BLAS repacks the operand the blocks
// share for each block, so a block costs time even on one thread, the more
// so the smaller the blocks: blocks stay large, and few.
constexpr int64_t kBlockLen = 256;
constexpr int64_t kMaxBlocks = 16;
// The thinnest products weft's own float32 kernel takes.
constexpr int64_t kOwnSgemmMinRows = 8;
constexpr int64_t kOwnSgemmMinCols = 16;
// Blocks start on multiples of this many elements (a cache line of float32).
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

// How a product is cut into blocks: `count` blocks of `len` rows (`rows`) or
// columns of C, the last one possibly shorter, along the longer dimension.
// The cut depends only on the shape, never on the thread count: a BLAS kernel
// may compute an element of a block called on its own with other
// instructions than the same element inside a larger call, so a product's
// bits follow its blocks. OpenBLAS 0.3.21's Haswell sgemm kernel, for one,
// sums an element's k products in one accumulator or in two (even and odd k,
// added at the end) depending on where the element falls among the call's
// tiles (groups of 12, 8, 4, 2, 1 rows of C, 16x6 and 8x6 tiles with special
// first and last ones across its columns), and its SkylakeX kernels send
// calls of up to 10^6 multiply-adds to a separate small-matrix kernel. With
// fixed blocks the bits are the same for any number of threads.
struct GemmBlocks {
  bool rows;
  int64_t len, count;
};

GemmBlocks gemmBlocks(int64_t m, int64_t n, int64_t k) {
  const bool rows = m >= n;
  const int64_t total = rows ? m : n;
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (work < kParallelGemmWork || total <= kBlockAlign) return {rows, total, 1};
  const int64_t want = std::clamp<int64_t>(total / kBlockLen, 2, kMaxBlocks);
  const int64_t len = ((total + want - 1) / want + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  return {rows, len, (total + len - 1) / len};
}

// Float32 products go to weft's own AVX-512 kernel (kernels/cpu/sgemm.h)
// where the CPU has it, unless they are too thin for its 12 x 32 tiles to
// pay (a matrix-vector product, a few rows): those, and every product on
// other CPUs, go to OpenBLAS. The choice depends on the shape alone.
bool useOwnSgemm(int64_t m, int64_t n) {
  return m >= kOwnSgemmMinRows && n >= kOwnSgemmMinCols && ownSgemmAvailable();
}

// One product, cut into its blocks (gemmBlocks), one BLAS call per block,
// spread over the pool.
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
  if constexpr (std::is_same_v<T, float>) {
    if (useOwnSgemm(m, n)) {  // k >= 1 here
      ownSgemm(a.trans, b.trans, m, n, k, alpha, pa, lda, pb, ldb, beta, c, ldc);
      return;
    }
  }
  const GemmBlocks blocks = gemmBlocks(m, n, k);
  if (blocks.count == 1) {
    blasGemm<T>(a.trans, b.trans, m, n, k, alpha, pa, lda, pb, ldb, beta, c, ldc);
    return;
  }
  const int64_t total = blocks.rows ? m : n;
  parallelRun(blocks.count, numThreads(), [&](int64_t block, int) {
    int64_t lo = block * blocks.len, hi = std::min(total, lo + blocks.len);
    if (blocks.rows) {  // rows [lo, hi) of op(A) and of C
      const T* sa = a.trans ? pa + lo : pa + lo * lda;
      blasGemm<T>(a.trans, b.trans, hi - lo, n, k, alpha, sa, lda, pb, ldb, beta, c + lo * ldc, ldc);
    } else {  // columns [lo, hi) of op(B) and of C
      const T* sb = b.trans ? pb + lo * ldb : pb + lo;
      blasGemm<T>(a.trans, b.trans, m, hi - lo, k, alpha, pa, lda, sb, ldb, beta, c + lo, ldc);
    }
  });
}


// A bfloat16/float16 product through float32 (OpenBLAS 0.3.21 has no 16-bit
// GEMM): op(B) is converted to float32 once, op(A) and C in panels of
// kHalfPanelRows rows; each panel is one float32 product (cut and spread over
// the pool as any other) whose result is rounded back to the 16-bit type.
// Memory beyond the operands: op(B) and one panel of op(A) and of C, as
// float32.
constexpr int64_t kHalfPanelRows = 512;

void gemmHalf(DType type, const MatrixOperand& a, const MatrixOperand& b, int64_t m, int64_t n, int64_t k,
              float alpha, float beta, void* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const auto* pa = static_cast<const uint16_t*>(a.data);
  const auto* pb = static_cast<const uint16_t*>(b.data);
  auto* pc = static_cast<uint16_t*>(c);
  ldc = std::max<int64_t>(ldc, std::max<int64_t>(n, 1));
  // Converts `rows` stored rows of `cols` elements (source leading dimension
  // ld) into a tight float32 matrix.
  auto toFloatRows = [type](const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
    parallelFor(rows, kParallelGrain / std::max<int64_t>(cols, 1) + 1, [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) halfToFloat(type, src + r * ld, dst + r * cols, cols);
    });
  };
  const int64_t bRows = b.trans ? n : k, bCols = b.trans ? k : n;
  // Uninitialised: every element is written before it is read.
  std::unique_ptr<float[]> fb(new float[static_cast<size_t>(std::max<int64_t>(bRows * bCols, 1))]);
  if (k > 0) toFloatRows(pb, b.trans ? normalizedLd(b, n, k) : normalizedLd(b, k, n), bRows, bCols, fb.get());
  const MatrixOperand fbOp{fb.get(), b.trans, std::max<int64_t>(bCols, 1)};
  const int64_t lda = k == 0 ? 1 : (a.trans ? normalizedLd(a, k, m) : normalizedLd(a, m, k));
  const int64_t panel = std::min(m, kHalfPanelRows);
  std::unique_ptr<float[]> fa(new float[static_cast<size_t>(std::max<int64_t>(panel * k, 1))]);
  std::unique_ptr<float[]> fc(new float[static_cast<size_t>(std::max<int64_t>(panel * n, 1))]);
  for (int64_t i0 = 0; i0 < m; i0 += panel) {
    const int64_t rows = std::min(panel, m - i0);
    MatrixOperand faOp;
    if (a.trans) {  // stored [k, m]: columns [i0, i0 + rows) of every stored row
      for (int64_t j = 0; j < k; ++j) halfToFloat(type, pa + j * lda + i0, fa.get() + j * rows, rows);
      faOp = {fa.get(), true, std::max<int64_t>(rows, 1)};
    } else {
      if (k > 0) toFloatRows(pa + i0 * lda, lda, rows, k, fa.get());
      faOp = {fa.get(), false, std::max<int64_t>(k, 1)};
    }
    if (beta != 0.0f) toFloatRows(pc + i0 * ldc, ldc, rows, n, fc.get());
    gemmTyped<float>(faOp, fa.get(), fbOp, fb.get(), rows, n, k, alpha, beta, fc.get(), n);
    parallelFor(rows, kParallelGrain / n + 1, [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) floatToHalf(type, fc.get() + r * n, pc + (i0 + r) * ldc, n);
    });
  }
}

}  // namespace

void gemm(DType type, MatrixOperand a, MatrixOperand b, int64_t m, int64_t n, int64_t k, double alpha, double beta,
          void* c, int64_t ldc) {
  checkBlasRange(m, n, k, a, b, ldc);
  if (isLowPrecision(type)) {
    gemmHalf(type, a, b, m, n, k, static_cast<float>(alpha), static_cast<float>(beta), c, ldc);
    return;
  }
  WEFT_DISPATCH_FLOATING(type, "gemm", [&]<class T>() {
    gemmTyped<T>(a, static_cast<const T*>(a.data), b, static_cast<const T*>(b.data), m, n, k, static_cast<T>(alpha),
                 static_cast<T>(beta), static_cast<T*>(c), ldc);
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
  if (isLowPrecision(type)) {
    // In order, one panel-converted product each.
    int64_t index[kMaxDims] = {};
    int64_t offA = 0, offB = 0, offC = 0;
    const auto* pa = static_cast<const uint16_t*>(a.data);
    const auto* pb = static_cast<const uint16_t*>(b.data);
    auto* pc = static_cast<uint16_t*>(c);
    for (int64_t e = 0; e < count; ++e) {
      gemmHalf(type, {pa + offA, a.trans, a.ld}, {pb + offB, b.trans, b.ld}, m, n, k, static_cast<float>(alpha),
               static_cast<float>(beta), pc + offC, ldc);
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
    return;
  }
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
          gemmTyped<T>(a, pa + offA, b, pb + offB, m, n, k, al, be, pc + offC, ldc);
        }
      });
      return;
    }
    // In order (aliased C matrices accumulate with beta = 1), each product
    // cut into the blocks its own size warrants.
    int64_t index[kMaxDims] = {};
    int64_t offA = 0, offB = 0, offC = 0;
    for (int64_t e = 0; e < count; ++e) {
      gemmTyped<T>(a, pa + offA, b, pb + offB, m, n, k, al, be, pc + offC, ldc);
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
  WEFT_DISPATCH_ALL_AND_HALF(type, "fillRows", [&]<class T>() {
    const T* r = static_cast<const T*>(row);
    T* out = static_cast<T*>(c);
    parallelFor(rows, kParallelGrain / std::max<int64_t>(cols, 1) + 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) std::memcpy(out + i * ldc, r, sizeof(T) * cols);
    });
  });
}

}  // namespace weft::kernels::cpu
