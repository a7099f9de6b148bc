// tensor_bench: weft's tensor library against its baselines, in one run.
//
// 1. GEMM: weft::mm (float32, output allocated per call, as a user calls it)
//    against cblas_sgemm into a preallocated output, same process, same
//    threads, measured in alternating rounds; prints GFLOP/s and the overhead.
// 2. MLP training step (784-256-128-10, ReLU, batch 64, SGD): weft samples/s,
//    and when /usr/bin/python3 has torch, the same step in PyTorch measured in
//    the same run (bench/torch_mlp_step.py), with the ratio.
// 3. layerNorm forward + backward (float32, affine, dx, dweight and dbias) on
//    transformer-sized rows, against F.layer_norm in PyTorch with the same
//    thread count (bench/torch_layer_norm_step.py), median microseconds.
// 4. bfloat16 and float16 against float32: mm (forward), a linear layer's
//    forward + backward, elementwise add, gelu and sum, median microseconds
//    per call and the ratio to float32 (the 16-bit types compute through
//    float32: the ratio is the price of the conversions).
// 5. GEMM shapes of the transformer (the wide GPT of bench/gpt_bench: 2048
//    tokens, width 256; forward, input-gradient and weight-gradient products):
//    weft's gemm (its own AVX-512 kernel where the CPU has it,
//    kernels/cpu/sgemm.h) against cblas_sgemm on every core through
//    OpenBLAS's threads, GFLOP/s per shape, the sum of the medians and the
//    ratio. OpenBLAS's kernels are the ones it chose at load time (printed;
//    OPENBLAS_CORETYPE sets them).
//
// Usage: tensor_bench [--quick] [--only gemm|mlp|layernorm|lowp|shapes]   (one section, or all)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/median_time.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/sgemm.h"
#include "nn/nn.h"
#include "tensor/ops.h"

using namespace weft;

namespace {

void benchGemm(bool quick) {
  std::printf("== GEMM float32: weft::mm vs direct cblas_sgemm (median of rounds)\n");
  std::printf("%6s %12s %12s %10s\n", "n", "weft GF/s", "blas GF/s", "overhead");
  for (int64_t n : {64, 128, 256, 512, 1024}) {
    if (quick && n > 512) break;
    Tensor a = randn({n, n}), b = randn({n, n});
    Tensor c = empty({n, n});
    double flops = 2.0 * n * n * n;
    int inner = n <= 128 ? 200 : (n <= 256 ? 40 : (n <= 512 ? 8 : 2));
    int rounds = quick ? 5 : 15;
    // weft's rounds first, then the baseline's: OpenBLAS's OpenMP workers
    // spin for milliseconds after each call and would take a core from
    // weft's threads if the two were interleaved.
    std::vector<double> tw, tb;
    for (int r = 0; r < rounds + 1; ++r) {
      double w = bench::medianSeconds(0, 1, [&] {
        for (int i = 0; i < inner; ++i) {
          Tensor out = mm(a, b);
          (void)out;
        }
      });
      if (r > 0) tw.push_back(w / inner);  // round 0 warms up
    }
    // The baseline as a plain OpenBLAS user gets it: every core, through
    // OpenBLAS's own OpenMP threads (weft's products keep BLAS calls on one
    // thread and reset this thread's OpenMP count to 1).
    omp_set_num_threads(kernels::cpu::numThreads());
    for (int r = 0; r < rounds + 1; ++r) {
      double d = bench::medianSeconds(0, 1, [&] {
        for (int i = 0; i < inner; ++i)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n,
                      b.data<float>(), n, 0.0f, c.data<float>(), n);
      });
      if (r > 0) tb.push_back(d / inner);
    }
    std::sort(tw.begin(), tw.end());
    std::sort(tb.begin(), tb.end());
    double mw = tw[tw.size() / 2], mb = tb[tb.size() / 2];
    std::printf("%6lld %12.2f %12.2f %9.2f%%\n", static_cast<long long>(n), flops / mw / 1e9, flops / mb / 1e9,
                (mw / mb - 1.0) * 100.0);
  }
}

extern "C" char* openblas_get_corename(void);

void benchGemmShapes(bool quick) {
  struct Shape {
    const char* name;
    int64_t m, n, k;
    bool ta, tb;
  };
  // y = x W^T (forward), dx = dy W, dW = dy^T x for the QKV, attention
  // output, MLP up and MLP down projections.
  const Shape shapes[] = {{"qkv fwd", 2048, 768, 256, false, true},   {"proj fwd", 2048, 256, 256, false, true},
                          {"fc fwd", 2048, 1024, 256, false, true},   {"fc2 fwd", 2048, 256, 1024, false, true},
                          {"qkv dx", 2048, 256, 768, false, false},   {"fc dx", 2048, 256, 1024, false, false},
                          {"fc2 dx", 2048, 1024, 256, false, false},  {"qkv dW", 768, 256, 2048, true, false},
                          {"proj dW", 256, 256, 2048, true, false},   {"fc dW", 1024, 256, 2048, true, false},
                          {"fc2 dW", 256, 1024, 2048, true, false}};
  const bool own = kernels::cpu::ownSgemmAvailable();
  std::printf("== GEMM shapes of the wide GPT, float32: weft's gemm (%s) vs cblas_sgemm (OpenBLAS %s kernels, "
              "%d threads), median of rounds\n",
              own ? "own AVX-512 kernel" : "OpenBLAS", openblas_get_corename(), kernels::cpu::numThreads());
  std::printf("%-9s %5s %5s %5s %10s %10s %7s\n", "product", "m", "n", "k", "weft GF/s", "blas GF/s", "ratio");
  const int rounds = quick ? 5 : 15;
  double sumWeft = 0, sumBlas = 0;
  for (const Shape& s : shapes) {
    Tensor a = s.ta ? randn({s.k, s.m}) : randn({s.m, s.k});
    Tensor b = s.tb ? randn({s.n, s.k}) : randn({s.k, s.n});
    Tensor c = empty({s.m, s.n});
    const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    std::vector<double> tw, tb;
    for (int r = 0; r < rounds + 1; ++r) {
      double w = bench::medianSeconds(0, 1, [&] {
        kernels::cpu::gemm(DType::Float32, {a.data<float>(), s.ta, lda}, {b.data<float>(), s.tb, ldb}, s.m, s.n,
                           s.k, 1.0, 0.0, c.data<float>(), s.n);
      });
      if (r > 0) tw.push_back(w);
    }
    omp_set_num_threads(kernels::cpu::numThreads());
    for (int r = 0; r < rounds + 1; ++r) {
      double d = bench::medianSeconds(0, 1, [&] {
        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                    static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data<float>(),
                    static_cast<int>(lda), b.data<float>(), static_cast<int>(ldb), 0.0f, c.data<float>(),
                    static_cast<int>(s.n));
      });
      if (r > 0) tb.push_back(d);
    }
    std::sort(tw.begin(), tw.end());
    std::sort(tb.begin(), tb.end());
    const double mw = tw[tw.size() / 2], mb = tb[tb.size() / 2], flops = 2.0 * s.m * s.n * s.k;
    sumWeft += mw;
    sumBlas += mb;
    std::printf("%-9s %5lld %5lld %5lld %10.1f %10.1f %6.2fx\n", s.name, static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k), flops / mw / 1e9, flops / mb / 1e9, mb / mw);
  }
  std::printf("all products: weft %.2f ms, OpenBLAS %.2f ms, OpenBLAS/weft %.2fx\n", sumWeft * 1e3, sumBlas * 1e3,
              sumBlas / sumWeft);
}

double benchWeftMlp(int64_t batch, int steps) {
  manualSeed(0);
  auto model = nn::makeSequential({std::make_shared<nn::Linear>(784, 256), std::make_shared<nn::ReLU>(),
                                   std::make_shared<nn::Linear>(256, 128), std::make_shared<nn::ReLU>(),
                                   std::make_shared<nn::Linear>(128, 10)});
  nn::optim::SGD opt(model->parameters(), {.lr = 0.01});
  Tensor x = rand({batch, 784});
  Tensor y = randint(0, 10, {batch});
  auto step = [&] {
    opt.zeroGrad();
    Tensor loss = crossEntropy(model->forward(x), y);
    loss.backward();
    opt.step();
  };
  double t = bench::medianSeconds(20, steps, step);
  return static_cast<double>(batch) / t;
}

// Runs the PyTorch version of the same step; returns samples/s or 0 when torch
// is unavailable.
double torchMlp(int64_t batch, int steps) {
  std::string cmd = "/usr/bin/python3 " WEFT_BENCH_DIR "/torch_mlp_step.py " + std::to_string(batch) + " " +
                    std::to_string(steps) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  char buf[256] = {};
  double v = 0;
  if (std::fgets(buf, sizeof buf, p)) v = std::atof(buf);
  pclose(p);
  return v;
}

// Median seconds of one layerNorm forward and backward of x [rows, n]; the
// backward feeds a fixed gradient g, as y.backward(g) in PyTorch.
double benchWeftLayerNorm(int64_t rows, int64_t n, int steps) {
  Generator gen(0);
  Tensor x = randn({rows, n}, {}, &gen).requiresGrad_();
  Tensor w = randn({n}, {}, &gen).requiresGrad_(), b = randn({n}, {}, &gen).requiresGrad_();
  Tensor g = randn({rows, n}, {}, &gen);
  auto step = [&] {
    for (const Tensor* t : {&x, &w, &b}) t->setGrad(Tensor());
    layerNorm(x, {n}, w, b).backward(g);
  };
  return bench::medianSeconds(20, steps, step);
}

double torchLayerNorm(int64_t rows, int64_t n, int steps) {
  std::string cmd = "/usr/bin/python3 " WEFT_BENCH_DIR "/torch_layer_norm_step.py " + std::to_string(rows) + " " +
                    std::to_string(n) + " " + std::to_string(steps) + " " +
                    std::to_string(kernels::cpu::numThreads()) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  char buf[256] = {};
  double v = 0;
  if (std::fgets(buf, sizeof buf, p)) v = std::atof(buf);
  pclose(p);
  return v;
}

void benchMlp(bool quick) {
  std::printf("\n== MLP 784-256-128-10 training step (forward, cross-entropy, backward, SGD), median samples/s\n");
  std::printf("%6s %14s %14s %12s\n", "batch", "weft", "pytorch", "weft/pytorch");
  for (int64_t batch : {32, 64, 256}) {
    int steps = quick ? 50 : 300;
    double w = benchWeftMlp(batch, steps);
    double t = torchMlp(batch, steps);
    if (t > 0) {
      std::printf("%6lld %14.0f %14.0f %11.2fx\n", static_cast<long long>(batch), w, t, w / t);
    } else {
      std::printf("%6lld %14.0f %14s %12s\n", static_cast<long long>(batch), w, "n/a", "n/a");
    }
  }
}

void benchLayerNorm(bool quick) {
  std::printf("\n== layerNorm float32 forward + backward (dx, dweight, dbias), median microseconds\n");
  std::printf("%14s %10s %10s %14s\n", "shape", "weft", "pytorch", "pytorch/weft");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{16 * 128, 128}, {8 * 256, 256}, {4 * 512, 768}}) {
    int steps = quick ? 50 : 300;
    double w = benchWeftLayerNorm(rows, n, steps);
    double t = torchLayerNorm(rows, n, steps);
    char shape[32];
    std::snprintf(shape, sizeof shape, "[%lld, %lld]", static_cast<long long>(rows), static_cast<long long>(n));
    if (t > 0) {
      std::printf("%14s %10.1f %10.1f %13.2fx\n", shape, w * 1e6, t * 1e6, t / w);
    } else {
      std::printf("%14s %10.1f %10s %14s\n", shape, w * 1e6, "n/a", "n/a");
    }
  }
}

// Median seconds per call of fn over `steps` calls (after a few to warm up).
double perCall(int steps, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  return bench::medianSeconds(0, steps, fn);
}

void benchLowPrecision(bool quick) {
  std::printf("\n== bfloat16 / float16 vs float32 (16-bit types compute through float32), median microseconds\n");
  std::printf("%-28s %10s %10s %10s %9s %9s\n", "op", "float32", "bfloat16", "float16", "bf16/f32", "f16/f32");
  const int steps = quick ? 20 : 100;
  auto row = [&](const char* name, const std::function<void(DType)>& op) {
    double t[3];
    const DType types[3] = {DType::Float32, DType::BFloat16, DType::Float16};
    for (int i = 0; i < 3; ++i) t[i] = perCall(steps, [&] { op(types[i]); });
    std::printf("%-28s %10.1f %10.1f %10.1f %8.2fx %8.2fx\n", name, t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, t[1] / t[0],
                t[2] / t[0]);
  };
  for (int64_t n : {128, 512, 1024}) {
    if (quick && n > 512) break;
    Tensor a = randn({n, n}), b = randn({n, n});
    Tensor ab[3] = {a, a.to(DType::BFloat16), a.to(DType::Float16)};
    Tensor bb[3] = {b, b.to(DType::BFloat16), b.to(DType::Float16)};
    auto idx = [](DType d) { return d == DType::Float32 ? 0 : (d == DType::BFloat16 ? 1 : 2); };
    char name[64];
    std::snprintf(name, sizeof name, "mm [%lld]^2", static_cast<long long>(n));
    row(name, [&](DType d) { (void)mm(ab[idx(d)], bb[idx(d)]); });
  }
  {
    // A transformer-sized linear layer, forward and backward.
    const int64_t rows = 16 * 128, in = 128, out = 512;
    Tensor x = randn({rows, in}), w = randn({out, in}), bias = randn({out});
    auto idx = [](DType d) { return d == DType::Float32 ? 0 : (d == DType::BFloat16 ? 1 : 2); };
    Tensor xs[3], ws[3], bs[3];
    for (DType d : {DType::Float32, DType::BFloat16, DType::Float16}) {
      xs[idx(d)] = x.to(d).detach().requiresGrad_();
      ws[idx(d)] = w.to(d).detach().requiresGrad_();
      bs[idx(d)] = bias.to(d).detach().requiresGrad_();
    }
    row("linear fwd+bwd [2048,128]x512", [&](DType d) {
      int i = idx(d);
      linear(xs[i], ws[i], bs[i]).sum().backward();
      xs[i].setGrad({});
      ws[i].setGrad({});
      bs[i].setGrad({});
    });
  }
  {
    const int64_t n = quick ? (1 << 18) : (1 << 22);
    Tensor a = randn({n}), b = randn({n});
    auto idx = [](DType d) { return d == DType::Float32 ? 0 : (d == DType::BFloat16 ? 1 : 2); };
    Tensor as[3] = {a, a.to(DType::BFloat16), a.to(DType::Float16)};
    Tensor bs[3] = {b, b.to(DType::BFloat16), b.to(DType::Float16)};
    char name[64];
    std::snprintf(name, sizeof name, "add [%lld]", static_cast<long long>(n));
    row(name, [&](DType d) { (void)add(as[idx(d)], bs[idx(d)]); });
    std::snprintf(name, sizeof name, "gelu [%lld]", static_cast<long long>(n));
    row(name, [&](DType d) { (void)gelu(as[idx(d)]); });
    std::snprintf(name, sizeof name, "sum [%lld]", static_cast<long long>(n));
    row(name, [&](DType d) { (void)sum(as[idx(d)]); });
    std::snprintf(name, sizeof name, "from f32 (f32: clone) [%lld]", static_cast<long long>(n));
    row(name, [&](DType d) { (void)(d == DType::Float32 ? a.clone() : a.to(d)); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  weft::bench::Flags flags;
  flags.onSwitch("--quick", [&] { quick = true; });
  flags.onValue("--only", [&](const std::string& v) {
    if (v != "gemm" && v != "mlp" && v != "layernorm" && v != "lowp" && v != "shapes") {
      throw weft::bench::FlagError("--only takes gemm, mlp, layernorm, lowp or shapes, got '" + v + "'");
    }
    only = v;
  });
  if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "tensor_bench",
                                      "usage: tensor_bench [--quick] [--only gemm|mlp|layernorm|lowp|shapes]\n")) {
    return 2;
  }
  auto runs = [&](const char* section) { return only.empty() || only == section; };
  std::printf("threads: weft kernels %d (the direct OpenBLAS baseline uses as many OpenMP threads)\n",
              kernels::cpu::numThreads());
  if (runs("gemm")) benchGemm(quick);
  if (runs("mlp")) benchMlp(quick);
  if (runs("layernorm")) benchLayerNorm(quick);
  if (runs("lowp")) benchLowPrecision(quick);
  if (runs("shapes")) benchGemmShapes(quick);
  return 0;
}
