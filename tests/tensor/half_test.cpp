// bfloat16 and float16 on the CPU: conversions bit for bit against PyTorch
// 1.13 (tests/tensor/fixtures/gen_half_cases.py writes the .inc file), element
// access, printing, and the ops that compute through float32 (elementwise,
// reductions, softmax, matmul, embedding, losses), with their gradients.
#include <bit>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "kernels/cpu/copy.h"
#include "tensor/ops.h"
#include "weft_test.h"

using namespace weft;

namespace {

#include "fixtures/half_cases.inc"

// The bits of a 16-bit tensor, row-major.
std::vector<uint16_t> bitsOf(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint16_t*>(c.rawData());
  return std::vector<uint16_t>(p, p + c.numel());
}

Tensor fromBits(const std::vector<uint16_t>& bits, Shape shape, DType dt) {
  Tensor t = empty(std::move(shape), {.dtype = dt});
  std::memcpy(t.rawData(), bits.data(), bits.size() * 2);
  return t;
}

// Distance in units in the last place between two finite 16-bit values of
// the same sign (their bit patterns are ordered like the values).
int ulpDistance(uint16_t a, uint16_t b) {
  auto key = [](uint16_t v) { return (v & 0x8000) ? -static_cast<int>(v & 0x7fff) : static_cast<int>(v); };
  return std::abs(key(a) - key(b));
}

// Every element equal to the reference bits (maxUlp 0) or within maxUlp.
void checkBits(const Tensor& got, const std::vector<uint16_t>& want, int maxUlp, const char* what) {
  const std::string op = what;
  CAPTURE(op);
  std::vector<uint16_t> g = bitsOf(got);
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CAPTURE(g[i]);
    CAPTURE(want[i]);
    CHECK(ulpDistance(g[i], want[i]) <= maxUlp);
  }
}

struct HalfCases {
  DType dt;
  const std::vector<uint16_t>&f32, &f64, &i64;
  const std::vector<double>& back;
  const std::vector<uint16_t>&a, &b, &m, &add, &sub, &mul, &div, &addScalar, &mulScalar, &exp, &tanh, &sigmoid,
      &gelu, &relu, &sqrt, &sumDim1, &sumDim0, &meanAll, &softmax, &logSoftmax, &matmul, &maxDim1;
};

const HalfCases kCases[] = {
    {DType::BFloat16, kF32ToBF16, kF64ToBF16, kI64ToBF16, kBF16ToF64, kBF16A, kBF16B, kBF16M, kBF16Add, kBF16Sub,
     kBF16Mul, kBF16Div, kBF16AddScalar, kBF16MulScalar, kBF16Exp, kBF16Tanh, kBF16Sigmoid, kBF16Gelu, kBF16Relu,
     kBF16Sqrt, kBF16SumDim1, kBF16SumDim0, kBF16MeanAll, kBF16Softmax, kBF16LogSoftmax, kBF16Matmul, kBF16MaxDim1},
    {DType::Float16, kF32ToF16, kF64ToF16, kI64ToF16, kF16ToF64, kF16A, kF16B, kF16M, kF16Add, kF16Sub, kF16Mul,
     kF16Div, kF16AddScalar, kF16MulScalar, kF16Exp, kF16Tanh, kF16Sigmoid, kF16Gelu, kF16Relu, kF16Sqrt,
     kF16SumDim1, kF16SumDim0, kF16MeanAll, kF16Softmax, kF16LogSoftmax, kF16Matmul, kF16MaxDim1},
};

}  // namespace

TEST_CASE("float32, float64 and int64 convert to bfloat16 and float16 with PyTorch's bits") {
  for (const HalfCases& c : kCases) {
    const std::string dtype = dtypeName(c.dt);
    CAPTURE(dtype);
    Tensor x = fromVector(kF32Values);
    checkBits(x.to(c.dt), c.f32, 0, "from float32");
    checkBits(fromVector(kF64Values).to(c.dt), c.f64, 0, "from float64 (through float32)");
    checkBits(fromVector(kI64Values).to(c.dt), c.i64, 0, "from int64 (through float32)");
    // Back to float64 exactly, infinities and signed zeros included.
    std::vector<double> back = x.to(c.dt).toVector<double>();
    REQUIRE(back.size() == c.back.size());
    for (size_t i = 0; i < back.size(); ++i) {
      CAPTURE(i);
      CHECK(back[i] == c.back[i]);
      CHECK(std::signbit(back[i]) == std::signbit(c.back[i]));
    }
  }
}

TEST_CASE("NaN stays NaN with its sign through bfloat16 and float16") {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    std::vector<float> v = fromVector(std::vector<float>{NAN, -NAN}).to(dt).toVector<float>();
    CHECK(std::isnan(v[0]));
    CHECK_FALSE(std::signbit(v[0]));
    CHECK(std::isnan(v[1]));
    CHECK(std::signbit(v[1]));
  }
  CHECK(BFloat16(std::bit_cast<float>(0x7f800001u)).bits == 0x7fc0);  // a signalling NaN does not become inf
  CHECK(Float16(std::bit_cast<float>(0xff800001u)).bits == 0xfe00);
}

TEST_CASE("every conversion to and from bfloat16 and float16 follows common/dtype.h") {
  const DType all[] = {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool};
  Tensor src = fromVector<float>({0.0f, 1.0f, 2.75f, 7.5f, 200.0f});
  for (DType half : {DType::BFloat16, DType::Float16}) {
    CAPTURE(dtypeName(half));
    Tensor h = src.to(half);
    CHECK(h.dtype() == half);
    CHECK(h.toVector<double>() == std::vector<double>{0, 1, 2.75, 7.5, 200});
    for (DType d : all) {
      CAPTURE(dtypeName(d));
      // half -> d equals float32 -> d for values half holds exactly.
      CHECK(h.to(d).toVector<double>() == src.to(d).toVector<double>());
      // d -> half of values d holds: through float32.
      Tensor viaD = src.to(d);
      CHECK(viaD.to(half).toVector<double>() == viaD.to(DType::Float32).to(half).toVector<double>());
    }
    Tensor other = h.to(half == DType::BFloat16 ? DType::Float16 : DType::BFloat16);
    CHECK(other.toVector<double>() == h.toVector<double>());
    // To an integer type as from float32: truncated, saturated (values exact in both 16-bit types).
    Tensor exact = fromVector<float>({-3.875f, 300.0f, -1.0f, 2.5f});
    CHECK(exact.to(half).to(DType::UInt8).toVector<double>() == exact.to(DType::UInt8).toVector<double>());
    CHECK(exact.to(half).to(DType::Int32).toVector<double>() == std::vector<double>{-3, 300, -1, 2});
  }
}

TEST_CASE("bfloat16 and float16 tensors are created, read, viewed and printed") {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    CAPTURE(dtypeName(dt));
    CHECK(zeros({2, 3}, {.dtype = dt}).toVector<float>() == std::vector<float>(6, 0.0f));
    CHECK(full({2}, 1.5, {.dtype = dt}).toVector<float>() == std::vector<float>{1.5f, 1.5f});
    CHECK(arange(0, 4, 1, {.dtype = dt}).toVector<float>() == std::vector<float>{0, 1, 2, 3});
    Tensor r = randn({1000}, {.dtype = dt});
    CHECK(r.dtype() == dt);
    CHECK(std::abs(r.to(DType::Float32).mean().item<float>()) < 0.2f);
    Tensor t = fromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).to(dt);
    CHECK_THROWS_AS(t.item<float>(), InvalidArgumentError);
    CHECK(t.select(1, 2).toVector<float>() == std::vector<float>{3, 6});
    CHECK(t.t().contiguous().toVector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
    CHECK(cat({t, t}, 0).toVector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
    CHECK(t.indexSelect(1, fromVector<int64_t>({2, 0})).toVector<float>() == std::vector<float>{3, 1, 6, 4});
    CHECK(t.clone().fill_(0.25).toVector<float>() == std::vector<float>(6, 0.25f));
    Tensor dst = zeros({3, 2}, {.dtype = dt});
    dst.t().copy_(t);
    CHECK(dst.toVector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
    CHECK(eq(t, t.clone()).toVector<bool>() == std::vector<bool>(6, true));
    CHECK(gt(t, full({3}, 2.5, {.dtype = dt})).toVector<bool>() ==
          std::vector<bool>{false, false, true, true, true, true});
  }
  CHECK(fromVector(std::vector<BFloat16>{BFloat16(1.5f), BFloat16(-2.0f)}).toVector<BFloat16>()[1].bits == 0xc000);
  CHECK(fromVector(std::vector<Float16>{Float16(0.5f)}).item<Float16>().bits == 0x3800);
  CHECK(fromVector<float>({1.5f, -2.25f}).to(DType::BFloat16).toString() == "tensor([ 1.5000, -2.2500], dtype=bfloat16)");
  CHECK(fromVector<float>({0.5f}).to(DType::Float16).toString() == "tensor([0.5000], dtype=float16)");
}

TEST_CASE("elementwise ops, reductions, softmax and matmul in bfloat16 and float16 match PyTorch") {
  for (const HalfCases& c : kCases) {
    const std::string dtype = dtypeName(c.dt);
    CAPTURE(dtype);
    Tensor a = fromBits(c.a, {4, 6}, c.dt), b = fromBits(c.b, {4, 6}, c.dt), m = fromBits(c.m, {6, 5}, c.dt);
    // One rounding of an exact float32 result: the same bits.
    checkBits(a + b, c.add, 0, "add");
    checkBits(a - b, c.sub, 0, "sub");
    checkBits(a * b, c.mul, 0, "mul");
    checkBits(a / b, c.div, 0, "div");
    checkBits(relu(a), c.relu, 0, "relu");
    checkBits(std::get<0>(max(a, 1)), c.maxDim1, 0, "max");
    checkBits(a * 1.7, c.mulScalar, 0, "mul by a scalar");
    checkBits(a + 0.3, c.addScalar, 0, "add a scalar");
    // Transcendentals, sums and products: float32 kernels that differ from
    // PyTorch's in the last float32 bits (or in summation order) may round to
    // the neighbouring 16-bit value.
    checkBits(exp(a), c.exp, 1, "exp");
    checkBits(tanh(a), c.tanh, 1, "tanh");
    checkBits(sigmoid(a), c.sigmoid, 1, "sigmoid");
    checkBits(gelu(a), c.gelu, 1, "gelu");
    checkBits(sqrt(abs(a)), c.sqrt, 1, "sqrt");
    checkBits(a.sum({1}), c.sumDim1, 1, "sum over dim 1");
    checkBits(a.sum({0}), c.sumDim0, 1, "sum over dim 0");
    checkBits(a.mean().reshape({1}), c.meanAll, 1, "mean");
    checkBits(softmax(a, 1), c.softmax, 1, "softmax");
    checkBits(logSoftmax(a, 1), c.logSoftmax, 1, "logSoftmax");
    checkBits(matmul(a, m), c.matmul, 1, "matmul");
    checkBits(mm(a, m), c.matmul, 1, "mm");
    checkBits(linear(a, m.t()), c.matmul, 1, "linear");
    checkBits(bmm(a.unsqueeze(0), m.unsqueeze(0)).squeeze(0), c.matmul, 1, "bmm");
    // Results keep the dtype.
    CHECK((a + b).dtype() == c.dt);
    CHECK(matmul(a, m).dtype() == c.dt);
    CHECK(a.sum().dtype() == c.dt);
  }
}

TEST_CASE("a bfloat16 product of large, transposed and batched operands is the float32 product rounded") {
  Generator g(11);
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    CAPTURE(dtypeName(dt));
    // Large enough for several row panels and the pool's blocks; B transposed.
    Tensor a = randn({1100, 70}, {}, &g).to(dt), b = randn({90, 70}, {}, &g).to(dt);
    Tensor want = mm(a.to(DType::Float32), b.to(DType::Float32).t());
    Tensor got = mm(a, b.t());
    CHECK(got.dtype() == dt);
    CHECK(allclose(got.to(DType::Float32), want, dt == DType::BFloat16 ? 8e-3 : 1e-3, 1e-3));
    // A transposed, batched with a broadcast operand.
    Tensor x = randn({3, 40, 30}, {}, &g).to(dt), y = randn({40, 20}, {}, &g).to(dt);
    Tensor gotB = matmul(x.transpose(1, 2), y);
    Tensor wantB = matmul(x.to(DType::Float32).transpose(1, 2), y.to(DType::Float32));
    CHECK(allclose(gotB.to(DType::Float32), wantB, dt == DType::BFloat16 ? 8e-3 : 1e-3, 1e-3));
  }
}

TEST_CASE("gradients of bfloat16 and float16 tensors are of their dtype and match float32's") {
  Generator g(3);
  Tensor x32 = randn({5, 8}, {}, &g), w32 = randn({6, 8}, {}, &g), b32 = randn({6}, {}, &g);
  Tensor t = fromVector<int64_t>({0, 5, 2, 3, 1});
  auto run = [&](DType dt) {
    Tensor x = x32.to(dt).detach().requiresGrad_(), w = w32.to(dt).detach().requiresGrad_(),
           b = b32.to(dt).detach().requiresGrad_();
    Tensor h = gelu(linear(x, w, b)) * 0.5 + sigmoid(x.sum({1}, true));
    Tensor loss = crossEntropy(h, t) + softmax(h, 1).mean() + max(tanh(h));
    loss.backward();
    return std::vector<Tensor>{loss, x.grad(), w.grad(), b.grad()};
  };
  std::vector<Tensor> ref = run(DType::Float32);
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    CAPTURE(dtypeName(dt));
    std::vector<Tensor> got = run(dt);
    const double tol = dt == DType::BFloat16 ? 5e-2 : 8e-3;
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i].dtype() == dt);
      CHECK(allclose(got[i].to(DType::Float32), ref[i], tol, tol));
    }
  }
}

TEST_CASE("embedding, dropout, losses and conv2d take bfloat16 and compute in float32") {
  Generator g(4);
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    CAPTURE(dtypeName(dt));
    Tensor table = randn({10, 4}, {}, &g).to(dt).requiresGrad_();
    Tensor idx = fromVector<int64_t>({1, 7, 1});
    Tensor e = embedding(table, idx);
    CHECK(e.dtype() == dt);
    CHECK(e.toVector<float>() == table.detach().indexSelect(0, idx).toVector<float>());
    e.sum().backward();
    CHECK(table.grad().dtype() == dt);
    CHECK(table.grad().select(0, 1).toVector<float>() == std::vector<float>(4, 2.0f));

    Generator d1(9), d2(9);
    Tensor x = randn({64}, {}, &g);
    Tensor dropped = dropout(x.to(dt), 0.5, true, &d1);
    CHECK(dropped.dtype() == dt);
    CHECK(dropped.toVector<float>() == dropout(x, 0.5, true, &d2).to(dt).toVector<float>());

    Tensor logits = randn({4, 5}, {}, &g);
    Tensor target = fromVector<int64_t>({0, 4, 2, 2});
    Tensor ce = crossEntropy(logits.to(dt), target);
    CHECK(ce.dtype() == dt);
    CHECK(ce.item<float>() == doctest::Approx(crossEntropy(logits.to(dt).to(DType::Float32), target).item<float>())
                                  .epsilon(dt == DType::BFloat16 ? 8e-3 : 1e-3));
    Tensor img = randn({1, 2, 5, 5}, {}, &g), ker = randn({3, 2, 3, 3}, {}, &g);
    Tensor conv = conv2d(img.to(dt), ker.to(dt));
    CHECK(conv.dtype() == dt);
    CHECK(allclose(conv.to(DType::Float32), conv2d(img.to(dt).to(DType::Float32), ker.to(dt).to(DType::Float32)),
                   dt == DType::BFloat16 ? 1e-2 : 2e-3, 2e-2));
  }
}

TEST_CASE("selection, triangles, gather, scatterAdd and cumsum take bfloat16 and float16") {
  Generator g(8);
  Tensor x32 = randn({3, 5}, {}, &g);
  Tensor mask = gt(x32, zerosLike(x32));
  Tensor index = fromVector<int64_t>({4, 0, 2, 1, 1, 3}, {3, 2});
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    const std::string dtype = dtypeName(dt);
    CAPTURE(dtype);
    Tensor x = x32.to(dt), up = x.to(DType::Float32);
    // Moves and selections: exactly the float32 results, rounded (they are exact).
    CHECK(where(mask, x, zerosLike(x)).toVector<float>() == where(mask, up, zerosLike(up)).toVector<float>());
    CHECK(maskedFill(x, mask, -1.5).toVector<float>() == maskedFill(up, mask, -1.5).toVector<float>());
    CHECK(triu(x, 1).toVector<float>() == triu(up, 1).toVector<float>());
    CHECK(tril(x).toVector<float>() == tril(up).toVector<float>());
    CHECK(gather(x, 1, index).toVector<float>() == gather(up, 1, index).toVector<float>());
    // Sums: accumulated in float32, rounded once.
    CHECK(cumsum(x, 1).toVector<float>() == cumsum(up, 1).to(dt).toVector<float>());
    Tensor src = onesLike(x).narrow(1, 0, 2);
    CHECK(scatterAdd(x, 1, index, src).toVector<float>() ==
          scatterAdd(up, 1, index, src.to(DType::Float32)).to(dt).toVector<float>());
    // Gradients in the dtype.
    Tensor leaf = x.detach().requiresGrad_();
    (cumsum(leaf, 1) * 2.0 + gather(leaf, 1, index).sum()).sum().backward();
    CHECK(leaf.grad().dtype() == dt);
    Tensor leaf32 = up.detach().requiresGrad_();
    (cumsum(leaf32, 1) * 2.0 + gather(leaf32, 1, index).sum()).sum().backward();
    CHECK(leaf.grad().toVector<float>() == leaf32.grad().to(dt).toVector<float>());
  }
}

TEST_CASE("ops that need one dtype still name a bfloat16/float32 mismatch outside autocast") {
  Tensor a = ones({2}), b = ones({2}, {.dtype = DType::BFloat16});
  CHECK_THROWS_WITH_AS(add(a, b), doctest::Contains("dtype mismatch: float32"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("dtype mismatch"), InvalidArgumentError);
}

TEST_CASE("the vectorised float16 and bfloat16 conversions give the portable code's bits for every value") {
  // Every 16-bit pattern, and float32 values around every float16 rounding
  // boundary (ties, subnormals, overflow, NaNs with payloads), in lengths that
  // leave vector tails.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> floats;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint32_t f = std::bit_cast<uint32_t>(static_cast<float>(Float16::fromBits(static_cast<uint16_t>(i))));
    for (uint32_t delta : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu}) floats.push_back(std::bit_cast<float>(f + delta));
  }
  floats.push_back(std::bit_cast<float>(0x7fa00001u));
  floats.push_back(std::bit_cast<float>(0xffc12345u));
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    const std::string dtype = dtypeName(dt);
    CAPTURE(dtype);
    for (size_t n : {all.size(), size_t{13}}) {
      std::vector<float> fast(n), portable(n);
      kernels::cpu::halfToFloat(dt, all.data(), fast.data(), static_cast<int64_t>(n));
      kernels::cpu::halfToFloatPortable(dt, all.data(), portable.data(), static_cast<int64_t>(n));
      CHECK(std::memcmp(fast.data(), portable.data(), n * sizeof(float)) == 0);
    }
    for (size_t n : {floats.size(), size_t{29}}) {
      std::vector<uint16_t> fast(n), portable(n);
      kernels::cpu::floatToHalf(dt, floats.data(), fast.data(), static_cast<int64_t>(n));
      kernels::cpu::floatToHalfPortable(dt, floats.data(), portable.data(), static_cast<int64_t>(n));
      CHECK(fast == portable);
    }
  }
}
