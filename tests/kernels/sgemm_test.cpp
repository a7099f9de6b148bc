// weft's own AVX-512 float32 GEMM (kernels/cpu/sgemm.h) against a sum in
// double, and its bits: the same on any thread count, from inside a task, and
// for rows or columns computed in a smaller product. Skipped (with a message)
// on a CPU without AVX-512F or under WEFT_GEMM=blas.
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/sgemm.h"
#include "weft_test.h"

using namespace weft::kernels::cpu;

namespace {

struct ThreadsScope {
  int saved = numThreads();
  ~ThreadsScope() { setNumThreads(saved); }
};

std::vector<float> wave(int64_t count, double phase) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = static_cast<float>(std::sin(0.37 * i + phase));
  return v;
}

// One product's operands, stored with padding beyond each row (leading
// dimensions larger than the rows), so that reading past a row shows.
struct Case {
  int64_t m, n, k;
  bool ta, tb;
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c;

  Case(int64_t m_, int64_t n_, int64_t k_, bool ta_, bool tb_, int64_t pad)
      : m(m_), n(n_), k(k_), ta(ta_), tb(tb_) {
    lda = (ta ? m : k) + pad;
    ldb = (tb ? k : n) + pad;
    ldc = n + pad;
    a = wave((ta ? k : m) * lda, 0.1);
    b = wave((tb ? n : k) * ldb, 0.2);
    c = wave(m * ldc, 0.3);
  }
  double at(int64_t i, int64_t p) const { return a[static_cast<size_t>(ta ? p * lda + i : i * lda + p)]; }
  double bt(int64_t p, int64_t j) const { return b[static_cast<size_t>(tb ? j * ldb + p : p * ldb + j)]; }
};

bool skipWithoutKernel() {
  if (ownSgemmAvailable()) return false;
  MESSAGE("weft's own float32 kernel is off here (no AVX-512F, or WEFT_GEMM=blas): nothing to check");
  return true;
}

}  // namespace

TEST_CASE("own sgemm matches a sum in double for every transpose, edge, alpha and beta") {
  if (skipWithoutKernel()) return;
  ThreadsScope restore;
  setNumThreads(2);
  // Edges of the 12 x 32 tiles and of the 16-step packing in every
  // dimension, k over one and several blocks of 256 (even and uneven).
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {12, 32, 16}, {13, 33, 17}, {11, 31, 15},
                         {37, 70, 5}, {100, 47, 300}, {25, 129, 513}, {200, 64, 1000}, {7, 300, 256}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (auto [alpha, beta] : {std::pair<float, float>{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.25f}}) {
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(alpha);
          CAPTURE(beta);
          Case x(m, n, k, ta, tb, 3);
          std::vector<float> c = x.c;
          // beta == 0 must not read C: NaN there would survive a read.
          if (beta == 0.0f) {
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) c[static_cast<size_t>(i * x.ldc + j)] = std::numeric_limits<float>::quiet_NaN();
            }
          }
          ownSgemm(ta, tb, m, n, k, alpha, x.a.data(), x.lda, x.b.data(), x.ldb, beta, c.data(), x.ldc);
          double worst = 0.0;
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < x.ldc; ++j) {
              const size_t at = static_cast<size_t>(i * x.ldc + j);
              if (j >= n) {  // the padding beyond each row of C is untouched
                REQUIRE(std::memcmp(&c[at], &x.c[at], sizeof(float)) == 0);
                continue;
              }
              double s = 0.0, mag = 0.0;
              for (int64_t p = 0; p < k; ++p) {
                s += x.at(i, p) * x.bt(p, j);
                mag += std::abs(x.at(i, p) * x.bt(p, j));
              }
              const double want = alpha * s + beta * static_cast<double>(x.c[at]);
              worst = std::max(worst, std::abs(c[at] - want) / (1.0 + std::abs(alpha) * mag));
            }
          }
          CHECK(worst < 1e-6);
        }
      }
    }
  }
}

TEST_CASE("own sgemm gives the same bits on any thread count, in a task, and for a part of the product") {
  if (skipWithoutKernel()) return;
  ThreadsScope restore;
  // Chunks of 4096 rows or columns, several k blocks, remainders everywhere.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{4109, 45, 20}, {50, 4133, 9}, {301, 290, 700}}) {
    for (bool trans : {false, true}) {
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(k);
      CAPTURE(trans);
      Case x(m, n, k, trans, trans, 0);
      auto product = [&](int threads, bool inTask) {
        setNumThreads(threads);
        std::vector<float> c = x.c;
        auto call = [&] {
          ownSgemm(trans, trans, m, n, k, 1.0f, x.a.data(), x.lda, x.b.data(), x.ldb, 1.0f, c.data(), x.ldc);
        };
        if (inTask) {
          parallelRun(1, threads, [&](int64_t, int) { call(); });
        } else {
          call();
        }
        return c;
      };
      const std::vector<float> one = product(1, false);
      CHECK(std::memcmp(product(2, false).data(), one.data(), sizeof(float) * one.size()) == 0);
      CHECK(std::memcmp(product(2, true).data(), one.data(), sizeof(float) * one.size()) == 0);
      // Rows [r0, r0 + rows) and columns [c0, c0 + cols) on their own: the
      // same bits as inside the whole product (k unchanged).
      setNumThreads(2);
      const int64_t r0 = m / 3, rows = std::min<int64_t>(29, m - r0), c0 = n / 5, cols = std::min<int64_t>(41, n - c0);
      std::vector<float> part(static_cast<size_t>(rows * cols));
      for (int64_t i = 0; i < rows; ++i) {
        std::memcpy(&part[static_cast<size_t>(i * cols)], &x.c[static_cast<size_t>((r0 + i) * x.ldc + c0)],
                    sizeof(float) * cols);
      }
      const float* pa = trans ? x.a.data() + r0 : x.a.data() + r0 * x.lda;
      const float* pb = trans ? x.b.data() + c0 * x.ldb : x.b.data() + c0;
      ownSgemm(trans, trans, rows, cols, k, 1.0f, pa, x.lda, pb, x.ldb, 1.0f, part.data(), cols);
      bool same = true;
      for (int64_t i = 0; i < rows; ++i) {
        same &= std::memcmp(&part[static_cast<size_t>(i * cols)], &one[static_cast<size_t>((r0 + i) * x.ldc + c0)],
                            sizeof(float) * cols) == 0;
      }
      CHECK(same);
    }
  }
}

TEST_CASE("gemm sends float32 products of at least 8 x 16 to the own kernel; a matrix-vector product still multiplies") {
  if (skipWithoutKernel()) return;
  ThreadsScope restore;
  setNumThreads(2);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{300, 200, 100}, {8, 16, 3}}) {
    CAPTURE(m);
    Case x(m, n, k, false, true, 0);
    std::vector<float> viaGemm = x.c, direct = x.c;
    gemm(weft::DType::Float32, {x.a.data(), false, x.lda}, {x.b.data(), true, x.ldb}, m, n, k, 1.0, 0.5,
         viaGemm.data(), x.ldc);
    ownSgemm(false, true, m, n, k, 1.0f, x.a.data(), x.lda, x.b.data(), x.ldb, 0.5f, direct.data(), x.ldc);
    CHECK(std::memcmp(viaGemm.data(), direct.data(), sizeof(float) * direct.size()) == 0);
  }
  // A matrix-vector product goes to OpenBLAS, and is still the product.
  Case v(64, 1, 50, false, false, 0);
  std::vector<float> c(64);
  gemm(weft::DType::Float32, {v.a.data(), false, v.lda}, {v.b.data(), false, v.ldb}, 64, 1, 50, 1.0, 0.0, c.data(), 1);
  for (int64_t i = 0; i < 64; ++i) {
    double s = 0.0;
    for (int64_t p = 0; p < 50; ++p) s += v.at(i, p) * v.bt(p, 0);
    CHECK(std::abs(c[static_cast<size_t>(i)] - s) < 1e-5);
  }
}
