#include <tuple>
#include <vector>

#include "gradcheck.h"
#include "kernels/cpu/parallel.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;
using weft::testing::gradcheck;
using weft::testing::kF64;

namespace {

// Reference product of two 2-D tensors by the textbook triple loop.
Tensor naiveMm(const Tensor& a, const Tensor& b) {
  int64_t n = a.size(0), k = a.size(1), m = b.size(1);
  std::vector<double> x = a.toVector<double>(), y = b.toVector<double>(), out(n * m, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t p = 0; p < k; ++p) out[i * m + j] += x[i * k + p] * y[p * m + j];
  return fromVector(out, {n, m});
}

// A [rows, cols] view in which neither dimension has unit stride.
Tensor stridedMatrix(int64_t rows, int64_t cols) { return randn({rows, cols, 2}, kF64).select(2, 1); }

}  // namespace

TEST_CASE("mm of small integer-valued matrices gives the exact product") {
  Tensor a = fromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = fromVector<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  CHECK(mm(a, b).toVector<float>() == std::vector<float>{58, 64, 139, 154});
  CHECK(a.matmul(b).toVector<float>() == std::vector<float>{58, 64, 139, 154});
}

TEST_CASE("mm reads transposed and strided operands without changing the result") {
  Tensor a = randn({5, 4}, kF64), b = randn({4, 3}, kF64);
  Tensor at = randn({4, 5}, kF64).t(), bt = randn({3, 4}, kF64).t();
  expectClose(mm(a, b), naiveMm(a, b), 1e-12, 1e-12);
  expectClose(mm(at, b), naiveMm(at, b), 1e-12, 1e-12);
  expectClose(mm(a, bt), naiveMm(a, bt), 1e-12, 1e-12);
  expectClose(mm(at, bt), naiveMm(at, bt), 1e-12, 1e-12);
  Tensor s = stridedMatrix(5, 4);
  CHECK_FALSE(s.isContiguous());
  expectClose(mm(s, b), naiveMm(s, b), 1e-12, 1e-12);
  // A row and a column whose unused stride is arbitrary.
  Tensor row = randn({4, 3}, kF64).narrow(1, 1, 1).t();  // [1, 4], strides (1, 3)
  expectClose(mm(row, b), naiveMm(row, b), 1e-12, 1e-12);
}

TEST_CASE("large products split across threads agree with the reference in every layout") {
  // Big enough to be cut into row blocks (m >= n) or column blocks (m < n).
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{300, 90, 70}, {70, 90, 300}, {257, 65, 33}}) {
    Tensor a = randn({m, k}, kF64), b = randn({k, n}, kF64);
    Tensor at = a.t().contiguous().t(), bt = b.t().contiguous().t();  // same values, transposed storage
    Tensor expected = naiveMm(a, b);
    expectClose(mm(a, b), expected, 1e-11, 1e-11);
    expectClose(mm(at, b), expected, 1e-11, 1e-11);
    expectClose(mm(a, bt), expected, 1e-11, 1e-11);
    expectClose(mm(at, bt), expected, 1e-11, 1e-11);
  }
}

TEST_CASE("products leave the kernel thread count alone") {
  // (That BLAS starts no threads of its own is checked in tests/kernels.)
  int before = kernels::cpu::numThreads();
  Tensor a = randn({300, 200}), b = randn({200, 100});
  mm(a, b);
  mm(randn({4, 4}), randn({4, 4}));
  CHECK(kernels::cpu::numThreads() == before);
}

TEST_CASE("a batch of many small products gives each element its own product") {
  // Enough of them that the batch is spread across threads.
  Tensor a = randn({600, 16, 12}, kF64), b = randn({600, 12, 16}, kF64).transpose(1, 2).contiguous().transpose(1, 2);
  Tensor out = bmm(a, b);
  for (int64_t i = 0; i < 600; i += 37) {
    expectClose(out.select(0, i), naiveMm(a.select(0, i), b.select(0, i)), 1e-12, 1e-12);
  }
  // The gradient of a matrix broadcast over the batch accumulates one
  // product per batch element into the same matrix.
  Tensor x = randn({5, 96, 7}, kF64).transpose(0, 1);  // not foldable into one GEMM
  Tensor w = randn({7, 6}, kF64).requiresGrad_();
  Tensor g = randn({96, 5, 6}, kF64);
  matmul(x, w).backward(g);
  Tensor expected = zeros({7, 6}, kF64);
  for (int64_t i = 0; i < 96; ++i) expected = add(expected, naiveMm(x.select(0, i).t(), g.select(0, i)));
  expectClose(w.grad(), expected, 1e-10, 1e-10);
}

TEST_CASE("mm float32 agrees with float64") {
  Tensor a = randn({7, 9}, kF64), b = randn({9, 5}, kF64);
  expectClose(mm(a.to(DType::Float32), b.to(DType::Float32)).to(DType::Float64), mm(a, b), 1e-4, 1e-5);
}

TEST_CASE("mm with an empty inner dimension is all zeros") {
  Tensor out = mm(randn({3, 0}, kF64), randn({0, 2}, kF64));
  CHECK(out.shape() == Shape{3, 2});
  CHECK(out.toVector<double>() == std::vector<double>(6, 0.0));
  CHECK(mm(randn({0, 4}, kF64), randn({4, 2}, kF64)).shape() == Shape{0, 2});
}

TEST_CASE("mm passes gradcheck for contiguous, transposed and strided inputs") {
  auto f = [](const auto& in) { return mm(in[0], in[1]); };
  CHECK(gradcheck(f, {randn({3, 4}, kF64), randn({4, 2}, kF64)}));
  CHECK(gradcheck(f, {randn({4, 3}, kF64).t(), randn({2, 4}, kF64).t()}));
  CHECK(gradcheck(f, {stridedMatrix(3, 4), randn({4, 2}, kF64)}));
  CHECK(gradcheck(f, {randn({3, 4}, kF64), stridedMatrix(4, 2)}));
}

TEST_CASE("mm computes only the gradients that are needed") {
  Tensor a = randn({3, 4}, kF64).requiresGrad_();
  Tensor b = randn({4, 2}, kF64);
  mm(a, b).sum().backward();
  CHECK(a.grad().defined());
  // d(sum(a·b))/da[i, p] = sum_j b[p, j]
  Tensor expected = b.sum({1}).unsqueeze(0).expand({3, 4});
  expectClose(a.grad(), expected, 1e-12, 1e-12);
}

TEST_CASE("bmm multiplies batch by batch and passes gradcheck") {
  Tensor a = randn({3, 2, 4}, kF64), b = randn({3, 4, 5}, kF64);
  Tensor out = bmm(a, b);
  REQUIRE(out.shape() == Shape{3, 2, 5});
  for (int64_t i = 0; i < 3; ++i) expectClose(out.select(0, i), naiveMm(a.select(0, i), b.select(0, i)), 1e-12, 1e-12);
  auto f = [](const auto& in) { return bmm(in[0], in[1]); };
  CHECK(gradcheck(f, {a, b}));
  CHECK(gradcheck(f, {randn({3, 4, 2}, kF64).transpose(1, 2), randn({5, 3, 4}, kF64).permute({1, 2, 0})}));
}

TEST_CASE("matmul follows torch.matmul for 1-D and 2-D operands") {
  Tensor v = fromVector<double>({1, 2, 3}), w = fromVector<double>({4, 5, 6});
  Tensor dot = matmul(v, w);
  CHECK(dot.dim() == 0);
  CHECK(dot.item<double>() == 32);
  Tensor m = fromVector<double>({1, 0, 2, 0, 1, 1}, {2, 3});
  CHECK(matmul(m, v).shape() == Shape{2});
  CHECK(matmul(m, v).toVector<double>() == std::vector<double>{7, 5});
  Tensor u = fromVector<double>({1, -1});
  CHECK(matmul(u, m).toVector<double>() == std::vector<double>{1, -1, 1});
  auto f = [](const auto& in) { return matmul(in[0], in[1]); };
  CHECK(gradcheck(f, {randn({3}, kF64), randn({3}, kF64)}));
  CHECK(gradcheck(f, {randn({2, 3}, kF64), randn({3}, kF64)}));
  CHECK(gradcheck(f, {randn({3}, kF64), randn({3, 2}, kF64)}));
}

TEST_CASE("matmul folds a batched left operand against a matrix or a vector") {
  Tensor a = randn({2, 3, 4}, kF64), b = randn({4, 5}, kF64), v = randn({4}, kF64);
  Tensor out = matmul(a, b);
  REQUIRE(out.shape() == Shape{2, 3, 5});
  for (int64_t i = 0; i < 2; ++i) expectClose(out.select(0, i), naiveMm(a.select(0, i), b), 1e-12, 1e-12);
  CHECK(matmul(a, v).shape() == Shape{2, 3});
  auto f = [](const auto& in) { return matmul(in[0], in[1]); };
  CHECK(gradcheck(f, {a, b}));
  CHECK(gradcheck(f, {a, v}));
  // A non-contiguous batched operand goes through the batched path.
  CHECK(gradcheck(f, {randn({3, 2, 4}, kF64).transpose(0, 1), b}));
}

TEST_CASE("matmul broadcasts batch dimensions and sums gradients over them") {
  Tensor a = randn({2, 1, 3, 4}, kF64), b = randn({5, 4, 2}, kF64);
  Tensor out = matmul(a, b);
  REQUIRE(out.shape() == Shape{2, 5, 3, 2});
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 5; ++j)
      expectClose(out.select(0, i).select(0, j), naiveMm(a.select(0, i).select(0, 0), b.select(0, j)), 1e-12, 1e-12);
  auto f = [](const auto& in) { return matmul(in[0], in[1]); };
  CHECK(gradcheck(f, {a, b}));
  CHECK(gradcheck(f, {randn({4}, kF64), randn({2, 4, 3}, kF64)}));
  CHECK(matmul(randn({4}, kF64), randn({2, 4, 3}, kF64)).shape() == Shape{2, 3});
  CHECK(gradcheck(f, {randn({3, 4}, kF64), randn({2, 4, 3}, kF64)}));
  CHECK(gradcheck(f, {randn({2, 3, 4}, kF64), randn({1, 4, 2}, kF64)}));
}

TEST_CASE("linear equals x · W^T + b for 1-D, 2-D and 3-D inputs") {
  Tensor w = randn({5, 4}, kF64), b = randn({5}, kF64);
  Tensor x = randn({3, 4}, kF64);
  expectClose(linear(x, w, b), add(naiveMm(x, w.t()), b), 1e-12, 1e-12);
  expectClose(linear(x, w), naiveMm(x, w.t()), 1e-12, 1e-12);
  Tensor x1 = randn({4}, kF64);
  CHECK(linear(x1, w, b).shape() == Shape{5});
  expectClose(linear(x1, w, b), add(matmul(w, x1), b), 1e-12, 1e-12);
  Tensor x3 = randn({2, 3, 4}, kF64);
  Tensor y3 = linear(x3, w, b);
  REQUIRE(y3.shape() == Shape{2, 3, 5});
  expectClose(y3.select(0, 1), add(naiveMm(x3.select(0, 1), w.t()), b), 1e-12, 1e-12);
}

TEST_CASE("linear passes gradcheck, including transposed input and weight") {
  auto withBias = [](const auto& in) { return linear(in[0], in[1], in[2]); };
  auto noBias = [](const auto& in) { return linear(in[0], in[1]); };
  CHECK(gradcheck(withBias, {randn({3, 4}, kF64), randn({5, 4}, kF64), randn({5}, kF64)}));
  CHECK(gradcheck(noBias, {randn({3, 4}, kF64), randn({5, 4}, kF64)}));
  CHECK(gradcheck(withBias, {randn({4, 3}, kF64).t(), randn({4, 5}, kF64).t(), randn({5}, kF64)}));
  CHECK(gradcheck(withBias, {stridedMatrix(3, 4), stridedMatrix(5, 4), randn({5}, kF64)}));
  CHECK(gradcheck(withBias, {randn({2, 3, 4}, kF64), randn({5, 4}, kF64), randn({5}, kF64)}));
  CHECK(gradcheck(withBias, {randn({3, 2, 4}, kF64).transpose(0, 1), randn({5, 4}, kF64), randn({5}, kF64)}));
  CHECK(gradcheck(withBias, {randn({4}, kF64), randn({5, 4}, kF64), randn({5}, kF64)}));
}

TEST_CASE("linear leaves an input that needs no gradient alone") {
  Tensor x = randn({6, 4}, kF64);
  Tensor w = randn({3, 4}, kF64).requiresGrad_();
  Tensor b = randn({3}, kF64).requiresGrad_();
  linear(x, w, b).sum().backward();
  CHECK_FALSE(x.grad().defined());
  expectClose(w.grad(), x.sum({0}).unsqueeze(0).expand({3, 4}), 1e-12, 1e-12);
  CHECK(b.grad().toVector<double>() == std::vector<double>{6, 6, 6});
}

TEST_CASE("matrix products name the op and both shapes on a mismatch") {
  CHECK_THROWS_WITH_AS(mm(ones({2, 3}), ones({4, 5})), doctest::Contains("mm: shapes [2, 3] and [4, 5]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(mm(ones({2, 3, 1}), ones({3, 5})), doctest::Contains("[2, 3, 1]"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(bmm(ones({2, 3, 4}), ones({3, 4, 5})), doctest::Contains("bmm: batch sizes differ"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(matmul(ones({2, 3, 4}), ones({5, 6})), doctest::Contains("matmul: shapes [2, 3, 4] and [5, 6]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(matmul(ones({2, 3, 4}), ones({3, 4, 5})), doctest::Contains("cannot be broadcast"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(matmul(scalarTensor(1.0), ones({3})), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(linear(ones({2, 3}), ones({4, 5})), doctest::Contains("linear: input of shape [2, 3]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(linear(ones({2, 5}), ones({4, 5}), ones({3})), doctest::Contains("bias of shape [3]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(mm(ones({2, 2}), ones({2, 2}, {.dtype = DType::Float64})), doctest::Contains("dtype mismatch"),
                       InvalidArgumentError);
}

TEST_CASE("int64 matrix products are rejected with a clear error") {
  Tensor a = ones({2, 2}, {.dtype = DType::Int64});
  CHECK_THROWS_WITH_AS(mm(a, a), doctest::Contains("int64 matrix products are not supported"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(matmul(a, a), doctest::Contains("matmul"), InvalidArgumentError);
}
