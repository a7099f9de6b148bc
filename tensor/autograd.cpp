#include "tensor/autograd.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "kernels/cpu/elementwise.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"

namespace weft {

// ---- nodes ------------------------------------------------------------------

namespace {
std::atomic<uint64_t> gNextSequenceNr{0};
thread_local bool tGradEnabled = true;
}  // namespace

Node::Node() : sequenceNr_(gNextSequenceNr.fetch_add(1, std::memory_order_relaxed)) {}

int Node::registerPreHook(PreHook h) {
  int id = nextHookId_++;
  preHooks_.emplace(id, std::move(h));
  return id;
}

int Node::registerPostHook(PostHook h) {
  int id = nextHookId_++;
  postHooks_.emplace(id, std::move(h));
  return id;
}

void Node::removeHook(int id) {
  preHooks_.erase(id);
  postHooks_.erase(id);
}

void Node::callPreHooks(std::vector<Tensor>& gradOutputs) {
  for (auto& [id, h] : preHooks_) h(gradOutputs);
}

std::vector<Tensor> Node::callApply(std::vector<Tensor> gradOutputs) {
  if (postHooks_.empty()) return apply(std::move(gradOutputs));
  std::vector<Tensor> kept = gradOutputs;
  std::vector<Tensor> gradInputs = apply(std::move(gradOutputs));
  for (auto& [id, h] : postHooks_) h(gradInputs, kept);
  return gradInputs;
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor> gradOutputs) {
  WEFT_ENFORCE(!released_, StateError, "backward through the graph a second time (node ", name_,
               "): its saved tensors were freed by the first backward; pass retainGraph=true to that first "
               "backward to run it again");
  return rule_(gradOutputs);
}

void FunctionNode::release() {
  rule_ = nullptr;
  released_ = true;
}

AccumulateGrad::AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf) : leaf_(leaf) {
  mutableOutputs().push_back({leaf->shape, leaf->dtype, leaf->storage->device()});
}

Tensor AccumulateGrad::variable() const {
  auto p = leaf_.lock();
  return p ? Tensor(p) : Tensor();
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor> gradOutputs) {
  Tensor leaf = variable();
  const Tensor& g = gradOutputs[0];
  if (!leaf.defined() || !g.defined()) return {};
  Tensor cur = leaf.grad();
  if (!cur.defined()) {
    leaf.setGrad(autograd::ownedGradient(g));
  } else {
    NoGradGuard ng;
    cur.add_(g);
  }
  return {};
}

SavedTensor::SavedTensor(const Tensor& t) {
  if (t.defined()) {
    tensor_ = t.detach();
    version_ = t.version();
  }
}

Tensor SavedTensor::unpack(const char* op) const {
  if (tensor_.defined()) {
    WEFT_ENFORCE(tensor_.version() == version_, StateError, op,
                 ": a tensor saved for backward was modified in place after it was saved (version ", version_,
                 " -> ", tensor_.version(), ")");
  }
  return tensor_;
}

// ---- grad mode and recording -------------------------------------------------

bool GradMode::enabled() { return tGradEnabled; }
void GradMode::setEnabled(bool on) { tGradEnabled = on; }

bool anyRequiresGrad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->requiresGrad()) return true;
  }
  return false;
}

bool anyRequiresGrad(const std::vector<Tensor>& inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requiresGrad()) return true;
  }
  return false;
}

Edge gradientEdge(const Tensor& t) {
  if (!t.defined() || !t.requiresGrad()) return {};
  if (t.gradFn()) return {t.gradFn(), t.outputNr()};
  return {t.gradAccumulator(), 0};
}

void recordOp(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
              FunctionNode::Rule rule) {
  if (!anyRequiresGrad(inputs)) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(rule));
  auto& edges = node->mutableNextEdges();
  edges.reserve(inputs.size());
  for (const Tensor& in : inputs) edges.push_back(gradientEdge(in));
  auto& metas = node->mutableOutputs();
  metas.reserve(outputs.size());
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    metas.push_back({out.shape(), out.dtype(), out.device()});
    TensorImpl* im = out.impl();
    im->gradFn = node;
    im->outputNr = i;
    im->requiresGrad = true;
  }
}

// ---- the engine ----------------------------------------------------------------

namespace autograd {

Tensor ownedGradient(const Tensor& g) {
  bool exclusive = g.implPtr().use_count() == 1 && g.storage().use_count() == 1 && g.isContiguous();
  return exclusive ? g : g.contiguous().clone();
}

Tensor accumulate(const Tensor& dst, const Tensor& g) {
  if (!dst.defined()) return g;
  if (!g.defined()) return dst;
  NoGradGuard ng;
  return add(dst, g);
}

}  // namespace autograd

namespace {

// The ready queue's order: AccumulateGrad nodes first (a leaf's gradient, and the hooks on it such
// as DDP's bucket allreduce, as soon as it is complete, as in PyTorch, rather than after the rest of
// the graph), then the latest op first.
bool runsLater(const Node* a, const Node* b) {
  const bool aLeaf = dynamic_cast<const AccumulateGrad*>(a) != nullptr;
  const bool bLeaf = dynamic_cast<const AccumulateGrad*>(b) != nullptr;
  if (aLeaf != bLeaf) return bLeaf;
  return a->sequenceNr() < b->sequenceNr();
}

}  // namespace

GraphTask::GraphTask(BackwardOptions options) : options_(std::move(options)) {
  for (size_t i = 0; i < options_.captures.size(); ++i) {
    const Edge& c = options_.captures[i];
    if (c.fn) captureAt_[c.fn.get()].push_back({c.inputNr, i});
  }
  captured_.resize(options_.captures.size());
}

void GraphTask::computeDependencies(const std::vector<std::shared_ptr<Node>>& roots) {
  std::vector<Node*> stack;
  for (const auto& r : roots) {
    if (r && alive_.emplace(r.get(), r).second) stack.push_back(r.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->nextEdges()) {
      if (!e.fn) continue;
      ++deps_[e.fn.get()];
      if (alive_.emplace(e.fn.get(), e.fn).second) stack.push_back(e.fn.get());
    }
  }
}

void GraphTask::deliver(const Edge& to, const Tensor& g) {
  Node* n = to.fn.get();
  auto& buf = buffers_[n];
  if (buf.size() < n->outputs().size()) buf.resize(n->outputs().size());
  WEFT_CHECK(to.inputNr < buf.size()) << n->name() << " has " << buf.size() << " gradient slots, got slot "
                                      << to.inputNr;
  if (!g.defined()) return;
  const OutputMeta& m = n->outputs()[to.inputNr];
  WEFT_ENFORCE(g.shape() == m.shape, InvalidArgumentError, "backward: gradient of shape ", g.shape(),
               " delivered to ", n->name(), " whose output ", to.inputNr, " has shape ", m.shape);
  buf[to.inputNr] = autograd::accumulate(buf[to.inputNr], g);
}

void GraphTask::schedule(Node* n) {
  if (n == nullptr) return;
  int& d = deps_[n];
  if (d != 0) return;
  d = -1;  // queued once
  ready_.push_back(n);
  std::push_heap(ready_.begin(), ready_.end(), runsLater);
}

namespace {
// The task running on this thread (run() and runCallbacks() set it).
thread_local GraphTask* tRunning = nullptr;

class RunningGuard {
 public:
  explicit RunningGuard(GraphTask* t) : previous_(tRunning) { tRunning = t; }
  ~RunningGuard() { tRunning = previous_; }
  RunningGuard(const RunningGuard&) = delete;
  RunningGuard& operator=(const RunningGuard&) = delete;

 private:
  GraphTask* previous_;
};
}  // namespace

namespace autograd {

bool inBackward() { return tRunning != nullptr; }

void queueCallback(std::function<void()> fn) {
  WEFT_ENFORCE(tRunning != nullptr, StateError, "autograd::queueCallback: no backward pass is running on this thread");
  tRunning->callbacks_.push_back(std::move(fn));
}

void accumulateLeafGradient(const Tensor& leaf, const Tensor& grad) {
  WEFT_ENFORCE(tRunning != nullptr, StateError,
               "autograd::accumulateLeafGradient: no backward pass is running on this thread");
  tRunning->accumulateLeaf(leaf, grad);
}

std::vector<Tensor> nestedBackward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& gradOutputs,
                                   const std::vector<Tensor>& inputs) {
  WEFT_ENFORCE(tRunning != nullptr, StateError, "autograd::nestedBackward: no backward pass is running on this thread");
  WEFT_CHECK(outputs.size() == gradOutputs.size()) << outputs.size() << " outputs, " << gradOutputs.size()
                                                   << " gradients";
  NoGradGuard ng;
  BackwardOptions opt;
  opt.skipLeaves = true;  // the captured inputs' own accumulators
  for (const Tensor& in : inputs) opt.captures.push_back(gradientEdge(in));
  GraphTask task(std::move(opt));
  task.parent_ = tRunning;
  std::vector<Edge> roots;
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined() || !outputs[i].requiresGrad()) continue;
    roots.push_back(gradientEdge(outputs[i]));
    seeds.push_back(gradOutputs[i]);
  }
  std::vector<std::shared_ptr<Node>> rootNodes;
  for (const Edge& r : roots) rootNodes.push_back(r.fn);
  task.computeDependencies(rootNodes);
  for (size_t i = 0; i < roots.size(); ++i) task.deliver(roots[i], seeds[i]);
  for (const Edge& r : roots) task.schedule(r.fn.get());
  task.run();
  GraphTask* parent = task.parent_;
  for (auto& fn : task.callbacks_) parent->callbacks_.push_back(std::move(fn));
  return task.takeCaptured();
}

}  // namespace autograd

void GraphTask::deliverToLeaf(const std::shared_ptr<Node>& acc, const Tensor& g) {
  Node* n = acc.get();
  alive_.emplace(n, acc);
  deliver({acc, 0}, g);
  int& d = deps_[n];
  if (d == kRan) d = 0;
  schedule(n);
}

void GraphTask::runCallbacks() {
  RunningGuard running(this);
  NoGradGuard ng;
  for (size_t i = 0; i < callbacks_.size(); ++i) {
    auto fn = std::move(callbacks_[i]);
    fn();
  }
  callbacks_.clear();
}

void GraphTask::accumulateLeaf(const Tensor& leaf, const Tensor& grad) {
  WEFT_ENFORCE(leaf.defined() && leaf.isLeaf() && leaf.requiresGrad(), InvalidArgumentError,
               "accumulateLeafGradient: the tensor is not a leaf that requires grad");
  if (!grad.defined() || options_.skipLeaves) return;
  WEFT_ENFORCE(grad.shape() == leaf.shape(), InvalidArgumentError, "accumulateLeafGradient: gradient of shape ",
               grad.shape(), " for a leaf of shape ", leaf.shape());
  if (options_.leafSink) {
    options_.leafSink(leaf, grad);
  } else {
    leaf.gradAccumulator()->callApply({grad});
  }
}

size_t GraphTask::scheduleWaiting() {
  std::vector<Node*> waiting;
  for (auto& [n, buf] : buffers_) {
    if (deps_[n] > 0) waiting.push_back(n);
  }
  for (Node* n : waiting) {
    deps_[n] = 0;
    schedule(n);
  }
  return waiting.size();
}

void GraphTask::run() {
  RunningGuard running(this);
  NoGradGuard ng;
  while (!ready_.empty()) {
    std::pop_heap(ready_.begin(), ready_.end(), runsLater);
    Node* n = ready_.back();
    ready_.pop_back();
    deps_[n] = kRan;
    std::vector<Tensor> grads;
    if (auto it = buffers_.find(n); it != buffers_.end()) {
      grads = std::move(it->second);
      buffers_.erase(it);
    }
    grads.resize(n->outputs().size());
    if (parent_ && dynamic_cast<AccumulateGrad*>(n) != nullptr && captureAt_.count(n) == 0) {
      if (grads[0].defined()) parent_->deliverToLeaf(alive_.at(n), grads[0]);
      continue;
    }
    n->callPreHooks(grads);

    if (auto it = captureAt_.find(n); it != captureAt_.end()) {
      for (auto [slot, idx] : it->second) captured_[idx] = autograd::accumulate(captured_[idx], grads[slot]);
    }

    std::vector<Tensor> gradInputs;
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      if (!options_.skipLeaves && grads[0].defined()) {
        if (options_.leafSink) {
          Tensor leaf = acc->variable();
          if (leaf.defined()) options_.leafSink(leaf, grads[0]);
        } else {
          n->callApply(std::move(grads));
        }
      }
    } else {
      bool any = false;
      for (const Tensor& g : grads) any |= g.defined();
      if (any) {
        for (size_t i = 0; i < grads.size(); ++i) {
          if (!grads[i].defined()) {
            const OutputMeta& m = n->outputs()[i];
            grads[i] = zeros(m.shape, {.dtype = m.dtype, .device = m.device});
          }
        }
        gradInputs = n->callApply(std::move(grads));
        WEFT_CHECK(gradInputs.size() == n->nextEdges().size())
            << n->name() << " returned " << gradInputs.size() << " gradients for " << n->nextEdges().size()
            << " inputs";
      }
      if (!options_.retainGraph) n->release();
    }

    const auto& edges = n->nextEdges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.fn) continue;
      deliver(e, i < gradInputs.size() ? gradInputs[i] : Tensor());
      int& d = deps_[e.fn.get()];
      if (--d == 0) {
        d = -1;
        ready_.push_back(e.fn.get());
        std::push_heap(ready_.begin(), ready_.end(), runsLater);
      }
    }
  }
}

std::vector<Tensor> runBackward(const std::vector<Edge>& roots, const std::vector<Tensor>& rootGrads,
                                const BackwardOptions& options) {
  WEFT_CHECK(roots.size() == rootGrads.size()) << roots.size() << " roots, " << rootGrads.size() << " gradients";
  NoGradGuard ng;
  autocast::Scope noAutocast(DType::BFloat16, false);  // backward rules compute in their forward's dtypes
  GraphTask task(options);
  std::vector<std::shared_ptr<Node>> rootNodes;
  rootNodes.reserve(roots.size());
  for (const Edge& r : roots) rootNodes.push_back(r.fn);
  task.computeDependencies(rootNodes);
  for (size_t i = 0; i < roots.size(); ++i) {
    if (roots[i].fn) task.deliver(roots[i], rootGrads[i]);
  }
  for (const Edge& r : roots) task.schedule(r.fn.get());
  task.run();
  task.runCallbacks();
  return task.takeCaptured();
}

namespace autograd {

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& gradOutputs, bool retainGraph, bool allowUnused) {
  WEFT_ENFORCE(gradOutputs.empty() || gradOutputs.size() == outputs.size(), InvalidArgumentError, "grad: ",
               gradOutputs.size(), " gradOutputs for ", outputs.size(), " outputs");
  std::vector<Edge> roots;
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    WEFT_ENFORCE(o.requiresGrad(), InvalidArgumentError, "grad: output ", i, " does not require grad");
    Tensor s = gradOutputs.empty() ? Tensor() : gradOutputs[i];
    if (!s.defined()) {
      WEFT_ENFORCE(o.numel() == 1, InvalidArgumentError, "grad: output ", i, " of shape ", o.shape(),
                   " needs an explicit gradOutput");
      s = onesLike(o);
    }
    roots.push_back(gradientEdge(o));
    seeds.push_back(s);
  }
  BackwardOptions opt;
  opt.retainGraph = retainGraph;
  opt.skipLeaves = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    WEFT_ENFORCE(inputs[i].requiresGrad(), InvalidArgumentError, "grad: input ", i, " does not require grad");
    opt.captures.push_back(gradientEdge(inputs[i]));
  }
  std::vector<Tensor> result = runBackward(roots, seeds, opt);
  for (size_t i = 0; i < result.size(); ++i) {
    WEFT_ENFORCE(allowUnused || result[i].defined(), InvalidArgumentError, "grad: input ", i,
                 " was not used in computing the outputs (pass allowUnused=true to get an undefined gradient)");
  }
  return result;
}

}  // namespace autograd
}  // namespace weft
