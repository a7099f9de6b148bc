// Parameter initialisation, after torch.nn.init: fill a tensor in place from
// a distribution, with the gains and fan computations PyTorch uses, so that a
// weft model starts from the same distributions as its PyTorch twin.
//
//   Tensor w = empty({256, 784});
//   nn::init::kaimingUniform_(w, std::sqrt(5.0));   // Linear's default: U(±1/sqrt(784))
//   nn::init::zeros_(bias);
//   Generator g(42);
//   nn::init::normal_(emb, 0.0, 1.0, &g);           // reproducible
//
// Every function writes into `t`'s existing storage without recording
// autograd history (it works on parameters that require grad) and returns
// `t`. Random draws come from `gen`, or from the process default generator
// when null (tensor/generator.h). `t` must be a floating tensor; the fan-based
// ones need at least two dimensions (InvalidArgumentError otherwise).
#pragma once

#include <cstdint>
#include <utility>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace weft::nn::init {

enum class Nonlinearity { Linear, Conv, Sigmoid, Tanh, Relu, LeakyRelu };
enum class FanMode { FanIn, FanOut };

// torch.nn.init.calculate_gain. `param` is LeakyRelu's negative slope
// (PyTorch's default 0.01 is used when it is negative).
double calculateGain(Nonlinearity nonlinearity, double param = -1.0);
// (fan_in, fan_out) of a weight [out, in, k...]: in·∏k and out·∏k.
std::pair<int64_t, int64_t> calculateFanInAndFanOut(const Tensor& t);

Tensor uniform_(const Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
Tensor normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor constant_(const Tensor& t, double value);
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);

// U(-b, b) with b = gain·sqrt(3 / fan), gain = calculateGain(nonlinearity, a).
// With a = sqrt(5) (Linear and Conv2d's default) b is exactly 1/sqrt(fan_in).
Tensor kaimingUniform_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyRelu, Generator* gen = nullptr);
// N(0, std²) with std = gain / sqrt(fan).
Tensor kaimingNormal_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                      Nonlinearity nonlinearity = Nonlinearity::LeakyRelu, Generator* gen = nullptr);
// U(-b, b) with b = gain·sqrt(6 / (fan_in + fan_out)).
Tensor xavierUniform_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);
// N(0, std²) with std = gain·sqrt(2 / (fan_in + fan_out)).
Tensor xavierNormal_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace weft::nn::init
