// cuda_bench: weft's CUDA kernels on cuda:0, against the device's own copy bandwidth and, through
// bench/torch_cuda_bench.py (the same table from PyTorch on the same device), against PyTorch
// eager. scripts/device_check.sh runs both and joins the tables (bench/device_report.py).
//
// Rows (every op through the public tensor/nn API, which dispatches on the tensors' device):
//   copy                       device-to-device copy of 256 MiB (cudaMemcpyAsync): the bandwidth
//                              the memory-bound rows are measured against
//   gemm <dtype> <n>           matmul of two n x n matrices, n = 4096 and 8192, for float32, TF32
//                              (float32 with setAllowTF32(true)) and bfloat16: 2 n^3 / time
//   add, gelu                  elementwise over 64 Mi elements: bytes read and written / time
//   sum, softmax, layer norm   over the last dimension of [16384, 4096]: bytes read and written / time
//   attention fwd(+bwd)        causal scaled dot-product attention, B=4, H=16, T=2048, D=64
//   <model> step               one training step (forward, loss, backward, optimizer) of the
//                              models examples/ train, with their batch sizes and optimizers:
//                              mlp (examples/fashion_mnist_mlp), cnn (examples/parameter_server),
//                              lstm (examples/rnn), gpt and gpt-wide (examples/gpt, bench/gpt_bench)
// Each figure is the median of --iters runs after warm-up, each run timed with CUDA events on
// the current stream and waited for. A row that throws prints n/a and the error on stderr.
//
// Output: a markdown table | benchmark | unit | value | (unit TFLOP/s, GB/s or ms).
// Usage: cuda_bench [--iters N] [--only SUBSTRING]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "kernels/cuda/runtime.h"
#include "nn/nn.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "nn/utils.h"
#include "tensor/ops.h"

using namespace weft;
namespace kc = weft::kernels::cuda;

namespace {

constexpr int kDevice = 0;
const Device kCuda = Device::cuda(kDevice);

int gIters = 20;
std::string gOnly;

// Median milliseconds of `iters` runs of f after `warmup` runs.
double medianMs(int warmup, int iters, const std::function<void()>& f) {
  kc::DeviceGuard guard(kDevice);
  kc::Stream s = kc::currentStream(kDevice);
  kc::Event start = kc::createEvent(kDevice, true);
  kc::Event end = kc::createEvent(kDevice, true);
  std::vector<double> times;
  try {
    for (int i = 0; i < warmup; ++i) f();
    kc::synchronize(kDevice);
    for (int i = 0; i < iters; ++i) {
      kc::recordEvent(kDevice, start, s);
      f();
      kc::recordEvent(kDevice, end, s);
      kc::synchronizeEvent(kDevice, end);
      times.push_back(kc::elapsedMs(kDevice, start, end));
    }
  } catch (...) {
    kc::destroyEvent(kDevice, start);
    kc::destroyEvent(kDevice, end);
    throw;
  }
  kc::destroyEvent(kDevice, start);
  kc::destroyEvent(kDevice, end);
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

// One table row: value() gives the figure in `unit`.
void row(const std::string& name, const char* unit, const std::function<double()>& value) {
  if (!gOnly.empty() && name.find(gOnly) == std::string::npos) return;
  try {
    const double v = value();
    std::printf("| %s | %s | %.3f |\n", name.c_str(), unit, v);
  } catch (const std::exception& e) {
    std::printf("| %s | %s | n/a |\n", name.c_str(), unit);
    std::fprintf(stderr, "cuda_bench: %s: %s\n", name.c_str(), e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
}

// A normal random tensor on the device. The host draws at most 4 Mi values, which are
// repeated to fill larger tensors: drawing 64 Mi values one by one would take seconds.
Tensor randnOn(const Shape& shape, DType dtype = DType::Float32) {
  Tensor out = empty(shape, {.dtype = dtype, .device = kCuda});
  const int64_t n = out.numel();
  const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 22);
  if (chunk == 0) return out;
  Tensor src = randn({chunk}).to(dtype).to(kCuda);
  const size_t width = elementSize(dtype);
  char* dst = static_cast<char*>(out.rawData());
  for (int64_t offset = 0; offset < n; offset += chunk) {
    const int64_t len = std::min(chunk, n - offset);
    kc::copyDeviceToDevice(dst + static_cast<size_t>(offset) * width, src.rawData(), static_cast<size_t>(len) * width,
                           kDevice);
  }
  return out;
}

double gbPerS(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

// ---- bandwidth and GEMM ----------------------------------------------------------

double copyBandwidth() {
  const int64_t n = int64_t{64} << 20;
  Tensor src = full({n}, 1.0, {.device = kCuda});
  Tensor dst = empty({n}, {.device = kCuda});
  const size_t bytes = src.nbytes();
  const double ms = medianMs(3, gIters, [&] { kc::copyDeviceToDevice(dst.rawData(), src.rawData(), bytes, kDevice); });
  return gbPerS(2.0 * static_cast<double>(bytes), ms);
}

double gemm(int64_t n, DType dtype, bool tf32) {
  Tensor a = randnOn({n, n}, dtype), b = randnOn({n, n}, dtype);
  const bool before = kc::allowTF32();
  kc::setAllowTF32(tf32);
  double ms = 0;
  try {
    ms = medianMs(2, std::max(3, gIters / 2), [&] { (void)matmul(a, b); });
  } catch (...) {
    kc::setAllowTF32(before);
    throw;
  }
  kc::setAllowTF32(before);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / (ms * 1e-3) / 1e12;
}

// ---- attention -------------------------------------------------------------------

double attention(DType dtype, bool backward) {
  const Shape shape{4, 16, 2048, 64};
  Tensor q = randnOn(shape, dtype), k = randnOn(shape, dtype), v = randnOn(shape, dtype);
  Tensor grad = randnOn(shape, dtype);
  if (backward) {
    q.requiresGrad_();
    k.requiresGrad_();
    v.requiresGrad_();
  }
  return medianMs(3, gIters, [&] {
    Tensor out = scaledDotProductAttention(q, k, v, {.causal = true});
    if (backward) out.backward(grad);
  });
}

// ---- training steps --------------------------------------------------------------

// examples/fashion_mnist_mlp: 784-256-128-10 with ReLU, cross-entropy, SGD (lr 0.01, momentum 0.9), batch 64.
double mlpStep() {
  manualSeed(0);
  auto model = nn::makeSequential({std::make_shared<nn::Linear>(784, 256), std::make_shared<nn::ReLU>(),
                                   std::make_shared<nn::Linear>(256, 128), std::make_shared<nn::ReLU>(),
                                   std::make_shared<nn::Linear>(128, 10)});
  model->to(kCuda);
  nn::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  Tensor x = randnOn({64, 784});
  Tensor y = randint(0, 10, {64}).to(kCuda);
  return medianMs(5, gIters, [&] {
    Tensor loss = crossEntropy(model->forward(x), y);
    opt.zeroGrad();
    loss.backward();
    opt.step();
  });
}

// examples/parameter_server's Net: conv 1->32 3x3, ReLU, conv 32->64 3x3, max pool 2, dropout
// 0.25, flatten, linear 9216->128, ReLU, dropout 0.5, linear 128->10, log-softmax, NLL; SGD lr
// 0.03, batch 32.
double cnnStep() {
  manualSeed(0);
  auto conv1 = std::make_shared<nn::Conv2d>(1, 32, 3);
  auto conv2 = std::make_shared<nn::Conv2d>(32, 64, 3);
  auto fc1 = std::make_shared<nn::Linear>(9216, 128);
  auto fc2 = std::make_shared<nn::Linear>(128, 10);
  std::vector<Tensor> params;
  for (nn::Module* m : std::vector<nn::Module*>{conv1.get(), conv2.get(), fc1.get(), fc2.get()}) {
    m->to(kCuda);
    for (const Tensor& p : m->parameters()) params.push_back(p);
  }
  nn::optim::SGD opt(params, {.lr = 0.03});
  Tensor x = randnOn({32, 1, 28, 28});
  Tensor y = randint(0, 10, {32}).to(kCuda);
  return medianMs(5, gIters, [&] {
    Tensor h = relu(conv1->forward(x));
    h = maxPool2d(conv2->forward(h), 2);
    h = dropout(h, 0.25, true).flatten(1);
    h = dropout(relu(fc1->forward(h)), 0.5, true);
    Tensor loss = nllLoss(logSoftmax(fc2->forward(h), 1), y);
    opt.zeroGrad();
    loss.backward();
    opt.step();
  });
}

// examples/rnn's model in one process: embedding 8->32, dropout 0.5, LSTM 32->64 of 2 layers,
// dropout 0.5, linear 64->8, cross-entropy over [bptt 20, batch 32]; SGD lr 0.05.
double lstmStep() {
  manualSeed(0);
  auto emb = std::make_shared<nn::Embedding>(8, 32);
  auto lstm = std::make_shared<nn::LSTM>(32, 64, 2);
  auto dec = std::make_shared<nn::Linear>(64, 8);
  std::vector<Tensor> params;
  for (nn::Module* m : std::vector<nn::Module*>{emb.get(), lstm.get(), dec.get()}) {
    m->to(kCuda);
    for (const Tensor& p : m->parameters()) params.push_back(p);
  }
  nn::optim::SGD opt(params, {.lr = 0.05});
  Tensor x = randint(0, 8, {20, 32}).to(kCuda);
  Tensor y = randint(0, 8, {20, 32}).to(kCuda);
  return medianMs(5, gIters, [&] {
    Tensor e = dropout(emb->forward(x), 0.5, true);
    Tensor h = dropout(lstm->forward(e), 0.5, true);
    Tensor loss = crossEntropy(dec->forward(h).reshape({-1, 8}), y.reshape({-1}));
    opt.zeroGrad();
    loss.backward();
    opt.step();
  });
}

// examples/gpt's step (bench/gpt_bench): mean cross-entropy, backward, clipping at norm 1, AdamW
// (lr 1e-3, betas 0.9/0.95, weight decay 0.1 on the matrices only), one fixed batch of bytes.
double gptStep(int64_t layers, int64_t heads, int64_t width, int64_t block, int64_t batch) {
  Generator init(0);
  auto model = std::make_shared<nn::GPT>(
      nn::GPTConfig{.vocabSize = 256, .blockSize = block, .layers = layers, .heads = heads, .width = width}, &init);
  model->to(kCuda);
  nn::optim::AdamW opt(nn::optim::decayGroups(
      model->namedParameters(), nn::optim::AdamWOptions{.lr = 1e-3, .betas = {0.9, 0.95}, .weightDecay = 0.1}));
  Generator g(1);
  Tensor data = randint(0, 256, {batch, block + 1}, {.dtype = DType::Int64}, &g);
  Tensor x = data.narrow(1, 0, block).contiguous().to(kCuda);
  Tensor y = data.narrow(1, 1, block).contiguous().to(kCuda);
  return medianMs(3, gIters, [&] {
    opt.zeroGrad(true);
    Tensor loss = model->loss(x, y);
    loss.backward();
    nn::clipGradNorm_(model->parameters(), 1.0);
    opt.step();
  });
}

}  // namespace

int main(int argc, char** argv) {
  weft::bench::Flags flags;
  flags.onValue("--iters", [&](const std::string& v) { gIters = static_cast<int>(bench::intFlag("--iters", v, 1, 10000)); });
  flags.onValue("--only", [&](const std::string& v) { gOnly = v; });
  if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "cuda_bench", "usage: cuda_bench [--iters N] [--only SUBSTRING]\n")) {
    return 2;
  }
  try {
    std::printf("weft on %s\n\n", kc::properties(kDevice).name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench: no CUDA device: %s\n", e.what());
    return 1;
  }
  std::printf("| benchmark | unit | value |\n|---|---|---:|\n");
  row("copy", "GB/s", copyBandwidth);
  for (int64_t n : {4096, 8192}) {
    const std::string size = std::to_string(n);
    row("gemm f32 " + size, "TFLOP/s", [n] { return gemm(n, DType::Float32, false); });
    row("gemm tf32 " + size, "TFLOP/s", [n] { return gemm(n, DType::Float32, true); });
    row("gemm bf16 " + size, "TFLOP/s", [n] { return gemm(n, DType::BFloat16, false); });
  }

  const int64_t n = int64_t{64} << 20;
  row("add f32", "GB/s", [&] {
    Tensor a = randnOn({n}), b = randnOn({n});
    return gbPerS(3.0 * static_cast<double>(a.nbytes()), medianMs(3, gIters, [&] { (void)add(a, b); }));
  });
  row("add bf16", "GB/s", [&] {
    Tensor a = randnOn({n}, DType::BFloat16), b = randnOn({n}, DType::BFloat16);
    return gbPerS(3.0 * static_cast<double>(a.nbytes()), medianMs(3, gIters, [&] { (void)add(a, b); }));
  });
  row("gelu f32", "GB/s", [&] {
    Tensor a = randnOn({n});
    return gbPerS(2.0 * static_cast<double>(a.nbytes()), medianMs(3, gIters, [&] { (void)gelu(a); }));
  });
  const Shape rows{16384, 4096};
  row("sum last dim f32", "GB/s", [&] {
    Tensor a = randnOn(rows);
    const double bytes = static_cast<double>(a.nbytes() + static_cast<size_t>(rows[0]) * 4);
    return gbPerS(bytes, medianMs(3, gIters, [&] { (void)sum(a, {-1}); }));
  });
  row("softmax last dim f32", "GB/s", [&] {
    Tensor a = randnOn(rows);
    return gbPerS(2.0 * static_cast<double>(a.nbytes()), medianMs(3, gIters, [&] { (void)softmax(a, -1); }));
  });
  row("layer norm f32", "GB/s", [&] {
    Tensor a = randnOn(rows), w = randnOn({rows[1]}), b = randnOn({rows[1]});
    return gbPerS(2.0 * static_cast<double>(a.nbytes()),
                  medianMs(3, gIters, [&] { (void)layerNorm(a, {rows[1]}, w, b); }));
  });

  row("attention fwd bf16", "ms", [] { return attention(DType::BFloat16, false); });
  row("attention fwd+bwd bf16", "ms", [] { return attention(DType::BFloat16, true); });
  row("attention fwd+bwd f32", "ms", [] { return attention(DType::Float32, true); });

  row("mlp step", "ms", mlpStep);
  row("cnn step", "ms", cnnStep);
  row("lstm step", "ms", lstmStep);
  row("gpt step", "ms", [] { return gptStep(4, 4, 128, 128, 16); });
  row("gpt-wide step", "ms", [] { return gptStep(8, 8, 256, 256, 8); });
  return 0;
}
