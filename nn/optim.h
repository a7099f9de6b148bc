// Local optimizers — SGD, Adam, AdamW, Adagrad, RMSprop — with PyTorch 1.13's
// update rules, defaults and argument checks, so a weft run can be compared
// with its PyTorch twin step for step.
//
// Each optimizer exists in two forms:
//  - a functional step that takes parameters, gradients and per-parameter
//    state explicitly (the distributed optimizer calls it with gradients held
//    in a distributed autograd context, not in .grad):
//
//      std::vector<nn::optim::ParamState> state(params.size());
//      nn::optim::adam(params, grads, state, {.lr = 1e-3, .weightDecay = 1e-4});
//
//  - an Optimizer object that owns the state and reads .grad:
//
//      nn::optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
//      opt.zeroGrad();
//      loss.backward();
//      opt.step();
//
// Contracts shared by every step function:
//  - params, grads and state have the same length; state[i] belongs to
//    params[i]. A default ParamState is a fresh one; the step creates the
//    buffers it needs on a parameter's first update.
//  - a parameter whose gradient is undefined is skipped (its state untouched),
//    as PyTorch skips parameters without .grad.
//  - a gradient has its parameter's shape, dtype and device; parameters are
//    floating. Violations and invalid hyper-parameters raise
//    InvalidArgumentError naming the optimizer and the parameter index.
//  - parameters and state are updated in place under a NoGradGuard (no
//    history is recorded), so handles held elsewhere see the new values.
//    Contiguous CPU float32/float64 parameters are updated by one fused
//    parallel pass; other layouts and devices by the equivalent tensor ops.
//
// State names follow torch.optim's state_dict: SGD "momentum_buffer"; Adam
// and AdamW "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad); Adagrad
// "sum"; RMSprop "square_avg", "momentum_buffer" (momentum > 0), "grad_avg"
// (centered). `step` counts the updates a parameter has received.
//
// Threading: a step must not run concurrently with anything else that reads
// or writes the same parameters or state.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace weft::nn::optim {

// Per-parameter optimizer state: an update count and named buffers shaped
// like the parameter.
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;

  bool has(const std::string& name) const { return buffers.count(name) != 0; }
  // NotFoundError naming the buffer when absent.
  const Tensor& at(const std::string& name) const;
};

// ---- options (defaults are PyTorch's) -----------------------------------------

struct SgdOptions {
  // Required, as in PyTorch: leaving it unset is an InvalidArgumentError.
  double lr = std::numeric_limits<double>::quiet_NaN();
  double momentum = 0.0;
  double dampening = 0.0;
  double weightDecay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
  bool maximize = false;
};

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};  // each in [0, 1)
  double eps = 1e-8;
  double weightDecay = 0.0;  // L2 penalty added to the gradient
  bool amsgrad = false;
  bool maximize = false;
};

struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weightDecay = 1e-2;  // decoupled: p *= 1 - lr * weightDecay
  bool amsgrad = false;
  bool maximize = false;
};

struct AdagradOptions {
  double lr = 1e-2;
  double lrDecay = 0.0;
  double weightDecay = 0.0;
  double initialAccumulatorValue = 0.0;
  double eps = 1e-10;
  bool maximize = false;
};

struct RmspropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weightDecay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool maximize = false;
};

// Any optimizer's options; the alternative chosen is the optimizer kind.
using OptimizerOptions = std::variant<SgdOptions, AdamOptions, AdamWOptions, AdagradOptions, RmspropOptions>;

// "SGD", "Adam", "AdamW", "Adagrad", "RMSprop".
const char* optimizerName(const OptimizerOptions& options);
// InvalidArgumentError naming the optimizer and the offending value, with
// PyTorch's rules (lr, eps, weight decay, momentum, lrDecay,
// initialAccumulatorValue and alpha >= 0; betas in [0, 1); nesterov needs
// momentum > 0 and zero dampening).
void validate(const OptimizerOptions& options);
double learningRate(const OptimizerOptions& options);
// The same options with lr replaced (validated).
OptimizerOptions withLearningRate(OptimizerOptions options, double lr);
// The state buffer names the options can create, in a fixed order.
std::vector<std::string> stateBufferNames(const OptimizerOptions& options);

// ---- functional steps --------------------------------------------------------------

void sgd(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
         const SgdOptions& options);
void adam(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
          const AdamOptions& options);
void adamw(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
           const AdamWOptions& options);
void adagrad(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
             const AdagradOptions& options);
void rmsprop(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
             const RmspropOptions& options);
// Dispatches on the options' kind.
void step(const OptimizerOptions& options, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
          std::vector<ParamState>& state);

// ---- optimizer objects ---------------------------------------------------------

// Owns the parameter list (handles), the options and one ParamState per
// parameter. Parameters must be defined, floating and distinct, and the list
// non-empty (InvalidArgumentError otherwise).
class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, OptimizerOptions options);
  virtual ~Optimizer() = default;

  // One update from each parameter's .grad (parameters without one skipped).
  void step();
  // One update from explicit gradients, one per parameter (undefined: skip).
  void step(const std::vector<Tensor>& grads);
  // Zeroes defined gradients in place, or drops them when setToNone.
  void zeroGrad(bool setToNone = false);

  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<ParamState>& state() const { return state_; }
  std::vector<ParamState>& state() { return state_; }
  const OptimizerOptions& options() const { return options_; }
  // Replaces the options; the kind must stay the same (validated).
  void setOptions(OptimizerOptions options);
  double lr() const { return learningRate(options_); }
  void setLr(double lr) { options_ = withLearningRate(options_, lr); }
  const char* name() const { return optimizerName(options_); }

  // The state as named tensors: "state.<i>.step" (an Int64 scalar) and
  // "state.<i>.<buffer>" for every parameter index i that has state. Buffers
  // are shared, not copied. Hyper-parameters are not part of it.
  StateDict stateDict() const;
  // Replaces all state with `dict` (as produced by stateDict() of an
  // optimizer of the same kind over parameters of the same shapes). Indices,
  // buffer names, shapes and steps are all checked before anything changes;
  // buffers are copied and converted to their parameter's dtype and device.
  void loadStateDict(const StateDict& dict);

 private:
  std::vector<Tensor> params_;
  OptimizerOptions options_;
  std::vector<ParamState> state_;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SgdOptions options) : Optimizer(std::move(params), options) {}
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {}) : Optimizer(std::move(params), options) {}
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {}) : Optimizer(std::move(params), options) {}
};

class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, AdagradOptions options = {}) : Optimizer(std::move(params), options) {}
};

class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, RmspropOptions options = {}) : Optimizer(std::move(params), options) {}
};

}  // namespace weft::nn::optim
