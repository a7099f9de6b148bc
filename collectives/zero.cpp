#include "collectives/zero.h"

#include <algorithm>
#include <charconv>
#include <exception>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "collectives/detail/sharding.h"
#include "collectives/object_collectives.h"
#include "common/error.h"
#include "nn/master_weights.h"
#include "nn/utils.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::collectives {

namespace {

// "state.<index>.<name>": the index and the name; nothing when the key has another form.
std::optional<std::pair<size_t, std::string>> parseStateKey(const std::string& key) {
  static const std::string kPrefix = "state.";
  if (key.rfind(kPrefix, 0) != 0) return std::nullopt;
  const size_t from = kPrefix.size();
  const size_t dot = key.find('.', from);
  if (dot == std::string::npos || dot == from) return std::nullopt;
  size_t index = 0;
  auto [end, ec] = std::from_chars(key.data() + from, key.data() + dot, index);
  if (ec != std::errc() || end != key.data() + dot) return std::nullopt;
  return std::make_pair(index, key.substr(dot + 1));
}

// "master.<index>": the index; nothing when the key has another form.
std::optional<size_t> parseMasterKey(const std::string& key) {
  static const std::string kPrefix = "master.";
  if (key.rfind(kPrefix, 0) != 0 || key.size() == kPrefix.size()) return std::nullopt;
  size_t index = 0;
  auto [end, ec] = std::from_chars(key.data() + kPrefix.size(), key.data() + key.size(), index);
  if (ec != std::errc() || end != key.data() + key.size()) return std::nullopt;
  return index;
}

std::string groupKey(size_t g, const char* field) { return weft::detail::concat("param_groups.", g, ".", field); }

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<nn::optim::ParamGroup> groups, ProcessGroup& group,
                                                 Options options)
    : group_(group), options_(options), groups_(std::move(groups)) {
  WEFT_ENFORCE(options_.broadcastBucketBytes > 0, InvalidArgumentError,
               "ZeroRedundancyOptimizer: Options::broadcastBucketBytes must be > 0, got ",
               options_.broadcastBucketBytes);
  // The plain optimizer's checks (kinds, options, parameters), on every rank alike.
  { nn::optim::Optimizer check(groups_); }
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const Tensor& p : groups_[g].params) {
      params_.push_back(p);
      groupOf_.push_back(g);
    }
  }
  checkLayoutsAgree();
  partition();
}

void ZeroRedundancyOptimizer::checkLayoutsAgree() {
  std::vector<size_t> sizes;
  for (const nn::optim::ParamGroup& g : groups_) sizes.push_back(g.params.size());
  detail::checkLayoutsAgree(group_, sizes, params_, "ZeroRedundancyOptimizer");
}

void ZeroRedundancyOptimizer::partition() {
  const size_t n = params_.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [this](size_t a, size_t b) { return params_[a].nbytes() > params_[b].nbytes(); });
  std::vector<int64_t> load(static_cast<size_t>(group_.size()), 0);
  owner_.assign(n, 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // the first of equals: the lowest rank
    owner_[i] = static_cast<int>(least - load.begin());
    *least += static_cast<int64_t>(params_[i].nbytes());
  }
  localIndex_.assign(n, 0);
  std::vector<nn::optim::ParamGroup> local;
  for (const nn::optim::ParamGroup& g : groups_) local.push_back({{}, g.options});
  for (size_t i = 0; i < n; ++i) {
    if (owner_[i] != group_.rank()) continue;
    localIndex_[i] = mine_.size();
    mine_.push_back(i);
    Tensor stepped = params_[i];
    if (options_.masterWeights && nn::optim::needsMaster(stepped.dtype())) {
      NoGradGuard noGrad;
      stepped = stepped.detach().to(DType::Float32);
    }
    local[groupOf_[i]].params.push_back(stepped);
  }
  if (!mine_.empty()) local_ = std::make_unique<nn::optim::Optimizer>(std::move(local));
}

void ZeroRedundancyOptimizer::step() {
  if (local_ && !options_.masterWeights) local_->step();
  if (local_ && options_.masterWeights) {
    // The local optimizer steps the masters (local order is mine_'s) with the gradients cast to their dtype.
    const std::vector<Tensor>& stepped = local_->params();
    std::vector<Tensor> grads(mine_.size());
    NoGradGuard noGrad;
    for (size_t j = 0; j < mine_.size(); ++j) {
      Tensor g = params_[mine_[j]].grad();
      if (g.defined()) grads[j] = g.dtype() == stepped[j].dtype() ? g : g.to(stepped[j].dtype());
    }
    local_->step(grads);
    for (size_t j = 0; j < mine_.size(); ++j) {
      if (!grads[j].defined() || stepped[j].sameAs(params_[mine_[j]])) continue;
      Tensor target = params_[mine_[j]];  // a handle: copy_ writes the caller's parameter
      target.copy_(stepped[j]);
    }
  }
  broadcastParameters();
}

void ZeroRedundancyOptimizer::broadcastParameters() {
  if (group_.size() == 1) return;
  // Each rank's parameters, coalesced per dtype and device up to the bucket size.
  struct Flat {
    int root = 0;
    std::vector<size_t> members;
    int64_t numel = 0;
    Tensor buffer;
    Work work;
  };
  std::vector<Flat> flats;
  for (int r = 0; r < group_.size(); ++r) {
    int64_t bytes = 0;
    bool fresh = true;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] != r) continue;
      const Tensor& p = params_[i];
      const auto pb = static_cast<int64_t>(p.nbytes());
      if (!fresh) {
        const Tensor& first = params_[flats.back().members.front()];
        fresh = bytes + pb > options_.broadcastBucketBytes || first.dtype() != p.dtype() ||
                first.device() != p.device();
      }
      if (fresh) {
        flats.push_back({r, {}, 0, Tensor(), Work()});
        bytes = 0;
        fresh = false;
      }
      flats.back().members.push_back(i);
      flats.back().numel += p.numel();
      bytes += pb;
    }
  }
  NoGradGuard noGrad;
  std::exception_ptr failure;
  int failedRoot = 0;
  try {
    for (Flat& f : flats) {
      const Tensor& first = params_[f.members.front()];
      f.buffer = empty({f.numel}, {.dtype = first.dtype(), .device = first.device()});
      if (f.root == group_.rank()) {
        int64_t offset = 0;
        for (size_t i : f.members) {
          f.buffer.narrow(0, offset, params_[i].numel()).view(params_[i].shape()).copy_(params_[i]);
          offset += params_[i].numel();
        }
      }
      f.work = group_.broadcast(f.buffer, f.root);
    }
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  if (auto [waited, at] = detail::waitAll(flats, [](const Flat& f) -> const Work& { return f.work; });
      waited && !failure) {
    failure = waited;
    failedRoot = flats[at].root;
  }
  if (failure) {
    detail::rethrowPrefixed(failure, weft::detail::concat("ZeroRedundancyOptimizer::step: broadcasting the parameters "
                                                  "updated by rank ",
                                                  failedRoot, " failed: "));
  }
  for (Flat& f : flats) {
    if (f.root == group_.rank()) continue;
    int64_t offset = 0;
    for (size_t i : f.members) {
      Tensor target = params_[i];  // a handle: copy_ writes the caller's parameter
      target.copy_(f.buffer.narrow(0, offset, target.numel()).view(target.shape()));
      offset += target.numel();
    }
  }
}

void ZeroRedundancyOptimizer::zeroGrad(bool setToNone) { nn::zeroGrads(params_, setToNone); }

int ZeroRedundancyOptimizer::ownerOf(size_t index) const {
  WEFT_ENFORCE(index < params_.size(), IndexError, "ZeroRedundancyOptimizer::ownerOf: index ", index,
               " out of range for ", params_.size(), " parameters");
  return owner_[index];
}

std::vector<size_t> ZeroRedundancyOptimizer::shard(int rank) const {
  WEFT_ENFORCE(rank >= 0 && rank < group_.size(), InvalidArgumentError, "ZeroRedundancyOptimizer::shard: rank ",
               rank, " out of range for a group of ", group_.size());
  std::vector<size_t> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] == rank) out.push_back(i);
  }
  return out;
}

int64_t ZeroRedundancyOptimizer::stateBytes() const {
  if (!local_) return 0;
  int64_t bytes = 0;
  for (const nn::optim::ParamState& s : local_->state()) {
    for (const auto& [name, buffer] : s.buffers) bytes += static_cast<int64_t>(buffer.nbytes());
  }
  return bytes;
}

int64_t ZeroRedundancyOptimizer::masterBytes() const {
  if (!local_) return 0;
  int64_t bytes = 0;
  for (size_t j = 0; j < mine_.size(); ++j) {
    if (!local_->params()[j].sameAs(params_[mine_[j]])) bytes += static_cast<int64_t>(local_->params()[j].nbytes());
  }
  return bytes;
}

size_t ZeroRedundancyOptimizer::checkGroup(const char* what, size_t group) const {
  WEFT_ENFORCE(group < groups_.size(), InvalidArgumentError, "ZeroRedundancyOptimizer::", what, ": group ", group,
               " out of range (the optimizer has ", groups_.size(), ")");
  return group;
}

double ZeroRedundancyOptimizer::lr(size_t group) const {
  return nn::optim::learningRate(groups_[checkGroup("lr", group)].options);
}

void ZeroRedundancyOptimizer::setLr(double lr) {
  for (size_t g = 0; g < groups_.size(); ++g) setLr(g, lr);
}

void ZeroRedundancyOptimizer::setLr(size_t group, double lr) {
  checkGroup("setLr", group);
  groups_[group].options = nn::optim::withLearningRate(groups_[group].options, lr);
  if (local_) local_->setLr(group, lr);
}

nn::StateDict ZeroRedundancyOptimizer::consolidatedStateDict(int to) {
  WEFT_ENFORCE(to >= 0 && to < group_.size(), InvalidArgumentError,
               "ZeroRedundancyOptimizer::consolidatedStateDict: rank ", to, " out of range for a group of ",
               group_.size());
  // This rank's state under global indices.
  std::map<std::string, Tensor> mine;
  if (local_) {
    for (const auto& [key, value] : local_->stateDict()) {
      auto parsed = parseStateKey(key);
      if (!parsed) continue;  // the local groups' entries
      mine.emplace(weft::detail::concat("state.", mine_[parsed->first], ".", parsed->second), value.contiguous());
    }
    for (size_t j = 0; j < mine_.size(); ++j) {
      const Tensor& stepped = local_->params()[j];
      if (!stepped.sameAs(params_[mine_[j]])) mine.emplace(weft::detail::concat("master.", mine_[j]), stepped);
    }
  }
  nn::StateDict out;
  if (group_.size() == 1) {
    out = std::move(mine);
  } else {
    std::vector<std::map<std::string, Tensor>> all;
    try {
      all = allGatherObject(group_, mine);
    } catch (const std::exception&) {
      detail::rethrowPrefixed(std::current_exception(),
                      "ZeroRedundancyOptimizer::consolidatedStateDict: gathering the shards' state failed: ");
    }
    if (group_.rank() != to) return {};
    for (auto& shardState : all) {
      for (auto& [key, value] : shardState) out.emplace(key, std::move(value));
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    out.emplace(groupKey(g, "params"), scalarTensor(static_cast<double>(groups_[g].params.size()), DType::Int64));
    out.emplace(groupKey(g, "lr"), scalarTensor(nn::optim::learningRate(groups_[g].options), DType::Float64));
  }
  return out;
}

nn::StateDict ZeroRedundancyOptimizer::shardedStateDict() const {
  nn::StateDict out;
  if (local_) {
    for (const auto& [key, value] : local_->stateDict()) {
      auto parsed = parseStateKey(key);
      if (!parsed) continue;  // the local groups' entries
      out.emplace(weft::detail::concat("state.", mine_[parsed->first], ".", parsed->second), value);
    }
    for (size_t j = 0; j < mine_.size(); ++j) {
      const Tensor& stepped = local_->params()[j];
      if (!stepped.sameAs(params_[mine_[j]])) out.emplace(weft::detail::concat("master.", mine_[j]), stepped);
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    out.emplace(groupKey(g, "params"), scalarTensor(static_cast<double>(groups_[g].params.size()), DType::Int64));
    out.emplace(groupKey(g, "lr"), scalarTensor(nn::optim::learningRate(groups_[g].options), DType::Float64));
  }
  out.emplace("shard.rank", scalarTensor(group_.rank(), DType::Int64));
  out.emplace("shard.world", scalarTensor(group_.size(), DType::Int64));
  Tensor owned = empty({static_cast<int64_t>(mine_.size())}, {.dtype = DType::Int64});
  for (size_t k = 0; k < mine_.size(); ++k) owned.data<int64_t>()[k] = static_cast<int64_t>(mine_[k]);
  out.emplace("shard.params", owned);
  return out;
}

void ZeroRedundancyOptimizer::loadShardedStateDict(const nn::StateDict& shard) {
  const char* where = "ZeroRedundancyOptimizer::loadShardedStateDict";
  auto scalar = [&](const char* key) {
    auto it = shard.find(key);
    WEFT_ENFORCE(it != shard.end() && it->second.defined() && it->second.numel() == 1, InvalidArgumentError, where,
                 ": the dict has no '", key, "' (not a shardedStateDict())");
    return it->second.to(Device::cpu()).item<double>();
  };
  const double rank = scalar("shard.rank");
  const double world = scalar("shard.world");
  WEFT_ENFORCE(world == group_.size(), InvalidArgumentError, where, ": the shard was saved in a group of ", world,
               " ranks, this group has ", group_.size());
  WEFT_ENFORCE(rank == group_.rank(), InvalidArgumentError, where, ": the shard was saved by rank ", rank,
               ", this is rank ", group_.rank());
  auto it = shard.find("shard.params");
  WEFT_ENFORCE(it != shard.end() && it->second.defined(), InvalidArgumentError, where,
               ": the dict has no 'shard.params'");
  std::vector<int64_t> owned = it->second.to(Device::cpu()).toVector<int64_t>();
  std::vector<int64_t> mine(mine_.begin(), mine_.end());
  WEFT_ENFORCE(owned == mine, InvalidArgumentError, where, ": the shard holds ", owned.size(),
               " parameters other than the ", mine.size(), " this rank owns (the parameters or their sizes differ)");
  nn::StateDict rest;
  for (const auto& [key, value] : shard) {
    if (key.rfind("shard.", 0) != 0) rest.emplace(key, value);
  }
  loadStateDict(rest);
}

void ZeroRedundancyOptimizer::loadStateDict(const nn::StateDict& full) {
  const char* where = "ZeroRedundancyOptimizer::loadStateDict";
  nn::StateDict local;
  std::vector<std::optional<double>> lrs(groups_.size());
  std::vector<std::pair<size_t, Tensor>> masters;  // (local index, value) of the masters this rank keeps
  for (const auto& [key, value] : full) {
    if (auto index = parseMasterKey(key)) {
      WEFT_ENFORCE(*index < params_.size(), InvalidArgumentError, where, ": key '", key, "' refers to parameter ",
                   *index, " but the optimizer has ", params_.size());
      if (owner_[*index] != group_.rank()) continue;
      const Tensor& stepped = local_->params()[localIndex_[*index]];
      WEFT_ENFORCE(!stepped.sameAs(params_[*index]), InvalidArgumentError, where, ": key '", key, "': parameter ",
                   *index, " has no master of its own (Options::masterWeights with a 16-bit parameter)");
      WEFT_ENFORCE(value.defined() && value.shape() == stepped.shape(), InvalidArgumentError, where, ": '", key,
                   "' has shape ", value.defined() ? value.shape() : Shape{}, ", the parameter ", stepped.shape());
      masters.emplace_back(localIndex_[*index], value);
      continue;
    }
    if (key.rfind("param_groups.", 0) == 0) {
      bool known = false;
      for (size_t g = 0; g < groups_.size() && !known; ++g) {
        const bool isParams = key == groupKey(g, "params");
        const bool isLr = key == groupKey(g, "lr");
        if (!isParams && !isLr) continue;
        known = true;
        WEFT_ENFORCE(value.defined() && value.numel() == 1, InvalidArgumentError, where, ": '", key,
                     "' must hold one value");
        const double v = value.to(Device::cpu()).item<double>();
        if (isParams) {
          WEFT_ENFORCE(v == static_cast<double>(groups_[g].params.size()), InvalidArgumentError, where, ": '", key,
                       "' is ", v, " but group ", g, " has ", groups_[g].params.size(), " parameters");
        } else {
          lrs[g] = v;
        }
      }
      WEFT_ENFORCE(known, InvalidArgumentError, where, ": unexpected group entry '", key, "' (the optimizer has ",
                   groups_.size(), " groups)");
      continue;
    }
    auto parsed = parseStateKey(key);
    WEFT_ENFORCE(parsed.has_value(), InvalidArgumentError, where, ": malformed key '", key,
                 "' (expected state.<index>.<name>, master.<index> or param_groups.<index>.<name>)");
    WEFT_ENFORCE(parsed->first < params_.size(), InvalidArgumentError, where, ": key '", key,
                 "' refers to parameter ", parsed->first, " but the optimizer has ", params_.size());
    if (owner_[parsed->first] != group_.rank()) continue;
    local.emplace(weft::detail::concat("state.", localIndex_[parsed->first], ".", parsed->second), value);
  }
  if (local_) {
    std::vector<size_t> localSizes(groups_.size(), 0);
    for (size_t i : mine_) ++localSizes[groupOf_[i]];
    for (size_t g = 0; g < groups_.size(); ++g) {
      local.emplace(groupKey(g, "params"), scalarTensor(static_cast<double>(localSizes[g]), DType::Int64));
      if (lrs[g]) local.emplace(groupKey(g, "lr"), scalarTensor(*lrs[g], DType::Float64));
    }
    try {
      local_->loadStateDict(local);
    } catch (const InvalidArgumentError& e) {
      // The local optimizer names local indices; say which shard it was.
      throw InvalidArgumentError(weft::detail::concat(where, ": rank ", group_.rank(),
                                                      "'s shard (local index k is global parameter shard(rank)[k]): ",
                                                      e.what()));
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (lrs[g]) groups_[g].options = nn::optim::withLearningRate(groups_[g].options, *lrs[g]);
  }
  NoGradGuard noGrad;
  for (const auto& [j, value] : masters) {
    Tensor master = local_->params()[j];  // handles: copy_ writes the master and the parameter
    master.copy_(value.to(master.device()));
    Tensor param = params_[mine_[j]];
    param.copy_(master);
  }
}

}  // namespace weft::collectives
