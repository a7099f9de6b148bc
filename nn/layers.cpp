#include "nn/layers.h"

#include "tensor/ops.h"

namespace weft::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }

Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim_); }
std::string Softmax::extraRepr() const { return detail::concat("dim=", dim_); }

Tensor LogSoftmax::forward(const Tensor& x) { return logSoftmax(x, dim_); }
std::string LogSoftmax::extraRepr() const { return detail::concat("dim=", dim_); }

Dropout::Dropout(double p) : Module("Dropout"), p_(p) {
  WEFT_ENFORCE(p >= 0.0 && p <= 1.0, InvalidArgumentError, "Dropout: probability must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, isTraining(), gen_); }
std::string Dropout::extraRepr() const { return detail::concat("p=", p_); }

Tensor Flatten::forward(const Tensor& x) { return x.flatten(startDim_, endDim_); }
std::string Flatten::extraRepr() const { return detail::concat("start_dim=", startDim_, ", end_dim=", endDim_); }

}  // namespace weft::nn
