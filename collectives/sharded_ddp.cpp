#include "collectives/sharded_ddp.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "collectives/detail/sharding.h"
#include "collectives/object_collectives.h"
#include "common/error.h"
#include "nn/master_weights.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::collectives {

namespace {

// The state dicts' name for the float32 masters (Options::masterWeights).
constexpr const char* kMasterName = "master";

std::vector<nn::optim::ParamGroup> oneGroup(const nn::Module* module, nn::optim::OptimizerOptions options) {
  WEFT_ENFORCE(module != nullptr, InvalidArgumentError, "ShardedDataParallel: the module is null");
  std::vector<Tensor> params;
  for (const Tensor& p : module->parameters()) {
    if (p.requiresGrad()) params.push_back(p);
  }
  return {nn::optim::ParamGroup{std::move(params), std::move(options)}};
}

}  // namespace

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<nn::Module> module, nn::optim::OptimizerOptions options,
                                         ProcessGroup& group)
    : ShardedDataParallel(module, oneGroup(module.get(), std::move(options)), group, Options{}) {}

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<nn::Module> module, std::vector<nn::optim::ParamGroup> groups,
                                         ProcessGroup& group, Options options)
    : module_(std::move(module)), group_(group), options_(options), groups_(std::move(groups)) {
  WEFT_ENFORCE(module_ != nullptr, InvalidArgumentError, "ShardedDataParallel: the module is null");
  WEFT_ENFORCE(options_.bucketCapBytes > 0, InvalidArgumentError,
               "ShardedDataParallel: Options::bucketCapBytes must be > 0, got ", options_.bucketCapBytes);
  if (options_.reduceDtype) {
    const DType rd = *options_.reduceDtype;
    WEFT_ENFORCE(rd == DType::Float32 || rd == DType::Float16 || rd == DType::Float64, InvalidArgumentError,
                 "ShardedDataParallel: Options::reduceDtype must be float32, float16 or float64, got ", dtypeName(rd));
  }
  { nn::optim::Optimizer check(groups_); }  // the plain optimizer's checks
  auto named = module_->namedParameters();
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const Tensor& p : groups_[g].params) {
      auto it = std::find_if(named.begin(), named.end(), [&p](const auto& np) { return np.second.sameAs(p); });
      WEFT_ENFORCE(it != named.end(), InvalidArgumentError, "ShardedDataParallel: parameter ", params_.size(),
                   " of the groups is not a parameter of module ", module_->typeName());
      WEFT_ENFORCE(p.requiresGrad(), InvalidArgumentError, "ShardedDataParallel: parameter '", it->first,
                   "' does not require grad");
      WEFT_ENFORCE(p.isContiguous(), InvalidArgumentError, "ShardedDataParallel: parameter '", it->first,
                   "' is not contiguous");
      detail::checkReducible(group_, p.dtype(), options_.reduceDtype, "ShardedDataParallel", it->first);
      Param m;
      m.tensor = p;
      m.name = it->first;
      m.group = g;
      m.moduleIndex = static_cast<size_t>(it - named.begin());
      meta_.push_back(std::move(m));
      params_.push_back(p);
    }
  }
  std::vector<size_t> sizes;
  for (const nn::optim::ParamGroup& g : groups_) sizes.push_back(g.params.size());
  detail::checkLayoutsAgree(group_, sizes, params_, "ShardedDataParallel");
  broadcastState();
  layOut();
  for (size_t i = 0; i < meta_.size(); ++i) {
    meta_[i].hookId = meta_[i].tensor.gradAccumulator()->registerPreHook(
        [this, i](std::vector<Tensor>& grads) { onGradient(i, grads); });
  }
}

ShardedDataParallel::~ShardedDataParallel() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Param& p : meta_) {
    if (p.hookId >= 0) p.tensor.gradAccumulator()->removeHook(p.hookId);
  }
  for (Bucket& b : buckets_) {
    if (!b.work.valid()) continue;
    try {
      b.work.wait();
    } catch (const std::exception&) {
      // Dropped: the destructor has nobody to report to.
    }
  }
}

void ShardedDataParallel::broadcastState() {
  detail::broadcastModuleState(group_, *module_, "ShardedDataParallel");
}

void ShardedDataParallel::layOut() {
  // Reverse module order: the order in which backward usually produces the gradients.
  std::vector<size_t> order(meta_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(),
            [this](size_t a, size_t b) { return meta_[a].moduleIndex > meta_[b].moduleIndex; });
  int64_t bytes = 0;
  for (size_t k : order) {
    Param& p = meta_[k];
    const auto pb = static_cast<int64_t>(p.tensor.nbytes());
    bool fresh = buckets_.empty() || bytes + pb > options_.bucketCapBytes;
    if (!fresh) fresh = meta_[buckets_.back().params.front()].tensor.dtype() != p.tensor.dtype();
    if (fresh) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    p.bucket = buckets_.size() - 1;
    p.offset = b.numel;
    b.params.push_back(k);
    b.numel += p.tensor.numel();
    bytes += pb;
  }
  const int64_t n = group_.size();
  const int64_t r = group_.rank();
  NoGradGuard noGrad;
  for (Bucket& b : buckets_) {
    b.chunk = (b.numel + n - 1) / n;
    const int64_t lo = r * b.chunk;
    const int64_t hi = lo + b.chunk;
    for (size_t k : b.params) {
      const Param& p = meta_[k];
      const int64_t from = std::max(lo, p.offset);
      const int64_t to = std::min(hi, p.offset + p.tensor.numel());
      if (from >= to) continue;
      Piece piece;
      piece.param = k;
      piece.start = from - p.offset;
      piece.length = to - from;
      piece.shardOffset = from - lo;
      piece.values = p.tensor.detach().view({-1}).narrow(0, piece.start, piece.length);
      if (options_.masterWeights && nn::optim::needsMaster(p.tensor.dtype())) {
        piece.master = piece.values.to(DType::Float32);
      }
      b.pieces.push_back(pieces_.size());
      pieces_.push_back(std::move(piece));
    }
  }
}

void ShardedDataParallel::onGradient(size_t index, std::vector<Tensor>& grads) {
  Tensor g = grads.empty() ? Tensor() : grads[0];
  if (!grads.empty()) grads[0] = Tensor();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) {
    if (!g.defined()) return;
    NoGradGuard noGrad;
    Param& p = meta_[index];
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
    passActive_ = true;
    nextBucket_ = 0;
    for (Param& p : meta_) p.ready = false;
    for (Bucket& b : buckets_) {
      b.waiting = b.params.size();
      b.launched = false;
      b.work = Work();
    }
    stats_.launchHooks.clear();
    stats_.hooks = 0;
  }
  ++stats_.hooks;
  Param& p = meta_[index];
  Bucket& b = buckets_[p.bucket];
  NoGradGuard noGrad;
  const DType reduceDtype = options_.reduceDtype.value_or(p.tensor.dtype());
  if (g.defined() && g.dtype() != reduceDtype) g = g.to(reduceDtype);
  if (!b.flat.defined()) {
    b.flat = empty({b.chunk * group_.size()}, {.dtype = reduceDtype});
    b.flat.narrow(0, b.numel, b.flat.numel() - b.numel).zero_();  // padding
  }
  Tensor slot = b.flat.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.shape());
  if (p.ready) {
    WEFT_ENFORCE(!b.launched, StateError, "ShardedDataParallel: parameter '", p.name,
                 "' received a second gradient in one pass after its bucket ", p.bucket, " was reduced");
    if (g.defined()) slot.add_(g);
    return;
  }
  if (g.defined()) {
    slot.copy_(g);
  } else {
    slot.zero_();
  }
  if (p.pending.defined()) {
    slot.add_(p.pending.dtype() == reduceDtype ? p.pending : p.pending.to(reduceDtype));
    p.pending = Tensor();
  }
  p.ready = true;
  --b.waiting;
  launchReadyLocked();
}

void ShardedDataParallel::launchReadyLocked() {
  while (nextBucket_ < buckets_.size() && buckets_[nextBucket_].waiting == 0) {
    Bucket& b = buckets_[nextBucket_];
    std::vector<Tensor> inputs;
    for (int r = 0; r < group_.size(); ++r) inputs.push_back(b.flat.narrow(0, r * b.chunk, b.chunk));
    b.reduced = empty({b.chunk}, {.dtype = b.flat.dtype()});
    b.work = group_.reduceScatter(b.reduced, inputs, ReduceOp::Sum);
    b.launched = true;
    stats_.launchHooks.push_back(stats_.hooks);
    ++nextBucket_;
  }
}

void ShardedDataParallel::abandonPassLocked() {
  for (Bucket& b : buckets_) {
    if (b.work.valid()) {
      try {
        b.work.wait();
      } catch (const std::exception&) {
        // The pass is over; its failure was (or will be) reported by the group.
      }
    }
    b.work = Work();
    b.flat = Tensor();
    b.reduced = Tensor();
  }
  passActive_ = false;
}

void ShardedDataParallel::finishPass() {
  std::vector<std::pair<size_t, Work>> works;
  int64_t passNumber = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!passActive_) return;
    passNumber = stats_.syncedPasses + 1;
    std::string missing;
    size_t count = 0;
    for (const Param& p : meta_) {
      if (p.ready) continue;
      missing += (missing.empty() ? "'" : ", '") + p.name + "'";
      ++count;
    }
    if (count > 0) {
      abandonPassLocked();
      throw StateError(weft::detail::concat("ShardedDataParallel: backward pass #", passNumber, ": ", count, " of ",
                                            meta_.size(), " parameters received no gradient (", missing,
                                            "), so their buckets were never reduced and no gradient was kept (every "
                                            "parameter must receive a gradient in every pass)"));
    }
    WEFT_CHECK(nextBucket_ == buckets_.size()) << nextBucket_ << " of " << buckets_.size() << " buckets launched";
    for (size_t k = 0; k < buckets_.size(); ++k) works.emplace_back(k, buckets_[k].work);
  }
  const auto [failure, failedAt] = detail::waitAll(works, [](const auto& kw) -> const Work& { return kw.second; });
  const size_t failedBucket = failure ? works[failedAt].first : 0;
  std::lock_guard<std::mutex> lock(mutex_);
  passActive_ = false;
  if (failure) {
    for (Bucket& b : buckets_) {
      b.work = Work();
      b.flat = Tensor();
      b.reduced = Tensor();
    }
    detail::rethrowPrefixed(failure, weft::detail::concat("ShardedDataParallel: backward pass #", passNumber,
                                                          ": the reduce-scatter of bucket ", failedBucket, " (of ",
                                                          buckets_.size(),
                                                          ") failed (every rank must run the same number of "
                                                          "backward passes over the same parameters): "));
  }
  NoGradGuard noGrad;
  const double scale = 1.0 / static_cast<double>(group_.size());
  for (Bucket& b : buckets_) {
    if (group_.size() > 1) b.reduced.mul_(scale);
    const DType gradDtype = meta_[b.params.front()].tensor.dtype();  // the gradient shard's: the parameters'
    if (b.reduced.dtype() != gradDtype) b.reduced = b.reduced.to(gradDtype);
    if (b.gradShard.defined()) {
      b.gradShard.add_(b.reduced);
    } else {
      b.gradShard = b.reduced;
    }
    b.work = Work();
    b.flat = Tensor();
    b.reduced = Tensor();
  }
  ++stats_.syncedPasses;
}

void ShardedDataParallel::step() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_ENFORCE(!passActive_, StateError, "ShardedDataParallel::step: called during a backward pass");
    // Each group's slices, with their state moved out and back.
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<size_t> mine;
      for (size_t i = 0; i < pieces_.size(); ++i) {
        if (meta_[pieces_[i].param].group == g) mine.push_back(i);
      }
      if (mine.empty()) continue;
      std::vector<Tensor> values, grads;
      std::vector<nn::optim::ParamState> state;
      for (size_t i : mine) {
        const Piece& piece = pieces_[i];
        const Bucket& b = buckets_[meta_[piece.param].bucket];
        const Tensor stepped = piece.stepped();
        values.push_back(stepped);
        Tensor grad = b.gradShard.defined() ? b.gradShard.narrow(0, piece.shardOffset, piece.length) : Tensor();
        if (grad.defined() && grad.dtype() != stepped.dtype()) grad = grad.to(stepped.dtype());
        grads.push_back(grad);
        state.push_back(std::move(pieces_[i].state));
      }
      struct MoveBack {
        std::vector<nn::optim::ParamState>& from;
        std::vector<Piece>& to;
        const std::vector<size_t>& at;
        ~MoveBack() {
          for (size_t j = 0; j < at.size(); ++j) to[at[j]].state = std::move(from[j]);
        }
      } moveBack{state, pieces_, mine};
      nn::optim::step(groups_[g].options, values, grads, state);
      NoGradGuard noGrad;
      for (size_t j = 0; j < mine.size(); ++j) {
        Piece& piece = pieces_[mine[j]];
        if (piece.master.defined() && grads[j].defined()) piece.values.copy_(piece.master);
      }
    }
  }
  // Every bucket's parameters from their owners.
  NoGradGuard noGrad;
  std::vector<Tensor> gathered(buckets_.size());
  std::vector<Work> works;
  std::exception_ptr failure;
  size_t failedBucket = 0;
  try {
    for (size_t k = 0; k < buckets_.size(); ++k) {
      const Bucket& b = buckets_[k];
      const DType dtype = meta_[b.params.front()].tensor.dtype();
      Tensor mine = zeros({b.chunk}, {.dtype = dtype});
      for (size_t i : b.pieces) {
        const Piece& piece = pieces_[i];
        mine.narrow(0, piece.shardOffset, piece.length).copy_(piece.values);
      }
      gathered[k] = empty({b.chunk * group_.size()}, {.dtype = dtype});
      failedBucket = k;
      works.push_back(group_.allGatherInto(gathered[k], mine));
    }
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  if (auto [waited, at] = detail::waitAll(works, [](const Work& w) -> const Work& { return w; }); waited && !failure) {
    failure = waited;
    failedBucket = at;
  }
  if (failure) {
    detail::rethrowPrefixed(failure, weft::detail::concat("ShardedDataParallel::step: gathering the parameters of "
                                                          "bucket ",
                                                          failedBucket, " failed: "));
  }
  for (size_t k = 0; k < buckets_.size(); ++k) {
    for (size_t i : buckets_[k].params) {
      Tensor target = meta_[i].tensor;  // a handle: copy_ writes the module's parameter
      target.copy_(gathered[k].narrow(0, meta_[i].offset, target.numel()).view(target.shape()));
    }
  }
}

void ShardedDataParallel::zeroGrad(bool setToNone) {
  std::lock_guard<std::mutex> lock(mutex_);
  NoGradGuard noGrad;
  for (Bucket& b : buckets_) {
    if (setToNone) {
      b.gradShard = Tensor();
    } else if (b.gradShard.defined()) {
      b.gradShard.zero_();
    }
  }
}

double ShardedDataParallel::lr(size_t group) const {
  WEFT_ENFORCE(group < groups_.size(), InvalidArgumentError, "ShardedDataParallel::lr: group ", group,
               " out of range for ", groups_.size(), " groups");
  return nn::optim::learningRate(groups_[group].options);
}

void ShardedDataParallel::setLr(double lr) {
  for (size_t g = 0; g < groups_.size(); ++g) setLr(g, lr);
}

void ShardedDataParallel::setLr(size_t group, double lr) {
  WEFT_ENFORCE(group < groups_.size(), InvalidArgumentError, "ShardedDataParallel::setLr: group ", group,
               " out of range for ", groups_.size(), " groups");
  std::lock_guard<std::mutex> lock(mutex_);
  groups_[group].options = nn::optim::withLearningRate(groups_[group].options, lr);
}

double ShardedDataParallel::clipGradNorm_(double maxNorm, double normType, bool errorIfNonfinite) {
  WEFT_ENFORCE(normType > 0, InvalidArgumentError, "ShardedDataParallel::clipGradNorm_: normType must be positive, got ",
               normType);
  WEFT_ENFORCE(maxNorm >= 0, InvalidArgumentError,
               "ShardedDataParallel::clipGradNorm_: maxNorm must be non-negative, got ", maxNorm);
  const bool inf = std::isinf(normType);
  NoGradGuard noGrad;
  double part = 0.0;  // padding is zero and adds nothing
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Bucket& b : buckets_) {
      if (!b.gradShard.defined() || b.gradShard.numel() == 0) continue;
      // A 16-bit shard (mixed precision) is summed in float32.
      const bool wide = b.gradShard.dtype() == DType::Float32 || b.gradShard.dtype() == DType::Float64;
      Tensor a = abs(wide ? b.gradShard : b.gradShard.to(DType::Float32));
      if (inf) {
        part = std::max(part, max(a).item<double>());
      } else if (normType == 2.0) {
        part += sum(square(a)).item<double>();
      } else {
        part += sum(pow(a, normType)).item<double>();
      }
    }
  }
  Tensor total = scalarTensor(part, DType::Float64).reshape({1});
  try {
    group_.allReduce(total, inf ? ReduceOp::Max : ReduceOp::Sum).wait();
  } catch (const std::exception&) {
    detail::rethrowPrefixed(std::current_exception(),
                            "ShardedDataParallel::clipGradNorm_: reducing the gradients' norm failed: ");
  }
  double norm = total.item<double>();
  if (!inf) norm = normType == 2.0 ? std::sqrt(norm) : std::pow(norm, 1.0 / normType);
  WEFT_ENFORCE(!errorIfNonfinite || std::isfinite(norm), InvalidArgumentError,
               "ShardedDataParallel::clipGradNorm_: the total norm of order ", normType, " of the gradients is ",
               norm);
  const double coef = maxNorm / (norm + 1e-6);
  if (coef < 1.0) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Bucket& b : buckets_) {
      if (b.gradShard.defined()) b.gradShard.mul_(coef);
    }
  }
  return norm;
}

nn::StateDict ShardedDataParallel::consolidatedStateDict(int to) {
  WEFT_ENFORCE(to >= 0 && to < group_.size(), InvalidArgumentError,
               "ShardedDataParallel::consolidatedStateDict: rank ", to, " out of range for a group of ",
               group_.size());
  // This rank's slices: "<param>.<start>.step", "<param>.<start>.<buffer>" and "<param>.<start>.master".
  std::map<std::string, Tensor> mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Piece& piece : pieces_) {
      const std::string key = weft::detail::concat(piece.param, ".", piece.start, ".");
      if (piece.master.defined()) mine.emplace(key + kMasterName, piece.master.contiguous());
      if (piece.state.step == 0 && piece.state.buffers.empty()) continue;
      mine.emplace(key + "step", scalarTensor(static_cast<double>(piece.state.step), DType::Int64));
      for (const auto& [name, buffer] : piece.state.buffers) mine.emplace(key + name, buffer.contiguous());
    }
  }
  std::vector<std::map<std::string, Tensor>> all;
  try {
    all = allGatherObject(group_, mine);
  } catch (const std::exception&) {
    detail::rethrowPrefixed(std::current_exception(),
                            "ShardedDataParallel::consolidatedStateDict: gathering the slices' state failed: ");
  }
  if (group_.rank() != to) return {};
  nn::StateDict out;
  NoGradGuard noGrad;
  for (const auto& slices : all) {
    for (const auto& [key, value] : slices) {
      const size_t dot1 = key.find('.');
      const size_t dot2 = key.find('.', dot1 + 1);
      const size_t param = std::stoul(key.substr(0, dot1));
      const int64_t start = std::stoll(key.substr(dot1 + 1, dot2 - dot1 - 1));
      const std::string name = key.substr(dot2 + 1);
      const std::string target = name == kMasterName ? weft::detail::concat(kMasterName, ".", param)
                                                     : weft::detail::concat("state.", param, ".", name);
      if (name == "step") {
        out.emplace(target, value);
        continue;
      }
      const Tensor& p = meta_[param].tensor;
      auto it = out.find(target);
      if (it == out.end()) it = out.emplace(target, zeros(p.shape(), {.dtype = value.dtype()})).first;
      it->second.view({-1}).narrow(0, start, value.numel()).copy_(value);
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    out.emplace(weft::detail::concat("param_groups.", g, ".params"),
                scalarTensor(static_cast<double>(groups_[g].params.size()), DType::Int64));
    out.emplace(weft::detail::concat("param_groups.", g, ".lr"),
                scalarTensor(nn::optim::learningRate(groups_[g].options), DType::Float64));
  }
  return out;
}

void ShardedDataParallel::loadStateDict(const nn::StateDict& full) {
  // The plain optimizer checks and converts the whole dict; this rank keeps its slices. With
  // masters, it converts to float32 (stand-ins of the 16-bit parameters' shapes), not to 16 bits.
  std::vector<nn::optim::ParamGroup> groups = groups_;
  if (options_.masterWeights) {
    for (nn::optim::ParamGroup& g : groups) {
      for (Tensor& p : g.params) {
        if (nn::optim::needsMaster(p.dtype())) p = empty(p.shape(), {.dtype = DType::Float32});
      }
    }
  }
  nn::optim::Optimizer whole(std::move(groups));
  // The masters ("master.<param>") are this wrapper's; the rest is the optimizer's.
  nn::StateDict rest;
  std::map<size_t, Tensor> masters;
  const std::string prefix = std::string(kMasterName) + ".";
  for (const auto& [key, value] : full) {
    if (key.rfind(prefix, 0) != 0) {
      rest.emplace(key, value);
      continue;
    }
    size_t index = 0;
    auto [end, ec] = std::from_chars(key.data() + prefix.size(), key.data() + key.size(), index);
    WEFT_ENFORCE(key.size() > prefix.size() && ec == std::errc() && end == key.data() + key.size(),
                 InvalidArgumentError, "ShardedDataParallel::loadStateDict: malformed key '", key, "'");
    WEFT_ENFORCE(index < meta_.size(), InvalidArgumentError, "ShardedDataParallel::loadStateDict: key '", key,
                 "' refers to parameter ", index, " but there are ", meta_.size());
    const Tensor& p = meta_[index].tensor;
    WEFT_ENFORCE(options_.masterWeights && nn::optim::needsMaster(p.dtype()), InvalidArgumentError,
                 "ShardedDataParallel::loadStateDict: key '", key, "': parameter '", meta_[index].name,
                 "' has no master (Options::masterWeights with a 16-bit parameter)");
    WEFT_ENFORCE(value.defined() && value.shape() == p.shape(), InvalidArgumentError,
                 "ShardedDataParallel::loadStateDict: '", key, "' has shape ",
                 value.defined() ? value.shape() : Shape{}, ", the parameter ", p.shape());
    masters.emplace(index, value);
  }
  try {
    whole.loadStateDict(rest);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(std::string("ShardedDataParallel::loadStateDict: ") + e.what());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  NoGradGuard noGrad;
  for (Piece& piece : pieces_) {
    const nn::optim::ParamState& st = whole.state()[piece.param];
    piece.state = nn::optim::ParamState{};
    piece.state.step = st.step;
    for (const auto& [name, buffer] : st.buffers) {
      piece.state.buffers.emplace(name, buffer.view({-1}).narrow(0, piece.start, piece.length).clone());
    }
    auto m = masters.find(piece.param);
    if (m != masters.end()) {
      piece.master.copy_(m->second.to(Device::cpu()).reshape({-1}).narrow(0, piece.start, piece.length));
      piece.values.copy_(piece.master);
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = whole.groups()[g].options;
}

ShardedDataParallel::NoSyncGuard ShardedDataParallel::noSync() {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool previous = sync_;
  sync_ = false;
  return NoSyncGuard(this, previous);
}

void ShardedDataParallel::setSync(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_ = on;
}

Tensor ShardedDataParallel::pendingGradient(size_t index) const {
  WEFT_ENFORCE(index < meta_.size(), IndexError, "ShardedDataParallel::pendingGradient: index ", index,
               " out of range for ", meta_.size(), " parameters");
  std::lock_guard<std::mutex> lock(mutex_);
  return meta_[index].pending;
}

nn::StateDict ShardedDataParallel::shardedStateDict() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nn::StateDict out;
  Tensor slices = empty({static_cast<int64_t>(pieces_.size()), 3}, {.dtype = DType::Int64});
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& piece = pieces_[i];
    int64_t* row = slices.data<int64_t>() + 3 * i;
    row[0] = static_cast<int64_t>(piece.param);
    row[1] = piece.start;
    row[2] = piece.length;
    const std::string key = weft::detail::concat("slice.", piece.param, ".", piece.start, ".");
    if (piece.master.defined()) out.emplace(key + kMasterName, piece.master.detach());
    if (piece.state.step == 0 && piece.state.buffers.empty()) continue;
    out.emplace(key + "step", scalarTensor(static_cast<double>(piece.state.step), DType::Int64));
    for (const auto& [name, buffer] : piece.state.buffers) out.emplace(key + name, buffer.detach());
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    out.emplace(weft::detail::concat("param_groups.", g, ".params"),
                scalarTensor(static_cast<double>(groups_[g].params.size()), DType::Int64));
    out.emplace(weft::detail::concat("param_groups.", g, ".lr"),
                scalarTensor(nn::optim::learningRate(groups_[g].options), DType::Float64));
  }
  out.emplace("shard.rank", scalarTensor(group_.rank(), DType::Int64));
  out.emplace("shard.world", scalarTensor(group_.size(), DType::Int64));
  out.emplace("shard.slices", slices);
  return out;
}

void ShardedDataParallel::loadShardedStateDict(const nn::StateDict& shard) {
  const char* where = "ShardedDataParallel::loadShardedStateDict";
  auto scalar = [&](const std::string& key) {
    auto it = shard.find(key);
    WEFT_ENFORCE(it != shard.end() && it->second.defined() && it->second.numel() == 1, InvalidArgumentError, where,
                 ": the dict has no '", key, "' (not a shardedStateDict())");
    return it->second.to(Device::cpu()).item<double>();
  };
  const double world = scalar("shard.world");
  const double rank = scalar("shard.rank");
  WEFT_ENFORCE(world == group_.size(), InvalidArgumentError, where, ": the shard was saved in a group of ", world,
               " ranks, this group has ", group_.size());
  WEFT_ENFORCE(rank == group_.rank(), InvalidArgumentError, where, ": the shard was saved by rank ", rank,
               ", this is rank ", group_.rank());
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = shard.find("shard.slices");
  WEFT_ENFORCE(it != shard.end() && it->second.defined(), InvalidArgumentError, where,
               ": the dict has no 'shard.slices'");
  std::vector<int64_t> saved = it->second.to(Device::cpu()).toVector<int64_t>();
  std::vector<int64_t> mine;
  std::map<std::string, size_t> pieceOf;  // "<param>.<start>" -> piece
  for (size_t i = 0; i < pieces_.size(); ++i) {
    mine.insert(mine.end(), {static_cast<int64_t>(pieces_[i].param), pieces_[i].start, pieces_[i].length});
    pieceOf.emplace(weft::detail::concat(pieces_[i].param, ".", pieces_[i].start), i);
  }
  WEFT_ENFORCE(saved == mine, InvalidArgumentError, where, ": the shard holds ", saved.size() / 3,
               " slices other than the ", pieces_.size(),
               " this rank owns (the parameters, their sizes or the bucket size differ)");
  std::vector<nn::optim::ParamState> loaded(pieces_.size());
  std::vector<Tensor> masters(pieces_.size());
  std::vector<std::optional<double>> lrs(groups_.size());
  NoGradGuard noGrad;
  for (const auto& [key, value] : shard) {
    if (key.rfind("shard.", 0) == 0) continue;
    if (key.rfind("param_groups.", 0) == 0) {
      bool known = false;
      for (size_t g = 0; g < groups_.size() && !known; ++g) {
        const std::string prefix = weft::detail::concat("param_groups.", g, ".");
        if (key != prefix + "params" && key != prefix + "lr") continue;
        known = true;
        const double v = scalar(key);
        if (key == prefix + "lr") {
          lrs[g] = v;
        } else {
          WEFT_ENFORCE(v == static_cast<double>(groups_[g].params.size()), InvalidArgumentError, where, ": '", key,
                       "' is ", v, " but group ", g, " has ", groups_[g].params.size(), " parameters");
        }
      }
      WEFT_ENFORCE(known, InvalidArgumentError, where, ": unexpected group entry '", key, "'");
      continue;
    }
    // slice.<param>.<start>.<name>
    WEFT_ENFORCE(key.rfind("slice.", 0) == 0, InvalidArgumentError, where, ": unexpected key '", key, "'");
    const size_t dot1 = key.find('.', 6);
    const size_t dot2 = dot1 == std::string::npos ? std::string::npos : key.find('.', dot1 + 1);
    WEFT_ENFORCE(dot2 != std::string::npos, InvalidArgumentError, where, ": malformed key '", key, "'");
    auto piece = pieceOf.find(key.substr(6, dot2 - 6));
    WEFT_ENFORCE(piece != pieceOf.end(), InvalidArgumentError, where, ": key '", key,
                 "' names a slice this rank does not own");
    const std::string name = key.substr(dot2 + 1);
    const Piece& p = pieces_[piece->second];
    nn::optim::ParamState& st = loaded[piece->second];
    WEFT_ENFORCE(value.defined(), InvalidArgumentError, where, ": '", key, "' is undefined");
    if (name == kMasterName) {
      WEFT_ENFORCE(p.master.defined(), InvalidArgumentError, where, ": '", key,
                   "': the slice has no master (Options::masterWeights with a 16-bit parameter)");
      WEFT_ENFORCE(value.numel() == p.length, InvalidArgumentError, where, ": '", key, "' holds ", value.numel(),
                   " elements, the slice has ", p.length);
      masters[piece->second] = value;
      continue;
    }
    if (name == "step") {
      const double s = scalar(key);
      WEFT_ENFORCE(s >= 0 && s == std::floor(s) && s < 9.0e15, InvalidArgumentError, where, ": '", key,
                   "' is not a valid step count: ", s);
      st.step = static_cast<int64_t>(s);
      continue;
    }
    const auto known = nn::optim::stateBufferNames(groups_[meta_[p.param].group].options);
    WEFT_ENFORCE(std::find(known.begin(), known.end(), name) != known.end(), InvalidArgumentError, where, ": '", key,
                 "' is not a buffer of ", nn::optim::optimizerName(groups_[meta_[p.param].group].options),
                 " with these options");
    WEFT_ENFORCE(value.numel() == p.length, InvalidArgumentError, where, ": '", key, "' holds ", value.numel(),
                 " elements, the slice has ", p.length);
    st.buffers[name] = value.to(Device::cpu()).to(p.stepped().dtype()).contiguous().view({p.length}).clone();
  }
  for (size_t i = 0; i < pieces_.size(); ++i) {
    pieces_[i].state = std::move(loaded[i]);
    if (!masters[i].defined()) continue;
    pieces_[i].master.copy_(masters[i].to(Device::cpu()).reshape({-1}));
    pieces_[i].values.copy_(pieces_[i].master);
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (lrs[g]) groups_[g].options = nn::optim::withLearningRate(groups_[g].options, *lrs[g]);
  }
}

std::vector<std::vector<size_t>> ShardedDataParallel::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : buckets_) out.push_back(b.params);
  return out;
}

std::vector<ShardedDataParallel::Slice> ShardedDataParallel::gradientSlices(size_t index) const {
  WEFT_ENFORCE(index < meta_.size(), IndexError, "ShardedDataParallel::gradientSlices: index ", index,
               " out of range for ", meta_.size(), " parameters");
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Slice> out;
  for (const Piece& piece : pieces_) {
    if (piece.param != index) continue;
    const Bucket& b = buckets_[meta_[index].bucket];
    out.push_back({piece.start, b.gradShard.defined() ? b.gradShard.narrow(0, piece.shardOffset, piece.length)
                                                      : Tensor()});
  }
  return out;
}

int64_t ShardedDataParallel::gradientShardBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) {
    if (b.gradShard.defined()) bytes += static_cast<int64_t>(b.gradShard.nbytes());
  }
  return bytes;
}

int64_t ShardedDataParallel::masterBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const Piece& piece : pieces_) {
    if (piece.master.defined()) bytes += static_cast<int64_t>(piece.master.nbytes());
  }
  return bytes;
}

int64_t ShardedDataParallel::stateBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const Piece& piece : pieces_) {
    for (const auto& [name, buffer] : piece.state.buffers) bytes += static_cast<int64_t>(buffer.nbytes());
  }
  return bytes;
}

ShardedDataParallel::Stats ShardedDataParallel::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace weft::collectives
