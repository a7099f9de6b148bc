#include "collectives/ddp.h"

#include <algorithm>
#include <exception>
#include <unordered_set>
#include <utility>

#include "collectives/detail/sharding.h"
#include "common/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::collectives {

namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A contiguous view of `flat`'s elements [offset, offset + t.numel()) shaped like t.
Tensor sliceLike(const Tensor& flat, int64_t offset, const Tensor& t) {
  return flat.narrow(0, offset, t.numel()).view(t.shape());
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group,
                                                 Options options)
    : module_(std::move(module)), group_(group), options_(options) {
  WEFT_ENFORCE(module_ != nullptr, InvalidArgumentError, "DistributedDataParallel: the module is null");
  WEFT_ENFORCE(options_.bucketCapBytes > 0, InvalidArgumentError,
               "DistributedDataParallel: Options::bucketCapBytes must be > 0, got ", options_.bucketCapBytes);
  if (options_.reduceDtype) {
    const DType rd = *options_.reduceDtype;
    WEFT_ENFORCE(rd == DType::Float32 || rd == DType::Float16 || rd == DType::Float64, InvalidArgumentError,
                 "DistributedDataParallel: Options::reduceDtype must be float32, float16 or float64, got ",
                 dtypeName(rd));
  }
  for (auto& [name, t] : module_->namedParameters()) {
    if (!t.requiresGrad()) continue;
    Param p;
    p.tensor = t;
    p.name = name;
    params_.push_back(std::move(p));
  }
  WEFT_ENFORCE(!params_.empty(), InvalidArgumentError, "DistributedDataParallel: module ", module_->typeName(),
               " has no parameter that requires grad: there is nothing to synchronise");
  for (const Param& p : params_) {
    detail::checkReducible(group_, p.tensor.dtype(), options_.reduceDtype, "DistributedDataParallel", p.name);
  }
  broadcastState();
  std::vector<size_t> reverse(params_.size());
  for (size_t i = 0; i < reverse.size(); ++i) reverse[i] = reverse.size() - 1 - i;
  layOutBuckets(reverse);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].hookId = params_[i].tensor.gradAccumulator()->registerPreHook(
        [this, i](std::vector<Tensor>& grads) { onGradient(i, grads); });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Param& p : params_) {
    if (p.hookId >= 0) p.tensor.gradAccumulator()->removeHook(p.hookId);
  }
  for (Bucket& b : buckets_) {
    if (b.work.valid()) {
      try {
        b.work.wait();
      } catch (const std::exception&) {
        // Dropped: the destructor has nobody to report to.
      }
    }
  }
}

void DistributedDataParallel::broadcastState() {
  std::vector<Tensor> all = module_->parameters();
  for (const Tensor& b : module_->buffers()) all.push_back(b);
  broadcastFromRank0(all,
                     "DistributedDataParallel: broadcasting the parameters and buffers from rank 0 failed (every rank "
                     "must wrap a module with the same parameters and buffers): ");
}

void DistributedDataParallel::broadcastFromRank0(const std::vector<Tensor>& all, const std::string& prefix) {
  // Coalesced into flat tensors of one dtype and device, at most
  // bucketCapBytes each (or one tensor).
  struct Group {
    std::vector<size_t> members;
    int64_t numel = 0;
    Tensor flat;
    Work work;
  };
  std::vector<Group> groups;
  int64_t bytes = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Tensor& t = all[i];
    const int64_t tb = static_cast<int64_t>(t.nbytes());
    bool fresh = groups.empty() || bytes + tb > options_.bucketCapBytes;
    if (!fresh) {
      const Tensor& first = all[groups.back().members.front()];
      fresh = first.dtype() != t.dtype() || first.device() != t.device();
    }
    if (fresh) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().members.push_back(i);
    groups.back().numel += t.numel();
    bytes += tb;
  }
  NoGradGuard noGrad;
  try {
    for (Group& g : groups) {
      const Tensor& first = all[g.members.front()];
      g.flat = empty({g.numel}, {.dtype = first.dtype(), .device = first.device()});
      int64_t offset = 0;
      for (size_t i : g.members) {
        sliceLike(g.flat, offset, all[i]).copy_(all[i]);
        offset += all[i].numel();
      }
      g.work = group_.broadcast(g.flat, 0);
    }
  } catch (const std::exception&) {
    for (Group& g : groups) {
      if (!g.work.valid()) continue;
      try {
        g.work.wait();
      } catch (const std::exception&) {
        // The first error is the one reported.
      }
    }
    detail::rethrowPrefixed(std::current_exception(), prefix);
  }
  const std::exception_ptr failure = detail::waitAll(groups, [](const Group& g) -> const Work& { return g.work; }).first;
  if (failure) detail::rethrowPrefixed(failure, prefix);
  if (group_.rank() == 0) return;
  for (Group& g : groups) {
    int64_t offset = 0;
    for (size_t i : g.members) {
      Tensor target = all[i];  // a handle: copy_ writes the caller's tensor
      target.copy_(sliceLike(g.flat, offset, target));
      offset += all[i].numel();
    }
  }
}

void DistributedDataParallel::layOutBuckets(const std::vector<size_t>& order) {
  buckets_.clear();
  int64_t bytes = 0;
  for (size_t k : order) {
    Param& p = params_[k];
    const int64_t pb = static_cast<int64_t>(p.tensor.nbytes());
    bool fresh = buckets_.empty() || bytes + pb > options_.bucketCapBytes;
    if (!fresh) {
      const Tensor& first = params_[buckets_.back().params.front()].tensor;
      fresh = first.dtype() != p.tensor.dtype() || first.device() != p.tensor.device();
    }
    if (fresh) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    p.bucket = buckets_.size() - 1;
    p.offset = bytes / static_cast<int64_t>(elementSize(p.tensor.dtype()));
    b.params.push_back(k);
    bytes += pb;
  }
  for (Bucket& b : buckets_) {
    const Tensor& first = params_[b.params.front()].tensor;
    b.numel = 0;
    for (size_t k : b.params) b.numel += params_[k].tensor.numel();
    b.dtype = options_.reduceDtype.value_or(first.dtype());
    if (!options_.reduceDtype) b.flat = zeros({b.numel}, {.dtype = b.dtype, .device = first.device()});
  }
}

void DistributedDataParallel::releaseBucketsLocked() {
  if (!options_.reduceDtype) return;
  for (Bucket& b : buckets_) b.flat = Tensor();
}

void DistributedDataParallel::rebuildBuckets(const std::vector<size_t>& arrived, int64_t passNumber) {
  // Rank 0's arrival order, then the parameters that got no gradient there
  // (in reverse order: they are ready from the start or only at the end).
  const size_t n = params_.size();
  std::vector<size_t> order;
  std::vector<bool> seen(n, false);
  for (size_t k : arrived) {
    if (!seen[k]) order.push_back(k);
    seen[k] = true;
  }
  for (size_t k = n; k-- > 0;) {
    if (!seen[k]) order.push_back(k);
  }
  if (group_.size() > 1) {
    Tensor shared = empty({static_cast<int64_t>(n)}, {.dtype = DType::Int64});
    for (size_t i = 0; i < n; ++i) shared.data<int64_t>()[i] = static_cast<int64_t>(order[i]);
    try {
      group_.broadcast(shared, 0).wait();
    } catch (const std::exception&) {
      detail::rethrowPrefixed(std::current_exception(),
                      weft::detail::concat("DistributedDataParallel: after synced backward pass #", passNumber,
                                           ": broadcasting rank 0's gradient order for the bucket rebuild failed: "));
    }
    std::vector<bool> placed(n, false);
    for (size_t i = 0; i < n; ++i) {
      const int64_t k = shared.data<int64_t>()[i];
      WEFT_ENFORCE(k >= 0 && static_cast<size_t>(k) < n && !placed[static_cast<size_t>(k)], StateError,
                   "DistributedDataParallel: rank 0's gradient order for the bucket rebuild is not an order of this "
                   "rank's ", n, " parameters (entry ", i, " is ", k, "): every rank must wrap the same module");
      placed[static_cast<size_t>(k)] = true;
      order[i] = static_cast<size_t>(k);
    }
  }
  layOutBuckets(order);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  broadcastBuffersForForward();
  Tensor out = module_->forward(input);
  if (options_.findUnusedParameters) prepareForBackward({out});
  return out;
}

void DistributedDataParallel::broadcastBuffersForForward() {
  if (options_.broadcastBuffers && group_.size() > 1 && GradMode::enabled() && syncEnabled()) {
    std::vector<Tensor> buffers = module_->buffers();
    if (!buffers.empty()) {
      broadcastFromRank0(buffers,
                         "DistributedDataParallel: broadcasting the buffers from rank 0 before forward failed (every "
                         "rank runs the same number of synced forwards): ");
    }
  }
}

void DistributedDataParallel::prepareForBackward(const std::vector<Tensor>& outputs) {
  if (!options_.findUnusedParameters) return;
  // Every node of the outputs' local graph.
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack;
  auto push = [&](const std::shared_ptr<Node>& n) {
    if (n && seen.insert(n.get()).second) stack.push_back(n);
  };
  for (const Tensor& o : outputs) {
    if (!o.defined() || !o.requiresGrad()) continue;
    push(o.isLeaf() ? std::static_pointer_cast<Node>(o.gradAccumulator()) : o.gradFn());
  }
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    for (const Edge& e : n->nextEdges()) push(e.fn);
  }
  std::vector<bool> unused(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    unused[i] = seen.count(params_[i].tensor.gradAccumulator().get()) == 0;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  unusedNext_ = std::move(unused);
}

Tensor DistributedDataParallel::slotOf(const Param& p) {
  Bucket& b = buckets_[p.bucket];
  if (!b.flat.defined()) b.flat = empty({b.numel}, {.dtype = b.dtype, .device = p.tensor.device()});
  return sliceLike(b.flat, p.offset, p.tensor);
}

void DistributedDataParallel::onGradient(size_t index, std::vector<Tensor>& grads) {
  Tensor g = grads.empty() ? Tensor() : grads[0];
  std::lock_guard<std::mutex> lock(mutex_);
  Param& p = params_[index];
  if (!sync_) {
    if (!g.defined()) return;
    grads[0] = Tensor();
    NoGradGuard noGrad;
    if (p.pending.defined()) {
      p.pending.add_(g);
    } else {
      p.pending = g.contiguous().clone();
    }
    return;
  }
  if (passActive_ && passToken_.expired()) abandonPassLocked();
  if (!passActive_) {
    auto token = std::make_shared<int>(0);
    autograd::queueCallback([this, token] { finishPass(); });
    passToken_ = token;
    startPassLocked();
  }
  if (!grads.empty()) grads[0] = Tensor();
  stats_.hookOrder.push_back(index);
  stats_.hookNs.push_back(nowNs());
  ++hooksThisPass_;
  markReadyLocked(index, g);
  launchReadyLocked();
}

void DistributedDataParallel::startPassLocked() {
  passActive_ = true;
  nextBucket_ = 0;
  hooksThisPass_ = 0;
  for (Param& p : params_) {
    p.ready = false;
    p.markedUnused = false;
  }
  for (Bucket& b : buckets_) {
    b.waiting = b.params.size();
    b.launched = false;
    b.work = Work();
  }
  stats_.hookOrder.clear();
  stats_.hookNs.clear();
  stats_.launches.clear();
  stats_.unusedParameters = 0;
  stats_.completedAtEnd = 0;
  if (!unusedNext_.empty()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!unusedNext_[i]) continue;
      params_[i].markedUnused = true;
      markReadyLocked(i, Tensor());
      ++stats_.unusedParameters;
    }
    unusedNext_.clear();
  }
}

void DistributedDataParallel::markReadyLocked(size_t index, const Tensor& grad) {
  Param& p = params_[index];
  Bucket& b = buckets_[p.bucket];
  NoGradGuard noGrad;
  if (p.ready) {
    // A second gradient for this parameter in this pass.
    WEFT_ENFORCE(!b.launched, StateError, "DistributedDataParallel: parameter '", p.name,
                 "' received a gradient after its bucket ", p.bucket, " was launched",
                 p.markedUnused ? " (forward marked it unused: findUnusedParameters walks the local graph only)"
                                : " (a second gradient in one pass after its bucket was complete)");
    if (grad.defined()) slotOf(p).add_(grad.dtype() == b.dtype ? grad : grad.to(b.dtype));
    return;
  }
  Tensor slot = slotOf(p);
  if (grad.defined()) {
    slot.copy_(grad);
  } else {
    slot.zero_();
  }
  if (p.pending.defined()) {
    slot.add_(p.pending.dtype() == b.dtype ? p.pending : p.pending.to(b.dtype));
    p.pending = Tensor();
  }
  p.ready = true;
  --b.waiting;
}

void DistributedDataParallel::launchReadyLocked() {
  while (nextBucket_ < buckets_.size() && buckets_[nextBucket_].waiting == 0) {
    Bucket& b = buckets_[nextBucket_];
    b.work = group_.allReduce(b.flat, ReduceOp::Sum);
    b.launched = true;
    stats_.launches.push_back({nextBucket_, hooksThisPass_, nowNs()});
    ++nextBucket_;
  }
}

void DistributedDataParallel::abandonPassLocked() {
  for (Bucket& b : buckets_) {
    if (!b.work.valid()) continue;
    try {
      b.work.wait();
    } catch (const std::exception&) {
      // The pass is over; its failure was (or will be) reported by the group.
    }
    b.work = Work();
  }
  releaseBucketsLocked();
  passActive_ = false;
}

void DistributedDataParallel::finishPass() {
  std::vector<std::pair<size_t, Work>> works;
  int64_t passNumber = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!passActive_) return;
    passNumber = stats_.syncedPasses + 1;
    std::vector<size_t> missing;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].ready) missing.push_back(i);
    }
    if (!missing.empty()) {
      if (options_.findUnusedParameters) {
        for (size_t i : missing) {
          markReadyLocked(i, Tensor());
          ++stats_.unusedParameters;
        }
        launchReadyLocked();
      } else {
        std::string names;
        for (size_t i : missing) names += (names.empty() ? "'" : ", '") + params_[i].name + "'";
        abandonPassLocked();
        throw StateError(weft::detail::concat(
            "DistributedDataParallel: synced backward pass #", passNumber, ": ", missing.size(), " of ",
            params_.size(), " parameters received no gradient (", names,
            "), so their buckets' allreduce was never launched and no gradient was handed over; construct "
            "DistributedDataParallel with Options::findUnusedParameters = true when a forward may leave "
            "parameters unused (every rank must launch the same allreduces)"));
      }
    }
    WEFT_CHECK(nextBucket_ == buckets_.size()) << nextBucket_ << " of " << buckets_.size() << " buckets launched";
    for (size_t k = 0; k < buckets_.size(); ++k) {
      if (buckets_[k].work.isCompleted()) ++stats_.completedAtEnd;
      works.emplace_back(k, buckets_[k].work);
    }
  }
  const auto [failure, failedAt] = detail::waitAll(works, [](const auto& kw) -> const Work& { return kw.second; });
  const size_t failedBucket = failure ? works[failedAt].first : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  for (Bucket& b : buckets_) b.work = Work();
  passActive_ = false;
  if (failure) {
    releaseBucketsLocked();
    detail::rethrowPrefixed(failure, weft::detail::concat("DistributedDataParallel: synced backward pass #", passNumber,
                                            ": the allreduce of bucket ", failedBucket, " (of ", buckets_.size(),
                                            ") failed (every rank must run the same number of synced backward "
                                            "passes over the same parameters): "));
  }
  NoGradGuard noGrad;
  const double scale = 1.0 / static_cast<double>(group_.size());
  for (Bucket& b : buckets_) {
    if (group_.size() > 1) b.flat.mul_(scale);
  }
  for (Param& p : params_) {
    Tensor slot = slotOf(p);
    autograd::accumulateLeafGradient(p.tensor, slot.dtype() == p.tensor.dtype() ? slot : slot.to(p.tensor.dtype()));
  }
  releaseBucketsLocked();
  ++stats_.syncedPasses;
  if (stats_.syncedPasses == 1 && options_.rebuildBuckets) {
    rebuildBuckets(stats_.hookOrder, stats_.syncedPasses);
    ++stats_.bucketRebuilds;
  }
}

DistributedDataParallel::NoSyncGuard DistributedDataParallel::noSync() {
  std::lock_guard<std::mutex> lock(mutex_);
  bool previous = sync_;
  sync_ = false;
  return NoSyncGuard(this, previous);
}

void DistributedDataParallel::setSync(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_ = on;
}

bool DistributedDataParallel::syncEnabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_;
}

std::vector<Tensor> DistributedDataParallel::parameters() const {
  std::vector<Tensor> out;
  out.reserve(params_.size());
  for (const Param& p : params_) out.push_back(p.tensor);
  return out;
}

std::vector<std::string> DistributedDataParallel::parameterNames() const {
  std::vector<std::string> out;
  out.reserve(params_.size());
  for (const Param& p : params_) out.push_back(p.name);
  return out;
}

std::vector<std::vector<size_t>> DistributedDataParallel::buckets() const {
  std::lock_guard<std::mutex> lock(mutex_);  // the rebuild replaces them
  std::vector<std::vector<size_t>> out;
  out.reserve(buckets_.size());
  for (const Bucket& b : buckets_) out.push_back(b.params);
  return out;
}

Tensor DistributedDataParallel::pendingGradient(size_t index) const {
  WEFT_ENFORCE(index < params_.size(), IndexError, "DistributedDataParallel::pendingGradient: index ", index,
               " out of range for ", params_.size(), " parameters");
  std::lock_guard<std::mutex> lock(mutex_);
  return params_[index].pending;
}

DistributedDataParallel::Stats DistributedDataParallel::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace weft::collectives
