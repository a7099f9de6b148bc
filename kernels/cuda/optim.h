// Fused multi-tensor kernels for the optimizers of nn/optim.h, the loss
// scaler's unscale (nn/amp.h) and gradient-norm clipping (nn/utils.h) on
// CUDA. There is no CPU twin of this header: on the CPU the same rules are
// loops in nn/optim.cpp, and each rule here repeats that file's per-element
// arithmetic operation for operation (contraction into fused multiply-adds
// is off for this file), so a CUDA step equals the CPU's to rounding of the
// same operations.
//
// Multi-tensor apply (kernels/cuda/tensor_table.h): a step over many
// parameters is one kernel launch per 32 tensors, or per 320 chunks of 64 Ki
// elements when those come first. The table of pointers and sizes travels
// in the launch's parameter block, so nothing is uploaded or synchronised.
//
//   std::vector<kernels::cuda::OptimTensor> ts;
//   ts.push_back({p.rawData(), g.rawData(), {m.rawData(), v.rawData()}, p.numel(), {-stepSize, bc2Sqrt}});
//   kernels::cuda::adamStep(DType::Float32, ts, {.beta1 = 0.9, ...});
//
// Contract: every pointer is device memory of the current device holding
// `numel` contiguous elements of `dtype` (float32 or float64; others are an
// InvalidArgumentError naming the op); a tensor's arrays do not overlap one
// another. Empty tensors are skipped. Everything is enqueued on the current
// stream; only gradScaleAndCheckFinite and gradPowerSum wait for it, to read
// back one value.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace weft::kernels::cuda {

// One parameter of a fused step: its value, gradient, up to three state
// buffers (by rule, below; nullptr where the options leave one out) and two
// per-parameter constants, as the CPU computes them in float64.
struct OptimTensor {
  void* param = nullptr;
  const void* grad = nullptr;
  void* state[3] = {nullptr, nullptr, nullptr};
  int64_t numel = 0;
  double scalar[2] = {0, 0};
};

// state[0] momentum_buffer (momentum != 0). scalar[0] != 0: the buffer is
// fresh (this is the parameter's first update) and is set to the gradient.
struct SgdStepOptions {
  double lr, momentum, dampening, weightDecay;
  bool nesterov, maximize;
};
void sgdStep(DType dtype, std::span<const OptimTensor> tensors, const SgdStepOptions& o);

// state[0] exp_avg, state[1] exp_avg_sq, state[2] max_exp_avg_sq (amsgrad).
// scalar[0] -lr / (1 - beta1^step), scalar[1] sqrt(1 - beta2^step).
// decoupled (AdamW): p *= 1 - lr * weightDecay instead of the L2 term.
struct AdamStepOptions {
  double lr, beta1, beta2, eps, weightDecay;
  bool amsgrad, maximize, decoupled;
};
void adamStep(DType dtype, std::span<const OptimTensor> tensors, const AdamStepOptions& o);

// state[0] sum. scalar[0] -lr / (1 + (step - 1) * lrDecay).
struct AdagradStepOptions {
  double weightDecay, eps;
  bool maximize;
};
void adagradStep(DType dtype, std::span<const OptimTensor> tensors, const AdagradStepOptions& o);

// state[0] square_avg, state[1] momentum_buffer (momentum > 0), state[2]
// grad_avg (centered).
struct RmspropStepOptions {
  double lr, alpha, eps, weightDecay, momentum;
  bool centered, maximize;
};
void rmspropStep(DType dtype, std::span<const OptimTensor> tensors, const RmspropStepOptions& o);

// A contiguous device array of `numel` elements of `dtype`.
struct DeviceArray {
  void* data = nullptr;
  DType dtype = DType::Float32;
  int64_t numel = 0;
};

// x[i] *= scale for every array (scale as float32 for float32 and the 16-bit
// dtypes, as kernels::cpu::scaleAndCheckFinite), and *found = whether any
// element was inf or NaN before scaling: one device flag, read back once for
// all arrays. Floating dtypes only.
void gradScaleAndCheckFinite(std::span<const DeviceArray> arrays, double scale, bool* found);

// x[i] *= scale for every array (scale as above), without a check or a wait.
void gradScale(std::span<const DeviceArray> arrays, double scale);

// *total = the sum of |x|^normType over all arrays' elements (normType > 0;
// the maximum |x| when normType is infinity, NaN when any x is NaN),
// accumulated in float64 on the device and read back once.
void gradPowerSum(std::span<const DeviceArray> arrays, double normType, double* total);

}  // namespace weft::kernels::cuda
