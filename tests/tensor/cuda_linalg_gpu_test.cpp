// Matrix products on CUDA (cuBLAS) against the CPU (OpenBLAS): mm, bmm,
// matmul and linear, forward and backward, in every operand layout the
// tensor layer hands to BLAS, odd and empty sizes, float64 / float32 /
// bfloat16 / float16; and the TF32 switch. Each test skips without a device.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_compare.h"
#include "kernels/cuda/runtime.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::CompareOptions;
using weft::testing::compareWithCpu;
using weft::testing::randomTensor;

namespace {

const DType kTypes[] = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16};

// The default tolerance of the dtype, widened by sqrt(k) for the 16-bit types
// (cuBLAS may add split-k partial sums in their precision; the CPU rounds once).
CompareOptions forK(DType t, int64_t k) {
  CompareOptions o;
  if (t == DType::BFloat16 || t == DType::Float16) {
    o.rtolScale = o.atolScale = std::max(1.0, std::sqrt(static_cast<double>(k) / 16.0));
  }
  return o;
}

std::string caseName(const char* op, DType t, int64_t m, int64_t k, int64_t n) {
  return std::string(op) + " " + dtypeName(t) + " m=" + std::to_string(m) + " k=" + std::to_string(k) +
         " n=" + std::to_string(n);
}

// Turns TF32 for float32 products on or off for the scope, restoring after
// (the runtime is defined only in builds with CUDA; without, every test
// here has skipped before).
class Tf32Scope {
 public:
#ifdef WEFT_HAVE_CUDA
  explicit Tf32Scope(bool on) : previous_(kernels::cuda::allowTF32()) { kernels::cuda::setAllowTF32(on); }
  ~Tf32Scope() { kernels::cuda::setAllowTF32(previous_); }
#else
  explicit Tf32Scope(bool) {}
#endif

 private:
  [[maybe_unused]] bool previous_ = false;
};

}  // namespace

TEST_CASE("mm on CUDA matches the CPU for odd sizes in every dtype, forward and backward") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tf32Scope tf32(false);
  const std::tuple<int64_t, int64_t, int64_t> sizes[] = {{1, 1, 1}, {3, 17, 129}, {129, 3, 17}, {17, 129, 1},
                                                         {1, 129, 3}, {64, 64, 64}};
  uint64_t seed = 1;
  for (DType t : kTypes) {
    for (auto [m, k, n] : sizes) {
      compareWithCpu(caseName("mm", t, m, k, n), {randomTensor({m, k}, t, seed), randomTensor({k, n}, t, seed + 1)},
                     [](const std::vector<Tensor>& x) { return mm(x[0], x[1]); }, forK(t, k));
      seed += 2;
    }
  }
}

TEST_CASE("mm on CUDA reads transposed, sliced and broadcast operands as the CPU does") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tf32Scope tf32(false);
  for (DType t : kTypes) {
    const int64_t m = 17, k = 33, n = 13;
    Tensor a = randomTensor({m, k}, t, 11), b = randomTensor({k, n}, t, 12);
    Tensor at = randomTensor({k, m}, t, 13), bt = randomTensor({n, k}, t, 14);
    CompareOptions o = forK(t, k);
    auto f = [](auto g) { return std::function<Tensor(const std::vector<Tensor>&)>(g); };
    compareWithCpu(caseName("mm aᵀ·b", t, m, k, n), {at, b}, f([](const auto& x) { return mm(x[0].t(), x[1]); }), o);
    compareWithCpu(caseName("mm a·bᵀ", t, m, k, n), {a, bt}, f([](const auto& x) { return mm(x[0], x[1].t()); }), o);
    compareWithCpu(caseName("mm aᵀ·bᵀ", t, m, k, n), {at, bt},
                   f([](const auto& x) { return mm(x[0].t(), x[1].t()); }), o);
    // Column slices: a leading dimension larger than the columns.
    Tensor wide = randomTensor({m, k + 9}, t, 15), tall = randomTensor({k + 5, n + 7}, t, 16);
    compareWithCpu(caseName("mm sliced", t, m, k, n), {wide, tall},
                   f([=](const auto& x) { return mm(x[0].narrow(1, 4, k), x[1].narrow(0, 2, k).narrow(1, 3, n)); }),
                   o);
    // Sliced and transposed: the transpose of a column slice.
    compareWithCpu(caseName("mm sliced transposed", t, m, k, n), {randomTensor({k, m + 6}, t, 17), b},
                   f([=](const auto& x) { return mm(x[0].narrow(1, 5, m).t(), x[1]); }), o);
    // No unit stride (every other element) and a broadcast row (stride 0):
    // both copied to contiguous matrices first.
    compareWithCpu(caseName("mm strided", t, m, k, n), {randomTensor({m, k, 2}, t, 18), randomTensor({n}, t, 19)},
                   f([=](const auto& x) { return mm(x[0].select(2, 1), x[1].unsqueeze(0).expand({k, n})); }), o);
  }
}

TEST_CASE("bmm on CUDA matches the CPU, with transposed and permuted batches") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tf32Scope tf32(false);
  auto f = [](auto g) { return std::function<Tensor(const std::vector<Tensor>&)>(g); };
  uint64_t seed = 100;
  for (DType t : kTypes) {
    for (auto [batch, m, k, n] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 3, 17, 129}, {5, 17, 3, 1},
                                  {7, 33, 65, 31}}) {
      CompareOptions o = forK(t, k);
      compareWithCpu(caseName("bmm", t, m, k, n) + " batch " + std::to_string(batch),
                     {randomTensor({batch, m, k}, t, seed), randomTensor({batch, k, n}, t, seed + 1)},
                     f([](const auto& x) { return bmm(x[0], x[1]); }), o);
      compareWithCpu(caseName("bmm transposed", t, m, k, n) + " batch " + std::to_string(batch),
                     {randomTensor({batch, k, m}, t, seed + 2), randomTensor({batch, n, k}, t, seed + 3)},
                     f([](const auto& x) { return bmm(x[0].transpose(1, 2), x[1].transpose(1, 2)); }), o);
      // The batch not outermost in memory: [m, batch, k] read as [batch, m, k].
      compareWithCpu(caseName("bmm permuted", t, m, k, n) + " batch " + std::to_string(batch),
                     {randomTensor({m, batch, k}, t, seed + 4), randomTensor({k, n, batch}, t, seed + 5)},
                     f([](const auto& x) { return bmm(x[0].permute({1, 0, 2}), x[1].permute({2, 0, 1})); }), o);
      seed += 6;
    }
  }
}

TEST_CASE("matmul on CUDA matches the CPU for 1-D, 2-D and broadcast batched operands") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tf32Scope tf32(false);
  using Case = std::tuple<const char*, Shape, Shape>;
  const Case cases[] = {
      {"dot", {17}, {17}},
      {"matrix-vector", {5, 17}, {17}},
      {"vector-matrix", {17}, {17, 3}},
      {"vector-batched", {17}, {4, 17, 3}},
      {"batched-vector", {2, 3, 5, 17}, {17}},
      {"batched-matrix folded", {2, 3, 5, 17}, {17, 3}},
      {"matrix-batched", {5, 17}, {4, 17, 3}},
      {"batched broadcast both", {2, 1, 5, 17}, {1, 3, 17, 3}},
      {"batched broadcast one", {2, 3, 5, 17}, {3, 17, 129}},
      {"batched size-1 matrix dims", {4, 1, 1}, {4, 1, 1}},
  };
  // The gradient of a broadcast operand sums over batch products: the CPU
  // rounds a 16-bit sum after each, CUDA once, so those sums get the
  // tolerance of a longer product.
  uint64_t seed = 200;
  for (DType t : kTypes) {
    for (const auto& [name, sa, sb] : cases) {
      const int64_t k = sa.back();
      compareWithCpu(std::string("matmul ") + name + " " + dtypeName(t),
                     {randomTensor(sa, t, seed), randomTensor(sb, t, seed + 1)},
                     [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, forK(t, std::max<int64_t>(k, 64)));
      seed += 2;
    }
    // A non-contiguous batched operand against a matrix: the batched
    // (not folded) path, whose matrix gradient sums over the whole batch.
    compareWithCpu(std::string("matmul transposed batch · matrix ") + dtypeName(t),
                   {randomTensor({3, 17, 2, 5}, t, seed), randomTensor({17, 9}, t, seed + 1)},
                   [](const std::vector<Tensor>& x) { return matmul(x[0].permute({0, 2, 3, 1}), x[1]); },
                   forK(t, 17 * 6));
    seed += 2;
  }
}

TEST_CASE("linear on CUDA matches the CPU with and without bias, in any input layout") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tf32Scope tf32(false);
  uint64_t seed = 300;
  for (DType t : kTypes) {
    for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 17, 129}, {129, 33, 3},
                                 {64, 128, 96}}) {
      CompareOptions o = forK(t, in);
      std::string tag = caseName("linear", t, rows, in, out);
      Tensor x = randomTensor({rows, in}, t, seed), w = randomTensor({out, in}, t, seed + 1),
             b = randomTensor({out}, t, seed + 2);
      compareWithCpu(tag + " bias", {x, w, b}, [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); },
                     o);
      compareWithCpu(tag + " no bias", {x, w}, [](const std::vector<Tensor>& v) { return linear(v[0], v[1]); }, o);
      // x transposed, weight transposed (stored [in, out]), bias sliced.
      compareWithCpu(tag + " transposed", {randomTensor({in, rows}, t, seed + 3), randomTensor({in, out}, t, seed + 4),
                                           randomTensor({out + 4}, t, seed + 5)},
                     [=](const std::vector<Tensor>& v) { return linear(v[0].t(), v[1].t(), v[2].narrow(0, 3, out)); },
                     o);
      // A 3-D input, contiguous and permuted (its leading dimensions do not merge).
      compareWithCpu(tag + " 3-D", {randomTensor({2, rows, in}, t, seed + 6), w, b},
                     [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); }, o);
      compareWithCpu(tag + " 3-D permuted", {randomTensor({rows, 2, in}, t, seed + 7), w, b},
                     [](const std::vector<Tensor>& v) { return linear(v[0].transpose(0, 1), v[1], v[2]); }, o);
      seed += 8;
    }
  }
}

TEST_CASE("products with an empty dimension on CUDA give the CPU's empty or zero results") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : {DType::Float64, DType::Float32, DType::BFloat16}) {
    // Fill the allocator's cache with NaN blocks of the result's size, so
    // that a k = 0 product that failed to write its zeros would show.
    { Tensor garbage = full({6, 7}, NAN, {.dtype = t, .device = Device::cuda(0)}); }
    compareWithCpu(std::string("mm k=0 ") + dtypeName(t), {randomTensor({6, 0}, t, 1), randomTensor({0, 7}, t, 2)},
                   [](const std::vector<Tensor>& x) { return mm(x[0], x[1]); });
    Tensor z = mm(zeros({6, 0}, {.dtype = t, .device = Device::cuda(0)}),
                  zeros({0, 7}, {.dtype = t, .device = Device::cuda(0)}));
    CHECK(z.device() == Device::cuda(0));
    CHECK(z.to(Device::cpu()).to(DType::Float64).toVector<double>() == std::vector<double>(42, 0.0));
    compareWithCpu(std::string("mm m=0 ") + dtypeName(t), {randomTensor({0, 5}, t, 3), randomTensor({5, 4}, t, 4)},
                   [](const std::vector<Tensor>& x) { return mm(x[0], x[1]); });
    compareWithCpu(std::string("mm n=0 ") + dtypeName(t), {randomTensor({3, 5}, t, 5), randomTensor({5, 0}, t, 6)},
                   [](const std::vector<Tensor>& x) { return mm(x[0], x[1]); });
    compareWithCpu(std::string("bmm batch 0 ") + dtypeName(t),
                   {randomTensor({0, 3, 5}, t, 7), randomTensor({0, 5, 4}, t, 8)},
                   [](const std::vector<Tensor>& x) { return bmm(x[0], x[1]); });
    compareWithCpu(std::string("bmm k=0 ") + dtypeName(t),
                   {randomTensor({4, 3, 0}, t, 9), randomTensor({4, 0, 5}, t, 10)},
                   [](const std::vector<Tensor>& x) { return bmm(x[0], x[1]); });
    compareWithCpu(std::string("matmul broadcast k=0 ") + dtypeName(t),
                   {randomTensor({2, 1, 3, 0}, t, 11), randomTensor({1, 4, 0, 5}, t, 12)},
                   [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); });
    // linear: no rows; and no input features (the output is the bias).
    compareWithCpu(std::string("linear rows=0 ") + dtypeName(t),
                   {randomTensor({0, 5}, t, 13), randomTensor({4, 5}, t, 14), randomTensor({4}, t, 15)},
                   [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); });
    compareWithCpu(std::string("linear in=0 ") + dtypeName(t),
                   {randomTensor({3, 0}, t, 16), randomTensor({4, 0}, t, 17), randomTensor({4}, t, 18)},
                   [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); });
  }
}

TEST_CASE("TF32 changes float32 products on CUDA only within TF32's precision") {
  WEFT_SKIP_WITHOUT_CUDA();
  const int64_t m = 256, k = 512, n = 256;
  Tensor a = randomTensor({m, k}, DType::Float32, 41), b = randomTensor({k, n}, DType::Float32, 42);
  // Exact reference and the scale of each element's sum, sum_p |a_ip| |b_pj|.
  Tensor a64 = a.to(DType::Float64), b64 = b.to(DType::Float64);
  std::vector<double> ref = mm(a64, b64).toVector<double>();
  std::vector<double> scale = mm(abs(a64), abs(b64)).toVector<double>();
  Tensor ad = a.to(Device::cuda(0)), bd = b.to(Device::cuda(0));
  auto worstRelative = [&](bool tf32) {
    Tf32Scope s(tf32);
    std::vector<double> got = mm(ad, bd).to(Device::cpu()).to(DType::Float64).toVector<double>();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]) / scale[i]);
    return worst;
  };
  const double off = worstRelative(false), on = worstRelative(true);
  INFO("largest error relative to sum |a||b|: TF32 off " << off << ", on " << on);
  // Off: the float32 inputs are exact, so only float32 accumulation errs:
  // at most k units of 2^-24 in any summation order. On: each input also
  // loses its mantissa past 10 bits (relative error below 2^-10 even when
  // truncated, so below 2^-9 per product); and it must show, since TF32's
  // input rounding is far coarser than float32 accumulation.
  const double accumulation = static_cast<double>(k) * std::ldexp(1.0, -24);
  CHECK(off <= accumulation);
  CHECK(on <= std::ldexp(1.0, -9) + accumulation);
  CHECK(on > 4 * off);
}

TEST_CASE("matrix products on CUDA reject mixed devices and integer operands as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor a = randomTensor({3, 4}, DType::Float32, 1), b = randomTensor({4, 2}, DType::Float32, 2);
  CHECK_THROWS_AS(mm(a.to(Device::cuda(0)), b), InvalidArgumentError);
  CHECK_THROWS_AS(linear(a.to(Device::cuda(0)), b.t()), InvalidArgumentError);
  Tensor i = randomTensor({3, 4}, DType::Int64, 3).to(Device::cuda(0));
  CHECK_THROWS_AS(mm(i, randomTensor({4, 2}, DType::Int64, 4).to(Device::cuda(0))), InvalidArgumentError);
}
