// int32, uint8 and bool next to float32/float64/int64: creation, printing, element access, conversions
// among all six (against PyTorch 1.13's values: tests/tensor/fixtures/gen_dtype_cases.py writes the
// .inc file), views, comparisons into bool masks, integer arithmetic, and the typed errors of the
// ops that do not take them.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "weft_test.h"

using namespace weft;

namespace {

struct ConversionCase {
  DType from, to;
  std::vector<double> source, expected;
};

#include "fixtures/dtype_cases.inc"

const DType kAll[] = {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool};

}  // namespace

TEST_CASE("int32, uint8 and bool have their sizes, names and kinds") {
  CHECK(elementSize(DType::Int32) == 4);
  CHECK(elementSize(DType::UInt8) == 1);
  CHECK(elementSize(DType::Bool) == 1);
  CHECK(std::string(dtypeName(DType::Int32)) == "int32");
  CHECK(std::string(dtypeName(DType::UInt8)) == "uint8");
  CHECK(std::string(dtypeName(DType::Bool)) == "bool");
  for (DType t : {DType::Int64, DType::Int32, DType::UInt8}) {
    CHECK(isIntegral(t));
    CHECK_FALSE(isFloating(t));
  }
  CHECK_FALSE(isIntegral(DType::Bool));
  CHECK_FALSE(isFloating(DType::Bool));
  CHECK(kDTypeOf<int32_t> == DType::Int32);
  CHECK(kDTypeOf<uint8_t> == DType::UInt8);
  CHECK(kDTypeOf<bool> == DType::Bool);
}

TEST_CASE("zeros, ones, full, empty and fromVector make int32, uint8 and bool tensors") {
  for (DType t : {DType::Int32, DType::UInt8, DType::Bool}) {
    CAPTURE(dtypeName(t));
    CHECK(zeros({2, 3}, {.dtype = t}).dtype() == t);
    CHECK(zeros({2, 3}, {.dtype = t}).toVector<double>() == std::vector<double>(6, 0.0));
    CHECK(ones({4}, {.dtype = t}).toVector<double>() == std::vector<double>(4, 1.0));
    CHECK(empty({5}, {.dtype = t}).nbytes() == 5 * elementSize(t));
  }
  CHECK(full({3}, -7, {.dtype = DType::Int32}).toVector<int32_t>() == std::vector<int32_t>{-7, -7, -7});
  CHECK(full({2}, 255, {.dtype = DType::UInt8}).toVector<uint8_t>() == std::vector<uint8_t>{255, 255});
  CHECK(full({2}, 0.25, {.dtype = DType::Bool}).toVector<bool>() == std::vector<bool>{true, true});

  Tensor i = fromVector<int32_t>({1, -2, 2147483647, -2147483647 - 1}, {2, 2});
  CHECK(i.dtype() == DType::Int32);
  CHECK(i.shape() == Shape{2, 2});
  CHECK(i.data<int32_t>()[2] == 2147483647);
  Tensor u = fromVector<uint8_t>({0, 128, 255});
  CHECK(u.dtype() == DType::UInt8);
  CHECK(u.data<uint8_t>()[2] == 255);
  // std::vector<bool> packs bits: fromVector unpacks them into one byte per element.
  Tensor b = fromVector(std::vector<bool>{true, false, false, true, true});
  CHECK(b.dtype() == DType::Bool);
  const bool* bp = b.data<bool>();
  CHECK(std::vector<bool>(bp, bp + 5) == std::vector<bool>{true, false, false, true, true});
}

TEST_CASE("item, data and toVector read int32, uint8 and bool elements") {
  Tensor i = fromVector<int32_t>({5, -6, 7}, {3});
  CHECK(i.select(0, 1).item<int32_t>() == -6);
  CHECK(i.toVector<int64_t>() == std::vector<int64_t>{5, -6, 7});
  CHECK(i.toVector<bool>() == std::vector<bool>{true, true, true});
  Tensor u = fromVector<uint8_t>({9, 0});
  CHECK(u.select(0, 0).item<uint8_t>() == 9);
  CHECK(u.select(0, 1).item<bool>() == false);
  CHECK(u.toVector<float>() == std::vector<float>{9.0f, 0.0f});
  Tensor b = fromVector(std::vector<bool>{false, true});
  CHECK(b.select(0, 1).item<bool>());
  CHECK(b.select(0, 1).item<int32_t>() == 1);
  CHECK(b.toVector<uint8_t>() == std::vector<uint8_t>{0, 1});
  CHECK_THROWS_WITH_AS(u.data<int32_t>(), doctest::Contains("data<int32>() on a tensor of dtype uint8"),
                       InvalidArgumentError);
}

TEST_CASE("to(dtype) converts between every pair of the six dtypes as PyTorch does") {
  int checked = 0;
  for (const ConversionCase& c : kConversionCases) {
    CAPTURE(dtypeName(c.from));
    CAPTURE(dtypeName(c.to));
    Tensor src = fromVector(c.source).to(c.from);
    REQUIRE(src.toVector<double>() == c.source);
    Tensor out = src.to(c.to);
    CHECK(out.dtype() == c.to);
    CHECK(out.toVector<double>() == c.expected);
    // The same from a strided view ([n, 2] with strides [1, 0]: the kernel's strided path).
    Tensor wide = src.view({1, -1}).expand({2, src.numel()}).t();
    REQUIRE_FALSE(wide.isContiguous());
    Tensor wideOut = wide.to(c.to);
    CHECK(wideOut.select(1, 0).toVector<double>() == c.expected);
    CHECK(wideOut.select(1, 1).toVector<double>() == c.expected);
    ++checked;
  }
  CHECK(checked == 36);
}

TEST_CASE("floats outside an integer dtype saturate and NaN becomes 0") {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = fromVector<double>({-3.7, 3.7, 1e20, -1e20, inf, -inf, std::nan("")});
  CHECK(x.to(DType::Int32).toVector<int64_t>() ==
        std::vector<int64_t>{-3, 3, 2147483647, -2147483648LL, 2147483647, -2147483648LL, 0});
  CHECK(x.to(DType::UInt8).toVector<int64_t>() == std::vector<int64_t>{0, 3, 255, 0, 255, 0, 0});
  CHECK(x.to(DType::Int64).toVector<int64_t>() ==
        std::vector<int64_t>{-3, 3, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::lowest(),
                             std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::lowest(), 0});
  // NaN is not zero: true, as in PyTorch.
  CHECK(x.to(DType::Bool).toVector<bool>() == std::vector<bool>(7, true));
}

TEST_CASE("views, contiguous, clone, copy_ and cat work on int32, uint8 and bool") {
  for (DType t : {DType::Int32, DType::UInt8, DType::Bool}) {
    CAPTURE(dtypeName(t));
    // [[0, 1, 2], [3, 4, 5]] as t (bool: [[F, T, T], [T, T, T]]).
    Tensor x = arange(6, {.dtype = DType::Int64}).view({2, 3}).to(t);
    auto as = [t](std::vector<double> v) { return fromVector(v).to(t).toVector<double>(); };
    Tensor xt = x.t();
    CHECK_FALSE(xt.isContiguous());
    CHECK(xt.contiguous().toVector<double>() == as({0, 3, 1, 4, 2, 5}));
    CHECK(x.narrow(1, 1, 2).toVector<double>() == as({1, 2, 4, 5}));
    CHECK(x.reshape({3, 2}).select(0, 2).toVector<double>() == as({4, 5}));
    Tensor c = x.clone();
    c.zero_();
    CHECK(x.toVector<double>() == as({0, 1, 2, 3, 4, 5}));
    CHECK(c.toVector<double>() == as({0, 0, 0, 0, 0, 0}));
    c.copy_(xt.t());
    CHECK(c.toVector<double>() == x.toVector<double>());
    Tensor strided = zeros({3, 2}, {.dtype = t}).t();  // copy_ into a strided destination
    strided.copy_(x);
    CHECK(strided.toVector<double>() == x.toVector<double>());
    CHECK(cat({x, x}, 1).select(0, 1).toVector<double>() == as({3, 4, 5, 3, 4, 5}));
    CHECK(x.indexSelect(1, fromVector<int64_t>({2, 0})).toVector<double>() == as({2, 0, 5, 3}));
  }
}

TEST_CASE("int32, uint8 and bool print as PyTorch prints them") {
  CHECK(fromVector(std::vector<bool>{true, false, false, true}, {2, 2}).toString() ==
        "tensor([[ True, False],\n        [False,  True]])");
  CHECK(fromVector<uint8_t>({0, 255, 7}).toString() == "tensor([  0, 255,   7], dtype=uint8)");
  CHECK(fromVector<int32_t>({-5, 12, 300, 0}, {2, 2}).toString() ==
        "tensor([[ -5,  12],\n        [300,   0]], dtype=int32)");
  CHECK(scalarTensor(1, DType::Bool).toString() == "tensor(True)");
}

TEST_CASE("comparisons give bool masks for every dtype, and a mask sums to an int64 count") {
  for (DType t : kAll) {
    CAPTURE(dtypeName(t));
    Tensor a = fromVector<double>({0, 1, 2, 1}).to(t);
    Tensor b = fromVector<double>({1, 1, 1, 0}).to(t);
    Tensor e = eq(a, b), g = gt(a, b), l = lt(a, b);
    CHECK(e.dtype() == DType::Bool);
    CHECK(g.dtype() == DType::Bool);
    if (t == DType::Bool) {  // a is [F, T, T, T], b is [T, T, T, F]
      CHECK(e.toVector<bool>() == std::vector<bool>{false, true, true, false});
      CHECK(g.toVector<bool>() == std::vector<bool>{false, false, false, true});
      CHECK(l.toVector<bool>() == std::vector<bool>{true, false, false, false});
    } else {
      CHECK(e.toVector<bool>() == std::vector<bool>{false, true, false, false});
      CHECK(g.toVector<bool>() == std::vector<bool>{false, false, true, true});
      CHECK(l.toVector<bool>() == std::vector<bool>{true, false, false, false});
    }
    Tensor count = eq(a, a).sum();
    CHECK(count.dtype() == DType::Int64);
    CHECK(count.item<int64_t>() == 4);
  }
  // Broadcast against a scalar.
  Tensor m = gt(fromVector<int32_t>({3, 9, 5}), scalarTensor(4, DType::Int32));
  CHECK(m.toVector<bool>() == std::vector<bool>{false, true, true});
}

TEST_CASE("integer arithmetic wraps and truncates as in PyTorch") {
  Tensor a8 = fromVector<uint8_t>({200, 10, 255, 0}), b8 = fromVector<uint8_t>({100, 20, 1, 1});
  Tensor a32 = fromVector<int32_t>({2147483647, -7, 7, -2147483647 - 1}), b32 = fromVector<int32_t>({1, 2, -2, 3});
  CHECK(add(a8, b8).toVector<double>() == kUInt8Add);
  CHECK(sub(a8, b8).toVector<double>() == kUInt8Sub);
  CHECK(mul(a8, b8).toVector<double>() == kUInt8Mul);
  CHECK(div(a8, b8).toVector<double>() == kUInt8Div);
  CHECK(add(a32, b32).toVector<double>() == kInt32Add);
  CHECK(sub(a32, b32).toVector<double>() == kInt32Sub);
  CHECK(mul(a32, b32).toVector<double>() == kInt32Mul);
  CHECK(div(a32, b32).toVector<double>() == kInt32Div);
  CHECK(a8.dtype() == DType::UInt8);
  CHECK(add(a8, b8).dtype() == DType::UInt8);
  // Sums are int64: no wrap-around.
  CHECK(sum(a8).dtype() == DType::Int64);
  CHECK(std::vector<double>{sum(a8).item<double>()} == kUInt8Sum);
  CHECK(std::vector<double>{sum(a32).item<double>()} == kInt32Sum);
  CHECK(sum(a32.view({2, 2}), {1}).toVector<int64_t>() == std::vector<int64_t>{2147483647 - 7, 7 - 2147483648LL});
  CHECK(gt(a8, b8).toVector<double>() == kUInt8Gt);
  CHECK(lt(a32, b32).toVector<double>() == kInt32Lt);
  // The scalar forms: a negative scalar wraps in uint8 as in PyTorch (x - 1).
  CHECK((a8 - 1.0).toVector<int64_t>() == std::vector<int64_t>{199, 9, 254, 255});
  CHECK((a32 * 2.0).toVector<int64_t>() == std::vector<int64_t>{-2, -14, 14, 0});
  CHECK(neg(fromVector<int32_t>({3, -4})).toVector<int32_t>() == std::vector<int32_t>{-3, 4});
  CHECK(abs(fromVector<int32_t>({3, -4})).toVector<int32_t>() == std::vector<int32_t>{3, 4});
  CHECK(maximum(a8, b8).toVector<uint8_t>() == std::vector<uint8_t>{200, 20, 255, 1});
  CHECK(clamp(fromVector<uint8_t>({0, 100, 250}), -5, 300).toVector<uint8_t>() == std::vector<uint8_t>{0, 100, 250});
  CHECK(clamp(a32, -10, std::numeric_limits<double>::infinity()).toVector<int64_t>() ==
        std::vector<int64_t>{2147483647, -7, 7, -10});
  // The lowest value divided by -1 wraps instead of trapping.
  CHECK(div(fromVector<int32_t>({-2147483647 - 1}), fromVector<int32_t>({-1})).item<int32_t>() == -2147483647 - 1);
  CHECK_THROWS_WITH_AS(div(a8, fromVector<uint8_t>({1, 0, 1, 1})), doctest::Contains("integer division by zero"),
                       InvalidArgumentError);
}

TEST_CASE("max, min and argmax take int32, uint8 and bool and keep the dtype") {
  Tensor i = fromVector<int32_t>({4, -9, 11, 11}, {2, 2});
  CHECK(max(i).item<int32_t>() == 11);
  CHECK(max(i).dtype() == DType::Int32);
  CHECK(min(i).item<int32_t>() == -9);
  CHECK(argmax(i, 1).toVector<int64_t>() == std::vector<int64_t>{0, 0});
  Tensor u = fromVector<uint8_t>({3, 250, 17});
  auto [v, idx] = max(u, 0);
  CHECK(v.item<uint8_t>() == 250);
  CHECK(idx.item<int64_t>() == 1);
  Tensor b = fromVector(std::vector<bool>{false, true, false});
  CHECK(max(b).dtype() == DType::Bool);
  CHECK(max(b).item<bool>());
  CHECK_FALSE(min(b).item<bool>());
  CHECK(argmax(b, 0).item<int64_t>() == 1);
}

TEST_CASE("ops that need another dtype name the op and the dtype") {
  Tensor i = fromVector<int32_t>({1, 2}), u = fromVector<uint8_t>({1, 2}), b = fromVector(std::vector<bool>{true});
  CHECK_THROWS_WITH_AS(exp(i), doctest::Contains("exp: dtype int32 is not supported"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(sqrt(u), doctest::Contains("sqrt: dtype uint8 is not supported"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(log(fromVector<int64_t>({1})), doctest::Contains("log: dtype int64 is not supported"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(sigmoid(b), doctest::Contains("sigmoid: dtype bool is not supported"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(add(b, b), doctest::Contains("add: dtype bool is not supported"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(neg(b), doctest::Contains("neg: dtype bool is not supported"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(b * 2.0, doctest::Contains("mul: dtype bool is not supported"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(mean(i), doctest::Contains("mean: expected a floating-point tensor, got int32"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(matmul(i.view({1, 2}), i.view({2, 1})), doctest::Contains("int32"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(softmax(u, 0), doctest::Contains("uint8"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(i.requiresGrad_(), doctest::Contains("only floating-point tensors can require grad, got int32"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(full({2}, 300, {.dtype = DType::UInt8}),
                       doctest::Contains("value 300 cannot be converted to uint8 without overflow"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(full({2}, -1, {.dtype = DType::UInt8}), doctest::Contains("cannot be converted to uint8"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(randint(0, 300, {4}, {.dtype = DType::UInt8}),
                       doctest::Contains("randint: [0, 300) does not fit dtype uint8"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(arange(3, {.dtype = DType::Bool}), doctest::Contains("arange: dtype bool is not supported"),
                       InvalidArgumentError);
}

TEST_CASE("randint and arange fill int32 and uint8 tensors") {
  Generator g(4);
  Tensor r = randint(250, 256, {200}, {.dtype = DType::UInt8}, &g);
  CHECK(r.dtype() == DType::UInt8);
  for (int64_t v : r.toVector<int64_t>()) CHECK((v >= 250 && v <= 255));
  Tensor m = randint(0, 2, {64}, {.dtype = DType::Bool}, &g);
  CHECK(m.dtype() == DType::Bool);
  int64_t ones = sum(m).item<int64_t>();
  CHECK((ones > 0 && ones < 64));
  CHECK(arange(-2, 3, 1, {.dtype = DType::Int32}).toVector<int32_t>() == std::vector<int32_t>{-2, -1, 0, 1, 2});
}
