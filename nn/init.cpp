#include "nn/init.h"

#include <cmath>

#include "tensor/ops.h"

namespace weft::nn::init {

namespace {

void checkFloating(const Tensor& t, const char* op) {
  WEFT_ENFORCE(t.defined(), InvalidArgumentError, op, ": the tensor is undefined");
  WEFT_ENFORCE(isFloating(t.dtype()), InvalidArgumentError, op, ": needs a floating tensor, got ",
               dtypeName(t.dtype()));
}

// Overwrites t's values with `values` (same shape, any device/dtype).
Tensor fill(const Tensor& t, const Tensor& values) {
  NoGradGuard ng;
  Tensor v = values.dtype() == t.dtype() ? values : values.to(t.dtype());
  Tensor(t.implPtr()).copy_(v);
  return t;
}

int64_t fanFor(const Tensor& t, FanMode mode, const char* op) {
  WEFT_ENFORCE(t.dim() >= 2, InvalidArgumentError, op, ": fan in and fan out need at least 2 dimensions, got shape ",
               t.shape());
  auto [fanIn, fanOut] = calculateFanInAndFanOut(t);
  int64_t fan = mode == FanMode::FanIn ? fanIn : fanOut;
  WEFT_ENFORCE(fan > 0, InvalidArgumentError, op, ": zero fan for shape ", t.shape());
  return fan;
}

}  // namespace

double calculateGain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv:
    case Nonlinearity::Sigmoid:
      return 1.0;
    case Nonlinearity::Tanh:
      return 5.0 / 3.0;
    case Nonlinearity::Relu:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyRelu: {
      double slope = param < 0 ? 0.01 : param;
      return std::sqrt(2.0 / (1.0 + slope * slope));
    }
  }
  return 1.0;
}

std::pair<int64_t, int64_t> calculateFanInAndFanOut(const Tensor& t) {
  WEFT_ENFORCE(t.defined() && t.dim() >= 2, InvalidArgumentError,
               "calculateFanInAndFanOut: needs a tensor of at least 2 dimensions, got shape ",
               t.defined() ? t.shape() : Shape{});
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor uniform_(const Tensor& t, double low, double high, Generator* gen) {
  checkFloating(t, "uniform_");
  WEFT_ENFORCE(low <= high, InvalidArgumentError, "uniform_: low ", low, " is greater than high ", high);
  return fill(t, uniform(t.shape(), low, high, {.dtype = t.dtype(), .device = t.device()}, gen));
}

Tensor normal_(const Tensor& t, double mean, double std, Generator* gen) {
  checkFloating(t, "normal_");
  WEFT_ENFORCE(std >= 0, InvalidArgumentError, "normal_: std must be non-negative, got ", std);
  Tensor z = randn(t.shape(), {.dtype = t.dtype(), .device = t.device()}, gen);
  NoGradGuard ng;
  if (std != 1.0) z.mul_(std);
  if (mean != 0.0) z = add(z, mean);
  return fill(t, z);
}

Tensor constant_(const Tensor& t, double value) {
  checkFloating(t, "constant_");
  NoGradGuard ng;
  Tensor(t.implPtr()).fill_(value);
  return t;
}

Tensor zeros_(const Tensor& t) { return constant_(t, 0.0); }
Tensor ones_(const Tensor& t) { return constant_(t, 1.0); }

Tensor kaimingUniform_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  checkFloating(t, "kaimingUniform_");
  int64_t fan = fanFor(t, mode, "kaimingUniform_");
  double bound = calculateGain(nonlinearity, a) * std::sqrt(3.0 / static_cast<double>(fan));
  return uniform_(t, -bound, bound, gen);
}

Tensor kaimingNormal_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  checkFloating(t, "kaimingNormal_");
  int64_t fan = fanFor(t, mode, "kaimingNormal_");
  return normal_(t, 0.0, calculateGain(nonlinearity, a) / std::sqrt(static_cast<double>(fan)), gen);
}

Tensor xavierUniform_(const Tensor& t, double gain, Generator* gen) {
  checkFloating(t, "xavierUniform_");
  fanFor(t, FanMode::FanIn, "xavierUniform_");
  auto [fanIn, fanOut] = calculateFanInAndFanOut(t);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(fanIn + fanOut));
  return uniform_(t, -bound, bound, gen);
}

Tensor xavierNormal_(const Tensor& t, double gain, Generator* gen) {
  checkFloating(t, "xavierNormal_");
  fanFor(t, FanMode::FanIn, "xavierNormal_");
  auto [fanIn, fanOut] = calculateFanInAndFanOut(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fanIn + fanOut)), gen);
}

}  // namespace weft::nn::init
