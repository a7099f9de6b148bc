#include "nn/amp.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda_call.h"
#include "tensor/ops.h"

namespace weft::nn {

namespace {

void validateOptions(const GradScalerOptions& o) {
  WEFT_ENFORCE(std::isfinite(o.initScale) && o.initScale > 0, InvalidArgumentError,
               "GradScaler: initScale must be finite and positive, got ", o.initScale);
  WEFT_ENFORCE(std::isfinite(o.growthFactor) && o.growthFactor > 1.0, InvalidArgumentError,
               "GradScaler: growthFactor must be above 1, got ", o.growthFactor);
  WEFT_ENFORCE(o.backoffFactor > 0.0 && o.backoffFactor < 1.0, InvalidArgumentError,
               "GradScaler: backoffFactor must be in (0, 1), got ", o.backoffFactor);
  WEFT_ENFORCE(o.growthInterval > 0, InvalidArgumentError, "GradScaler: growthInterval must be positive, got ",
               o.growthInterval);
}

const Tensor& entry(const StateDict& dict, const std::string& key) {
  auto it = dict.find(key);
  WEFT_ENFORCE(it != dict.end(), InvalidArgumentError, "GradScaler.loadStateDict: missing key '", key, "'");
  WEFT_ENFORCE(it->second.defined() && it->second.numel() == 1, InvalidArgumentError,
               "GradScaler.loadStateDict: '", key, "' must be a one-element tensor");
  return it->second;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.initScale) {
  validateOptions(options_);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  WEFT_ENFORCE(loss.defined(), InvalidArgumentError, "GradScaler.scale: the loss is an undefined tensor");
  if (!options_.enabled) return loss;
  WEFT_ENFORCE(isFloating(loss.dtype()), InvalidArgumentError, "GradScaler.scale: the loss must be floating, got ",
               dtypeName(loss.dtype()));
  Tensor l = loss.dtype() == DType::Float64 ? loss : loss.to(DType::Float32);
  return mul(l, scale_);
}

bool GradScaler::unscaleGrads(const std::vector<Tensor>& params) const {
  NoGradGuard ng;
  const double inv = static_cast<double>(static_cast<float>(1.0 / scale_));
  bool found = false;
  // CUDA gradients per device, unscaled together after the loop: one flag
  // read back per device.
  std::map<int, std::vector<kernels::cuda::DeviceArray>> onDevice;
  std::vector<std::pair<Tensor, Tensor>> deviceGrads;  // (gradient, its contiguous form)
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    WEFT_ENFORCE((g.device().isCpu() || g.device().isCuda()) && isFloating(g.dtype()), InvalidArgumentError,
                 "GradScaler.unscale_: the gradient of parameter ", i, " is ", dtypeName(g.dtype()), " on ",
                 g.device().str(), "; only floating CPU or CUDA gradients can be unscaled");
    if (g.numel() == 0) continue;
    Tensor c = g.contiguous();
    if (g.device().isCuda()) {
      onDevice[g.device().index].push_back({c.rawData(), c.dtype(), c.numel()});
      deviceGrads.emplace_back(g, c);
      continue;
    }
    found |= kernels::cpu::scaleAndCheckFinite(c.dtype(), c.rawData(), c.numel(), inv);
    if (c.sameAs(g)) {
      g.storage()->bumpVersion();
    } else {
      g.copy_(c);
    }
  }
  for ([[maybe_unused]] const auto& [device, arrays] : onDevice) {
    bool deviceFound = false;
    WEFT_CUDA_CALL(device, gradScaleAndCheckFinite(arrays, inv, &deviceFound));
    found |= deviceFound;
  }
  for (auto& [g, c] : deviceGrads) {
    if (c.sameAs(g)) {
      g.storage()->bumpVersion();
    } else {
      g.copy_(c);
    }
  }
  return found;
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  auto it = perOptimizer_.find(&optimizer);
  WEFT_ENFORCE(it == perOptimizer_.end(), InvalidArgumentError, "GradScaler.unscale_: already ",
               it->second.stage == Stage::Stepped ? "stepped" : "unscaled",
               " this optimizer since the last update(); call update() first");
  PerOptimizer& st = perOptimizer_[&optimizer];
  st.foundInf = unscaleGrads(optimizer.params());
}

void GradScaler::unscale_(const std::vector<Tensor>& params) {
  if (!options_.enabled) return;
  paramListInf_ |= unscaleGrads(params);
  ++paramListsUnscaled_;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  auto it = perOptimizer_.find(&optimizer);
  if (it == perOptimizer_.end()) {
    unscale_(optimizer);
    it = perOptimizer_.find(&optimizer);
  }
  WEFT_ENFORCE(it->second.stage != Stage::Stepped, InvalidArgumentError,
               "GradScaler.step: step() was already called for this optimizer since the last update()");
  it->second.stage = Stage::Stepped;
  if (it->second.foundInf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  WEFT_ENFORCE(!perOptimizer_.empty() || paramListsUnscaled_ > 0, InvalidArgumentError,
               "GradScaler.update: no gradients were unscaled (unscale_ or step) since the last update");
  bool foundInf = paramListInf_;
  for (const auto& [opt, st] : perOptimizer_) foundInf |= st.foundInf;
  if (foundInf) {
    scale_ *= options_.backoffFactor;
    growthTracker_ = 0;
  } else if (++growthTracker_ == options_.growthInterval) {
    scale_ *= options_.growthFactor;
    growthTracker_ = 0;
  }
  perOptimizer_.clear();
  paramListsUnscaled_ = 0;
  paramListInf_ = false;
}

void GradScaler::update(double newScale) {
  if (!options_.enabled) return;
  WEFT_ENFORCE(std::isfinite(newScale) && newScale > 0, InvalidArgumentError,
               "GradScaler.update: the new scale must be finite and positive, got ", newScale);
  scale_ = newScale;
  perOptimizer_.clear();
  paramListsUnscaled_ = 0;
  paramListInf_ = false;
}

StateDict GradScaler::stateDict() const {
  return {{"scale", scalarTensor(scale_, DType::Float64)},
          {"growth_factor", scalarTensor(options_.growthFactor, DType::Float64)},
          {"backoff_factor", scalarTensor(options_.backoffFactor, DType::Float64)},
          {"growth_interval", scalarTensor(static_cast<double>(options_.growthInterval), DType::Int64)},
          {"growth_tracker", scalarTensor(static_cast<double>(growthTracker_), DType::Int64)}};
}

void GradScaler::loadStateDict(const StateDict& dict) {
  for (const auto& [key, value] : dict) {
    WEFT_ENFORCE(key == "scale" || key == "growth_factor" || key == "backoff_factor" || key == "growth_interval" ||
                     key == "growth_tracker",
                 InvalidArgumentError, "GradScaler.loadStateDict: unexpected key '", key, "'");
  }
  GradScalerOptions o = options_;
  o.initScale = entry(dict, "scale").item<double>();
  o.growthFactor = entry(dict, "growth_factor").item<double>();
  o.backoffFactor = entry(dict, "backoff_factor").item<double>();
  const double interval = entry(dict, "growth_interval").item<double>();
  const double tracker = entry(dict, "growth_tracker").item<double>();
  WEFT_ENFORCE(interval == std::floor(interval) && interval >= 1 && interval < 9.0e15, InvalidArgumentError,
               "GradScaler.loadStateDict: 'growth_interval' must be a positive integer, got ", interval);
  o.growthInterval = static_cast<int64_t>(interval);
  try {
    validateOptions(o);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(std::string("GradScaler.loadStateDict: ") + e.what());
  }
  WEFT_ENFORCE(tracker == std::floor(tracker) && tracker >= 0 && tracker < interval, InvalidArgumentError,
               "GradScaler.loadStateDict: 'growth_tracker' must be an integer in [0, growth_interval), got ", tracker);
  options_.growthFactor = o.growthFactor;
  options_.backoffFactor = o.backoffFactor;
  options_.growthInterval = o.growthInterval;
  scale_ = o.initScale;
  growthTracker_ = static_cast<int64_t>(tracker);
}

}  // namespace weft::nn
