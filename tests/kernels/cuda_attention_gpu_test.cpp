// The CUDA attention kernels (kernels/cuda/attention.h) against the CPU ones
// (kernels/cpu/attention.h, themselves checked against PyTorch in
// tests/tensor/attention_test.cpp) on the same raw buffers: forward (out,
// lse), backward (dQ, dK, dV, with a gradient through lse, all three or dQ
// or dK/dV alone) and the merge, causal or not, with offsets, fully masked
// rows, dropout (the same seed drops the same elements on both devices),
// empty sequences, head dimensions from 16 to 256. float64 agrees to
// rounding; float32 to the reassociation of sums. Built only with CUDA (the
// kernels are not there otherwise).
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_call.h"
#include "weft_test.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/runtime.h"
#endif

using namespace weft;

#ifdef WEFT_HAVE_CUDA
namespace {

namespace kc = weft::kernels::cuda;
using kernels::cpu::AttentionGeometry;

// Device memory of cuda:0 holding a copy of a host vector.
template <class T>
class DeviceVector {
 public:
  explicit DeviceVector(size_t n) : n_(n), p_(n ? kc::allocate(n * sizeof(T), 0) : nullptr) {}
  explicit DeviceVector(const std::vector<T>& h) : DeviceVector(h.size()) {
    if (n_) kc::copyHostToDevice(p_, h.data(), n_ * sizeof(T), 0);
  }
  ~DeviceVector() {
    if (p_) kc::deallocate(p_, 0);
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  void* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    if (n_) kc::copyDeviceToHost(h.data(), p_, n_ * sizeof(T), 0);
    return h;
  }

 private:
  size_t n_;
  void* p_;
};

template <class T>
std::vector<T> uniformVector(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(u(gen));
  return v;
}

// |actual - expected| <= atol + rtol |expected| everywhere (equal infinities
// agree); reports the worst element.
template <class T>
void checkClose(const std::string& what, const std::vector<T>& actual, const std::vector<T>& expected, double rtol,
                double atol) {
  INFO(what);
  REQUIRE(actual.size() == expected.size());
  size_t bad = 0, worstAt = 0;
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (std::isinf(e) && a == e) continue;
    const double d = std::isnan(a) || std::isnan(e) ? INFINITY : std::abs(a - e);
    if (d > atol + rtol * std::abs(e)) ++bad;
    if (d > worst) {
      worst = d;
      worstAt = i;
    }
  }
  INFO("mismatches " << bad << " of " << actual.size() << "; largest |difference| " << worst << " at " << worstAt
                     << " (" << (actual.empty() ? 0.0 : static_cast<double>(actual[worstAt])) << " vs "
                     << (expected.empty() ? 0.0 : static_cast<double>(expected[worstAt])) << ")");
  CHECK(bad == 0);
}

struct Case {
  int64_t bh, sq, sk, d;
  bool causal = false;
  int64_t queryOffset = 0, keyOffset = 0;
  double dropout = 0.0;
};

std::string describe(const Case& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "BH %lld Sq %lld Sk %lld D %lld causal %d offsets %lld/%lld dropout %g",
                static_cast<long long>(c.bh), static_cast<long long>(c.sq), static_cast<long long>(c.sk),
                static_cast<long long>(c.d), c.causal, static_cast<long long>(c.queryOffset),
                static_cast<long long>(c.keyOffset), c.dropout);
  return buf;
}

template <class T>
void compareAttention(const Case& c, double rtol, double atol) {
  INFO(describe(c));
  const DType dt = kDTypeOf<T>;
  const AttentionGeometry g{.batchHeads = c.bh,
                            .queries = c.sq,
                            .keys = c.sk,
                            .headDim = c.d,
                            .scale = 1.0 / std::sqrt(static_cast<double>(c.d)),
                            .causal = c.causal,
                            .queryOffset = c.queryOffset,
                            .keyOffset = c.keyOffset,
                            .dropout = c.dropout,
                            .seed = 0x5EEDull + static_cast<uint64_t>(c.sq * 7 + c.sk)};
  const size_t nq = c.bh * c.sq * c.d, nk = c.bh * c.sk * c.d, nl = c.bh * c.sq;
  const auto q = uniformVector<T>(nq, 1), k = uniformVector<T>(nk, 2), v = uniformVector<T>(nk, 3);
  const auto gOut = uniformVector<T>(nq, 4), gLse = uniformVector<T>(nl, 5);

  std::vector<T> out(nq), lse(nl), gq(nq), gk(nk), gv(nk);
  kernels::cpu::attentionForward(dt, g, q.data(), k.data(), v.data(), out.data(), lse.data());
  kernels::cpu::attentionBackward(dt, g, q.data(), k.data(), v.data(), out.data(), lse.data(), gOut.data(),
                                  gLse.data(), gq.data(), gk.data(), gv.data());

  kc::DeviceGuard guard(0);
  DeviceVector<T> dq(q), dk(k), dv(v), dgOut(gOut), dgLse(gLse);
  DeviceVector<T> dOut(nq), dLse(nl), dgq(nq), dgk(nk), dgv(nk);
  kc::attentionForward(dt, g, dq.get(), dk.get(), dv.get(), dOut.get(), dLse.get());
  checkClose("out", dOut.host(), out, rtol, atol);
  checkClose("lse", dLse.host(), lse, rtol, atol);

  kc::attentionBackward(dt, g, dq.get(), dk.get(), dv.get(), dOut.get(), dLse.get(), dgOut.get(), dgLse.get(),
                        dgq.get(), dgk.get(), dgv.get());
  checkClose("gradQ", dgq.host(), gq, rtol, atol);
  checkClose("gradK", dgk.host(), gk, rtol, atol);
  checkClose("gradV", dgv.host(), gv, rtol, atol);

  // dQ alone, then dK and dV alone without a gradient through lse.
  DeviceVector<T> onlyQ(nq), onlyK(nk), onlyV(nk);
  kc::attentionBackward(dt, g, dq.get(), dk.get(), dv.get(), dOut.get(), dLse.get(), dgOut.get(), dgLse.get(),
                        onlyQ.get(), nullptr, nullptr);
  checkClose("gradQ alone", onlyQ.host(), gq, rtol, atol);
  kernels::cpu::attentionBackward(dt, g, q.data(), k.data(), v.data(), out.data(), lse.data(), gOut.data(), nullptr,
                                  nullptr, gk.data(), gv.data());
  kc::attentionBackward(dt, g, dq.get(), dk.get(), dv.get(), dOut.get(), dLse.get(), dgOut.get(), nullptr, nullptr,
                        onlyK.get(), onlyV.get());
  checkClose("gradK alone, no gradLse", onlyK.host(), gk, rtol, atol);
  checkClose("gradV alone, no gradLse", onlyV.host(), gv, rtol, atol);
}

std::vector<Case> cases() {
  return {
      {1, 1, 1, 16},
      {3, 17, 17, 16, true},
      {2, 129, 129, 64, true},
      {2, 300, 300, 128},
      {2, 300, 300, 128, true},
      {4, 17, 129, 64, false, 0, 0, 0.3},
      {3, 129, 300, 128, true, 171, 0},
      // The first 20 queries see no key: out 0, lse -inf, no gradient.
      {2, 40, 70, 33, true, 0, 20},
      {2, 100, 50, 96, true, 10, 40, 0.2},
      {5, 33, 31, 80, false, 0, 0, 0.5},
      {2, 20, 20, 24, false, 0, 0, 1.0},
      {2, 5, 0, 16},
      {2, 0, 7, 16},
      {0, 4, 4, 16},
  };
}

}  // namespace

TEST_CASE("CUDA attention equals the CPU kernels in float64: out, lse, dQ, dK, dV") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (const Case& c : cases()) compareAttention<double>(c, 1e-10, 1e-12);
}

TEST_CASE("CUDA attention equals the CPU kernels in float32, head dimensions up to 256") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (const Case& c : cases()) compareAttention<float>(c, 2e-3, 2e-4);
  compareAttention<float>({2, 40, 33, 256, true}, 2e-3, 2e-4);
  compareAttention<float>({2, 37, 45, 200, false, 0, 0, 0.25}, 2e-3, 2e-4);
}

TEST_CASE("CUDA attention names the op when the head dimension is too large or the dtype unsupported") {
  WEFT_SKIP_WITHOUT_CUDA();
  kc::DeviceGuard guard(0);
  const AttentionGeometry g{.batchHeads = 1, .queries = 4, .keys = 4, .headDim = 300};
  DeviceVector<float> buf(4 * 300);
  CHECK_THROWS_WITH_AS(kc::attentionForward(DType::Float32, g, buf.get(), buf.get(), buf.get(), buf.get(), buf.get()),
                       doctest::Contains("scaledDotProductAttention"), InvalidArgumentError);
  const AttentionGeometry small{.batchHeads = 1, .queries = 4, .keys = 4, .headDim = 16};
  CHECK_THROWS_AS(kc::attentionForward(DType::Int64, small, buf.get(), buf.get(), buf.get(), buf.get(), buf.get()),
                  InvalidArgumentError);
}

template <class T>
void compareMerge(int64_t rows, int64_t d, double rtol, double atol) {
  INFO("rows " << rows << " D " << d);
  const DType dt = kDTypeOf<T>;
  const size_t n = rows * d;
  const auto oA = uniformVector<T>(n, 11), oB = uniformVector<T>(n, 12), gOut = uniformVector<T>(n, 13);
  auto lA = uniformVector<T>(rows, 14), lB = uniformVector<T>(rows, 15);
  const auto gLse = uniformVector<T>(rows, 16);
  const T inf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; r += 3) lA[r] = -inf;  // one side empty
  for (int64_t r = 0; r < rows; r += 6) lB[r] = -inf;  // both empty
  for (int64_t r = 1; r < rows; r += 5) lB[r] = lA[r] + 40;  // far apart
  std::vector<T> out(n), lse(rows), gA(n), gLA(rows), gB(n), gLB(rows);
  kernels::cpu::mergeAttentionForward(dt, rows, d, oA.data(), lA.data(), oB.data(), lB.data(), out.data(), lse.data());
  kernels::cpu::mergeAttentionBackward(dt, rows, d, oA.data(), lA.data(), oB.data(), lB.data(), out.data(),
                                       lse.data(), gOut.data(), gLse.data(), gA.data(), gLA.data(), gB.data(),
                                       gLB.data());
  kc::DeviceGuard guard(0);
  DeviceVector<T> doA(oA), dlA(lA), doB(oB), dlB(lB), dgOut(gOut), dgLse(gLse);
  DeviceVector<T> dOut(n), dLse(rows), dgA(n), dgLA(rows), dgB(n), dgLB(rows);
  kc::mergeAttentionForward(dt, rows, d, doA.get(), dlA.get(), doB.get(), dlB.get(), dOut.get(), dLse.get());
  checkClose("merged out", dOut.host(), out, rtol, atol);
  checkClose("merged lse", dLse.host(), lse, rtol, atol);
  kc::mergeAttentionBackward(dt, rows, d, doA.get(), dlA.get(), doB.get(), dlB.get(), dOut.get(), dLse.get(),
                             dgOut.get(), dgLse.get(), dgA.get(), dgLA.get(), dgB.get(), dgLB.get());
  checkClose("gradOutA", dgA.host(), gA, rtol, atol);
  checkClose("gradLseA", dgLA.host(), gLA, rtol, atol);
  checkClose("gradOutB", dgB.host(), gB, rtol, atol);
  checkClose("gradLseB", dgLB.host(), gLB, rtol, atol);
  // Only the lse gradients.
  DeviceVector<T> onlyLA(rows);
  kc::mergeAttentionBackward(dt, rows, d, doA.get(), dlA.get(), doB.get(), dlB.get(), dOut.get(), dLse.get(),
                             dgOut.get(), dgLse.get(), nullptr, onlyLA.get(), nullptr, nullptr);
  checkClose("gradLseA alone", onlyLA.host(), gLA, rtol, atol);
}

TEST_CASE("CUDA mergeAttention equals the CPU kernels, rows with one or both sides empty included") {
  WEFT_SKIP_WITHOUT_CUDA();
  compareMerge<double>(1000, 48, 1e-12, 1e-13);
  compareMerge<double>(7, 130, 1e-12, 1e-13);
  compareMerge<float>(1000, 48, 1e-5, 1e-6);
  compareMerge<float>(0, 16, 1e-5, 1e-6);
}
#endif  // WEFT_HAVE_CUDA
