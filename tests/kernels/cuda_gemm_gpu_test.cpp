// kernels::cuda's GEMMs against kernels::cpu's on the same operands, at the
// kernel level (device buffers from the runtime, no tensor ops on the
// device): every dtype and transpose, padded leading dimensions, alpha and
// beta, k = 0 over garbage, batches that merge, broadcast or repeat C, and
// fillRows. Each test skips without a device.
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_compare.h"
#include "kernels/cpu/gemm.h"
#include "weft_test.h"

#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/runtime.h"

using namespace weft;
namespace kc = weft::kernels::cuda;
namespace kcpu = weft::kernels::cpu;

namespace {

// A host tensor's bytes in device memory of cuda:0.
class DeviceCopy {
 public:
  explicit DeviceCopy(const Tensor& host) : bytes_(static_cast<size_t>(host.numel()) * elementSize(host.dtype())) {
    REQUIRE(host.isContiguous());
    p_ = kc::allocate(std::max<size_t>(bytes_, 1), 0);
    if (bytes_) kc::copyHostToDevice(p_, host.rawData(), bytes_, 0);
  }
  ~DeviceCopy() { kc::deallocate(p_, 0); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  void* get() const { return p_; }
  // The device bytes as a host tensor like `like`.
  Tensor toHost(const Tensor& like) const {
    Tensor out = empty(like.shape(), {.dtype = like.dtype()});
    if (bytes_) kc::copyDeviceToHost(out.rawData(), p_, bytes_, 0);
    return out;
  }

 private:
  size_t bytes_;
  void* p_ = nullptr;
};

class Tf32Off {
 public:
  Tf32Off() : previous_(kc::allowTF32()) { kc::setAllowTF32(false); }
  ~Tf32Off() { kc::setAllowTF32(previous_); }

 private:
  bool previous_;
};

const DType kTypes[] = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16};

testing::Tolerance toleranceFor(DType t, int64_t k) {
  testing::Tolerance tol = testing::defaultTolerance(t);
  if (t == DType::BFloat16 || t == DType::Float16) {
    const double s = std::max(1.0, std::sqrt(static_cast<double>(k) / 16.0));
    tol.rtol *= s;
    tol.atol *= s;
  }
  return tol;
}

}  // namespace

TEST_CASE("cuda::gemm matches cpu::gemm for every dtype, transpose, leading dimension, alpha and beta") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tf32Off tf32;
  uint64_t seed = 1;
  for (DType t : kTypes) {
    for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 17, 129}, {129, 3, 17}, {17, 129, 1}}) {
      for (int tr = 0; tr < 4; ++tr) {
        const bool ta = tr & 1, tb = tr & 2;
        // Stored matrices with 3 columns of padding: ld = stored columns + 3.
        const int64_t aRows = ta ? k : m, aCols = ta ? m : k, bRows = tb ? n : k, bCols = tb ? k : n;
        Tensor a = testing::randomTensor({aRows, aCols + 3}, t, seed++);
        Tensor b = testing::randomTensor({bRows, bCols + 3}, t, seed++);
        Tensor c = testing::randomTensor({m, n + 2}, t, seed++);
        DeviceCopy da(a), db(b), dc(c);
        Tensor expected = c.clone();
        kcpu::gemm(t, {a.rawData(), ta, aCols + 3}, {b.rawData(), tb, bCols + 3}, m, n, k, 0.75, 0.5,
                   expected.rawData(), n + 2);
        kc::gemm(t, {da.get(), ta, aCols + 3}, {db.get(), tb, bCols + 3}, m, n, k, 0.75, 0.5, dc.get(), n + 2);
        testing::checkMatches(std::string(dtypeName(t)) + " m=" + std::to_string(m) + " k=" + std::to_string(k) +
                                  " n=" + std::to_string(n) + " transposes " + std::to_string(tr),
                              dc.toHost(c), expected, toleranceFor(t, k));
      }
    }
  }
}

TEST_CASE("cuda::gemm with k = 0 writes beta times C, and zeros over NaN when beta is 0") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : kTypes) {
    Tensor nan = full({5, 7}, NAN, {.dtype = t});
    DeviceCopy dc(nan), none(empty({0}, {.dtype = t}));
    kc::gemm(t, {none.get(), false, 1}, {none.get(), false, 7}, 5, 7, 0, 1.0, 0.0, dc.get(), 7);
    CHECK(dc.toHost(nan).to(DType::Float64).toVector<double>() == std::vector<double>(35, 0.0));
    Tensor c = testing::randomTensor({5, 7}, t, 3);
    DeviceCopy dc2(c);
    kc::gemm(t, {none.get(), true, 5}, {none.get(), false, 7}, 5, 7, 0, 1.0, 2.0, dc2.get(), 7);
    CHECK(dc2.toHost(c).to(DType::Float64).toVector<double>() == mul(c, 2.0).to(DType::Float64).toVector<double>());
  }
}

TEST_CASE("cuda::gemmBatched matches cpu::gemmBatched for merged, broadcast and repeated-output batches") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tf32Off tf32;
  const int64_t m = 5, k = 19, n = 7, mk = m * k, kn = k * n, mn = m * n;
  struct Case {
    const char* name;
    std::vector<int64_t> shape, as, bs, cs;
    double alpha, beta;
  };
  const Case cases[] = {
      {"contiguous, merging", {2, 3}, {3 * mk, mk}, {3 * kn, kn}, {3 * mn, mn}, 1.0, 0.0},
      {"A broadcast over the inner dimension", {2, 3}, {mk, 0}, {3 * kn, kn}, {3 * mn, mn}, 1.0, 0.0},
      {"B broadcast over the outer dimension, alpha and beta", {4, 3}, {3 * mk, mk}, {0, kn}, {3 * mn, mn}, 0.5, 2.0},
      {"C repeated over the outer dimension", {3, 4}, {4 * mk, mk}, {0, kn}, {0, mn}, 1.0, 1.0},
      {"C repeated, in order with beta", {3, 2}, {2 * mk, mk}, {2 * kn, kn}, {mn, 0}, 1.5, 0.5},
      {"C repeated over every dimension", {2, 3}, {3 * mk, mk}, {3 * kn, kn}, {0, 0}, 1.0, 1.0},
      {"size-1 dimensions and a C repeated inside", {1, 3, 1, 2}, {0, 2 * mk, 0, mk}, {0, 0, 0, kn}, {0, mn, 0, 0},
       1.0, 1.0},
  };
  uint64_t seed = 50;
  for (DType t : kTypes) {
    for (const Case& cs : cases) {
      auto extent = [&](const std::vector<int64_t>& strides, int64_t matrix) {
        int64_t e = matrix;
        for (size_t d = 0; d < cs.shape.size(); ++d) e += strides[d] * (cs.shape[d] - 1);
        return e;
      };
      Tensor a = testing::randomTensor({extent(cs.as, mk)}, t, seed++);
      Tensor b = testing::randomTensor({extent(cs.bs, kn)}, t, seed++);
      Tensor c = testing::randomTensor({extent(cs.cs, mn)}, t, seed++);
      DeviceCopy da(a), db(b), dc(c);
      Tensor expected = c.clone();
      // A stored transposed ([k, m]), B as it is.
      kcpu::gemmBatched(t, cs.shape, {a.rawData(), true, m}, cs.as, {b.rawData(), false, n}, cs.bs, m, n, k, cs.alpha,
                        cs.beta, expected.rawData(), cs.cs, n);
      kc::gemmBatched(t, cs.shape, {da.get(), true, m}, cs.as, {db.get(), false, n}, cs.bs, m, n, k, cs.alpha,
                      cs.beta, dc.get(), cs.cs, n);
      // The CPU rounds a 16-bit C after each product of a repeated C.
      testing::checkMatches(std::string(dtypeName(t)) + " " + cs.name, dc.toHost(c), expected,
                            toleranceFor(t, 4 * k));
    }
  }
}

TEST_CASE("cuda::gemmBatched accumulates repeated C matrices in order past its workspace bound") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tf32Off tf32;
  // 1100 products of 256 x 256 into one C: 288 MB of float32 products,
  // past the 256 MiB workspace, so they run one round per product.
  const int64_t steps = 1100, m = 256, k = 8, n = 256;
  for (DType t : {DType::Float32, DType::BFloat16}) {
    Tensor a = testing::randomTensor({steps, m, k}, t, 61), b = testing::randomTensor({steps, k, n}, t, 62);
    Tensor c = testing::randomTensor({m, n}, t, 63);
    DeviceCopy da(a), db(b), dc(c);
    Tensor expected = c.clone();
    const std::vector<int64_t> shape{steps}, as{m * k}, bs{k * n}, cs{0};
    kcpu::gemmBatched(t, shape, {a.rawData(), false, k}, as, {b.rawData(), false, n}, bs, m, n, k, 0.01, 0.99,
                      expected.rawData(), cs, n);
    kc::gemmBatched(t, shape, {da.get(), false, k}, as, {db.get(), false, n}, bs, m, n, k, 0.01, 0.99, dc.get(), cs,
                    n);
    testing::checkMatches(std::string(dtypeName(t)) + " in rounds", dc.toHost(c), expected, toleranceFor(t, k));
  }
}

TEST_CASE("cuda::fillRows copies a row into every row of a strided matrix, for any dtype") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType t : {DType::Float32, DType::Float64, DType::BFloat16, DType::Int64, DType::Int32, DType::UInt8,
                  DType::Bool}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 300}, {70000, 3}}) {
      Tensor row = testing::randomTensor({cols}, t, 7);
      Tensor c = testing::randomTensor({rows, cols + 5}, t, 8);
      DeviceCopy drow(row), dc(c);
      Tensor expected = c.clone();
      kcpu::fillRows(t, row.rawData(), rows, cols, expected.rawData(), cols + 5);
      kc::fillRows(t, drow.get(), rows, cols, dc.get(), cols + 5);
      Tensor got = dc.toHost(c);
      INFO(dtypeName(t) << " rows " << rows << " cols " << cols);
      CHECK(std::memcmp(got.rawData(), expected.rawData(), static_cast<size_t>(c.numel()) * elementSize(t)) == 0);
    }
  }
}

TEST_CASE("cuda::gemm rejects integer dtypes as the CPU does") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor a = zeros({2, 2}, {.dtype = DType::Int64});
  DeviceCopy da(a);
  CHECK_THROWS_AS(kc::gemm(DType::Int64, {da.get(), false, 2}, {da.get(), false, 2}, 2, 2, 2, 1.0, 0.0, da.get(), 2),
                  InvalidArgumentError);
  CHECK_THROWS_AS(kcpu::gemm(DType::Int64, {a.rawData(), false, 2}, {a.rawData(), false, 2}, 2, 2, 2, 1.0, 0.0,
                             a.rawData(), 2),
                  InvalidArgumentError);
}

#else

TEST_CASE("cuBLAS products need a build with CUDA") { WEFT_SKIP_WITHOUT_CUDA(); }

#endif
