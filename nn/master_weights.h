// MasterWeightOptimizer: mixed-precision training with float32 master
// weights (Micikevicius et al., "Mixed Precision Training"; the ZeRO paper's
// 2 + 2 + 12 bytes per parameter under Adam). The module's parameters are
// 16-bit (BFloat16 or Float16): forward and backward run on them and their
// gradients arrive in .grad in that dtype. This optimizer keeps a float32 copy
// of each 16-bit parameter (its master), steps any weft optimizer over the
// masters with the gradients cast to float32, and writes each updated master,
// rounded to the parameter's dtype, back into the parameter. So the small
// updates that a 16-bit weight cannot represent still accumulate in the
// master.
//
//   net->to(DType::BFloat16);                         // the module in 16 bits
//   nn::optim::MasterWeightOptimizer opt(
//       nn::optim::decayGroups(net->namedParameters(), nn::optim::AdamWOptions{.lr = 6e-4, .weightDecay = 0.1}));
//   for (...) {
//     opt.zeroGrad();
//     Tensor loss;
//     {
//       autocast::Scope amp(DType::BFloat16);        // LayerNorm, softmax, losses in float32
//       loss = nn::functional::crossEntropy(net->forward(x), y);
//     }
//     loss.backward();                               // bfloat16 gradients in .grad
//     opt.step();                                    // masters step, parameters = masters rounded
//   }
//
// Contract:
//  - The groups are nn::optim::Optimizer's (the same checks, the same
//    errors). A 16-bit parameter's master is a float32 clone of its value
//    when the optimizer is built (build it after the module is converted and,
//    under data parallelism, after the wrapper has broadcast rank 0's values);
//    a float32 or float64 parameter is its own master.
//  - step(): each parameter with a defined .grad contributes that gradient
//    cast to its master's dtype; optimizer() steps the masters (parameters
//    without .grad are skipped, as by the plain optimizer); each stepped
//    16-bit parameter is then set to its master rounded to nearest-even. The
//    cast gradients exist during step() only.
//  - zeroGrad() acts on the parameters' .grad (the masters have none).
//  - optimizer() is the optimizer over masters(): its state and learning
//    rates are those of the masters. stateDict() is its state dict plus the
//    masters ("master.<i>" for every parameter index i with a master of its
//    own), so that a checkpoint resumes exactly: the 16-bit parameters alone
//    have lost the masters' low bits.
//
// Memory per element of a 16-bit parameter with Adam or AdamW: the parameter
// 2, its .grad 2, the master 4 and the state of the master 8 (exp_avg,
// exp_avg_sq): 16 bytes, of which this object holds the 12 of master and
// state (masterBytes() + stateBytes()). Transient during step(): the
// float32 gradients, 4 bytes per element of the 16-bit parameters.
//
// Float16 modules usually need loss scaling; nn::GradScaler drives
// nn::optim::Optimizer objects and not this one, so 16-bit training with it
// is meant for bfloat16 (float32's range), as in the example above.
//
// Threading: one thread at a time; a step must not run concurrently with
// anything that reads or writes the parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/module.h"
#include "nn/optim.h"
#include "tensor/tensor.h"

namespace weft::nn::optim {

// Whether parameters of `dtype` are stepped through a float32 master copy:
// BFloat16 and Float16.
bool needsMaster(DType dtype);

class MasterWeightOptimizer {
 public:
  explicit MasterWeightOptimizer(std::vector<ParamGroup> groups);
  MasterWeightOptimizer(std::vector<Tensor> params, OptimizerOptions options)
      : MasterWeightOptimizer({ParamGroup{std::move(params), std::move(options)}}) {}
  MasterWeightOptimizer(const MasterWeightOptimizer&) = delete;
  MasterWeightOptimizer& operator=(const MasterWeightOptimizer&) = delete;

  // See "Contract".
  void step();
  void zeroGrad(bool setToNone = false);

  // Every group's parameters in order, and their masters at the same indices.
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<Tensor>& masters() const { return optimizer_->params(); }
  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }

  // optimizer().stateDict() and "master.<i>" (float32, shared, not copied)
  // per 16-bit parameter i.
  StateDict stateDict() const;
  // Loads optimizer()'s entries (optimizer().loadStateDict, with its checks)
  // and each "master.<i>" into master i and, rounded, into parameter i. A
  // master the dict lacks keeps its value (a plain optimizer's dict loads).
  // InvalidArgumentError naming the key for a malformed or out-of-range
  // index, a parameter without a master of its own, or a shape that
  // differs; every check comes before anything changes.
  void loadStateDict(const StateDict& dict);

  // Bytes of the float32 copies this object holds (the masters of 16-bit
  // parameters), and of the optimizer's state buffers.
  int64_t masterBytes() const;
  int64_t stateBytes() const;

 private:
  std::vector<Tensor> params_;
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace weft::nn::optim
