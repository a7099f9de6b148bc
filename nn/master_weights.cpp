#include "nn/master_weights.h"

#include <charconv>
#include <string>
#include <utility>

#include "common/error.h"
#include "nn/utils.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::nn::optim {

namespace {
constexpr const char* kMasterPrefix = "master.";
}  // namespace

bool needsMaster(DType dtype) { return dtype == DType::BFloat16 || dtype == DType::Float16; }

MasterWeightOptimizer::MasterWeightOptimizer(std::vector<ParamGroup> groups) {
  { Optimizer check(groups); }  // the plain optimizer's checks, on the parameters themselves
  NoGradGuard noGrad;
  for (ParamGroup& g : groups) {
    for (Tensor& p : g.params) {
      params_.push_back(p);
      if (needsMaster(p.dtype())) p = p.detach().to(DType::Float32);
    }
  }
  optimizer_ = std::make_unique<Optimizer>(std::move(groups));
}

void MasterWeightOptimizer::step() {
  const std::vector<Tensor>& masters = optimizer_->params();
  std::vector<Tensor> grads(params_.size());
  NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    grads[i] = g.dtype() == masters[i].dtype() ? g : g.to(masters[i].dtype());
  }
  optimizer_->step(grads);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined() || masters[i].sameAs(params_[i])) continue;
    Tensor target = params_[i];  // a handle: copy_ writes the module's parameter
    target.copy_(masters[i]);
  }
}

void MasterWeightOptimizer::zeroGrad(bool setToNone) { zeroGrads(params_, setToNone); }

StateDict MasterWeightOptimizer::stateDict() const {
  StateDict out = optimizer_->stateDict();
  const std::vector<Tensor>& masters = optimizer_->params();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!masters[i].sameAs(params_[i])) out.emplace(weft::detail::concat(kMasterPrefix, i), masters[i]);
  }
  return out;
}

void MasterWeightOptimizer::loadStateDict(const StateDict& dict) {
  const std::vector<Tensor>& masters = optimizer_->params();
  StateDict rest;
  std::vector<std::pair<size_t, Tensor>> loaded;
  for (const auto& [key, value] : dict) {
    if (key.rfind(kMasterPrefix, 0) != 0) {
      rest.emplace(key, value);
      continue;
    }
    const std::string digits = key.substr(std::string(kMasterPrefix).size());
    size_t index = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    WEFT_ENFORCE(!digits.empty() && ec == std::errc() && end == digits.data() + digits.size(), InvalidArgumentError,
                 "MasterWeightOptimizer.loadStateDict: malformed key '", key, "' (expected master.<index>)");
    WEFT_ENFORCE(index < params_.size(), InvalidArgumentError, "MasterWeightOptimizer.loadStateDict: key '", key,
                 "' refers to parameter ", index, " but the optimizer has ", params_.size());
    WEFT_ENFORCE(!masters[index].sameAs(params_[index]), InvalidArgumentError,
                 "MasterWeightOptimizer.loadStateDict: key '", key, "': parameter ", index, " is ",
                 dtypeName(params_[index].dtype()), " and is its own master");
    WEFT_ENFORCE(value.defined() && value.shape() == masters[index].shape(), InvalidArgumentError,
                 "MasterWeightOptimizer.loadStateDict: '", key, "' has shape ",
                 value.defined() ? value.shape() : Shape{}, ", the parameter ", masters[index].shape());
    loaded.emplace_back(index, value);
  }
  optimizer_->loadStateDict(rest);
  NoGradGuard noGrad;
  for (const auto& [index, value] : loaded) {
    Tensor master = masters[index];  // a handle: copy_ writes the master
    master.copy_(value.to(master.device()));
    Tensor param = params_[index];
    param.copy_(master);
  }
}

int64_t MasterWeightOptimizer::masterBytes() const {
  int64_t bytes = 0;
  const std::vector<Tensor>& masters = optimizer_->params();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!masters[i].sameAs(params_[i])) bytes += static_cast<int64_t>(masters[i].nbytes());
  }
  return bytes;
}

int64_t MasterWeightOptimizer::stateBytes() const {
  int64_t bytes = 0;
  for (const ParamState& s : optimizer_->state()) {
    for (const auto& [name, b] : s.buffers) bytes += static_cast<int64_t>(b.nbytes());
  }
  return bytes;
}

}  // namespace weft::nn::optim
