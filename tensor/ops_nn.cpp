// Neural-network ops (embedding, embeddingBag, conv2d, maxPool2d, dropout,
// layerNorm, lstmCell, lstmLayer); their gradient rules are in grad_rules/nn.cpp. Losses
// are in ops_loss.cpp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <mutex>
#include <type_traits>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/lstm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/conv.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/lstm.h"
#include "kernels/cuda/pool.h"
#include "kernels/cuda/random.h"
#endif
#include "tensor/autocast.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/op_checks.h"
#include "tensor/op_layout.h"
#include "tensor/ops.h"

namespace weft {
namespace {

using kernels::cpu::BagReduce;

// A contiguous tensor with the same values and no history: what kernels read.
Tensor packed(const Tensor& t) { return t.defined() ? t.detach().contiguous() : Tensor(); }

void checkTable(const char* op, const Tensor& weight) {
  detail::checkDefined(op, weight, "weight");
  detail::requireFloating(op, weight);
  WEFT_ENFORCE(weight.dim() == 2, InvalidArgumentError, op, ": weight must be 2-D [num, dim], got shape ",
               weight.shape());
}

// An Int64 tensor on the device of `ref`.
void checkIndexTensor(const char* op, const Tensor& t, const char* what, const Tensor& ref) {
  detail::requireDType(op, t, DType::Int64, what);
  WEFT_ENFORCE(t.device() == ref.device(), InvalidArgumentError, op, ": ", what, " on ", t.device().str(),
               " but the weight on ", ref.device().str(), "; both must be on one device");
}

TensorOptions like(const Tensor& t) { return {.dtype = t.dtype(), .device = t.device()}; }

}  // namespace

// ---- embedding ------------------------------------------------------------

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  checkTable("embedding", weight);
  checkIndexTensor("embedding", indices, "indices", weight);
  if (isLowPrecision(weight.dtype())) return embedding(weight.to(DType::Float32), indices).to(weight.dtype());
  Tensor w = packed(weight), idx = packed(indices);
  int64_t num = w.size(0), dim = w.size(1), n = idx.numel();
  Shape outShape = indices.shape();
  outShape.push_back(dim);
  Tensor out = empty(outShape, like(weight));
  if (w.device().isCuda()) {
    WEFT_CUDA_CALL(w.device().index, checkEmbeddingIndices("embedding", idx.data<int64_t>(), n, num));
    WEFT_CUDA_CALL(w.device().index,
                   embeddingForward(w.dtype(), w.rawData(), num, dim, idx.data<int64_t>(), n, out.rawData()));
  } else {
    kernels::cpu::checkEmbeddingIndices("embedding", idx.data<int64_t>(), n, num);
    kernels::cpu::embeddingForward(w.dtype(), w.rawData(), num, dim, idx.data<int64_t>(), n, out.rawData());
  }
  grad_rules::embeddingBackward(weight, out, idx);
  return out;
}

namespace {

// Bag b covers indices [starts[b], starts[b+1]); validates offsets as
// PyTorch's embedding_bag does (plus monotonicity, which it leaves unchecked).
std::vector<int64_t> bagStarts(const Tensor& indices, const Tensor& offsets) {
  const char* op = "embeddingBag";
  std::vector<int64_t> starts;
  if (indices.dim() == 2) {
    WEFT_ENFORCE(!offsets.defined(), InvalidArgumentError, op,
                 ": offsets must be undefined when indices are 2-D [bags, n] (fixed-size bags), got indices of shape ",
                 indices.shape(), " and offsets of shape ", offsets.shape());
    int64_t bags = indices.size(0), len = indices.size(1);
    starts.resize(bags + 1);
    for (int64_t b = 0; b <= bags; ++b) starts[b] = b * len;
    return starts;
  }
  WEFT_ENFORCE(offsets.defined(), InvalidArgumentError, op,
               ": 1-D indices need offsets (the position where each bag starts), got indices of shape ",
               indices.shape());
  checkIndexTensor(op, offsets, "offsets", indices);
  WEFT_ENFORCE(offsets.dim() == 1, InvalidArgumentError, op, ": offsets must be 1-D, got shape ", offsets.shape());
  starts = offsets.toVector<int64_t>();
  int64_t n = indices.numel();
  if (!starts.empty()) {
    WEFT_ENFORCE(starts[0] == 0, InvalidArgumentError, op,
                 ": offsets[0] must be 0 (the first bag starts at the first index), got ", starts[0]);
    for (size_t b = 1; b < starts.size(); ++b) {
      WEFT_ENFORCE(starts[b] >= starts[b - 1], InvalidArgumentError, op,
                   ": offsets must be non-decreasing, got offsets[", b - 1, "] = ", starts[b - 1], " > offsets[", b,
                   "] = ", starts[b]);
    }
    WEFT_ENFORCE(starts.back() <= n, InvalidArgumentError, op, ": offsets[", starts.size() - 1, "] = ", starts.back(),
                 " is beyond the end of the ", n, " indices");
  }
  starts.push_back(n);
  return starts;
}

const char* modeName(EmbeddingBagMode m) {
  switch (m) {
    case EmbeddingBagMode::Sum: return "Sum";
    case EmbeddingBagMode::Mean: return "Mean";
    case EmbeddingBagMode::Max: return "Max";
  }
  return "?";
}

}  // namespace

Tensor embeddingBag(const Tensor& weight, const Tensor& indices, const Tensor& offsets, EmbeddingBagMode mode,
                    const Tensor& perSampleWeights) {
  const char* op = "embeddingBag";
  checkTable(op, weight);
  checkIndexTensor(op, indices, "indices", weight);
  WEFT_ENFORCE(indices.dim() == 1 || indices.dim() == 2, InvalidArgumentError, op,
               ": indices must be 1-D (with offsets) or 2-D [bags, n], got shape ", indices.shape());
  std::vector<int64_t> starts = bagStarts(indices, offsets);
  int64_t bags = static_cast<int64_t>(starts.size()) - 1;
  Tensor psw;
  if (perSampleWeights.defined()) {
    WEFT_ENFORCE(mode == EmbeddingBagMode::Sum, InvalidArgumentError, op,
                 ": perSampleWeights are only supported in Sum mode, got mode ", modeName(mode));
    detail::checkSameKind(op, weight, perSampleWeights);
    WEFT_ENFORCE(perSampleWeights.shape() == indices.shape(), InvalidArgumentError, op, ": perSampleWeights of shape ",
                 perSampleWeights.shape(), " must match indices of shape ", indices.shape());
    psw = packed(perSampleWeights);
  }
  if (isLowPrecision(weight.dtype())) {
    return embeddingBag(weight.to(DType::Float32), indices, offsets, mode,
                        psw.defined() ? perSampleWeights.to(DType::Float32) : Tensor())
        .to(weight.dtype());
  }
  Tensor w = packed(weight), idx = packed(indices);
  int64_t num = w.size(0), dim = w.size(1);
  BagReduce reduce = mode == EmbeddingBagMode::Sum ? BagReduce::Sum
                     : mode == EmbeddingBagMode::Mean ? BagReduce::Mean
                                                      : BagReduce::Max;
  Tensor out = empty({bags, dim}, like(weight));
  Tensor argmax =
      reduce == BagReduce::Max ? empty({bags, dim}, {.dtype = DType::Int64, .device = weight.device()}) : Tensor();
  // The bag bounds, validated on the host, where the kernels read them.
  Tensor st = fromVector(starts, {bags + 1});
  if (w.device().isCuda()) st = st.to(w.device());
  const void* pp = psw.defined() ? psw.rawData() : nullptr;
  int64_t* ap = argmax.defined() ? argmax.data<int64_t>() : nullptr;
  if (w.device().isCuda()) {
    WEFT_CUDA_CALL(w.device().index, checkEmbeddingIndices(op, idx.data<int64_t>(), idx.numel(), num));
    WEFT_CUDA_CALL(w.device().index, embeddingBagForward(w.dtype(), w.rawData(), num, dim, idx.data<int64_t>(),
                                                         st.data<int64_t>(), bags, reduce, pp, out.rawData(), ap));
  } else {
    kernels::cpu::checkEmbeddingIndices(op, idx.data<int64_t>(), idx.numel(), num);
    kernels::cpu::embeddingBagForward(w.dtype(), w.rawData(), num, dim, idx.data<int64_t>(), st.data<int64_t>(), bags,
                                      reduce, pp, out.rawData(), ap);
  }
  grad_rules::embeddingBagBackward(weight, perSampleWeights, out, w, idx, psw, argmax, st, reduce);
  return out;
}

// ---- convolution and pooling -------------------------------------------------

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::pair<int64_t, int64_t> stride,
              std::pair<int64_t, int64_t> padding) {
  const char* op = "conv2d";
  if (auto d = autocast::detail::lowFor({&x, &weight, &bias})) {
    return conv2d(autocast::detail::cast(x, *d), autocast::detail::cast(weight, *d), autocast::detail::cast(bias, *d),
                  stride, padding);
  }
  detail::checkSameKind(op, x, weight);
  detail::requireFloating(op, x);
  WEFT_ENFORCE(x.dim() == 4, InvalidArgumentError, op, ": input must be 4-D [N, C, H, W], got shape ", x.shape());
  WEFT_ENFORCE(weight.dim() == 4, InvalidArgumentError, op, ": weight must be 4-D [O, C, kh, kw], got shape ",
               weight.shape());
  WEFT_ENFORCE(weight.size(1) == x.size(1), InvalidArgumentError, op, ": weight of shape ", weight.shape(),
               " expects ", weight.size(1), " input channels, got input of shape ", x.shape());
  if (bias.defined()) {
    detail::checkSameKind(op, x, bias);
    WEFT_ENFORCE(bias.dim() == 1 && bias.size(0) == weight.size(0), InvalidArgumentError, op, ": bias of shape ",
                 bias.shape(), " does not match weight of shape ", weight.shape(), " (expected [", weight.size(0),
                 "])");
  }
  auto [sh, sw] = stride;
  auto [ph, pw] = padding;
  WEFT_ENFORCE(sh >= 1 && sw >= 1, InvalidArgumentError, op, ": stride must be positive, got (", sh, ", ", sw, ")");
  WEFT_ENFORCE(ph >= 0 && pw >= 0, InvalidArgumentError, op, ": padding must be non-negative, got (", ph, ", ", pw,
               ")");
  kernels::cpu::Conv2dGeometry geo{.batch = x.size(0), .inChannels = x.size(1), .height = x.size(2),
                                   .width = x.size(3), .outChannels = weight.size(0), .kernelH = weight.size(2),
                                   .kernelW = weight.size(3), .strideH = sh, .strideW = sw, .padH = ph, .padW = pw};
  WEFT_ENFORCE(geo.height + 2 * ph >= geo.kernelH && geo.width + 2 * pw >= geo.kernelW, InvalidArgumentError, op,
               ": kernel of size (", geo.kernelH, ", ", geo.kernelW, ") is larger than the padded input (",
               geo.height + 2 * ph, ", ", geo.width + 2 * pw, ") of input shape ", x.shape());
  if (isLowPrecision(x.dtype())) {
    autocast::Scope plain(x.dtype(), false);  // the float32 computation of a 16-bit op: not cast down again
    return conv2d(x.to(DType::Float32), weight.to(DType::Float32), bias.defined() ? bias.to(DType::Float32) : Tensor(),
                  stride, padding)
        .to(x.dtype());
  }
  geo.outH = (geo.height + 2 * ph - geo.kernelH) / sh + 1;
  geo.outW = (geo.width + 2 * pw - geo.kernelW) / sw + 1;
  Tensor xc = packed(x), wc = packed(weight), bc = packed(bias);
  Tensor out = empty({geo.batch, geo.outChannels, geo.outH, geo.outW}, like(x));
  const void* pb = bc.defined() ? bc.rawData() : nullptr;
  if (x.device().isCuda()) {
    WEFT_CUDA_CALL(x.device().index, conv2dForward(x.dtype(), geo, xc.rawData(), wc.rawData(), pb, out.rawData()));
  } else {
    kernels::cpu::conv2dForward(x.dtype(), geo, xc.rawData(), wc.rawData(), pb, out.rawData());
  }
  grad_rules::conv2dBackward(x, weight, bias, out, xc, wc, geo);
  return out;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding) {
  return conv2d(x, weight, bias, {stride, stride}, {padding, padding});
}

Tensor maxPool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  const char* op = "maxPool2d";
  detail::checkDefined(op, x, "input");
  detail::requireFloating(op, x);
  WEFT_ENFORCE(x.dim() == 4, InvalidArgumentError, op, ": input must be 4-D [N, C, H, W], got shape ", x.shape());
  if (isLowPrecision(x.dtype())) return maxPool2d(x.to(DType::Float32), kernel, stride, padding).to(x.dtype());
  if (stride == 0) stride = kernel;
  WEFT_ENFORCE(kernel >= 1 && stride >= 1, InvalidArgumentError, op, ": kernel (", kernel, ") and stride (", stride,
               ") must be positive");
  WEFT_ENFORCE(padding >= 0 && 2 * padding <= kernel, InvalidArgumentError, op, ": padding ", padding,
               " must be between 0 and half the kernel size ", kernel);
  int64_t H = x.size(2), W = x.size(3);
  WEFT_ENFORCE(H + 2 * padding >= kernel && W + 2 * padding >= kernel, InvalidArgumentError, op, ": input of shape ",
               x.shape(), " is smaller than the kernel ", kernel, " (padding ", padding, ")");
  kernels::cpu::Pool2dGeometry geo{.planes = x.size(0) * x.size(1), .height = H, .width = W, .kernelH = kernel,
                                   .kernelW = kernel, .strideH = stride, .strideW = stride, .padH = padding,
                                   .padW = padding};
  geo.outH = (H + 2 * padding - kernel) / stride + 1;
  geo.outW = (W + 2 * padding - kernel) / stride + 1;
  Tensor xc = packed(x);
  Tensor out = empty({x.size(0), x.size(1), geo.outH, geo.outW}, like(x));
  Tensor argmax = empty(out.shape(), {.dtype = DType::Int64, .device = x.device()});
  if (out.numel() > 0 && x.device().isCuda()) {
    WEFT_CUDA_CALL(x.device().index, maxPool2dForward(x.dtype(), geo, xc.rawData(), out.rawData(),
                                                      argmax.data<int64_t>()));
  } else if (out.numel() > 0) {
    kernels::cpu::maxPool2dForward(x.dtype(), geo, xc.rawData(), out.rawData(), argmax.data<int64_t>());
  }
  grad_rules::maxPool2dBackward(x, out, argmax, geo);
  return out;
}

// ---- dropout ---------------------------------------------------------------------

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  detail::checkDefined("dropout", x, "input");
  WEFT_ENFORCE(p >= 0.0 && p <= 1.0, InvalidArgumentError, "dropout: probability has to be between 0 and 1, got ", p);
  if (!training || p == 0.0) return x;
  detail::requireFloating("dropout", x);
  if (isLowPrecision(x.dtype())) return dropout(x.to(DType::Float32), p, training, gen).to(x.dtype());
  if (x.device().isCuda()) {
    // One Philox counter per element at most (kernels/cuda/random.h).
    Tensor xc = x.detach().contiguous();
    Tensor mask = empty(x.shape(), like(x));
    Tensor out = empty(x.shape(), like(x));
    [[maybe_unused]] const PhiloxKey key = reservePhilox(gen, static_cast<uint64_t>(xc.numel()));
    WEFT_CUDA_CALL(x.device().index, dropoutForward(x.dtype(), xc.rawData(), xc.numel(), p, key.seed, key.offset,
                                                    mask.rawData(), out.rawData()));
    grad_rules::dropoutBackward(x, out, mask);
    return out;
  }
  // mask = 0 with probability p, else 1 / (1 - p); all zeros when p == 1.
  // Element i is dropped when the generator's i-th nextDouble() would be
  // below p: (u >> 11) * 2^-53 < p, that is (u >> 11) < p * 2^53.
  Tensor xc = x.detach().contiguous();
  Tensor mask = empty(x.shape(), like(x));
  Tensor out = empty(x.shape(), like(x));
  const int64_t n = mask.numel();
  std::unique_lock<std::mutex> lock;
  if (!gen) {
    lock = std::unique_lock<std::mutex>(defaultGeneratorMutex());
    gen = &defaultGenerator();
  }
  const double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
  // k < p * 2^53 for an integer k is k < ceil(p * 2^53).
  const auto threshold = static_cast<uint64_t>(std::ceil(p * 0x1.0p53));
  WEFT_DISPATCH_FLOATING(x.dtype(), "dropout", [&]<class T>() {
    const T* px = xc.data<T>();
    T* m = mask.data<T>();
    T* po = out.data<T>();
    const T keep = static_cast<T>(scale);
    constexpr int64_t kBlock = 1024;
    uint64_t bits[kBlock];
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t len = std::min(kBlock, n - b);
      if (p == 1.0) {
        std::fill(m + b, m + b + len, T(0));
      } else {
        gen->fillU64(bits, len);
        // Branch-free (the draws are unpredictable): keep's bits under an
        // all-ones or all-zeros mask.
        using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
        const Bits keepBits = std::bit_cast<Bits>(keep);
        for (int64_t i = 0; i < len; ++i) {
          const Bits kept = Bits{0} - static_cast<Bits>((bits[i] >> 11) >= threshold);
          m[b + i] = std::bit_cast<T>(static_cast<Bits>(keepBits & kept));
        }
      }
      for (int64_t i = 0; i < len; ++i) po[b + i] = px[b + i] * m[b + i];
    }
  });
  grad_rules::dropoutBackward(x, out, mask);
  return out;
}

// ---- layer normalisation -------------------------------------------------------------

Tensor layerNorm(const Tensor& x, const Shape& normalizedShape, const Tensor& weight, const Tensor& bias,
                 double eps) {
  const char* op = "layerNorm";
  if (autocast::detail::float32For({&x, &weight, &bias})) {
    return layerNorm(autocast::detail::cast(x, DType::Float32), normalizedShape,
                     autocast::detail::cast(weight, DType::Float32), autocast::detail::cast(bias, DType::Float32), eps);
  }
  detail::checkDefined(op, x, "input");
  detail::requireFloating(op, x);
  const int64_t nd = static_cast<int64_t>(normalizedShape.size());
  WEFT_ENFORCE(nd >= 1, InvalidArgumentError, op, ": normalizedShape must have at least one dimension, got ",
               normalizedShape);
  bool trailing = x.dim() >= nd;
  for (int64_t d = 0; trailing && d < nd; ++d) trailing = x.size(x.dim() - nd + d) == normalizedShape[d];
  WEFT_ENFORCE(trailing, InvalidArgumentError, op, ": input of shape ", x.shape(),
               " does not end in normalizedShape ", normalizedShape);
  for (const auto& [t, what] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->defined()) continue;
    detail::checkSameKind(op, x, *t);
    WEFT_ENFORCE(t->shape() == normalizedShape, InvalidArgumentError, op, ": ", what, " of shape ", t->shape(),
                 " must equal normalizedShape ", normalizedShape);
  }
  WEFT_ENFORCE(eps >= 0.0, InvalidArgumentError, op, ": eps must be non-negative, got ", eps);
  if (isLowPrecision(x.dtype())) {
    auto up = [](const Tensor& t) { return t.defined() ? t.to(DType::Float32) : Tensor(); };
    return layerNorm(up(x), normalizedShape, up(weight), up(bias), eps).to(x.dtype());
  }
  int64_t n = 1;
  for (int64_t s : normalizedShape) n *= s;
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor xc = packed(x), wc = packed(weight), bc = packed(bias);
  Tensor out = empty(x.shape(), like(x));
  Tensor mean = empty({rows}, like(x)), rstd = empty({rows}, like(x));
  const void* wp = wc.defined() ? wc.rawData() : nullptr;
  const void* bp = bc.defined() ? bc.rawData() : nullptr;
  if (x.device().isCuda()) {
    WEFT_CUDA_CALL(x.device().index, layerNormForward(x.dtype(), xc.rawData(), rows, n, wp, bp, eps, out.rawData(),
                                                      mean.rawData(), rstd.rawData()));
  } else {
    kernels::cpu::layerNormForward(x.dtype(), xc.rawData(), rows, n, wp, bp, eps, out.rawData(), mean.rawData(),
                                   rstd.rawData());
  }
  grad_rules::layerNormBackward(x, weight, bias, out, xc, wc, mean, rstd, rows, n);
  return out;
}

// ---- LSTM cell and layer -------------------------------------------------------------

namespace {

// The checks lstmCell and lstmLayer share: x [..., N, in] (its last two
// dimensions), h and c [N, H], wIh [4H, in], wHh [4H, H], biases [4H] or undefined.
void checkLstmArguments(const char* op, const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& wIh,
                        const Tensor& wHh, const Tensor& bIh, const Tensor& bHh) {
  detail::checkSameKind(op, x, wIh);
  detail::checkSameKind(op, x, wHh);
  detail::checkSameKind(op, x, h);
  detail::checkSameKind(op, x, c);
  detail::requireFloating(op, x);
  WEFT_ENFORCE(wIh.dim() == 2 && wIh.size(0) % 4 == 0 && wIh.size(1) == x.size(-1), InvalidArgumentError, op,
               ": wIh of shape ", wIh.shape(), " must be [4*hidden, in] for input of shape ", x.shape());
  const int64_t N = x.size(-2), H = wIh.size(0) / 4;
  WEFT_ENFORCE(wHh.shape() == (Shape{4 * H, H}), InvalidArgumentError, op, ": wHh of shape ", wHh.shape(),
               " must be [", 4 * H, ", ", H, "] for wIh of shape ", wIh.shape());
  WEFT_ENFORCE(h.shape() == (Shape{N, H}) && c.shape() == (Shape{N, H}), InvalidArgumentError, op, ": h of shape ",
               h.shape(), " and c of shape ", c.shape(), " must both be [", N, ", ", H, "]");
  for (const Tensor* b : {&bIh, &bHh}) {
    if (!b->defined()) continue;
    detail::checkSameKind(op, x, *b);
    WEFT_ENFORCE(b->shape() == Shape{4 * H}, InvalidArgumentError, op, ": bias of shape ", b->shape(), " must be [",
                 4 * H, "]");
  }
}

// bIh + bHh as one contiguous tensor with no history; undefined without biases.
Tensor combinedBias(const Tensor& bIh, const Tensor& bHh) {
  if (bIh.defined() && bHh.defined()) {
    NoGradGuard ng;
    return add(bIh.detach(), bHh.detach()).contiguous();
  }
  return packed(bIh.defined() ? bIh : bHh);
}

}  // namespace

std::pair<Tensor, Tensor> lstmCell(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& wIh,
                                   const Tensor& wHh, const Tensor& bIh, const Tensor& bHh) {
  const char* op = "lstmCell";
  WEFT_ENFORCE(x.dim() == 2, InvalidArgumentError, op, ": input must be 2-D [N, in], got shape ", x.shape());
  checkLstmArguments(op, x, h, c, wIh, wHh, bIh, bHh);
  if (isLowPrecision(x.dtype())) {
    auto up = [](const Tensor& t) { return t.defined() ? t.to(DType::Float32) : Tensor(); };
    auto [h1, c1] = lstmCell(up(x), up(h), up(c), up(wIh), up(wHh), up(bIh), up(bHh));
    return {h1.to(x.dtype()), c1.to(x.dtype())};
  }
  int64_t N = x.size(0), in = x.size(1), H = wIh.size(0) / 4;
  DType dt = x.dtype();
  Tensor xc = packed(x), hc = packed(h), cc = packed(c), wi = packed(wIh), wh = packed(wHh);

  // gates = x · wIh^T + h · wHh^T + (bIh + bHh)
  Tensor gates = empty({N, 4 * H}, like(x));
  Tensor cNew = empty({N, H}, like(x)), hNew = empty({N, H}, like(x));
  Tensor bias = combinedBias(bIh, bHh);
  if (x.device().isCuda()) {  // one step of a layer: the same GEMMs and cell, on the device
    [[maybe_unused]] const kernels::cpu::LstmLayerGeometry step{.steps = 1, .batch = N, .input = in, .hidden = H};
    WEFT_CUDA_CALL(x.device().index,
                   lstmLayerForward(dt, step, xc.rawData(), hc.rawData(), cc.rawData(), wi.rawData(), wh.rawData(),
                                    bias.defined() ? bias.rawData() : nullptr, gates.rawData(), hNew.rawData(),
                                    cNew.rawData()));
  } else {
    double beta = 0.0;
    if (bias.defined()) {
      kernels::cpu::fillRows(dt, bias.rawData(), N, 4 * H, gates.rawData(), 4 * H);
      beta = 1.0;
    }
    kernels::cpu::gemm(dt, {xc.rawData(), false, in}, {wi.rawData(), true, in}, N, 4 * H, in, 1.0, beta,
                       gates.rawData(), 4 * H);
    kernels::cpu::gemm(dt, {hc.rawData(), false, H}, {wh.rawData(), true, H}, N, 4 * H, H, 1.0, 1.0,
                       gates.rawData(), 4 * H);
    kernels::cpu::lstmCellForward(dt, N, H, gates.rawData(), cc.rawData(), cNew.rawData(), hNew.rawData());
  }

  grad_rules::lstmCellBackward({x, h, c, wIh, wHh, bIh, bHh}, hNew, cNew, xc, hc, cc, wi, wh, gates);
  return {hNew, cNew};
}

LstmLayerOutput lstmLayer(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& wIh, const Tensor& wHh,
                          const Tensor& bIh, const Tensor& bHh) {
  const char* op = "lstmLayer";
  WEFT_ENFORCE(x.dim() == 3 && x.size(0) > 0, InvalidArgumentError, op,
               ": input must be 3-D [T, N, in] with T > 0, got shape ", x.shape());
  checkLstmArguments(op, x, h0, c0, wIh, wHh, bIh, bHh);
  if (isLowPrecision(x.dtype())) {
    auto up = [](const Tensor& t) { return t.defined() ? t.to(DType::Float32) : Tensor(); };
    LstmLayerOutput r = lstmLayer(up(x), up(h0), up(c0), up(wIh), up(wHh), up(bIh), up(bHh));
    return {r.output.to(x.dtype()), r.h.to(x.dtype()), r.c.to(x.dtype())};
  }
  const kernels::cpu::LstmLayerGeometry geo{
      .steps = x.size(0), .batch = x.size(1), .input = x.size(2), .hidden = wIh.size(0) / 4};
  const int64_t T = geo.steps, N = geo.batch, H = geo.hidden;
  const DType dt = x.dtype();
  Tensor xc = packed(x), hc = packed(h0), cc = packed(c0), wi = packed(wIh), wh = packed(wHh);
  Tensor bias = combinedBias(bIh, bHh);
  Tensor gates = empty({T, N, 4 * H}, like(x)), hs = empty({T, N, H}, like(x)), cs = empty({T, N, H}, like(x));
  const void* pb = bias.defined() ? bias.rawData() : nullptr;
  if (x.device().isCuda()) {
    WEFT_CUDA_CALL(x.device().index, lstmLayerForward(dt, geo, xc.rawData(), hc.rawData(), cc.rawData(), wi.rawData(),
                                                      wh.rawData(), pb, gates.rawData(), hs.rawData(), cs.rawData()));
  } else {
    kernels::cpu::lstmLayerForward(dt, geo, xc.rawData(), hc.rawData(), cc.rawData(), wi.rawData(), wh.rawData(), pb,
                                   gates.rawData(), hs.rawData(), cs.rawData());
  }
  LstmLayerOutput result;
  result.output = hs;
  result.h = hs.select(0, T - 1).clone();
  result.c = cs.select(0, T - 1).clone();

  grad_rules::lstmLayerBackward({x, h0, c0, wIh, wHh, bIh, bHh}, {result.output, result.h, result.c}, xc, hc, cc, wi,
                                wh, gates, hs, cs, geo);
  return result;
}

}  // namespace weft
