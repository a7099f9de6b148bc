// where, maskedFill, triu/tril, gather, scatterAdd and cumsum: values against
// element-by-element definitions, gradients against finite differences, and
// the typed errors.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "kernels/cpu/parallel.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::gradcheck;
using weft::testing::kF64;

namespace {

// The message of the exception of type E that f throws, or a note that it did not.
template <class E, class F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "no exception of the expected type";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Strides of a contiguous tensor of `shape`, and the flat position of a
// multi-index through given strides.
std::vector<int64_t> stridesOf(const Shape& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    st[d] = step;
    step *= shape[d];
  }
  return st;
}

// The multi-index of flat position `flat` in `shape`.
std::vector<int64_t> unflatten(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

// The flat position in `shape` of multi-index `idx` of an output of
// (possibly higher) rank, with size-1 dimensions of `shape` broadcast.
int64_t broadcastFlat(const std::vector<int64_t>& idx, const Shape& shape) {
  const std::vector<int64_t> st = stridesOf(shape);
  const size_t lead = idx.size() - shape.size();
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat += (shape[d] == 1 ? 0 : idx[lead + d]) * st[d];
  return flat;
}

Tensor boolTensor(const std::vector<int>& v, Shape shape) {
  std::vector<double> d(v.begin(), v.end());
  return fromVector(d, std::move(shape)).to(DType::Bool);
}

}  // namespace

// ---- where and maskedFill -------------------------------------------------------

TEST_CASE("where picks a where cond holds and b elsewhere, broadcasting all three") {
  Generator gen(1);
  Tensor cond = gt(randn({2, 1, 3}, kF64, &gen), zeros({}, kF64));
  Tensor a = randn({4, 1}, kF64, &gen), b = randn({3}, kF64, &gen);
  Tensor out = where(cond, a, b);
  REQUIRE(out.shape() == Shape{2, 4, 3});
  std::vector<double> c = cond.to(DType::Float64).toVector<double>(), av = a.toVector<double>(),
                      bv = b.toVector<double>(), ov = out.toVector<double>();
  for (int64_t p = 0; p < out.numel(); ++p) {
    std::vector<int64_t> idx = unflatten(p, out.shape());
    double want = c[broadcastFlat(idx, cond.shape())] != 0 ? av[broadcastFlat(idx, a.shape())]
                                                            : bv[broadcastFlat(idx, b.shape())];
    CHECK(ov[p] == want);
  }
}

TEST_CASE("where takes every dtype and non-contiguous operands") {
  Tensor cond = boolTensor({1, 0, 0, 1, 1, 0}, {2, 3});
  CHECK(where(cond, full({2, 3}, 7, {.dtype = DType::Int64}), full({}, -1, {.dtype = DType::Int64}))
            .toVector<int64_t>() == std::vector<int64_t>{7, -1, -1, 7, 7, -1});
  CHECK(where(cond, ones({2, 3}, {.dtype = DType::Bool}), zeros({2, 3}, {.dtype = DType::Bool})).toVector<bool>() ==
        std::vector<bool>{true, false, false, true, true, false});
  CHECK(where(cond, full({3}, 4, {.dtype = DType::UInt8}), full({3}, 9, {.dtype = DType::UInt8}))
            .toVector<uint8_t>() == std::vector<uint8_t>{4, 9, 9, 4, 4, 9});
  // a transposed view [3, 2] -> [2, 3]
  Tensor at = fromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2}).t();
  CHECK(where(cond, at, zeros({}, {})).toVector<float>() == std::vector<float>{1, 0, 0, 2, 4, 0});
}

TEST_CASE("where passes gradcheck for both branches with broadcasting") {
  Generator gen(2);
  Tensor cond = gt(randn({3, 4}, kF64, &gen), zeros({}, kF64));
  CHECK(gradcheck([cond](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); },
                  {randn({3, 1}, kF64, &gen), randn({4}, kF64, &gen)}));
  // Only b needs a gradient.
  Tensor a = randn({3, 4}, kF64, &gen);
  CHECK(gradcheck([cond, a](const std::vector<Tensor>& in) { return where(cond, a, in[0]); },
                  {randn({3, 4}, kF64, &gen)}));
}

TEST_CASE("where names the op and the problem on bad input") {
  Tensor x = zeros({2, 3});
  CHECK(contains(messageOf<InvalidArgumentError>([&] { where(zeros({2, 3}), x, x); }), "where"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] { where(zeros({2, 3}), x, x); }), "condition"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] { where(boolTensor({1, 0}, {2}), x, x); }),
                 "where: shapes [2] and [2, 3] cannot be broadcast"));
  CHECK(contains(messageOf<InvalidArgumentError>(
                     [&] { where(boolTensor({1, 0, 1}, {3}), x, zeros({2, 3}, kF64)); }),
                 "where"));
}

TEST_CASE("maskedFill writes the value where the mask holds, as a causal attention mask") {
  // Scores [2, 3, 3]: everything above the diagonal becomes -inf.
  Generator gen(3);
  Tensor scores = randn({2, 3, 3}, {}, &gen);
  Tensor mask = triu(ones({3, 3}, {.dtype = DType::Bool}), 1);
  Tensor out = maskedFill(scores, mask, -std::numeric_limits<double>::infinity());
  std::vector<float> s = scores.toVector<float>(), o = out.toVector<float>();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < 3; ++j) {
        const int64_t p = (b * 3 + i) * 3 + j;
        if (j > i) {
          CHECK(o[p] == -std::numeric_limits<float>::infinity());
        } else {
          CHECK(o[p] == s[p]);
        }
      }
    }
  }
  CHECK(maskedFill(fromVector<int64_t>({1, 2, 3}, {3}), boolTensor({0, 1, 0}, {3}), 9).toVector<int64_t>() ==
        std::vector<int64_t>{1, 9, 3});
}

TEST_CASE("maskedFill's gradient is g where the mask is false and zero where it filled") {
  Generator gen(4);
  Tensor mask = gt(randn({4}, kF64, &gen), zeros({}, kF64));
  CHECK(gradcheck([mask](const std::vector<Tensor>& in) { return maskedFill(in[0], mask, 2.5); },
                  {randn({3, 4}, kF64, &gen)}));
  Tensor x = ones({2, 2}).requiresGrad_();
  sum(maskedFill(x, boolTensor({1, 0}, {2}), 5.0)).backward();
  CHECK(x.grad().toVector<float>() == std::vector<float>{0, 1, 0, 1});
}

TEST_CASE("maskedFill names the op and the shapes on bad input") {
  Tensor x = zeros({2, 3});
  CHECK(contains(messageOf<InvalidArgumentError>([&] { maskedFill(x, boolTensor({1, 0, 1, 0, 1, 0}, {1, 2, 3}), 0); }),
                 "maskedFill: mask of shape [1, 2, 3] does not broadcast to the input's shape [2, 3]"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] { maskedFill(x, zeros({2, 3}), 0); }), "maskedFill"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] {
                   maskedFill(zeros({2}, {.dtype = DType::Int64}), boolTensor({1, 0}, {2}), std::nan(""));
                 }),
                 "maskedFill: value nan cannot be stored in a tensor of dtype int64"));
}

// ---- triu and tril --------------------------------------------------------------

TEST_CASE("triu and tril keep the triangles of the last two dims for any diagonal") {
  Generator gen(5);
  for (Shape shape : {Shape{4, 4}, Shape{2, 3, 5}, Shape{2, 1, 5, 3}}) {
    Tensor x = randn(shape, kF64, &gen);
    const int64_t R = shape[shape.size() - 2], C = shape.back();
    for (int64_t diagonal = -6; diagonal <= 6; ++diagonal) {
      CAPTURE(diagonal);
      std::vector<double> xv = x.toVector<double>(), up = triu(x, diagonal).toVector<double>(),
                          lo = tril(x, diagonal).toVector<double>();
      for (int64_t p = 0; p < x.numel(); ++p) {
        const int64_t j = p % C, i = (p / C) % R;
        CHECK(up[p] == (j - i >= diagonal ? xv[p] : 0.0));
        CHECK(lo[p] == (j - i <= diagonal ? xv[p] : 0.0));
      }
    }
  }
  // A transposed view, and a bool matrix.
  Tensor t = fromVector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3}).t();
  CHECK(triu(t).toVector<float>() == std::vector<float>{1, 4, 7, 0, 5, 8, 0, 0, 9});
  CHECK(tril(ones({2, 3}, {.dtype = DType::Bool}), -1).toVector<bool>() ==
        std::vector<bool>{false, false, false, true, false, false});
}

TEST_CASE("triu and tril pass gradcheck and reject inputs of fewer than two dims") {
  Generator gen(6);
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return triu(in[0], 1); }, {randn({2, 3, 4}, kF64, &gen)}));
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return tril(in[0], -1); }, {randn({4, 3}, kF64, &gen)}));
  CHECK(contains(messageOf<InvalidArgumentError>([] { triu(zeros({5})); }),
                 "triu: input must have at least 2 dimensions [..., R, C], got shape [5]"));
  CHECK(contains(messageOf<InvalidArgumentError>([] { tril(zeros({})); }), "tril: input must have at least 2"));
}

// ---- gather and scatterAdd ---------------------------------------------------------

TEST_CASE("gather reads x at the index along dim, for every dim and a strided x") {
  Generator gen(7);
  Tensor x = randn({3, 4, 5}, kF64, &gen);
  for (int64_t dim = 0; dim < 3; ++dim) {
    CAPTURE(dim);
    // index smaller than x outside dim, larger along it.
    Shape is = {2, 3, 4};
    is[dim] = 6;
    Tensor index = randint(0, x.size(dim), is, {.dtype = DType::Int64}, &gen);
    Tensor out = gather(x, dim, index);
    REQUIRE(out.shape() == is);
    std::vector<double> xv = x.toVector<double>(), ov = out.toVector<double>();
    std::vector<int64_t> iv = index.toVector<int64_t>();
    for (int64_t p = 0; p < out.numel(); ++p) {
      std::vector<int64_t> at = unflatten(p, is);
      at[dim] = iv[p];
      CHECK(ov[p] == xv[(at[0] * 4 + at[1]) * 5 + at[2]]);
    }
    CHECK(gather(x, dim - 3, index).toVector<double>() == ov);
  }
  Tensor xt = fromVector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}).t();  // [[1, 4], [2, 5], [3, 6]]
  CHECK(gather(xt, 1, fromVector<int64_t>({1, 1, 0}, {3, 1})).toVector<int64_t>() == std::vector<int64_t>{4, 5, 3});
}

TEST_CASE("gather passes gradcheck with repeated indices, which receive both gradients") {
  Generator gen(8);
  Tensor index = fromVector<int64_t>({0, 0, 2, 1, 1, 1, 3, 0}, {2, 4});
  CHECK(gradcheck([index](const std::vector<Tensor>& in) { return gather(in[0], 1, index); },
                  {randn({3, 4}, kF64, &gen)}));
  CHECK(gradcheck([index](const std::vector<Tensor>& in) { return gather(in[0], 0, index.narrow(1, 0, 3)); },
                  {randn({4, 5}, kF64, &gen)}));
  Tensor x = zeros({1, 3}).requiresGrad_();
  sum(gather(x, 1, fromVector<int64_t>({2, 2, 0}, {1, 3}))).backward();
  CHECK(x.grad().toVector<float>() == std::vector<float>{1, 0, 2});
}

TEST_CASE("scatterAdd adds src into a copy of x at the index, repeated targets accumulating") {
  Generator gen(9);
  Tensor x = randn({4, 5}, kF64, &gen);
  for (int64_t dim = 0; dim < 2; ++dim) {
    CAPTURE(dim);
    Shape is = {3, 4};
    is[dim] = 7;
    Tensor index = randint(0, x.size(dim), is, {.dtype = DType::Int64}, &gen);
    Tensor src = randn({8, 8}, kF64, &gen);  // larger than index: the rest is unused
    Tensor out = scatterAdd(x, dim, index, src);
    std::vector<double> want = x.toVector<double>(), sv = src.toVector<double>();
    std::vector<int64_t> iv = index.toVector<int64_t>();
    for (int64_t p = 0; p < index.numel(); ++p) {
      std::vector<int64_t> at = unflatten(p, is);
      const double s = sv[at[0] * 8 + at[1]];
      at[dim] = iv[p];
      want[at[0] * 5 + at[1]] += s;
    }
    std::vector<double> got = out.toVector<double>();
    REQUIRE(got.size() == want.size());
    for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == doctest::Approx(want[k]).epsilon(1e-14));
  }
  // x itself is untouched; integer dtypes add exactly.
  Tensor xi = fromVector<int64_t>({10, 20, 30}, {3});
  CHECK(scatterAdd(xi, 0, fromVector<int64_t>({2, 2, 0, 2}, {4}), fromVector<int64_t>({1, 2, 3, 4}, {4}))
            .toVector<int64_t>() == std::vector<int64_t>{13, 20, 37});
  CHECK(xi.toVector<int64_t>() == std::vector<int64_t>{10, 20, 30});
}

TEST_CASE("scatterAdd passes gradcheck for x and for a src larger than the index") {
  Generator gen(10);
  Tensor index = fromVector<int64_t>({0, 2, 2, 1, 0, 0}, {2, 3});
  CHECK(gradcheck([index](const std::vector<Tensor>& in) { return scatterAdd(in[0], 0, index, in[1]); },
                  {randn({3, 4}, kF64, &gen), randn({3, 5}, kF64, &gen)}));
  CHECK(gradcheck([index](const std::vector<Tensor>& in) { return scatterAdd(in[0], 1, index, in[1]); },
                  {randn({2, 3}, kF64, &gen), randn({2, 3}, kF64, &gen)}));
  // Only src needs a gradient.
  Tensor x = randn({3, 4}, kF64, &gen);
  CHECK(gradcheck([index, x](const std::vector<Tensor>& in) { return scatterAdd(x, 0, index, in[0]); },
                  {randn({2, 3}, kF64, &gen)}));
}

TEST_CASE("scatterAdd gives the same bits with one thread or several") {
  const int saved = kernels::cpu::numThreads();
  for (int64_t dim : {0, 1}) {
    auto run = [&](int threads) {
      kernels::cpu::setNumThreads(threads);
      Generator gen(11);
      Tensor index = randint(0, 16, {4000, 64}, {.dtype = DType::Int64}, &gen);
      Tensor src = randn({4000, 64}, {}, &gen);
      Shape xs = {4000, 64};
      xs[dim] = 16;
      return scatterAdd(zeros(xs), dim, index, src).toVector<float>();
    };
    CAPTURE(dim);
    auto one = run(1), two = run(2), three = run(3);
    kernels::cpu::setNumThreads(saved);
    CHECK(one == two);
    CHECK(one == three);
  }
}

TEST_CASE("gather and scatterAdd name the op, the index and the size on bad input") {
  Tensor x = zeros({3, 4});
  std::string m = messageOf<IndexError>([&] { gather(x, 1, fromVector<int64_t>({0, 4}, {1, 2})); });
  CHECK(contains(m, "gather: index 4 (at flat position 1 of index shape [1, 2]) is out of range for dimension 1 "
                    "of size 4"));
  CHECK(contains(messageOf<IndexError>([&] { gather(x, 0, fromVector<int64_t>({-1}, {1, 1})); }), "gather: index -1"));
  CHECK(contains(messageOf<IndexError>([&] {
                   scatterAdd(x, 0, fromVector<int64_t>({3}, {1, 1}), ones({1, 1}));
                 }),
                 "scatterAdd: index 3"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] { gather(x, 0, fromVector<int64_t>({0}, {1})); }),
                 "gather: index of shape [1] must have as many dimensions as the input of shape [3, 4]"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] { gather(x, 0, zeros({1, 5}, {.dtype = DType::Int64})); }),
                 "gather: index of shape [1, 5] is larger than the input of shape [3, 4] in dimension 1"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] { gather(x, 0, zeros({1, 1})); }), "gather"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] {
                   scatterAdd(x, 0, zeros({2, 2}, {.dtype = DType::Int64}), ones({2, 1}));
                 }),
                 "scatterAdd: index of shape [2, 2] is larger than src of shape [2, 1] in dimension 1"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] {
                   scatterAdd(x, 0, zeros({1, 1}, {.dtype = DType::Int64}), ones({1, 1}, kF64));
                 }),
                 "scatterAdd"));
  CHECK(contains(messageOf<InvalidArgumentError>([&] {
                   scatterAdd(zeros({2}, {.dtype = DType::Bool}), 0, zeros({1}, {.dtype = DType::Int64}),
                              ones({1}, {.dtype = DType::Bool}));
                 }),
                 "scatterAdd"));
}

// ---- cumsum -----------------------------------------------------------------------

TEST_CASE("cumsum sums along any dim, float32 in float64 and integers into int64") {
  Generator gen(12);
  Tensor x = randn({3, 4, 5}, kF64, &gen);
  for (int64_t dim = 0; dim < 3; ++dim) {
    CAPTURE(dim);
    Tensor out = cumsum(x, dim);
    std::vector<double> xv = x.toVector<double>(), ov = out.toVector<double>();
    const std::vector<int64_t> st = stridesOf(x.shape());
    for (int64_t p = 0; p < x.numel(); ++p) {
      std::vector<int64_t> at = unflatten(p, x.shape());
      double want = 0;
      for (int64_t s = 0; s <= at[dim]; ++s) want += xv[p + (s - at[dim]) * st[dim]];
      CHECK(ov[p] == doctest::Approx(want).epsilon(1e-14));
    }
    CHECK(cumsum(x, dim - 3).toVector<double>() == ov);
  }
  // float32: a long run whose float32 partial sums would drift; each output
  // is the float64 running sum rounded once.
  std::vector<float> v(100000, 0.1f);
  std::vector<float> got = cumsum(fromVector(v, {100000}), 0).toVector<float>();
  CHECK(got.back() == doctest::Approx(100000 * static_cast<double>(0.1f)).epsilon(1e-7));
  CHECK(cumsum(fromVector<int32_t>({2147483647, 1, -5}, {3}), 0).dtype() == DType::Int64);
  CHECK(cumsum(fromVector<int32_t>({2147483647, 1, -5}, {3}), 0).toVector<int64_t>() ==
        std::vector<int64_t>{2147483647, 2147483648, 2147483643});
  CHECK(cumsum(boolTensor({1, 0, 1, 1}, {4}), 0).toVector<int64_t>() == std::vector<int64_t>{1, 1, 2, 3});
  CHECK(cumsum(full({}, 3.5, kF64), 0).item<double>() == 3.5);
}

TEST_CASE("cumsum passes gradcheck along every dim") {
  Generator gen(13);
  for (int64_t dim : {0, 1, -1}) {
    CAPTURE(dim);
    CHECK(gradcheck([dim](const std::vector<Tensor>& in) { return cumsum(in[0], dim); },
                    {randn({3, 2, 4}, kF64, &gen)}));
  }
  Tensor x = zeros({4}).requiresGrad_();
  sum(cumsum(x, 0)).backward();
  CHECK(x.grad().toVector<float>() == std::vector<float>{4, 3, 2, 1});
}

TEST_CASE("cumsum names the op for a dim out of range") {
  CHECK(contains(messageOf<IndexError>([] { cumsum(zeros({2, 3}), 2); }), "cumsum: dimension 2 out of range"));
}
