#include "nn/master_weights.h"

#include <utility>

#include "nn/utils.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::nn::optim {

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
