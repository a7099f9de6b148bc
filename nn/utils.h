// Gradient and parameter utilities, as torch.nn.utils: gradient clipping and
// flattening a parameter list into one vector (and back).
//
//   loss.backward();
//   double norm = nn::clipGradNorm_(net->parameters(), 5.0);   // RNN training
//   opt.step();
//   Tensor flat = nn::parametersToVector(net->parameters());  // e.g. for a broadcast
//   nn::vectorToParameters(flat, other->parameters());
//
// Parameters without a gradient are ignored by the clipping functions.
// Gradients and parameters are changed in place without recording history.
#pragma once

#include <limits>
#include <vector>

#include "tensor/tensor.h"

namespace weft::nn {

// Scales all gradients by min(1, maxNorm / (total + 1e-6)), where total is
// the normType-norm of the concatenated gradients (normType may be
// infinity). Returns total. When errorIfNonfinite and total is NaN or
// infinite, raises InvalidArgumentError and leaves the gradients alone.
// Contiguous CUDA gradients are reduced on their device (float64
// accumulation, one value read back per device) and scaled there.
double clipGradNorm_(const std::vector<Tensor>& params, double maxNorm, double normType = 2.0,
                     bool errorIfNonfinite = false);
// Zeroes every defined gradient in place (PyTorch 1.13's default), or drops
// it when setToNone. Module::zeroGrad and Optimizer::zeroGrad both use it.
void zeroGrads(const std::vector<Tensor>& params, bool setToNone = false);
// Clamps every gradient element into [-clipValue, clipValue].
void clipGradValue_(const std::vector<Tensor>& params, double clipValue);

// The parameters flattened and concatenated into one 1-D tensor (a copy).
// They must share a dtype and device.
Tensor parametersToVector(const std::vector<Tensor>& params);
// Copies consecutive slices of the 1-D `vec` into the parameters; its length
// must equal their total element count.
void vectorToParameters(const Tensor& vec, const std::vector<Tensor>& params);

}  // namespace weft::nn
