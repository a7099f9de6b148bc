// Autograd: the backward graph and the engine that walks it.
//
// Every differentiable op that produced a tensor requiring grad records a
// Node: it holds the op's backward rule and one Edge per input, pointing at
// the node that must receive that input's gradient (the input's gradFn, or the
// AccumulateGrad node of a leaf). Backward is a plain reverse topological walk
// over those edges: dependencies are counted from the roots first, then a node
// runs once every gradient flowing into it has arrived.
//
//   Tensor y = mul(x, w).sum();
//   y.backward();                                   // w.grad(), x.grad()
//   auto g = autograd::grad({y}, {w});              // returns, .grad untouched
//   { NoGradGuard ng; w.add_(w.grad(), -0.1); }     // update without recording
//
// Op authors record history with `recordOp`; the ops of tensor/ do it through
// their gradient rules, one function per op, one file per op family (see
// tensor/grad_rules/grad_rules.h). Hooks: Node::registerPreHook sees (and may
// replace) the gradients flowing into a node; registerPostHook sees what it
// produced. On a leaf's AccumulateGrad node a pre-hook sees each incoming
// gradient before it is accumulated, which is what DDP and distributed
// autograd build on.
//
// Threading: a backward pass runs on the calling thread. Grad mode is
// thread-local. Two backward passes over disjoint graphs may run on different
// threads; over a shared graph they may not.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/tensor.h"

namespace weft {

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t inputNr = 0;      // which of fn's gradient slots it feeds
  bool valid() const { return fn != nullptr; }
};

// Shape/dtype/device of a forward output, so the engine can substitute zeros
// for a gradient that never arrived.
struct OutputMeta {
  Shape shape;
  DType dtype = DType::Float32;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  // Sees the gradients arriving for the node's outputs; may replace them.
  using PreHook = std::function<void(std::vector<Tensor>& gradOutputs)>;
  // Sees what the node produced for its inputs, and what it was given.
  using PostHook = std::function<void(const std::vector<Tensor>& gradInputs, const std::vector<Tensor>& gradOutputs)>;

  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  // Given d(out)/d(each forward output), returns d(out)/d(each forward input),
  // one per next edge (undefined where an input needs no gradient).
  virtual std::vector<Tensor> apply(std::vector<Tensor> gradOutputs) = 0;
  // Frees what the rule saved for backward; a later apply() throws StateError.
  virtual void release() {}

  const std::vector<Edge>& nextEdges() const { return nextEdges_; }
  std::vector<Edge>& mutableNextEdges() { return nextEdges_; }
  const std::vector<OutputMeta>& outputs() const { return outputs_; }
  std::vector<OutputMeta>& mutableOutputs() { return outputs_; }
  // Increases with creation order: later ops have larger numbers.
  uint64_t sequenceNr() const { return sequenceNr_; }

  int registerPreHook(PreHook h);
  int registerPostHook(PostHook h);
  void removeHook(int id);
  // Used by the engine: the pre-hooks, then apply() followed by the post-hooks.
  void callPreHooks(std::vector<Tensor>& gradOutputs);
  std::vector<Tensor> callApply(std::vector<Tensor> gradOutputs);

 private:
  std::vector<Edge> nextEdges_;
  std::vector<OutputMeta> outputs_;
  uint64_t sequenceNr_;
  int nextHookId_ = 0;
  std::map<int, PreHook> preHooks_;
  std::map<int, PostHook> postHooks_;
};

// The backward of one recorded op: a closure over what the op saved.
class FunctionNode final : public Node {
 public:
  using Rule = std::function<std::vector<Tensor>(const std::vector<Tensor>& gradOutputs)>;
  FunctionNode(std::string name, Rule rule) : name_(std::move(name)), rule_(std::move(rule)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor> gradOutputs) override;
  void release() override;

 private:
  std::string name_;
  Rule rule_;
  bool released_ = false;
};

// Sink of a leaf's gradient: adds it to the leaf's .grad (or hands it to the
// engine's leaf sink, see BackwardOptions). Holds the leaf weakly.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor> gradOutputs) override;
  // The leaf, or an undefined tensor once the leaf is gone.
  Tensor variable() const;

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// A saved tensor and the storage version it had when saved; unpacking after an
// in-place change is an error naming the op.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  Tensor unpack(const char* op) const;
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;  // detached: saving never creates a reference cycle
  uint64_t version_ = 0;
};

// ---- grad mode ------------------------------------------------------------
class GradMode {
 public:
  static bool enabled();
  static void setEnabled(bool on);
};

// Disables recording for its scope (thread-local), like torch.no_grad().
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::setEnabled(false); }
  ~NoGradGuard() { GradMode::setEnabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// ---- recording ------------------------------------------------------------
// True when grad mode is on and any input requires grad.
bool anyRequiresGrad(std::initializer_list<const Tensor*> inputs);
bool anyRequiresGrad(const std::vector<Tensor>& inputs);

// The edge an input's gradient must flow along: its gradFn slot, its leaf
// accumulator, or an invalid edge when it needs no gradient.
Edge gradientEdge(const Tensor& t);

// Attaches a FunctionNode named `name` with `rule` to `outputs` (which become
// non-leaves requiring grad) and edges to `inputs`. No-op unless
// anyRequiresGrad(inputs). The rule receives one gradient per output (zeros
// substituted for missing ones) and returns one per input.
void recordOp(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
              FunctionNode::Rule rule);

// ---- the engine -----------------------------------------------------------
struct BackwardOptions {
  bool retainGraph = false;
  // When set, a leaf's gradient is passed here instead of being added to .grad
  // (distributed autograd accumulates in its context this way).
  std::function<void(const Tensor& leaf, const Tensor& grad)> leafSink;
  // Edges whose total incoming gradient is returned by runBackward (in order)
  // instead of flowing on; used by autograd::grad.
  std::vector<Edge> captures;
  // When true, AccumulateGrad nodes do nothing (autograd::grad).
  bool skipLeaves = false;
};

namespace autograd {
// From a hook or a node's rule while a backward pass runs on this thread: runs
// fn once the pass is over on this worker, before backward() returns (local
// backward: after the graph has run; distributed backward: on the worker that
// called it, after every worker answered; on other workers, once the work a
// backward request started there is done). DDP waits for its reductions this
// way. StateError outside a backward pass.
void queueCallback(std::function<void()> fn);
// True while a backward pass runs on this thread (inside its nodes' rules,
// hooks and queued callbacks): what a forward hook checks to tell activation
// checkpointing's recomputation from a forward.
bool inBackward();
// From a hook, a rule or a queued callback while a backward pass runs on this
// thread: hands `grad` to leaf `leaf` as if it had reached the leaf's
// AccumulateGrad node: into .grad for a local backward, into the context for
// a distributed one. A pre-hook on the AccumulateGrad node that replaces the
// incoming gradient with an undefined tensor, then later calls this with
// another value (DDP's averaged gradient), substitutes that value.
void accumulateLeafGradient(const Tensor& leaf, const Tensor& grad);
// From a node's rule while a backward pass runs on this thread: a nested pass
// over another graph (activation checkpointing's recomputed one) from
// `outputs` (those that require grad) seeded with `gradOutputs`. Returns the
// gradient reaching each of `inputs` (undefined where none does or the input
// needs none); those gradients go nowhere else. The gradient reaching any
// other leaf of that graph is handed to the running pass as if it had arrived
// at the leaf's AccumulateGrad node there: its pre-hooks (DDP's), captures
// (autograd::grad) and sink (.grad, or distributed autograd's context) apply
// exactly as to the running pass's own leaves. Callbacks queued during the
// nested pass join the running pass's. StateError outside a backward pass.
std::vector<Tensor> nestedBackward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& gradOutputs,
                                   const std::vector<Tensor>& inputs);
}  // namespace autograd

// One backward pass over a graph: dependency counts, the gradient buffers of
// the nodes not yet run, and the ready queue. runBackward is one GraphTask run
// to completion. Distributed autograd keeps one per context and pass and feeds
// it more roots as gradients arrive from other workers (external dependencies):
//
//   GraphTask task(options);
//   task.computeDependencies({loss.gradFn(), sendNode});   // every root, up front
//   task.deliver(gradientEdge(loss), onesLike(loss));
//   task.schedule(loss.gradFn().get());
//   task.run();                              // runs what is ready; sendNode waits
//   task.deliver({sendNode, 0}, g);          // later: its gradient arrived
//   task.schedule(sendNode.get());
//   task.run();
//
// Not thread-safe: the owner serialises calls.
class GraphTask {
 public:
  explicit GraphTask(BackwardOptions options);
  GraphTask(const GraphTask&) = delete;
  GraphTask& operator=(const GraphTask&) = delete;

  // Counts, for every node reachable from `roots`, the edges pointing at it,
  // and keeps those nodes alive. Call once, before the first deliver().
  void computeDependencies(const std::vector<std::shared_ptr<Node>>& roots);
  // Adds g to slot `to.inputNr` of node `to.fn` (checked against its shape).
  // An undefined g only sizes the buffer.
  void deliver(const Edge& to, const Tensor& g);
  // Queues root `n` if nothing inside the graph still owes it a gradient (a
  // root that is also reached from another root runs when that one has run).
  // A node is queued at most once.
  void schedule(Node* n);
  // Runs queued nodes until none is ready: AccumulateGrad nodes as soon as
  // they are ready (a leaf's gradient and its hooks, e.g. DDP's bucket
  // allreduce, come while the rest of backward runs), the others latest
  // first. Throws what a node threw; the task must not be used afterwards.
  void run();
  // Queues every node that holds gradients but still waits for others (that,
  // the caller knows, will never come: distributed autograd's initiator once
  // every worker answered). Returns how many were queued.
  size_t scheduleWaiting();
  // Runs the callbacks queued during this task (autograd::queueCallback), in
  // queue order, with the task current (so they may call
  // autograd::accumulateLeafGradient); a callback may queue more. Whoever
  // owns the task calls this once its pass is over on this worker.
  void runCallbacks();
  // Gives `grad` to leaf `leaf` as the task's AccumulateGrad nodes would: to
  // BackwardOptions::leafSink when set, else added to leaf.grad().
  void accumulateLeaf(const Tensor& leaf, const Tensor& grad);
  // Adds g to the gradient of AccumulateGrad node `acc` and queues it unless
  // the graph still owes it gradients; a node that already ran runs again
  // with g alone. How a nested pass (autograd::nestedBackward) hands its leaf
  // gradients to the pass that started it.
  void deliverToLeaf(const std::shared_ptr<Node>& acc, const Tensor& g);
  // True when `n` was reached by computeDependencies.
  bool contains(const Node* n) const { return alive_.count(const_cast<Node*>(n)) != 0; }
  // The captured gradients (see BackwardOptions::captures), once run.
  std::vector<Tensor> takeCaptured() { return std::move(captured_); }

 private:
  BackwardOptions options_;
  std::unordered_map<Node*, int> deps_;  // -1 once queued, kRan once run
  static constexpr int kRan = -2;
  GraphTask* parent_ = nullptr;  // a nested pass's: where its leaf gradients go
  std::unordered_map<Node*, std::shared_ptr<Node>> alive_;
  std::unordered_map<Node*, std::vector<Tensor>> buffers_;
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captureAt_;
  std::vector<Tensor> captured_;
  std::vector<Node*> ready_;  // a heap ordered by sequence number, latest on top
  std::vector<std::function<void()>> callbacks_;
  friend void autograd::queueCallback(std::function<void()> fn);
  friend std::vector<Tensor> autograd::nestedBackward(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                                      const std::vector<Tensor>&);
};

// Runs backward from `roots` (edges) seeded with `rootGrads`. Returns the
// captured gradients (see BackwardOptions::captures).
std::vector<Tensor> runBackward(const std::vector<Edge>& roots, const std::vector<Tensor>& rootGrads,
                                const BackwardOptions& options);

namespace autograd {

// d(sum of outputs·gradOutputs)/d(inputs), without touching any .grad.
// gradOutputs may be empty (ones for one-element outputs). An input that the
// outputs do not depend on is an error unless allowUnused (then undefined).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& gradOutputs = {}, bool retainGraph = false,
                         bool allowUnused = false);

// Gradients are summed into `dst`, broadcast-reducing when shapes differ:
// the accumulation every node input buffer and AccumulateGrad use.
Tensor accumulate(const Tensor& dst, const Tensor& g);

// What a gradient sink keeps as a leaf's first gradient: g itself when
// nothing else can see its storage, else a contiguous copy, so that later
// in-place accumulation into it cannot alias another tensor.
Tensor ownedGradient(const Tensor& g);

}  // namespace autograd
}  // namespace weft
