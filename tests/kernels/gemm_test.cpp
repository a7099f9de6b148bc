#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "blas_core_types.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "weft_test.h"

using namespace weft::kernels::cpu;

namespace {

// Restores the kernel thread count when a test ends.
struct ThreadsScope {
  int saved = numThreads();
  ~ThreadsScope() { setNumThreads(saved); }
};

template <class T>
std::vector<T> wave(int64_t count, double phase) {
  std::vector<T> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = static_cast<T>(std::sin(0.37 * i + phase));
  return v;
}

// C = op(A) · op(B) + beta * C0 on `threads` kernel threads, called directly
// or from inside a task of a job (where it runs on that task's thread).
template <class T>
std::vector<T> product(int64_t m, int64_t n, int64_t k, bool ta, bool tb, double beta, int threads, bool inTask) {
  setNumThreads(threads);
  std::vector<T> a = wave<T>(m * k, 0.1), b = wave<T>(k * n, 0.2), c = wave<T>(m * n, 0.3);
  weft::DType type = sizeof(T) == 4 ? weft::DType::Float32 : weft::DType::Float64;
  auto run = [&] {
    gemm(type, {a.data(), ta, ta ? m : k}, {b.data(), tb, tb ? k : n}, m, n, k, 1.0, beta, c.data(), n);
  };
  if (inTask) {
    parallelRun(1, threads, [&](int64_t, int) {
      CHECK(inParallelTask());
      run();
    });
  } else {
    run();
  }
  return c;
}

template <class T>
void checkSameBits() {
  // Row blocks (m >= n) and column blocks (m < n), with remainders in both
  // dimensions; [256, 97] is the shape of the LSTM layer's weight gradient,
  // [16, 1024] of its recurrent product for hidden size 256.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{256, 97, 200}, {97, 256, 200}, {16, 1024, 64},
                         {301, 90, 70}, {70, 300, 91}}) {
    for (bool trans : {false, true}) {  // both operands stored as they are, or both transposed
      for (double beta : {0.0, 1.0}) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(trans);
        CAPTURE(beta);
        std::vector<T> one = product<T>(m, n, k, trans, trans, beta, 1, false);
        // Two threads (more would leave pool workers beyond numThreads() for
        // the other tests of this binary), directly and from inside a task.
        CHECK(std::memcmp(product<T>(m, n, k, trans, trans, beta, 2, false).data(), one.data(),
                          sizeof(T) * one.size()) == 0);
        CHECK(std::memcmp(product<T>(m, n, k, trans, trans, beta, 2, true).data(), one.data(),
                          sizeof(T) * one.size()) == 0);
        // And it is the product: C[0, 0] and C[m-1, n-1] against a sum in double.
        std::vector<T> a = wave<T>(m * k, 0.1), b = wave<T>(k * n, 0.2), c0 = wave<T>(m * n, 0.3);
        for (auto [i, j] : {std::pair<int64_t, int64_t>{0, 0}, {m - 1, n - 1}}) {
          double s = beta * static_cast<double>(c0[static_cast<size_t>(i * n + j)]);
          for (int64_t p = 0; p < k; ++p) {
            s += static_cast<double>(a[static_cast<size_t>(trans ? p * m + i : i * k + p)]) *
                 static_cast<double>(b[static_cast<size_t>(trans ? j * k + p : p * n + j)]);
          }
          CHECK(std::abs(static_cast<double>(one[static_cast<size_t>(i * n + j)]) - s) <=
                (sizeof(T) == 4 ? 1e-3 : 1e-10) * (1.0 + std::abs(s)));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("gemm gives the same bits with one thread or several in row and column blocks") {
  weft::testing::checkRequestedBlasCore();
  ThreadsScope restore;
  checkSameBits<float>();
  checkSameBits<double>();
}

TEST_CASE("gemm gives the same bits with one thread or several under each OpenBLAS core type this CPU runs") {
  weft::testing::checkUnderEachBlasCoreType("gemm gives the same bits with one thread or several in row and column blocks");
}
