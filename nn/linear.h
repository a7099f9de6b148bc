// Linear: y = x·Wᵀ + b, as torch.nn.Linear.
//
//   auto fc = std::make_shared<nn::Linear>(784, 128);
//   Tensor y = fc->forward(x);          // x [*, 784] -> y [*, 128]
//
// Parameters "weight" [out, in] and "bias" [out] (absent when bias is false).
// Default initialisation is PyTorch's: weight kaimingUniform_(a = sqrt(5)),
// i.e. U(±1/sqrt(in)), and bias U(±1/sqrt(in)).
#pragma once

#include "nn/module.h"
#include "tensor/generator.h"

namespace weft::nn {

class Linear : public Module {
 public:
  // Sizes must be positive (InvalidArgumentError).
  Linear(int64_t inFeatures, int64_t outFeatures, bool bias = true);

  // x [*, in] -> [*, out]; InvalidArgumentError when x's last size is not in.
  Tensor forward(const Tensor& x) override;
  // Re-draws the parameters with the default initialisation from `gen` (the
  // process default generator when null).
  void resetParameters(Generator* gen = nullptr);

  int64_t inFeatures() const { return inFeatures_; }
  int64_t outFeatures() const { return outFeatures_; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias

 protected:
  std::string extraRepr() const override;

 private:
  int64_t inFeatures_;
  int64_t outFeatures_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace weft::nn
