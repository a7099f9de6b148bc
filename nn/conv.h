// 2-D convolution and max pooling over [N, C, H, W] tensors, as
// torch.nn.Conv2d and torch.nn.MaxPool2d.
//
//   auto conv = std::make_shared<nn::Conv2d>(1, 32, 3);        // 3×3, stride 1, no padding
//   auto pool = std::make_shared<nn::MaxPool2d>(2);            // 2×2, stride 2
//   Tensor y = pool->forward(relu(conv->forward(x)));          // [N,1,28,28] -> [N,32,13,13]
//
// Conv2d's parameters are "weight" [out, in, kh, kw] and "bias" [out]
// (absent when bias is false), initialised as PyTorch does: weight
// kaimingUniform_(a = sqrt(5)), i.e. U(±1/sqrt(fan_in)) with
// fan_in = in·kh·kw, and bias U(±1/sqrt(fan_in)).
#pragma once

#include <utility>

#include "nn/module.h"
#include "tensor/generator.h"

namespace weft::nn {

class Conv2d : public Module {
 public:
  using Pair = std::pair<int64_t, int64_t>;  // (height, width)

  // Channels and kernel sizes must be positive, strides positive, paddings
  // non-negative (InvalidArgumentError).
  Conv2d(int64_t inChannels, int64_t outChannels, Pair kernelSize, Pair stride = {1, 1}, Pair padding = {0, 0},
         bool bias = true);
  Conv2d(int64_t inChannels, int64_t outChannels, int64_t kernelSize, int64_t stride = 1, int64_t padding = 0,
         bool bias = true)
      : Conv2d(inChannels, outChannels, Pair{kernelSize, kernelSize}, Pair{stride, stride}, Pair{padding, padding},
               bias) {}

  // x [N, in, H, W] -> [N, out, H', W'].
  Tensor forward(const Tensor& x) override;
  void resetParameters(Generator* gen = nullptr);

  int64_t inChannels() const { return inChannels_; }
  int64_t outChannels() const { return outChannels_; }
  Pair kernelSize() const { return kernel_; }
  Pair stride() const { return stride_; }
  Pair padding() const { return padding_; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 protected:
  std::string extraRepr() const override;

 private:
  int64_t inChannels_;
  int64_t outChannels_;
  Pair kernel_;
  Pair stride_;
  Pair padding_;
  Tensor weight_;
  Tensor bias_;
};

class MaxPool2d : public Module {
 public:
  // stride 0 means the kernel size (PyTorch's default).
  explicit MaxPool2d(int64_t kernelSize, int64_t stride = 0, int64_t padding = 0);

  // x [N, C, H, W] -> [N, C, H', W'].
  Tensor forward(const Tensor& x) override;

  int64_t kernelSize() const { return kernel_; }
  int64_t stride() const { return stride_; }
  int64_t padding() const { return padding_; }

 protected:
  std::string extraRepr() const override;

 private:
  int64_t kernel_;
  int64_t stride_;
  int64_t padding_;
};

}  // namespace weft::nn
