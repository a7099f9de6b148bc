#include "nn/linear.h"

#include <cmath>

#include "nn/init.h"
#include "tensor/ops.h"

namespace weft::nn {

Linear::Linear(int64_t inFeatures, int64_t outFeatures, bool bias)
    : Module("Linear"), inFeatures_(inFeatures), outFeatures_(outFeatures) {
  WEFT_ENFORCE(inFeatures > 0 && outFeatures > 0, InvalidArgumentError, "Linear: sizes must be positive, got in ",
               inFeatures, ", out ", outFeatures);
  weight_ = registerParameter("weight", empty({outFeatures, inFeatures}));
  if (bias) bias_ = registerParameter("bias", empty({outFeatures}));
  resetParameters();
}

void Linear::resetParameters(Generator* gen) {
  init::kaimingUniform_(weight_, std::sqrt(5.0), init::FanMode::FanIn, init::Nonlinearity::LeakyRelu, gen);
  if (bias_.defined()) {
    double bound = 1.0 / std::sqrt(static_cast<double>(inFeatures_));
    init::uniform_(bias_, -bound, bound, gen);
  }
}

Tensor Linear::forward(const Tensor& x) {
  WEFT_ENFORCE(x.defined() && x.dim() >= 1 && x.size(-1) == inFeatures_, InvalidArgumentError, "Linear(",
               inFeatures_, " -> ", outFeatures_, "): expected input [*, ", inFeatures_, "], got shape ",
               x.defined() ? x.shape() : Shape{});
  return linear(x, weight_, bias_);
}

std::string Linear::extraRepr() const {
  return detail::concat("in_features=", inFeatures_, ", out_features=", outFeatures_,
                        ", bias=", bias_.defined() ? "true" : "false");
}

}  // namespace weft::nn
