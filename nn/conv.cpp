#include "nn/conv.h"

#include <cmath>

#include "nn/init.h"
#include "tensor/ops.h"

namespace weft::nn {

Conv2d::Conv2d(int64_t inChannels, int64_t outChannels, Pair kernelSize, Pair stride, Pair padding, bool bias)
    : Module("Conv2d"),
      inChannels_(inChannels),
      outChannels_(outChannels),
      kernel_(kernelSize),
      stride_(stride),
      padding_(padding) {
  WEFT_ENFORCE(inChannels > 0 && outChannels > 0, InvalidArgumentError, "Conv2d: channels must be positive, got in ",
               inChannels, ", out ", outChannels);
  WEFT_ENFORCE(kernelSize.first > 0 && kernelSize.second > 0, InvalidArgumentError,
               "Conv2d: kernel size must be positive, got (", kernelSize.first, ", ", kernelSize.second, ")");
  WEFT_ENFORCE(stride.first > 0 && stride.second > 0, InvalidArgumentError, "Conv2d: stride must be positive, got (",
               stride.first, ", ", stride.second, ")");
  WEFT_ENFORCE(padding.first >= 0 && padding.second >= 0, InvalidArgumentError,
               "Conv2d: padding must be non-negative, got (", padding.first, ", ", padding.second, ")");
  weight_ = registerParameter("weight", empty({outChannels, inChannels, kernelSize.first, kernelSize.second}));
  if (bias) bias_ = registerParameter("bias", empty({outChannels}));
  resetParameters();
}

void Conv2d::resetParameters(Generator* gen) {
  init::kaimingUniform_(weight_, std::sqrt(5.0), init::FanMode::FanIn, init::Nonlinearity::LeakyRelu, gen);
  if (bias_.defined()) {
    double bound = 1.0 / std::sqrt(static_cast<double>(init::calculateFanInAndFanOut(weight_).first));
    init::uniform_(bias_, -bound, bound, gen);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  WEFT_ENFORCE(x.defined() && x.dim() == 4 && x.size(1) == inChannels_, InvalidArgumentError, "Conv2d(",
               inChannels_, " -> ", outChannels_, "): expected input [N, ", inChannels_, ", H, W], got shape ",
               x.defined() ? x.shape() : Shape{});
  return conv2d(x, weight_, bias_, stride_, padding_);
}

std::string Conv2d::extraRepr() const {
  auto pair = [](Pair p) { return detail::concat("(", p.first, ", ", p.second, ")"); };
  std::string s = detail::concat(inChannels_, ", ", outChannels_, ", kernel_size=", pair(kernel_),
                                 ", stride=", pair(stride_));
  if (padding_ != Pair{0, 0}) s += ", padding=" + pair(padding_);
  if (!bias_.defined()) s += ", bias=false";
  return s;
}

MaxPool2d::MaxPool2d(int64_t kernelSize, int64_t stride, int64_t padding)
    : Module("MaxPool2d"), kernel_(kernelSize), stride_(stride == 0 ? kernelSize : stride), padding_(padding) {
  WEFT_ENFORCE(kernelSize > 0 && stride >= 0, InvalidArgumentError, "MaxPool2d: kernel size must be positive and "
               "stride non-negative, got kernel ", kernelSize, ", stride ", stride);
  WEFT_ENFORCE(padding >= 0 && 2 * padding <= kernelSize, InvalidArgumentError,
               "MaxPool2d: padding must be in [0, kernel/2], got ", padding, " for kernel ", kernelSize);
}

Tensor MaxPool2d::forward(const Tensor& x) { return maxPool2d(x, kernel_, stride_, padding_); }

std::string MaxPool2d::extraRepr() const {
  return detail::concat("kernel_size=", kernel_, ", stride=", stride_, ", padding=", padding_);
}

}  // namespace weft::nn
