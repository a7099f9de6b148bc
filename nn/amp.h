// Dynamic loss scaling for float16 training, with the semantics of PyTorch's
// torch.cuda.amp.GradScaler: the loss is multiplied by a large scale before
// backward so that small float16 gradients do not flush to zero; the
// gradients are divided by it again before the optimizer step; a step whose
// gradients overflowed (inf or NaN) is skipped and the scale backs off, and
// after growthInterval good steps in a row the scale grows.
//
//   nn::GradScaler scaler;                          // scale 2^16
//   for (...) {
//     opt.zeroGrad();
//     Tensor loss;
//     {
//       autocast::Scope amp(DType::Float16);
//       loss = crossEntropy(model.forward(x), y);
//     }
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);                         // optional: to clip true gradients
//     nn::clipGradNorm_(opt.params(), 1.0);
//     scaler.step(opt);                             // skipped on inf/NaN gradients
//     scaler.update();                              // back off or grow the scale
//   }
//
// Contract:
//  - scale(loss) is loss * scale, computed in float32 (float64 for a float64
//    loss): a 16-bit loss is cast up first, as the scaled value may not fit.
//  - unscale_(opt) multiplies every defined .grad of opt's parameters in
//    place by 1 / scale (as float32, PyTorch's inv_scale), checking them for
//    inf/NaN in the same pass over their memory. At most once per optimizer
//    between update() calls (InvalidArgumentError on a second call). The
//    params form does the same for a list of parameters and counts as one
//    more "optimizer" whose overflow update() sees.
//  - step(opt) unscales first when unscale_(opt) was not called, then calls
//    opt.step() unless that optimizer's gradients overflowed; it returns
//    whether the step ran. A skipped step leaves the parameters and the
//    optimizer's state exactly as they were. Once per optimizer between
//    updates.
//  - update() backs off (scale *= backoffFactor, good-step count reset) when
//    any unscale since the last update found inf/NaN; otherwise it counts a
//    good step and, at growthInterval of them, grows the scale
//    (scale *= growthFactor, count reset). It needs an unscale since the last
//    update (InvalidArgumentError otherwise, as PyTorch asserts).
//    update(newScale) sets the scale instead (and resets nothing else).
//  - A scaler constructed with enabled = false passes everything through:
//    scale returns the loss, step just steps, update does nothing.
//  - stateDict() holds "scale" (float64), "growth_factor", "backoff_factor"
//    (float64), "growth_interval" and "growth_tracker" (int64), as PyTorch's
//    state_dict; loadStateDict checks every key and value before changing
//    anything (InvalidArgumentError naming the key).
//  - Gradients must be CPU or CUDA tensors of a floating dtype
//    (InvalidArgumentError). CUDA gradients are unscaled and checked on their
//    device by one multi-tensor pass per dtype, with one flag read back per
//    device and call, not one per tensor.
//
// Threading: one thread at a time, like the optimizer it drives.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "nn/module.h"
#include "nn/optim.h"
#include "tensor/tensor.h"

namespace weft::nn {

struct GradScalerOptions {
  double initScale = 65536.0;  // 2^16
  double growthFactor = 2.0;   // > 1
  double backoffFactor = 0.5;  // in (0, 1)
  int64_t growthInterval = 2000;  // > 0
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  Tensor scale(const Tensor& loss) const;
  void unscale_(optim::Optimizer& optimizer);
  void unscale_(const std::vector<Tensor>& params);
  bool step(optim::Optimizer& optimizer);
  void update();
  void update(double newScale);

  double getScale() const { return scale_; }
  int64_t growthTracker() const { return growthTracker_; }
  bool isEnabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  StateDict stateDict() const;
  void loadStateDict(const StateDict& dict);

 private:
  // Unscales and checks the gradients of `params`; true when one overflowed.
  bool unscaleGrads(const std::vector<Tensor>& params) const;

  enum class Stage { Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Unscaled;
    bool foundInf = false;
  };

  GradScalerOptions options_;
  double scale_;
  int64_t growthTracker_ = 0;
  std::map<const optim::Optimizer*, PerOptimizer> perOptimizer_;  // since the last update
  int64_t paramListsUnscaled_ = 0;  // unscale_(params) calls since the last update
  bool paramListInf_ = false;
};

}  // namespace weft::nn
