#include "collectives/fsdp.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <utility>

#include "collectives/detail/sharding.h"
#include "common/error.h"
#include "nn/transformer.h"
#include "tensor/autocast.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::collectives {

namespace {

constexpr const char* kWho = "FullyShardedDataParallel";

int64_t int64Scalar(const nn::StateDict& dict, const std::string& key, const char* where) {
  auto it = dict.find(key);
  WEFT_ENFORCE(it != dict.end() && it->second.defined() && it->second.numel() == 1, InvalidArgumentError, where,
               ": the dict has no '", key, "' (not a shardedStateDict())");
  return static_cast<int64_t>(it->second.to(Device::cpu()).item<double>());
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group,
                                                   Options options)
    : module_(std::move(module)), group_(group), options_(std::move(options)) {
  WEFT_ENFORCE(module_ != nullptr, InvalidArgumentError, kWho, ": the module is null");
  const DType pd = options_.mixedPrecision.param;
  const DType rd = options_.mixedPrecision.reduce;
  WEFT_ENFORCE(pd == DType::Float32 || pd == DType::BFloat16 || pd == DType::Float16, InvalidArgumentError, kWho,
               ": Options::mixedPrecision.param must be float32, bfloat16 or float16, got ", dtypeName(pd));
  WEFT_ENFORCE(rd == DType::Float32 || rd == DType::Float16, InvalidArgumentError, kWho,
               ": Options::mixedPrecision.reduce must be float32 or float16 (the backend reduces no bfloat16), got ",
               dtypeName(rd));
  std::vector<std::shared_ptr<nn::Module>> given = options_.units;
  if (given.empty()) {
    if (auto gpt = std::dynamic_pointer_cast<nn::GPT>(module_)) {
      for (const auto& b : gpt->blocks()) given.push_back(b);
    }
  }
  const auto modules = module_->namedModules();
  auto named = module_->namedParameters();
  std::vector<int> owner(named.size(), -1);  // given unit index, or -1 for the root
  std::vector<std::string> unitNames;
  for (size_t k = 0; k < given.size(); ++k) {
    WEFT_ENFORCE(given[k] != nullptr, InvalidArgumentError, kWho, ": unit ", k, " is null");
    auto m = std::find_if(modules.begin(), modules.end(), [&](const auto& nm) { return nm.second == given[k]; });
    WEFT_ENFORCE(m != modules.end(), InvalidArgumentError, kWho, ": unit ", k, " (", given[k]->typeName(),
                 ") is not a submodule of ", module_->typeName());
    WEFT_ENFORCE(!m->first.empty(), InvalidArgumentError, kWho, ": unit ", k,
                 " is the wrapped module itself (the root unit holds what no given unit holds)");
    unitNames.push_back(m->first);
    for (const Tensor& p : given[k]->parameters()) {
      auto it = std::find_if(named.begin(), named.end(), [&p](const auto& np) { return np.second.sameAs(p); });
      const size_t i = static_cast<size_t>(it - named.begin());
      WEFT_ENFORCE(owner[i] < 0, InvalidArgumentError, kWho, ": parameter '", it->first, "' is in unit '",
                   unitNames[static_cast<size_t>(owner[i])], "' and in unit '", m->first,
                   "' (units must not share parameters)");
      owner[i] = static_cast<int>(k);
    }
  }
  // Unit 0 the root, then the given units; each unit's parameters in namedParameters() order.
  std::vector<std::vector<size_t>> members(given.size() + 1);
  for (size_t i = 0; i < named.size(); ++i) members[static_cast<size_t>(owner[i] + 1)].push_back(i);
  for (size_t k = 0; k < members.size(); ++k) {
    if (members[k].empty()) continue;
    Unit u;
    u.name = k == 0 ? "" : unitNames[k - 1];
    u.module = k == 0 ? module_ : given[k - 1];
    for (size_t i : members[k]) {
      const auto& [name, p] = named[i];
      WEFT_ENFORCE(p.requiresGrad(), InvalidArgumentError, kWho, ": parameter '", name, "' does not require grad");
      WEFT_ENFORCE(p.dtype() == DType::Float32 && p.device().isCpu(), InvalidArgumentError, kWho, ": parameter '",
                   name, "' is ", dtypeName(p.dtype()), " on ", p.device().str(), "; float32 CPU parameters only");
      Param q;
      q.tensor = p;
      q.name = name;
      q.unit = units_.size();
      q.offset = u.numel;
      u.numel += p.numel();
      u.params.push_back(params_.size());
      params_.push_back(std::move(q));
    }
    units_.push_back(std::move(u));
  }
  std::vector<size_t> sizes;
  std::vector<Tensor> flatOrder;
  for (const Unit& u : units_) sizes.push_back(u.params.size());
  for (const Param& p : params_) flatOrder.push_back(p.tensor);
  detail::checkLayoutsAgree(group_, sizes, flatOrder, kWho);

  // Rank 0's parameters and buffers everywhere.
  detail::broadcastModuleState(group_, *module_, kWho);
  NoGradGuard noGrad;

  // Each unit's flat storage: the parameters become views of it; this rank keeps its shard.
  const int64_t n = group_.size();
  for (Unit& u : units_) {
    u.chunk = (u.numel + n - 1) / n;
    const int64_t padded = u.chunk * n;
    Tensor master = zeros({padded});
    for (size_t i : u.params) {
      const Param& p = params_[i];
      master.narrow(0, p.offset, p.tensor.numel()).copy_(p.tensor.detach().reshape({-1}));
    }
    u.storage = Storage::allocate(static_cast<size_t>(padded) * elementSize(pd), Device::cpu());
    u.flat = makeTensor(u.storage, {padded}, {1}, 0, pd);
    for (size_t i : u.params) {
      Param& p = params_[i];
      TensorImpl* im = p.tensor.impl();
      im->storage = u.storage;
      im->offset = p.offset;
      im->dtype = pd;
      Shape strides(im->shape.size(), 1);
      for (int64_t d = static_cast<int64_t>(strides.size()) - 2; d >= 0; --d) {
        strides[static_cast<size_t>(d)] = strides[static_cast<size_t>(d) + 1] * im->shape[static_cast<size_t>(d) + 1];
      }
      im->strides = strides;
    }
    Tensor shard = master.narrow(0, group_.rank() * u.chunk, u.chunk).clone();
    shard.requiresGrad_(true);
    shards_.push_back(shard);
    u.storage->release();
    u.gathered = false;
  }

  for (size_t k = 0; k < units_.size(); ++k) {
    units_[k].preHookId = units_[k].module->registerForwardPreHook([this, k](nn::Module&, const Tensor&) {
      onPreForward(k);
    });
    units_[k].postHookId = units_[k].module->registerForwardHook(
        [this, k](nn::Module&, const Tensor&, Tensor& output) { onPostForward(k, output); });
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].hookId = params_[i].tensor.gradAccumulator()->registerPreHook(
        [this, i](std::vector<Tensor>& grads) { onGradient(i, grads); });
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (Param& p : params_) {
    if (p.hookId >= 0) p.tensor.gradAccumulator()->removeHook(p.hookId);
  }
  for (Unit& u : units_) {
    u.module->removeForwardHook(u.preHookId);
    u.module->removeForwardHook(u.postHookId);
    if (u.gatherWork.valid()) {
      try {
        u.gatherWork.wait();
      } catch (const std::exception&) {
        // Dropped: the destructor has nobody to report to.
      }
    }
    if (!u.work.valid()) continue;
    try {
      u.work.wait();
    } catch (const std::exception&) {
      // Dropped: the destructor has nobody to report to.
    }
  }
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (!forwardOrder_.empty()) previousForwardOrder_ = std::exchange(forwardOrder_, {});
  }
  const DType pd = options_.mixedPrecision.param;
  autocast::Scope amp(pd == DType::Float32 ? DType::BFloat16 : pd, pd != DType::Float32);
  return (*module_)(input);
}

// ---- gathering and freeing --------------------------------------------------------

void FullyShardedDataParallel::startGather(size_t k, const char* why) {
  Unit& u = units_[k];
  if (u.gathered || u.gathering) return;
  const DType pd = options_.mixedPrecision.param;
  u.storage->reallocate(static_cast<size_t>(u.chunk * group_.size()) * elementSize(pd));
  try {
    u.gatherInput = shards_[k].detach();
    if (pd != DType::Float32) {
      NoGradGuard noGrad;
      u.gatherInput = u.gatherInput.to(pd);
    }
    u.gatherWork = group_.allGatherInto(u.flat, u.gatherInput);
  } catch (const std::exception&) {
    u.storage->release();
    u.gatherInput = Tensor();
    detail::rethrowPrefixed(std::current_exception(),
                            weft::detail::concat(kWho, ": gathering the parameters of unit ", k, " ('", u.name,
                                                 "') ", why, " failed: "));
  }
  u.gathering = true;
}

void FullyShardedDataParallel::gather(size_t k, const char* why) {
  Unit& u = units_[k];
  if (u.gathered) return;
  startGather(k, why);
  try {
    u.gatherWork.wait();
  } catch (const std::exception&) {
    u.gathering = false;
    u.gatherWork = Work();
    u.gatherInput = Tensor();
    u.storage->release();
    detail::rethrowPrefixed(std::current_exception(),
                            weft::detail::concat(kWho, ": gathering the parameters of unit ", k, " ('", u.name,
                                                 "') ", why, " failed: "));
  }
  u.gathering = false;
  u.gatherWork = Work();
  u.gatherInput = Tensor();
  u.gathered = true;
}

void FullyShardedDataParallel::prefetch(size_t k, const char* why) {
  if (k == 0) return;  // the root is gathered from the start of forward through its backward
  startGather(k, why);
}

void FullyShardedDataParallel::reshard(size_t k) {
  Unit& u = units_[k];
  if (u.gathering) {
    try {
      u.gatherWork.wait();
    } catch (const std::exception&) {
      // A prefetch nobody used: the group reports its failure to the next op.
    }
    u.gathering = false;
    u.gatherWork = Work();
    u.gatherInput = Tensor();
    u.gathered = true;
  }
  if (!u.gathered) return;
  u.storage->release();
  u.gathered = false;
}

void FullyShardedDataParallel::onPreForward(size_t k) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const bool recomputing = autograd::inBackward();
  if (!recomputing && std::find(forwardOrder_.begin(), forwardOrder_.end(), k) == forwardOrder_.end()) {
    forwardOrder_.push_back(k);
  }
  gather(k, recomputing ? "for the recomputation of its forward" : "before its forward");
  if (recomputing) return;
  // The unit that came next in the previous forward, gathered while this one computes.
  auto at = std::find(previousForwardOrder_.begin(), previousForwardOrder_.end(), k);
  if (at != previousForwardOrder_.end() && at + 1 != previousForwardOrder_.end()) {
    prefetch(*(at + 1), "ahead of its forward");
  }
}

void FullyShardedDataParallel::onPostForward(size_t k, Tensor& output) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (autograd::inBackward()) return;  // a recomputation: kept until its gradients are in
  const bool backwardComes = output.defined() && output.requiresGrad() && output.gradFn() != nullptr;
  if (!backwardComes) {
    reshard(k);
    if (k == 0) {
      for (size_t j = 0; j < units_.size(); ++j) reshard(j);  // prefetches this forward did not use
    }
    return;
  }
  output.gradFn()->registerPreHook([this, k](std::vector<Tensor>&) {
    std::lock_guard<std::recursive_mutex> held(mutex_);
    beginPassLocked();
    gather(k, "before its backward");
    // The unit whose backward comes next: the one before this in forward order.
    auto at = std::find(forwardOrder_.begin(), forwardOrder_.end(), k);
    if (at != forwardOrder_.end() && at != forwardOrder_.begin()) prefetch(*(at - 1), "ahead of its backward");
  });
  if (k != 0 && options_.reshardAfterForward) reshard(k);
}

// ---- backward ---------------------------------------------------------------------

void FullyShardedDataParallel::beginPassLocked() {
  if (passActive_ && passToken_.expired()) abandonPassLocked();
  if (passActive_) return;
  auto token = std::make_shared<int>(0);
  autograd::queueCallback([this, token] { finishPass(); });
  passToken_ = token;
  passActive_ = true;
  for (Param& p : params_) p.ready = false;
  for (Unit& u : units_) {
    u.waiting = u.params.size();
    u.complete = false;
    u.launched = false;
    u.work = Work();
  }
  launchOrder_.assign(forwardOrder_.rbegin(), forwardOrder_.rend());
  for (size_t k = 0; k < units_.size(); ++k) {
    if (std::find(launchOrder_.begin(), launchOrder_.end(), k) == launchOrder_.end()) launchOrder_.push_back(k);
  }
  nextLaunch_ = 0;
  launched_.clear();
}

void FullyShardedDataParallel::onGradient(size_t index, std::vector<Tensor>& grads) {
  Tensor g = grads.empty() ? Tensor() : grads[0];
  if (!grads.empty()) grads[0] = Tensor();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  beginPassLocked();
  // Reductions already done give their buffers back now rather than at the next launch.
  for (auto it = launched_.begin(); it != launched_.end();) {
    if (!units_[*it].work.isCompleted()) {
      ++it;
      continue;
    }
    const size_t done = *it;
    it = launched_.erase(it);
    settleLocked(done);
  }
  Param& p = params_[index];
  Unit& u = units_[p.unit];
  NoGradGuard noGrad;
  WEFT_ENFORCE(!u.complete || !p.ready, StateError, kWho, ": parameter '", p.name,
               "' received a second gradient in one pass after its unit ", p.unit, " was complete");
  if (!u.gradFlat.defined()) {
    if (u.pending.defined()) {
      u.gradFlat = std::exchange(u.pending, Tensor());
    } else {
      u.gradFlat = zeros({u.chunk * group_.size()}, {.dtype = options_.mixedPrecision.reduce});
    }
  }
  if (g.defined()) {
    Tensor slot = u.gradFlat.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.shape());
    slot.add_(g.dtype() == slot.dtype() ? g : g.to(slot.dtype()));
  }
  if (p.ready) return;
  p.ready = true;
  if (--u.waiting > 0) return;
  u.complete = true;
  reshard(p.unit);  // every use of its parameters in this pass is behind us
  launchReadyLocked();
}

void FullyShardedDataParallel::launchReadyLocked() {
  while (nextLaunch_ < launchOrder_.size() && units_[launchOrder_[nextLaunch_]].complete) {
    const size_t k = launchOrder_[nextLaunch_++];
    Unit& u = units_[k];
    if (!sync_) {
      u.pending = std::exchange(u.gradFlat, Tensor());
      continue;
    }
    std::vector<Tensor> inputs;
    for (int r = 0; r < group_.size(); ++r) inputs.push_back(u.gradFlat.narrow(0, r * u.chunk, u.chunk));
    u.reduced = empty({u.chunk}, {.dtype = u.gradFlat.dtype()});
    try {
      u.work = group_.reduceScatter(u.reduced, inputs, ReduceOp::Sum);
    } catch (const std::exception&) {
      detail::rethrowPrefixed(std::current_exception(),
                              weft::detail::concat(kWho, ": backward pass #", passes_ + 1,
                                                   ": launching the reduce-scatter of unit ", k, " failed: "));
    }
    u.launched = true;
    // The earlier units' reductions have had this unit's backward to finish: fold them in
    // and free their buffers, so that at most two units' full gradients are held.
    std::vector<size_t> earlier = std::exchange(launched_, {k});
    for (size_t e : earlier) settleLocked(e);
  }
}

void FullyShardedDataParallel::settleLocked(size_t k) {
  Unit& u = units_[k];
  try {
    u.work.wait();
  } catch (const std::exception&) {
    std::exception_ptr failure = std::current_exception();
    abandonPassLocked();
    detail::rethrowPrefixed(failure, weft::detail::concat(kWho, ": backward pass #", passes_ + 1,
                                                          ": the reduce-scatter of unit ", k, " ('", units_[k].name,
                                                          "') failed (every rank must run the same number of "
                                                          "backward passes over the same units): "));
  }
  NoGradGuard noGrad;
  if (group_.size() > 1) u.reduced.mul_(1.0 / static_cast<double>(group_.size()));
  if (u.reduced.dtype() != DType::Float32) u.reduced = u.reduced.to(DType::Float32);
  Tensor shard = shards_[k];
  Tensor grad = shard.grad();
  if (grad.defined()) {
    grad.add_(u.reduced);
  } else {
    shard.setGrad(u.reduced);
  }
  u.work = Work();
  u.reduced = Tensor();
  u.gradFlat = Tensor();
}

void FullyShardedDataParallel::abandonPassLocked() {
  for (Unit& u : units_) {
    if (u.work.valid()) {
      try {
        u.work.wait();
      } catch (const std::exception&) {
        // The pass is over; its failure was (or will be) reported by the group.
      }
    }
    u.work = Work();
    u.gradFlat = Tensor();
    u.reduced = Tensor();
    reshard(static_cast<size_t>(&u - units_.data()));
  }
  launched_.clear();
  passActive_ = false;
}

void FullyShardedDataParallel::finishPass() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!passActive_) return;
  std::string missing;
  size_t count = 0;
  for (const Param& p : params_) {
    if (p.ready) continue;
    missing += (missing.empty() ? "'" : ", '") + p.name + "'";
    ++count;
  }
  if (count > 0) {
    const int64_t pass = passes_ + 1;
    for (Unit& u : units_) u.pending = Tensor();
    abandonPassLocked();
    throw StateError(weft::detail::concat(kWho, ": backward pass #", pass, ": ", count, " of ", params_.size(),
                                          " parameters received no gradient (", missing,
                                          "), so their units were never reduced (every parameter must receive a "
                                          "gradient in every pass)"));
  }
  WEFT_CHECK(nextLaunch_ == launchOrder_.size()) << nextLaunch_ << " of " << launchOrder_.size() << " units launched";
  std::vector<size_t> last = std::exchange(launched_, {});
  for (size_t k : last) settleLocked(k);
  for (size_t k = 0; k < units_.size(); ++k) reshard(k);
  passActive_ = false;
  if (sync_) ++passes_;
}

// ---- noSync, zeroGrad, clipping ---------------------------------------------------

FullyShardedDataParallel::NoSyncGuard FullyShardedDataParallel::noSync() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const bool previous = sync_;
  sync_ = false;
  return NoSyncGuard(this, previous);
}

void FullyShardedDataParallel::setSync(bool on) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  sync_ = on;
}

void FullyShardedDataParallel::zeroGrad(bool setToNone) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  NoGradGuard noGrad;
  for (Tensor& s : shards_) {
    if (setToNone) {
      s.setGrad(Tensor());
    } else if (s.grad().defined()) {
      s.grad().zero_();
    }
  }
  for (Unit& u : units_) u.pending = Tensor();
}

double FullyShardedDataParallel::clipGradNorm_(double maxNorm, double normType, bool errorIfNonfinite) {
  const std::string where = std::string(kWho) + "::clipGradNorm_";
  WEFT_ENFORCE(normType > 0, InvalidArgumentError, where, ": normType must be positive, got ", normType);
  WEFT_ENFORCE(maxNorm >= 0, InvalidArgumentError, where, ": maxNorm must be non-negative, got ", maxNorm);
  const bool inf = std::isinf(normType);
  NoGradGuard noGrad;
  double part = 0.0;  // padding is zero and adds nothing
  for (const Tensor& s : shards_) {
    const Tensor g = s.grad();
    if (!g.defined() || g.numel() == 0) continue;
    Tensor a = abs(g);
    if (inf) {
      part = std::max(part, max(a).item<double>());
    } else if (normType == 2.0) {
      part += sum(square(a.to(DType::Float64))).item<double>();
    } else {
      part += sum(pow(a.to(DType::Float64), normType)).item<double>();
    }
  }
  Tensor total = scalarTensor(part, DType::Float64).reshape({1});
  try {
    group_.allReduce(total, inf ? ReduceOp::Max : ReduceOp::Sum).wait();
  } catch (const std::exception&) {
    detail::rethrowPrefixed(std::current_exception(), where + ": reducing the gradients' norm failed: ");
  }
  double norm = total.item<double>();
  if (!inf) norm = normType == 2.0 ? std::sqrt(norm) : std::pow(norm, 1.0 / normType);
  WEFT_ENFORCE(!errorIfNonfinite || std::isfinite(norm), InvalidArgumentError, where,
               ": the total norm of order ", normType, " of the gradients is ", norm);
  const double coef = maxNorm / (norm + 1e-6);
  if (coef < 1.0) {
    for (const Tensor& s : shards_) {
      Tensor g = s.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return norm;
}

// ---- state dicts ------------------------------------------------------------------

Tensor FullyShardedDataParallel::gatherCopy(size_t k) {
  const Unit& u = units_[k];
  Tensor out = empty({u.chunk * group_.size()});
  try {
    group_.allGatherInto(out, shards_[k].detach()).wait();
  } catch (const std::exception&) {
    detail::rethrowPrefixed(std::current_exception(), weft::detail::concat(kWho, ": gathering unit ", k,
                                                                           " for the full state dict failed: "));
  }
  return out;
}

nn::StateDict FullyShardedDataParallel::fullStateDict(int to) {
  WEFT_ENFORCE(to >= 0 && to < group_.size(), InvalidArgumentError, kWho, "::fullStateDict: rank ", to,
               " out of range for a group of ", group_.size());
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  WEFT_ENFORCE(!passActive_, StateError, kWho, "::fullStateDict: called during a backward pass");
  NoGradGuard noGrad;
  std::vector<Tensor> values(params_.size());
  for (size_t k = 0; k < units_.size(); ++k) {
    Tensor flat = gatherCopy(k);
    if (group_.rank() != to) continue;
    for (size_t i : units_[k].params) {
      const Param& p = params_[i];
      values[i] = flat.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.shape()).clone();
    }
  }
  if (group_.rank() != to) return {};
  nn::StateDict out;
  // stateDict() detaches without reading: the keys, and the buffers' values.
  for (const auto& [key, t] : module_->stateDict()) {
    auto it = std::find_if(params_.begin(), params_.end(), [&t](const Param& p) {
      return p.tensor.impl()->storage == t.storage() && p.tensor.storageOffset() == t.storageOffset() &&
             p.tensor.shape() == t.shape();
    });
    out.emplace(key, it != params_.end() ? values[static_cast<size_t>(it - params_.begin())] : t.clone());
  }
  return out;
}

void FullyShardedDataParallel::loadFullStateDict(const nn::StateDict& full) {
  const std::string where = std::string(kWho) + "::loadFullStateDict";
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (const Param& p : params_) {
    auto it = full.find(p.name);
    WEFT_ENFORCE(it != full.end() && it->second.defined(), InvalidArgumentError, where, ": the dict has no '",
                 p.name, "'");
    WEFT_ENFORCE(it->second.shape() == p.tensor.shape(), InvalidArgumentError, where, ": '", p.name, "' has shape ",
                 shapeString(it->second.shape()), ", the parameter ", shapeString(p.tensor.shape()));
  }
  const auto buffers = module_->namedBuffers();
  for (const auto& [name, b] : buffers) {
    auto it = full.find(name);
    if (it == full.end()) continue;
    WEFT_ENFORCE(it->second.shape() == b.shape(), InvalidArgumentError, where, ": buffer '", name, "' has shape ",
                 shapeString(it->second.shape()), ", the module's ", shapeString(b.shape()));
  }
  NoGradGuard noGrad;
  const int64_t r = group_.rank();
  for (size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    Tensor flat = zeros({u.chunk * group_.size()});
    for (size_t i : u.params) {
      const Param& p = params_[i];
      flat.narrow(0, p.offset, p.tensor.numel())
          .copy_(full.at(p.name).to(Device::cpu()).to(DType::Float32).reshape({-1}));
    }
    Tensor shard = shards_[k];
    shard.detach().copy_(flat.narrow(0, r * u.chunk, u.chunk));
  }
  for (const auto& [name, b] : buffers) {
    auto it = full.find(name);
    if (it == full.end()) continue;
    Tensor target = b;
    target.copy_(it->second.to(b.device()).to(b.dtype()));
  }
}

nn::StateDict FullyShardedDataParallel::shardedStateDict() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  nn::StateDict out;
  Tensor meta = empty({static_cast<int64_t>(units_.size()), 2}, {.dtype = DType::Int64});
  for (size_t k = 0; k < units_.size(); ++k) {
    meta.data<int64_t>()[2 * k] = units_[k].numel;
    meta.data<int64_t>()[2 * k + 1] = units_[k].chunk;
    out.emplace(weft::detail::concat("shard.", k), shards_[k].detach().clone());
  }
  for (const auto& [name, b] : module_->namedBuffers()) out.emplace("buffer." + name, b.detach().clone());
  out.emplace("shard.rank", scalarTensor(group_.rank(), DType::Int64));
  out.emplace("shard.world", scalarTensor(group_.size(), DType::Int64));
  out.emplace("shard.units", meta);
  return out;
}

void FullyShardedDataParallel::loadShardedStateDict(const nn::StateDict& shard) {
  const std::string w = std::string(kWho) + "::loadShardedStateDict";
  const char* where = w.c_str();
  const int64_t world = int64Scalar(shard, "shard.world", where);
  const int64_t rank = int64Scalar(shard, "shard.rank", where);
  WEFT_ENFORCE(world == group_.size(), InvalidArgumentError, where, ": the shard was saved in a group of ", world,
               " ranks, this group has ", group_.size());
  WEFT_ENFORCE(rank == group_.rank(), InvalidArgumentError, where, ": the shard was saved by rank ", rank,
               ", this is rank ", group_.rank());
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = shard.find("shard.units");
  WEFT_ENFORCE(it != shard.end() && it->second.defined(), InvalidArgumentError, where,
               ": the dict has no 'shard.units'");
  std::vector<int64_t> saved = it->second.to(Device::cpu()).toVector<int64_t>();
  std::vector<int64_t> mine;
  for (const Unit& u : units_) mine.insert(mine.end(), {u.numel, u.chunk});
  WEFT_ENFORCE(saved == mine, InvalidArgumentError, where, ": the shard describes ", saved.size() / 2,
               " units other than the ", units_.size(), " of this wrapper (the model or its units differ)");
  const auto buffers = module_->namedBuffers();
  for (const auto& [key, value] : shard) {
    if (key == "shard.world" || key == "shard.rank" || key == "shard.units") continue;
    WEFT_ENFORCE(value.defined(), InvalidArgumentError, where, ": '", key, "' is undefined");
    if (key.rfind("buffer.", 0) == 0) {
      const std::string name = key.substr(7);
      auto b = std::find_if(buffers.begin(), buffers.end(), [&](const auto& nb) { return nb.first == name; });
      WEFT_ENFORCE(b != buffers.end(), InvalidArgumentError, where, ": '", key, "' names no buffer of the module");
      WEFT_ENFORCE(value.shape() == b->second.shape(), InvalidArgumentError, where, ": '", key, "' has shape ",
                   shapeString(value.shape()), ", the buffer ", shapeString(b->second.shape()));
      continue;
    }
    bool known = false;
    for (size_t k = 0; k < units_.size() && !known; ++k) {
      if (key != weft::detail::concat("shard.", k)) continue;
      known = true;
      WEFT_ENFORCE(value.numel() == units_[k].chunk, InvalidArgumentError, where, ": '", key, "' holds ",
                   value.numel(), " elements, the shard has ", units_[k].chunk);
    }
    WEFT_ENFORCE(known, InvalidArgumentError, where, ": unexpected key '", key, "'");
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    const std::string key = weft::detail::concat("shard.", k);
    WEFT_ENFORCE(shard.count(key) != 0, InvalidArgumentError, where, ": the dict has no '", key, "'");
  }
  NoGradGuard noGrad;
  for (size_t k = 0; k < units_.size(); ++k) {
    Tensor s = shards_[k].detach();
    s.copy_(shard.at(weft::detail::concat("shard.", k)).to(Device::cpu()).to(DType::Float32).reshape({-1}));
  }
  for (const auto& [name, b] : buffers) {
    auto found = shard.find("buffer." + name);
    if (found == shard.end()) continue;
    Tensor target = b;
    target.copy_(found->second.to(b.device()).to(b.dtype()));
  }
}

// ---- introspection ----------------------------------------------------------------

std::vector<FullyShardedDataParallel::UnitInfo> FullyShardedDataParallel::units() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::vector<UnitInfo> out;
  for (const Unit& u : units_) {
    UnitInfo info;
    info.name = u.name;
    for (size_t i : u.params) info.params.push_back(params_[i].name);
    info.numel = u.numel;
    info.shardNumel = u.chunk;
    info.gathered = u.gathered;
    out.push_back(std::move(info));
  }
  return out;
}

int64_t FullyShardedDataParallel::shardBytes() const {
  int64_t bytes = 0;
  for (const Tensor& s : shards_) bytes += static_cast<int64_t>(s.nbytes());
  return bytes;
}

int64_t FullyShardedDataParallel::gradientShardBytes() const {
  int64_t bytes = 0;
  for (const Tensor& s : shards_) {
    if (s.grad().defined()) bytes += static_cast<int64_t>(s.grad().nbytes());
  }
  return bytes;
}

int64_t FullyShardedDataParallel::gatheredBytes() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const Unit& u : units_) {
    bytes += static_cast<int64_t>(u.storage->nbytes());
    if (u.pending.defined()) bytes += static_cast<int64_t>(u.pending.nbytes());
  }
  return bytes;
}

}  // namespace weft::collectives
