// cat, stack, split, chunk and indexSelect: values, views, backward against
// finite differences, and the error cases.
#include "gradcheck.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;
using weft::testing::gradcheck;
using weft::testing::kF64;

namespace {

Tensor iota(Shape shape, DType dt = DType::Float64) {
  return arange(0, static_cast<double>(shapeNumel(shape)), 1, {.dtype = dt}).view(std::move(shape));
}

}  // namespace

TEST_CASE("cat joins along the first, a middle and the last dim") {
  Tensor a = iota({2, 2});         // [[0,1],[2,3]]
  Tensor b = add(iota({1, 2}), 10.0);  // [[10,11]]
  CHECK(cat({a, b}).toVector<double>() == std::vector<double>{0, 1, 2, 3, 10, 11});
  CHECK(cat({a, b}).shape() == Shape{3, 2});
  Tensor c = add(iota({2, 1}), 20.0);  // [[20],[21]]
  Tensor ac = cat({a, c}, 1);
  CHECK(ac.shape() == Shape{2, 3});
  CHECK(ac.toVector<double>() == std::vector<double>{0, 1, 20, 2, 3, 21});
  CHECK(cat({c, a, c}, -1).toVector<double>() == std::vector<double>{20, 0, 1, 20, 21, 2, 3, 21});
  Tensor x = iota({2, 2, 3}), y = add(iota({2, 1, 3}), 100.0);
  Tensor xy = cat({x, y}, 1);
  CHECK(xy.shape() == Shape{2, 3, 3});
  CHECK(xy.toVector<double>() ==
        std::vector<double>{0, 1, 2, 3, 4, 5, 100, 101, 102, 6, 7, 8, 9, 10, 11, 103, 104, 105});
}

TEST_CASE("cat accepts non-contiguous, empty and int64 inputs") {
  Tensor a = iota({2, 3});
  Tensor t = a.t();  // [[0,3],[1,4],[2,5]], non-contiguous
  CHECK(cat({t, t}, 1).toVector<double>() == std::vector<double>{0, 3, 0, 3, 1, 4, 1, 4, 2, 5, 2, 5});
  CHECK(cat({a, empty({0, 3}, kF64)}).toVector<double>() == a.toVector<double>());
  Tensor i = iota({3}, DType::Int64);
  Tensor ii = cat({i, i});
  CHECK(ii.dtype() == DType::Int64);
  CHECK(ii.toVector<int64_t>() == std::vector<int64_t>{0, 1, 2, 0, 1, 2});
  Tensor f = cat({a.to(DType::Float32), a.to(DType::Float32)}, 0);
  CHECK(f.dtype() == DType::Float32);
  CHECK(f.toVector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
}

TEST_CASE("cat passes gradcheck along several dims with mixed layouts") {
  for (int64_t d : {0, 1, 2}) {
    CAPTURE(d);
    Shape s1{2, 3, 4}, s2{2, 3, 4};
    s2[d] = 1;
    CHECK(gradcheck([d](const auto& in) { return cat({in[0], in[1], in[2]}, d); },
                    {randn(s1, kF64), randn(s2, kF64), randn({4, 3, 2}, kF64).transpose(0, 2)}));
  }
}

TEST_CASE("cat sends no gradient to an input that does not require it") {
  Tensor a = ones({2}, kF64).requiresGrad_();
  Tensor b = ones({3}, kF64);
  mul(cat({a, b}), fromVector<double>({1, 2, 3, 4, 5})).sum().backward();
  CHECK(a.grad().toVector<double>() == std::vector<double>{1, 2});
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("stack inserts a new dim at the front, middle or end") {
  Tensor a = iota({2, 2}), b = add(iota({2, 2}), 10.0);
  Tensor s0 = stack({a, b});
  CHECK(s0.shape() == Shape{2, 2, 2});
  CHECK(s0.toVector<double>() == std::vector<double>{0, 1, 2, 3, 10, 11, 12, 13});
  Tensor s1 = stack({a, b}, 1);
  CHECK(s1.shape() == Shape{2, 2, 2});
  CHECK(s1.toVector<double>() == std::vector<double>{0, 1, 10, 11, 2, 3, 12, 13});
  Tensor s2 = stack({a, b, a}, -1);
  CHECK(s2.shape() == Shape{2, 2, 3});
  CHECK(s2.toVector<double>() == std::vector<double>{0, 10, 0, 1, 11, 1, 2, 12, 2, 3, 13, 3});
  Tensor scalars = stack({scalarTensor(1, DType::Int64), scalarTensor(2, DType::Int64)});
  CHECK(scalars.toVector<int64_t>() == std::vector<int64_t>{1, 2});
}

TEST_CASE("stack passes gradcheck for every insertion point") {
  for (int64_t d : {0, 1, 2}) {
    CAPTURE(d);
    CHECK(gradcheck([d](const auto& in) { return stack({in[0], in[1]}, d); },
                    {randn({2, 3}, kF64), randn({3, 2}, kF64).t()}));
  }
}

TEST_CASE("split returns views with a smaller last piece") {
  Tensor a = iota({5, 2});
  auto parts = split(a, 2);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].shape() == Shape{2, 2});
  CHECK(parts[2].shape() == Shape{1, 2});
  CHECK(parts[1].toVector<double>() == std::vector<double>{4, 5, 6, 7});
  CHECK(parts[2].toVector<double>() == std::vector<double>{8, 9});
  for (const auto& p : parts) CHECK(p.storage() == a.storage());
  CHECK(parts[1].storageOffset() == 4);
  auto cols = split(a, 1, 1);
  REQUIRE(cols.size() == 2);
  CHECK_FALSE(cols[1].isContiguous());
  CHECK(cols[1].toVector<double>() == std::vector<double>{1, 3, 5, 7, 9});
  // A write through the base shows in the view.
  {
    NoGradGuard ng;
    a.select(0, 4).fill_(-1);
  }
  CHECK(parts[2].toVector<double>() == std::vector<double>{-1, -1});
}

TEST_CASE("split by a list of sizes follows the list") {
  Tensor a = iota({2, 6});
  auto parts = split(a, std::vector<int64_t>{1, 0, 3, 2}, 1);
  REQUIRE(parts.size() == 4);
  CHECK(parts[0].toVector<double>() == std::vector<double>{0, 6});
  CHECK(parts[1].shape() == Shape{2, 0});
  CHECK(parts[2].toVector<double>() == std::vector<double>{1, 2, 3, 7, 8, 9});
  CHECK(parts[3].toVector<double>() == std::vector<double>{4, 5, 10, 11});
  CHECK(parts[3].storage() == a.storage());
}

TEST_CASE("chunk follows torch.chunk, including fewer pieces than asked") {
  // torch: [t.shape for t in torch.chunk(torch.empty(n), k)]
  auto sizes = [](const std::vector<Tensor>& ts) {
    std::vector<int64_t> s;
    for (const auto& t : ts) s.push_back(t.size(0));
    return s;
  };
  CHECK(sizes(chunk(zeros({5}), 3)) == std::vector<int64_t>{2, 2, 1});
  CHECK(sizes(chunk(zeros({6}), 4)) == std::vector<int64_t>{2, 2, 2});
  CHECK(sizes(chunk(empty({0}), 3)) == std::vector<int64_t>{0, 0, 0});
  CHECK(sizes(chunk(zeros({3}), 5)) == std::vector<int64_t>{1, 1, 1});
  Tensor a = iota({2, 4});
  auto halves = chunk(a, 2, -1);
  REQUIRE(halves.size() == 2);
  CHECK(halves[1].toVector<double>() == std::vector<double>{2, 3, 6, 7});
  CHECK(halves[1].storage() == a.storage());
}

TEST_CASE("split and chunk pass gradcheck, with unused pieces getting zero gradient") {
  CHECK(gradcheck(
      [](const auto& in) {
        auto p = split(in[0], 2, 1);
        return cat({mul(p[2], p[0].narrow(1, 0, 1)), p[1]}, 1);
      },
      {randn({3, 5}, kF64)}));
  CHECK(gradcheck([](const auto& in) { return chunk(in[0], 3, 0)[1]; }, {randn({4, 7}, kF64).t()}));
  CHECK(gradcheck(
      [](const auto& in) {
        auto p = split(in[0], std::vector<int64_t>{2, 1}, -1);
        return mul(p[0], p[0]);
      },
      {randn({2, 3, 3}, kF64)}));
  Tensor x = ones({4}, kF64).requiresGrad_();
  mul(chunk(x, 2)[1], 3.0).sum().backward();
  CHECK(x.grad().toVector<double>() == std::vector<double>{0, 0, 3, 3});
}

TEST_CASE("indexSelect gathers rows along any dim, repeating and reordering") {
  Tensor a = iota({3, 4});
  Tensor idx = fromVector<int64_t>({2, 0, 2});
  CHECK(indexSelect(a, 0, idx).toVector<double>() ==
        std::vector<double>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  Tensor cols = indexSelect(a, 1, fromVector<int64_t>({3, 1}));
  CHECK(cols.shape() == Shape{3, 2});
  CHECK(cols.toVector<double>() == std::vector<double>{3, 1, 7, 5, 11, 9});
  CHECK(a.indexSelect(-1, fromVector<int64_t>({0})).toVector<double>() == std::vector<double>{0, 4, 8});
  // Non-contiguous input and index, int64 data, empty index, 0-D index.
  CHECK(indexSelect(a.t(), 0, idx.narrow(0, 0, 2)).toVector<double>() == std::vector<double>{2, 6, 10, 0, 4, 8});
  Tensor strided = fromVector<int64_t>({1, 9, 0, 9}).narrow(0, 0, 4).view({2, 2}).select(1, 0);
  CHECK(indexSelect(iota({3}, DType::Int64), 0, strided).toVector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(indexSelect(a, 0, empty({0}, {.dtype = DType::Int64})).shape() == Shape{0, 4});
  CHECK(indexSelect(a, 1, scalarTensor(2, DType::Int64)).shape() == Shape{3, 1});
}

TEST_CASE("indexSelect passes gradcheck with repeated indices and strided inputs") {
  Tensor idx = fromVector<int64_t>({1, 1, 0, 3});
  CHECK(gradcheck([idx](const auto& in) { return indexSelect(in[0], 0, idx); }, {randn({4, 3}, kF64)}));
  CHECK(gradcheck([idx](const auto& in) { return indexSelect(in[0], 1, idx); }, {randn({5, 4}, kF64).t().t()}));
  CHECK(gradcheck([idx](const auto& in) { return indexSelect(in[0], 2, idx); },
                  {randn({4, 3, 2}, kF64).permute({2, 1, 0})}));
  // Repeated indices accumulate: d/dx of sum(x[[1,1,0,3]]) counts each row.
  Tensor x = zeros({4, 2}, kF64).requiresGrad_();
  indexSelect(x, 0, idx).sum().backward();
  CHECK(x.grad().toVector<double>() == std::vector<double>{1, 1, 2, 2, 0, 0, 1, 1});
}

TEST_CASE("indexSelect on a large table splits the gradient scatter without races") {
  Tensor table = randn({50, 4096}, kF64).requiresGrad_();
  std::vector<int64_t> rows(64);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>((i * 7) % 5);  // heavy repetition
  Tensor idx = fromVector(rows);
  indexSelect(table, 0, idx).sum().backward();
  std::vector<double> g = table.grad().toVector<double>();
  std::vector<double> counts(50, 0);
  for (int64_t r : rows) counts[r] += 1;
  bool ok = true;
  for (int64_t r = 0; r < 50; ++r) {
    for (int64_t c = 0; c < 4096; ++c) ok &= g[r * 4096 + c] == counts[r];
  }
  CHECK(ok);
}

TEST_CASE("shape ops report bad arguments with errors naming the op") {
  Tensor a = zeros({2, 3});
  CHECK_THROWS_WITH_AS(cat({a, zeros({2, 4})}), doctest::Contains("cat: tensor 1 has shape [2, 4]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(cat({a, zeros({2, 3, 1})}, 0), doctest::Contains("cat"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(cat({a, zeros({2, 3}, kF64)}), doctest::Contains("cat: tensor 1 has dtype float64"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(cat({}), doctest::Contains("cat: expected a non-empty list"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(cat({a, Tensor()}), doctest::Contains("cat: tensor 1 is undefined"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(cat({a}, 2), doctest::Contains("cat: dimension 2 out of range"), IndexError);
  CHECK_THROWS_WITH_AS(cat({scalarTensor(1), scalarTensor(2)}), doctest::Contains("cat: zero-dimensional"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(stack({a, a.t()}), doctest::Contains("stack: tensor 1 has shape [3, 2]"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(stack({a}, 3), doctest::Contains("stack"), IndexError);
  CHECK_THROWS_WITH_AS(split(a, 0, 1), doctest::Contains("split: split size 0"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(split(a, std::vector<int64_t>{1, 1}, 1), doctest::Contains("split: sizes [1, 1] sum to 2"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(split(a, 1, 2), doctest::Contains("split"), IndexError);
  CHECK_THROWS_WITH_AS(chunk(a, 0), doctest::Contains("chunk: the number of chunks must be positive"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(indexSelect(a, 1, fromVector<int64_t>({0, 3})),
                       doctest::Contains("indexSelect: index 3 (at position 1) is out of range for dimension 1 of size 3"),
                       IndexError);
  CHECK_THROWS_WITH_AS(indexSelect(a, 0, fromVector<int64_t>({-1})), doctest::Contains("index -1"), IndexError);
  CHECK_THROWS_WITH_AS(indexSelect(a, 0, fromVector<float>({0})), doctest::Contains("indexSelect: index must be int64"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(indexSelect(a, 0, zeros({1, 1}, {.dtype = DType::Int64})),
                       doctest::Contains("indexSelect: index must be 0-D or 1-D"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(indexSelect(a, 2, fromVector<int64_t>({0})), doctest::Contains("indexSelect"), IndexError);
}
