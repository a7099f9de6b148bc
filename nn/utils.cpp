#include "nn/utils.h"

#include <cmath>
#include <map>

#include "kernels/cuda/optim.h"
#include "kernels/cuda_call.h"
#include "tensor/ops.h"

namespace weft::nn {

void zeroGrads(const std::vector<Tensor>& params, bool setToNone) {
  NoGradGuard ng;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (setToNone) {
      p.setGrad(Tensor());
    } else {
      g.zero_();
    }
  }
}

double clipGradNorm_(const std::vector<Tensor>& params, double maxNorm, double normType, bool errorIfNonfinite) {
  WEFT_ENFORCE(normType > 0, InvalidArgumentError, "clipGradNorm_: normType must be positive, got ", normType);
  WEFT_ENFORCE(maxNorm >= 0, InvalidArgumentError, "clipGradNorm_: maxNorm must be non-negative, got ", maxNorm);
  NoGradGuard ng;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  bool inf = std::isinf(normType);
  double total = 0.0;
  // Contiguous CUDA gradients: one device reduction and read-back per device.
  std::map<int, std::vector<kernels::cuda::DeviceArray>> onDevice;
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;
    if (g.device().isCuda() && g.isContiguous() && isFloating(g.dtype())) {
      onDevice[g.device().index].push_back({g.rawData(), g.dtype(), g.numel()});
      continue;
    }
    if (inf) {
      total = std::max(total, max(abs(g)).item<double>());
    } else if (normType == 2.0) {
      total += sum(square(g)).item<double>();  // x² = |x|², one pass fewer
    } else {
      total += sum(pow(abs(g), normType)).item<double>();
    }
  }
  for ([[maybe_unused]] const auto& [device, arrays] : onDevice) {
    double part = 0.0;
    WEFT_CUDA_CALL(device, gradPowerSum(arrays, normType, &part));
    total = inf ? (std::isnan(part) || part > total ? part : total) : total + part;
  }
  if (!inf) total = normType == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / normType);
  WEFT_ENFORCE(!errorIfNonfinite || std::isfinite(total), InvalidArgumentError, "clipGradNorm_: the total norm ",
               "of order ", normType, " of the gradients is ", total);
  double coef = maxNorm / (total + 1e-6);
  if (coef < 1.0) {
    for ([[maybe_unused]] const auto& [device, arrays] : onDevice) WEFT_CUDA_CALL(device, gradScale(arrays, coef));
    for (Tensor& g : grads) {
      if (g.numel() == 0) continue;
      if (g.device().isCuda() && g.isContiguous() && isFloating(g.dtype())) {
        g.storage()->bumpVersion();
      } else {
        g.mul_(coef);
      }
    }
  }
  return total;
}

void clipGradValue_(const std::vector<Tensor>& params, double clipValue) {
  WEFT_ENFORCE(clipValue >= 0, InvalidArgumentError, "clipGradValue_: clipValue must be non-negative, got ",
               clipValue);
  NoGradGuard ng;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    g.copy_(clamp(g, -clipValue, clipValue));
  }
}

Tensor parametersToVector(const std::vector<Tensor>& params) {
  WEFT_ENFORCE(!params.empty(), InvalidArgumentError, "parametersToVector: no parameters");
  NoGradGuard ng;
  std::vector<Tensor> flat;
  for (size_t i = 0; i < params.size(); ++i) {
    WEFT_ENFORCE(params[i].defined(), InvalidArgumentError, "parametersToVector: parameter ", i, " is undefined");
    WEFT_ENFORCE(params[i].dtype() == params[0].dtype() && params[i].device() == params[0].device(),
                 InvalidArgumentError, "parametersToVector: parameter ", i, " is ", dtypeName(params[i].dtype()),
                 " on ", params[i].device().str(), " but parameter 0 is ", dtypeName(params[0].dtype()), " on ",
                 params[0].device().str());
    flat.push_back(params[i].reshape({-1}));
  }
  return cat(flat, 0);
}

void vectorToParameters(const Tensor& vec, const std::vector<Tensor>& params) {
  WEFT_ENFORCE(vec.defined() && vec.dim() == 1, InvalidArgumentError, "vectorToParameters: expected a 1-D vector, got ",
               vec.defined() ? shapeString(vec.shape()) : std::string("an undefined tensor"));
  int64_t total = 0;
  for (const Tensor& p : params) total += p.numel();
  WEFT_ENFORCE(total == vec.numel(), InvalidArgumentError, "vectorToParameters: the vector has ", vec.numel(),
               " elements but the parameters have ", total);
  NoGradGuard ng;
  int64_t offset = 0;
  for (const Tensor& p : params) {
    Tensor dst = p;
    dst.copy_(vec.narrow(0, offset, p.numel()).view(p.shape()));
    offset += p.numel();
  }
}

}  // namespace weft::nn
