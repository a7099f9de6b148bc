// Parameter-free layers: activations, (log-)softmax, dropout, flatten and
// identity, as their torch.nn namesakes. Each wraps one op of tensor/ops.h so
// that it can sit in a Sequential.
//
//   auto net = nn::makeSequential({
//       std::make_shared<nn::Flatten>(),
//       std::make_shared<nn::Linear>(784, 128), std::make_shared<nn::ReLU>(),
//       std::make_shared<nn::Dropout>(0.5),
//       std::make_shared<nn::Linear>(128, 10), std::make_shared<nn::LogSoftmax>(1)});
#pragma once

#include "nn/module.h"
#include "tensor/generator.h"

namespace weft::nn {

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};

// The exact (erf) GELU.
class GELU : public Module {
 public:
  GELU() : Module("GELU") {}
  Tensor forward(const Tensor& x) override;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : Module("Softmax"), dim_(dim) {}
  Tensor forward(const Tensor& x) override;
  int64_t dim() const { return dim_; }

 protected:
  std::string extraRepr() const override;

 private:
  int64_t dim_;
};

class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim) : Module("LogSoftmax"), dim_(dim) {}
  Tensor forward(const Tensor& x) override;
  int64_t dim() const { return dim_; }

 protected:
  std::string extraRepr() const override;

 private:
  int64_t dim_;
};

// Zeroes each element with probability p and scales the rest by 1/(1-p) in
// training mode; the identity in eval mode.
class Dropout : public Module {
 public:
  // p in [0, 1] (InvalidArgumentError otherwise).
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  // The generator the mask is drawn from (the default generator when null);
  // not owned, must outlive its use here.
  void setGenerator(Generator* gen) { gen_ = gen; }
  double p() const { return p_; }

 protected:
  std::string extraRepr() const override;

 private:
  double p_;
  Generator* gen_ = nullptr;
};

// Flattens dimensions startDim..endDim into one; the defaults keep the batch
// dimension: [N, C, H, W] -> [N, C·H·W].
class Flatten : public Module {
 public:
  explicit Flatten(int64_t startDim = 1, int64_t endDim = -1)
      : Module("Flatten"), startDim_(startDim), endDim_(endDim) {}
  Tensor forward(const Tensor& x) override;

 protected:
  std::string extraRepr() const override;

 private:
  int64_t startDim_;
  int64_t endDim_;
};

}  // namespace weft::nn
