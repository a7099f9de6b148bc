#include "tensor/checkpoint.h"

#include <memory>
#include <utility>

#include "common/error.h"
#include "tensor/autocast.h"
#include "tensor/autograd.h"

namespace weft {
namespace {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(GradMode::enabled()) { GradMode::setEnabled(true); }
  ~EnableGradGuard() { GradMode::setEnabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// The states of the default generator and of the listed ones.
struct RngStates {
  GeneratorState defaultState;
  std::vector<GeneratorState> others;
};

RngStates captureStates(const std::vector<Generator*>& gens) {
  RngStates s;
  s.defaultState = defaultGeneratorState();
  for (Generator* g : gens) s.others.push_back(g->state());
  return s;
}

void restoreStates(const std::vector<Generator*>& gens, const RngStates& s) {
  setDefaultGeneratorState(s.defaultState);
  for (size_t i = 0; i < gens.size(); ++i) gens[i]->setState(s.others[i]);
}

// Puts the caller's generator states back when the recomputation is over,
// whether or not it threw.
class RestoreOnExit {
 public:
  RestoreOnExit(const std::vector<Generator*>& gens, RngStates s) : gens_(gens), states_(std::move(s)) {}
  ~RestoreOnExit() { restoreStates(gens_, states_); }
  RestoreOnExit(const RestoreOnExit&) = delete;
  RestoreOnExit& operator=(const RestoreOnExit&) = delete;

 private:
  const std::vector<Generator*>& gens_;
  RngStates states_;
};

// What the node keeps: fn, the inputs (and which required grad), the
// generator states at forward, and which outputs are its gradient slots.
struct Saved {
  Fn fn;
  std::vector<SavedTensor> inputs;
  std::vector<bool> requiresGrad;
  CheckpointOptions options;
  RngStates states;
  // The autocast state fn ran under, re-entered for the recomputation (the
  // backward pass itself runs with autocast off).
  bool autocastEnabled = false;
  DType autocastDType = DType::BFloat16;
  size_t numOutputs = 0;
  std::vector<size_t> slots;  // output index of each gradient slot
};

std::vector<Tensor> recomputeAndBackward(const Saved& s, const std::vector<Tensor>& grads) {
  std::vector<Tensor> inputs;
  inputs.reserve(s.inputs.size());
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    Tensor t = s.inputs[i].unpack("checkpoint");
    if (t.defined()) {
      t = t.detach();
      if (s.requiresGrad[i]) t.requiresGrad_();
    }
    inputs.push_back(std::move(t));
  }
  std::vector<Tensor> outputs;
  {
    std::unique_ptr<RestoreOnExit> restore;
    if (s.options.preserveRngState) {
      restore = std::make_unique<RestoreOnExit>(s.options.generators, captureStates(s.options.generators));
      restoreStates(s.options.generators, s.states);
    }
    EnableGradGuard grad;
    autocast::Scope amp(s.autocastDType, s.autocastEnabled);
    outputs = s.fn(inputs);
  }
  WEFT_ENFORCE(outputs.size() == s.numOutputs, StateError, "checkpoint: the recomputation returned ", outputs.size(),
               " tensors where the forward returned ", s.numOutputs,
               " (the checkpointed function must compute the same thing when called again)");
  std::vector<Tensor> roots;
  roots.reserve(s.slots.size());
  for (size_t slot = 0; slot < s.slots.size(); ++slot) roots.push_back(outputs[s.slots[slot]]);
  // One gradient per input: the node's edges.
  return autograd::nestedBackward(roots, grads, inputs);
}

}  // namespace

std::vector<Tensor> checkpoint(const Fn& fn, const std::vector<Tensor>& inputs, CheckpointOptions o) {
  WEFT_ENFORCE(static_cast<bool>(fn), InvalidArgumentError, "checkpoint: the function is empty");
  for (Generator* g : o.generators) {
    WEFT_ENFORCE(g != nullptr, InvalidArgumentError, "checkpoint: CheckpointOptions::generators holds a null generator");
  }
  if (!GradMode::enabled()) return fn(inputs);
  if (!anyRequiresGrad(inputs)) return fn(inputs);

  auto saved = std::make_shared<Saved>();
  saved->fn = fn;
  saved->options = std::move(o);
  if (saved->options.preserveRngState) saved->states = captureStates(saved->options.generators);
  saved->autocastEnabled = autocast::isEnabled();
  if (saved->autocastEnabled) saved->autocastDType = autocast::dtype();
  std::vector<Tensor> detached;
  detached.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    saved->inputs.emplace_back(in);
    saved->requiresGrad.push_back(in.defined() && in.requiresGrad());
    detached.push_back(in.defined() ? in.detach() : Tensor());
  }
  std::vector<Tensor> outputs;
  {
    NoGradGuard ng;
    outputs = fn(detached);
  }
  saved->numOutputs = outputs.size();

  auto node = std::make_shared<FunctionNode>(
      "checkpoint", [saved](const std::vector<Tensor>& grads) { return recomputeAndBackward(*saved, grads); });
  auto& edges = node->mutableNextEdges();
  for (const Tensor& in : inputs) edges.push_back(gradientEdge(in));
  auto& metas = node->mutableOutputs();
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = outputs[i];
    if (!out.defined() || !isFloating(out.dtype())) continue;
    // An output that is one of fn's arguments (or a view of the same impl)
    // gets a fresh impl, so that recording never touches the caller's input.
    for (const Tensor& d : detached) {
      if (d.defined() && d.impl() == out.impl()) {
        out = out.detach();
        break;
      }
    }
    const auto slot = static_cast<uint32_t>(metas.size());
    metas.push_back({out.shape(), out.dtype(), out.device()});
    saved->slots.push_back(i);
    TensorImpl* im = out.impl();
    im->gradFn = node;
    im->outputNr = slot;
    im->requiresGrad = true;
  }
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input, CheckpointOptions o) {
  WEFT_ENFORCE(static_cast<bool>(fn), InvalidArgumentError, "checkpoint: the function is empty");
  std::vector<Tensor> out = checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                                       std::vector<Tensor>{input}, std::move(o));
  return out[0];
}

}  // namespace weft
