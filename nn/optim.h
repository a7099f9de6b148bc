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
//    optionally over parameter groups, each with its own options of the
//    optimizer's kind (torch.optim's param_groups); decayGroups() builds the
//    usual pair, weight decay on matrices only:
//
//      nn::optim::AdamW opt(nn::optim::decayGroups(net->namedParameters(),
//                                                  nn::optim::AdamWOptions{.lr = 6e-4, .weightDecay = 0.1}));
//      opt.setLr(schedule(step));        // every group; opt.setLr(1, lr) one
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
//    parallel pass; contiguous CUDA float32/float64 parameters (with their
//    gradients and buffers) by one multi-tensor kernel launch per step and
//    device for up to 32 of them (kernels/cuda/optim.h), with the same
//    arithmetic; other layouts and dtypes by the equivalent tensor ops.
//    CUDA state buffers are created on the parameter's device. The CUDA
//    parameters of one call are updated together, so they must be distinct
//    (as the Optimizer objects require).
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

#include "common/error.h"
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

struct SGDOptions {
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

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weightDecay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool maximize = false;
};

// Any optimizer's options; the alternative chosen is the optimizer kind.
using OptimizerOptions = std::variant<SGDOptions, AdamOptions, AdamWOptions, AdagradOptions, RMSpropOptions>;

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
         const SGDOptions& options);
void adam(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
          const AdamOptions& options);
void adamw(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
           const AdamWOptions& options);
void adagrad(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
             const AdagradOptions& options);
void rmsprop(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<ParamState>& state,
             const RMSpropOptions& options);
// Dispatches on the options' kind.
void step(const OptimizerOptions& options, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
          std::vector<ParamState>& state);

// ---- parameter groups -----------------------------------------------------------

// Parameters updated with their own options (torch.optim's param groups).
struct ParamGroup {
  std::vector<Tensor> params;
  OptimizerOptions options;
};

// The same options with weightDecay replaced (validated).
OptimizerOptions withWeightDecay(OptimizerOptions options, double weightDecay);

// Two groups, in this order: the parameters of dim >= 2 (weight matrices and
// embeddings) with `base`, and the others (biases, norms' gains) with `base`
// but weight decay 0, as nanoGPT configures AdamW. Parameters that do not
// require grad are left out; either group may be empty. Order within a group
// is that of `named`.
std::vector<ParamGroup> decayGroups(const std::vector<std::pair<std::string, Tensor>>& named,
                                    const OptimizerOptions& base);

// ---- optimizer objects ---------------------------------------------------------

// Owns the parameter groups (handles and options) and one ParamState per
// parameter. Every group's options are of one kind; a group may be empty but
// not all of them; parameters must be defined, floating and distinct across
// all groups (InvalidArgumentError otherwise). Parameters are indexed over
// the groups in order (params(), state(), step(grads), the state dict), as in
// torch.optim's state_dict.
class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, OptimizerOptions options);
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;

  // One update from each parameter's .grad (parameters without one skipped),
  // each group with its own options.
  void step();
  // One update from explicit gradients, one per parameter (undefined: skip).
  void step(const std::vector<Tensor>& grads);
  // Zeroes defined gradients in place, or drops them when setToNone.
  void zeroGrad(bool setToNone = false);

  // Every group's parameters, in order.
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const std::vector<ParamState>& state() const { return state_; }
  std::vector<ParamState>& state() { return state_; }
  // The first group's options.
  const OptimizerOptions& options() const { return groups_.front().options; }
  // Replaces every group's options, or group `group`'s; the kind must stay the
  // same (validated). A group index out of range is an InvalidArgumentError.
  void setOptions(OptimizerOptions options);
  void setOptions(size_t group, OptimizerOptions options);
  // The first group's learning rate, or group `group`'s.
  double lr() const { return learningRate(options()); }
  double lr(size_t group) const;
  // Sets every group's learning rate (what a schedule does each step), or
  // group `group`'s.
  void setLr(double lr);
  void setLr(size_t group, double lr);
  const char* name() const { return optimizerName(options()); }

  // The state as named tensors: "state.<i>.step" (an Int64 scalar) and
  // "state.<i>.<buffer>" for every parameter index i that has state, and per
  // group g "param_groups.<g>.params" (its parameter count, Int64) and
  // "param_groups.<g>.lr" (Float64): the one hyper-parameter a schedule
  // changes during training. Buffers are shared, not copied.
  StateDict stateDict() const;
  // Replaces all state with `dict` (as produced by stateDict() of an
  // optimizer of the same kind over parameters of the same shapes, in groups
  // of the same sizes) and sets each group's lr from it. Indices, buffer
  // names, shapes, steps and group sizes are all checked before anything
  // changes; buffers are copied and converted to their parameter's dtype and
  // device. A dict without param_groups entries leaves the groups' options.
  void loadStateDict(const StateDict& dict);

 private:
  size_t checkGroup(const char* what, size_t group) const;

  std::vector<ParamGroup> groups_;
  std::vector<Tensor> params_;  // every group's, in order
  std::vector<ParamState> state_;
};

namespace detail {
// `groups` when every group's options are `O`; InvalidArgumentError naming
// `optimizer` and the group otherwise.
template <class O>
std::vector<ParamGroup> requireKind(std::vector<ParamGroup> groups, const char* optimizer) {
  for (size_t g = 0; g < groups.size(); ++g) {
    WEFT_ENFORCE(std::holds_alternative<O>(groups[g].options), InvalidArgumentError, optimizer, ": group ", g,
                 " has ", optimizerName(groups[g].options), " options");
  }
  return groups;
}
}  // namespace detail

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options) : Optimizer(std::move(params), options) {}
  explicit SGD(std::vector<ParamGroup> groups)
      : Optimizer(detail::requireKind<SGDOptions>(std::move(groups), "SGD")) {}
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {}) : Optimizer(std::move(params), options) {}
  explicit Adam(std::vector<ParamGroup> groups)
      : Optimizer(detail::requireKind<AdamOptions>(std::move(groups), "Adam")) {}
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {}) : Optimizer(std::move(params), options) {}
  explicit AdamW(std::vector<ParamGroup> groups)
      : Optimizer(detail::requireKind<AdamWOptions>(std::move(groups), "AdamW")) {}
};

class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, AdagradOptions options = {}) : Optimizer(std::move(params), options) {}
  explicit Adagrad(std::vector<ParamGroup> groups)
      : Optimizer(detail::requireKind<AdagradOptions>(std::move(groups), "Adagrad")) {}
};

class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, RMSpropOptions options = {}) : Optimizer(std::move(params), options) {}
  explicit RMSprop(std::vector<ParamGroup> groups)
      : Optimizer(detail::requireKind<RMSpropOptions>(std::move(groups), "RMSprop")) {}
};

}  // namespace weft::nn::optim
