// The CUDA reduction, scan, softmax and loss kernels called directly on
// device buffers, against the CPU kernels of the same name on the same data:
// the paths each kernel picks by shape (warp or block per row, split rows
// and columns with a second pass, strided columns), ties, NaN and infinities.
// The CUDA kernels exist only in CUDA builds; without them this file is empty.
#ifdef WEFT_HAVE_CUDA

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/half.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/scan.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/loss.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/scan.h"
#include "kernels/cuda/softmax.h"
#include "weft_test.h"

using namespace weft;
namespace kc = weft::kernels::cuda;
namespace kp = weft::kernels::cpu;

namespace {

// A device copy of a host vector, freed at scope end.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes), p_(kc::allocate(bytes, 0)) {}
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size() * sizeof(T)) {
    if (bytes_ > 0) kc::copyHostToDevice(p_, h.data(), bytes_, 0);
  }
  ~DeviceBuffer() { kc::deallocate(p_, 0); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  template <class T>
  std::vector<T> download(size_t n) const {
    std::vector<T> h(n);
    if (n > 0) kc::copyDeviceToHost(h.data(), p_, n * sizeof(T), 0);
    return h;
  }

 private:
  size_t bytes_;
  void* p_;
};

template <class T>
std::vector<T> randomValues(size_t n, uint64_t seed, double lo = -1, double hi = 1, bool integral = false) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(integral ? std::floor(u(g)) : u(g));
  return v;
}

template <class T>
double asDouble(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
double asDouble(double v) {
  return v;
}
template <>
double asDouble(int64_t v) {
  return static_cast<double>(v);
}

// NaN matches NaN, infinities match exactly, the rest to rtol/atol.
template <class T>
void checkClose(const std::string& what, const std::vector<T>& gpu, const std::vector<T>& cpu, double rtol,
                double atol) {
  INFO(what);
  REQUIRE(gpu.size() == cpu.size());
  int reported = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    double g = asDouble(gpu[i]), c = asDouble(cpu[i]);
    bool ok = (std::isnan(g) && std::isnan(c)) || g == c || std::abs(g - c) <= atol + rtol * std::abs(c);
    if (!ok && reported++ < 5) {
      INFO("at " << i << ": gpu " << g << ", cpu " << c);
      CHECK(ok);
    }
  }
  CHECK(reported == 0);
}

template <class T>
constexpr double tol() {
  if constexpr (std::is_same_v<T, double>) return 1e-11;
  else if constexpr (std::is_same_v<T, float>) return 2e-5;
  else return 1e-2;
}

}  // namespace

TEST_CASE_TEMPLATE("sumRows and sumCols match the CPU on every path", T, double, float, BFloat16) {
  WEFT_SKIP_WITHOUT_CUDA();
  const DType dt = kDTypeOf<T>;
  // [K, R] rows: warp rows, block rows, split rows (few and long), empty rows.
  for (auto [K, R] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {37, 33}, {1000, 7}, {5, 3000}, {3, 300001}, {1, 1 << 20}, {4, 0}, {600, 2049}, {100, 64},
           {2, 1 << 19}}) {
    auto h = randomValues<T>(static_cast<size_t>(K * R), 1);
    DeviceBuffer in(h), out(static_cast<size_t>(K) * sizeof(T));
    kc::sumRows(dt, in.get(), K, R, out.get());
    std::vector<T> ref(static_cast<size_t>(K));
    kp::sumRows(dt, h.data(), K, R, ref.data());
    checkClose(detail::concat("sumRows K ", K, " R ", R), out.download<T>(K), ref, tol<T>(), tol<T>());
  }
  // [R, K] columns: one tile, many tiles, split columns, odd widths, no rows.
  for (auto [R, K] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {7, 33}, {8192, 256}, {16385, 96}, {100000, 3}, {3, 70000}, {0, 5}, {65536, 1}}) {
    auto h = randomValues<T>(static_cast<size_t>(K * R), 2);
    DeviceBuffer in(h), out(static_cast<size_t>(K) * sizeof(T));
    kc::sumCols(dt, in.get(), R, K, out.get());
    std::vector<T> ref(static_cast<size_t>(K));
    kp::sumCols(dt, h.data(), R, K, ref.data());
    checkClose(detail::concat("sumCols R ", R, " K ", K), out.download<T>(K), ref, tol<T>() * 10, tol<T>() * 10);
  }
  // A buffer that starts one element past a 16-byte boundary (a view's
  // offset): the vectorized column sum must step aside.
  {
    const int64_t R = 1000, K = 96;
    auto h = randomValues<T>(static_cast<size_t>(K * R + 1), 3);
    DeviceBuffer in(h), out(static_cast<size_t>(K) * sizeof(T));
    kc::sumCols(dt, in.as<T>() + 1, R, K, out.get());
    std::vector<T> ref(static_cast<size_t>(K));
    kp::sumCols(dt, h.data() + 1, R, K, ref.data());
    checkClose("sumCols unaligned", out.download<T>(K), ref, tol<T>() * 10, tol<T>() * 10);
    DeviceBuffer rowsOut(static_cast<size_t>(R) * sizeof(T));
    kc::sumRows(dt, in.as<T>() + 1, R, K, rowsOut.get());
    std::vector<T> rowsRef(static_cast<size_t>(R));
    kp::sumRows(dt, h.data() + 1, R, K, rowsRef.data());
    checkClose("sumRows unaligned", rowsOut.download<T>(R), rowsRef, tol<T>(), tol<T>());
  }
}

TEST_CASE("integer sums wrap and match the CPU exactly") {
  WEFT_SKIP_WITHOUT_CUDA();
  auto h = randomValues<int64_t>(3 * 100001, 3, -1e12, 1e12, true);
  DeviceBuffer in(h), out(3 * sizeof(int64_t));
  kc::sumRows(DType::Int64, in.get(), 3, 100001, out.get());
  std::vector<int64_t> ref(3);
  kp::sumRows(DType::Int64, h.data(), 3, 100001, ref.data());
  CHECK(out.download<int64_t>(3) == ref);
  DeviceBuffer colOut(100001 * sizeof(int64_t));
  kc::sumCols(DType::Int64, in.get(), 3, 100001, colOut.get());
  std::vector<int64_t> colRef(100001);
  kp::sumCols(DType::Int64, h.data(), 3, 100001, colRef.data());
  CHECK(colOut.download<int64_t>(100001) == colRef);
}

TEST_CASE_TEMPLATE("extremumForward matches the CPU: ties, NaN, every path", T, double, float, BFloat16) {
  WEFT_SKIP_WITHOUT_CUDA();
  const DType dt = kDTypeOf<T>;
  const T nan = T(std::numeric_limits<float>::quiet_NaN());
  struct Shape3 {
    int64_t outer, R, inner;
  };
  for (Shape3 s : std::vector<Shape3>{{1, 1, 1}, {5, 7, 9}, {1, 1 << 20, 1}, {3, 300001, 1}, {1000, 5, 1},
                                      {1, 100003, 3}, {2, 5000, 40}, {4, 3, 70000}}) {
    const size_t n = static_cast<size_t>(s.outer * s.R * s.inner);
    for (bool withNan : {false, true}) {
      auto h = randomValues<T>(n, 4, 0, 10, true);  // integers: many ties
      if (withNan) {
        for (size_t i = n / 3; i < n; i += n / 5 + 1) h[i] = nan;
      }
      for (bool isMax : {true, false}) {
        const size_t m = static_cast<size_t>(s.outer * s.inner);
        DeviceBuffer in(h), values(m * sizeof(T)), indices(m * sizeof(int64_t));
        kc::extremumForward(dt, in.get(), s.outer, s.R, s.inner, isMax, values.get(), indices.as<int64_t>());
        std::vector<T> refV(m);
        std::vector<int64_t> refI(m);
        kp::extremumForward(dt, h.data(), s.outer, s.R, s.inner, isMax, refV.data(), refI.data());
        const std::string what = detail::concat(isMax ? "max" : "min", " [", s.outer, ", ", s.R, ", ", s.inner,
                                                "] nan ", withNan);
        checkClose(what, values.download<T>(m), refV, 0, 0);
        INFO(what);
        CHECK(indices.download<int64_t>(m) == refI);
        // Indices alone (argmax) and values alone.
        DeviceBuffer idxOnly(m * sizeof(int64_t));
        kc::extremumForward(dt, in.get(), s.outer, s.R, s.inner, isMax, nullptr, idxOnly.as<int64_t>());
        CHECK(idxOnly.download<int64_t>(m) == refI);
      }
    }
  }
}

TEST_CASE("extremumBackward scatters the gradient to the chosen positions") {
  WEFT_SKIP_WITHOUT_CUDA();
  const int64_t outer = 3, R = 7, inner = 5;
  auto g = randomValues<float>(outer * inner, 5);
  std::vector<int64_t> idx(outer * inner);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>((i * 3) % R);
  DeviceBuffer dg(g), di(idx), out(outer * R * inner * sizeof(float));
  kc::extremumBackward(DType::Float32, dg.get(), di.as<int64_t>(), outer, R, inner, out.get());
  std::vector<float> ref(outer * R * inner);
  kp::extremumBackward(DType::Float32, g.data(), idx.data(), outer, R, inner, ref.data());
  CHECK(out.download<float>(ref.size()) == ref);
}

TEST_CASE_TEMPLATE("cumsum matches the CPU forward and reversed on every path", T, double, float, BFloat16, int64_t) {
  WEFT_SKIP_WITHOUT_CUDA();
  const DType dt = kDTypeOf<T>;
  const bool integral = std::is_integral_v<T>;
  const DType outType = integral ? DType::Int64 : dt;
  using O = std::conditional_t<std::is_integral_v<T>, int64_t, T>;
  struct Shape3 {
    int64_t outer, R, inner;
  };
  for (Shape3 s : std::vector<Shape3>{{1, 1, 1}, {5, 7, 9}, {3, 5000, 1}, {300, 33, 1}, {2, 1500, 2}, {1, 2049, 1}}) {
    const size_t n = static_cast<size_t>(s.outer * s.R * s.inner);
    auto h = randomValues<T>(n, 6, integral ? -1e15 : -1, integral ? 1e15 : 1, integral);
    for (bool reverse : {false, true}) {
      DeviceBuffer in(h), out(n * sizeof(O));
      kc::cumsum(dt, in.get(), s.outer, s.R, s.inner, reverse, outType, out.get());
      std::vector<O> ref(n);
      kp::cumsum(dt, h.data(), s.outer, s.R, s.inner, reverse, outType, ref.data());
      checkClose(detail::concat("cumsum [", s.outer, ", ", s.R, ", ", s.inner, "] reverse ", reverse),
                 out.download<O>(n), ref, integral ? 0 : tol<T>() * 10, integral ? 0 : tol<T>() * 10);
    }
  }
  CHECK_THROWS_AS(kc::cumsum(dt, nullptr, 1, 1, 1, false, DType::Int32, nullptr), InvalidArgumentError);
}

TEST_CASE_TEMPLATE("softmax forward and backward match the CPU on every path", T, double, float) {
  WEFT_SKIP_WITHOUT_CUDA();
  const DType dt = kDTypeOf<T>;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  struct Shape3 {
    int64_t outer, R, inner;
  };
  for (Shape3 s : std::vector<Shape3>{{1, 1, 1}, {37, 10, 1}, {33, 64, 1}, {4, 1500, 1}, {5, 1027, 1}, {3, 4, 5},
                                      {2, 40000, 1}, {2, 9, 700}}) {
    const size_t n = static_cast<size_t>(s.outer * s.R * s.inner);
    auto h = randomValues<T>(n, 7, -8, 8);
    if (s.outer >= 4 && s.inner == 1) {
      h[static_cast<size_t>(s.R) - 1] = -inf;                           // row 0: one -inf
      for (int64_t r = 0; r < s.R; ++r) h[static_cast<size_t>(s.R + r)] = -inf;  // row 1: all -inf
      h[static_cast<size_t>(2 * s.R + 3)] = inf;                        // row 2: +inf
      h[static_cast<size_t>(3 * s.R + s.R / 2)] = nan;                  // row 3: NaN
    }
    auto g = randomValues<T>(n, 8);
    for (bool log : {false, true}) {
      const std::string what = detail::concat(log ? "logSoftmax" : "softmax", " [", s.outer, ", ", s.R, ", ",
                                              s.inner, "]");
      DeviceBuffer in(h), out(n * sizeof(T)), dg(g), gi(n * sizeof(T));
      kc::softmaxForward(dt, in.get(), s.outer, s.R, s.inner, log, out.get());
      std::vector<T> ref(n);
      kp::softmaxForward(dt, h.data(), s.outer, s.R, s.inner, log, ref.data());
      auto y = out.download<T>(n);
      checkClose(what, y, ref, tol<T>() * 10, tol<T>());
      // Backward from the CPU's forward output, so both read the same y.
      DeviceBuffer dy(ref);
      kc::softmaxBackward(dt, dy.get(), dg.get(), s.outer, s.R, s.inner, log, gi.get());
      std::vector<T> refG(n);
      kp::softmaxBackward(dt, ref.data(), g.data(), s.outer, s.R, s.inner, log, refG.data());
      checkClose(what + " backward", gi.download<T>(n), refG, tol<T>() * 10, tol<T>());
      // In place: gradIn aliasing g.
      kc::softmaxBackward(dt, dy.get(), dg.get(), s.outer, s.R, s.inner, log, dg.get());
      checkClose(what + " backward in place", dg.download<T>(n), refG, tol<T>() * 10, tol<T>());
    }
  }
}

TEST_CASE_TEMPLATE("loss kernels match the CPU", T, double, float) {
  WEFT_SKIP_WITHOUT_CUDA();
  const DType dt = kDTypeOf<T>;
  for (auto [N, C, D] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {37, 11, 1}, {1, 13, 1}, {5, 7, 12}, {3, 5000, 1}, {2, 5, 1100}, {4000, 10, 1}, {64, 32, 1}}) {
    const size_t n = static_cast<size_t>(N * C * D), nt = static_cast<size_t>(N * D);
    auto x = randomValues<T>(n, 9, -3, 0);
    std::vector<int64_t> t(nt);
    std::mt19937_64 rng(10);
    for (size_t i = 0; i < nt; ++i) t[i] = i % 4 == 1 ? -100 : static_cast<int64_t>(rng() % C);
    const std::string what = detail::concat("[", N, ", ", C, ", ", D, "]");
    DeviceBuffer dx(x), dt_(t), losses(nt * sizeof(T));
    int64_t at = 0, value = 0;
    kc::firstInvalidTarget(dt_.as<int64_t>(), static_cast<int64_t>(nt), C, -100, &at, &value);
    CHECK(at == -1);
    std::vector<T> refLosses(nt);
    kp::NllTotals ref = kp::nllLossForward(dt, x.data(), t.data(), N, C, D, -100, refLosses.data());
    kp::NllTotals got = kc::nllLossForward(dt, dx.get(), dt_.as<int64_t>(), N, C, D, -100, losses.get());
    INFO(what);
    CHECK(got.count == ref.count);
    CHECK(got.sum == doctest::Approx(ref.sum).epsilon(1e-9));
    checkClose(what + " nll losses", losses.download<T>(nt), refLosses, 0, 0);
    got = kc::nllLossForward(dt, dx.get(), dt_.as<int64_t>(), N, C, D, -100, nullptr);
    CHECK(got.sum == doctest::Approx(ref.sum).epsilon(1e-9));
    for (bool perElement : {false, true}) {
      auto g = randomValues<T>(perElement ? nt : 1, 11);
      DeviceBuffer dg(g), gi(n * sizeof(T));
      kc::nllLossBackward(dt, dt_.as<int64_t>(), N, C, D, -100, dg.get(), perElement, 0.25, gi.get());
      std::vector<T> refG(n);
      kp::nllLossBackward(dt, t.data(), N, C, D, -100, g.data(), perElement, 0.25, refG.data());
      checkClose(what + " nll backward", gi.download<T>(n), refG, 0, 0);
      kc::crossEntropyBackward(dt, dx.get(), dt_.as<int64_t>(), N, C, D, -100, dg.get(), perElement, 0.25, gi.get());
      kp::crossEntropyBackward(dt, x.data(), t.data(), N, C, D, -100, g.data(), perElement, 0.25, refG.data());
      checkClose(what + " crossEntropy backward", gi.download<T>(n), refG, tol<T>(), tol<T>());
    }
    // An out-of-range target: its first position and value.
    t[nt / 2] = C;
    if (nt > 3) t[nt - 1] = -7;
    DeviceBuffer bad(t);
    kc::firstInvalidTarget(bad.as<int64_t>(), static_cast<int64_t>(nt), C, -100, &at, &value);
    CHECK(at == static_cast<int64_t>(nt / 2));
    CHECK(value == C);
  }
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(3 << 18)}) {
    auto x = randomValues<T>(n, 12), t = randomValues<T>(n, 13);
    DeviceBuffer dx(x), dt_(t), losses(n * sizeof(T));
    std::vector<T> ref(n);
    kp::mseLossForward(dt, x.data(), t.data(), n, ref.data());
    CHECK(kc::mseLossForward(dt, dx.get(), dt_.get(), n, losses.get()) == 0);
    checkClose("mse losses", losses.download<T>(n), ref, 0, 0);
    const double total = kc::mseLossForward(dt, dx.get(), dt_.get(), n, nullptr);
    CHECK(total == doctest::Approx(kp::mseLossForward(dt, x.data(), t.data(), n, nullptr)).epsilon(1e-9));
    for (bool perElement : {false, true}) {
      auto g = randomValues<T>(perElement ? n : 1, 14);
      DeviceBuffer dg(g), gx(n * sizeof(T)), gt(n * sizeof(T));
      kc::mseLossBackward(dt, dx.get(), dt_.get(), n, dg.get(), perElement, 0.5, gx.get(), gt.get());
      std::vector<T> rx(n), rt(n);
      kp::mseLossBackward(dt, x.data(), t.data(), n, g.data(), perElement, 0.5, rx.data(), rt.data());
      checkClose("mse backward input", gx.download<T>(n), rx, 0, 0);
      checkClose("mse backward target", gt.download<T>(n), rt, 0, 0);
    }
  }
}

#endif  // WEFT_HAVE_CUDA
