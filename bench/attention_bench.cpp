// attention_bench: the tiled (FlashAttention-2) scaledDotProductAttention
// against the naive formula softmax(q k^T * scale + mask) v built from
// matmul, softmax and matmul with autograd, float32, causal, B = 1, H = 4,
// D = 64, at several sequence lengths.
//
// For each: the median time of a forward and of a forward + backward, and the
// peak bytes held by tensors during a forward + backward beyond what was live
// before it (Storage::memoryStats: q, k, v, the upstream gradient and the
// naive formula's additive mask are live before and not counted). The flash
// kernel's per-thread tiles are plain heap memory outside that count: one
// [128, 128] tile (three in backward) per thread.
//
// Usage: attention_bench [--quick]   (--quick: sequences 256 and 1024 only)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "bench/flags.h"
#include "bench/median_time.h"
#include "kernels/cpu/parallel.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

using namespace weft;

namespace {

constexpr int64_t kBatch = 1, kHeads = 4, kHeadDim = 64;

struct Figures {
  double forward = 0, step = 0;  // median seconds
  size_t peak = 0;               // bytes above the live ones before a step
};

// Runs fn (one forward + backward) once under the peak counter.
size_t peakOf(const std::function<void()>& fn) {
  const size_t before = Storage::memoryStats().liveBytes;
  Storage::resetPeakBytes();
  fn();
  return Storage::memoryStats().peakBytes - before;
}

template <class F>
Figures measure(int reps, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& gOut, F&& attention) {
  Figures f;
  f.forward = bench::medianSeconds(1, reps, [&] {
    NoGradGuard ng;
    Tensor out = attention(q, k, v);
    (void)out;
  });
  auto step = [&] {
    Tensor out = attention(q, k, v);
    out.backward(gOut);
  };
  f.step = bench::medianSeconds(1, reps, step);
  f.peak = peakOf(step);
  for (const Tensor& t : {q, k, v}) t.grad().zero_();
  return f;
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  weft::bench::Flags flags;
  flags.onSwitch("--quick", [&] { quick = true; });
  if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "attention_bench", "usage: attention_bench [--quick]\n")) {
    return 2;
  }
  std::printf("== attention, float32, causal, B=%lld H=%lld D=%lld, %d kernel threads\n",
              static_cast<long long>(kBatch), static_cast<long long>(kHeads), static_cast<long long>(kHeadDim),
              kernels::cpu::numThreads());
  std::printf("   times: medians; peak: MiB held by tensors during forward+backward beyond the inputs\n");
  std::printf("%6s | %10s %10s %8s | %10s %10s %8s | %10s %10s %8s\n", "seq", "flash fwd", "naive fwd", "ratio",
              "flash f+b", "naive f+b", "ratio", "flash MiB", "naive MiB", "ratio");
  std::vector<int64_t> seqs = {256, 1024, 4096};
  if (quick) seqs.pop_back();
  std::vector<Figures> flashAll;
  for (int64_t S : seqs) {
    Generator g(1);
    const Shape shape{kBatch, kHeads, S, kHeadDim};
    Tensor q = randn(shape, {}, &g).requiresGrad_(), k = randn(shape, {}, &g).requiresGrad_();
    Tensor v = randn(shape, {}, &g).requiresGrad_(), gOut = randn(shape, {}, &g);
    const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
    std::vector<float> maskValues(static_cast<size_t>(S * S));
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t j = 0; j < S; ++j) maskValues[i * S + j] = j <= i ? 0.0f : -std::numeric_limits<float>::infinity();
    }
    Tensor mask = fromVector(maskValues, {S, S});
    const int reps = S >= 4096 ? 3 : (S >= 1024 ? 5 : 15);
    Figures flash = measure(reps, q, k, v, gOut, [](const Tensor& a, const Tensor& b, const Tensor& c) {
      return scaledDotProductAttention(a, b, c, {.causal = true});
    });
    Figures naive = measure(reps, q, k, v, gOut, [&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return matmul(softmax(matmul(a, b.transpose(-2, -1)) * scale + mask, -1), c);
    });
    std::printf("%6lld | %8.2fms %8.2fms %7.2fx | %8.2fms %8.2fms %7.2fx | %10.2f %10.2f %7.2fx\n",
                static_cast<long long>(S), flash.forward * 1e3, naive.forward * 1e3, naive.forward / flash.forward,
                flash.step * 1e3, naive.step * 1e3, naive.step / flash.step, mib(flash.peak), mib(naive.peak),
                static_cast<double>(naive.peak) / static_cast<double>(flash.peak));
    std::fflush(stdout);
    flashAll.push_back(flash);
  }
  std::printf("   flash peak per sequence position:");
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::printf(" %lld: %.0f B", static_cast<long long>(seqs[i]),
                static_cast<double>(flashAll[i].peak) / static_cast<double>(seqs[i]));
  }
  std::printf("\n   (ratio columns: naive / flash)\n");
  return 0;
}
