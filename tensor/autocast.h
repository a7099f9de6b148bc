// Automatic mixed precision: inside an autocast scope the matrix products run
// in bfloat16 or float16 while the numerically sensitive ops run in float32,
// and the parameters stay float32 ("master weights").
//
//   Tensor w = randn({512, 512}).requiresGrad_();    // float32
//   {
//     autocast::Scope amp(DType::BFloat16);
//     Tensor h = linear(x, w);                        // bfloat16: x and w cast down
//     Tensor loss = crossEntropy(h, target);          // float32: h cast up
//     loss.backward();                                // w.grad() is float32
//   }
//
// Op policy while a scope is enabled (the casts are ordinary to(dtype) calls,
// so they are differentiable and each gradient arrives in its tensor's own
// dtype):
//   - low precision: mm, bmm, matmul, linear, conv2d and
//     scaledDotProductAttention(WithLse) cast their float32 operands to the
//     scope's dtype. float64 operands are left alone, as in PyTorch.
//   - float32: softmax, logSoftmax, layerNorm, the losses (nllLoss,
//     crossEntropy, mseLoss), sum and mean cast bfloat16/float16 operands up
//     to float32 and return float32.
//   - every other op follows its inputs; a binary op (add, sub, mul, div,
//     maximum, minimum, pow, eq, gt, lt), where, mergeAttention and cat/stack
//     whose floating operands differ in dtype promote them to the widest
//     (float64 > float32 > bfloat16, float16; bfloat16 with float16 gives
//     float32).
//     Outside a scope mixed dtypes stay an InvalidArgumentError.
// The backward pass runs without autocast (autograd suspends it): each
// backward rule computes in the dtypes its forward saw. Code that re-runs a
// forward during backward (activation checkpointing) must re-enter the state
// of the original forward: isEnabled() and dtype() captured then, a
// Scope(dtype, enabled) around the recomputation.
//
// Threading: the state is per thread. Scopes nest; the innermost decides,
// and `Scope(dtype, false)` turns autocast off for its extent. Destroy scopes
// in reverse order of construction (they are stack objects).
#pragma once

#include <initializer_list>
#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace weft::autocast {

class Scope {
 public:
  // dtype: BFloat16 or Float16 (InvalidArgumentError otherwise, naming it).
  explicit Scope(DType dtype = DType::BFloat16, bool enabled = true);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool prevEnabled_;
  DType prevDType_;
};

// Whether an autocast scope is enabled on this thread, and its dtype.
bool isEnabled();
DType dtype();

namespace detail {

// For a low-precision op: the scope's dtype when autocast is on and some
// defined operand is float32 or of the other 16-bit dtype (the op then
// re-runs on cast operands); nullopt otherwise.
std::optional<DType> lowFor(std::initializer_list<const Tensor*> operands);
// For a float32 op: Float32 when autocast is on and some defined operand is
// bfloat16/float16; nullopt otherwise.
std::optional<DType> float32For(std::initializer_list<const Tensor*> operands);
// For an op that follows its inputs: the widest floating dtype when autocast
// is on and the defined floating operands differ in dtype; nullopt otherwise.
std::optional<DType> promotedFor(std::initializer_list<const Tensor*> operands);
std::optional<DType> promotedFor(const std::vector<Tensor>& operands);
// t.to(d) for a defined floating t that is not float64 (or, with
// castDouble, any floating t); t itself otherwise.
Tensor cast(const Tensor& t, DType d, bool castDouble = false);

}  // namespace detail

}  // namespace weft::autocast
