#include "nn/rnn.h"

#include <cmath>

#include "nn/init.h"
#include "tensor/ops.h"

namespace weft::nn {

LSTM::LSTM(LstmOptions options) : Module("LSTM"), options_(options) {
  const LstmOptions& o = options_;
  WEFT_ENFORCE(o.inputSize > 0 && o.hiddenSize > 0, InvalidArgumentError,
               "LSTM: inputSize and hiddenSize must be positive, got ", o.inputSize, " and ", o.hiddenSize);
  WEFT_ENFORCE(o.numLayers > 0, InvalidArgumentError, "LSTM: numLayers must be positive, got ", o.numLayers);
  WEFT_ENFORCE(o.dropout >= 0.0 && o.dropout <= 1.0, InvalidArgumentError, "LSTM: dropout must be in [0, 1], got ",
               o.dropout);
  int64_t gates = 4 * o.hiddenSize;
  for (int64_t k = 0; k < o.numLayers; ++k) {
    int64_t in = k == 0 ? o.inputSize : o.hiddenSize;
    std::string s = std::to_string(k);
    Layer l;
    l.wIh = registerParameter("weight_ih_l" + s, empty({gates, in}));
    l.wHh = registerParameter("weight_hh_l" + s, empty({gates, o.hiddenSize}));
    if (o.bias) {
      l.bIh = registerParameter("bias_ih_l" + s, empty({gates}));
      l.bHh = registerParameter("bias_hh_l" + s, empty({gates}));
    }
    layers_.push_back(l);
  }
  resetParameters();
}

void LSTM::resetParameters(Generator* gen) {
  double bound = 1.0 / std::sqrt(static_cast<double>(options_.hiddenSize));
  for (const Tensor& p : parameters(false)) init::uniform_(p, -bound, bound, gen);
}

LstmOutput LSTM::forward(const Tensor& input, const LstmState& state) {
  const LstmOptions& o = options_;
  WEFT_ENFORCE(input.defined() && (input.dim() == 3 || input.dim() == 2) && input.size(-1) == o.inputSize,
               InvalidArgumentError, "LSTM: expected input ", o.batchFirst ? "[N, T, " : "[T, N, ", o.inputSize,
               "] (or unbatched [T, ", o.inputSize, "]), got shape ", input.defined() ? input.shape() : Shape{});
  bool batched = input.dim() == 3;
  // x is [T, N, in] from here on.
  Tensor x = !batched ? input.unsqueeze(1) : o.batchFirst ? input.transpose(0, 1) : input;
  int64_t steps = x.size(0), batch = x.size(1);
  WEFT_ENFORCE(steps > 0, InvalidArgumentError, "LSTM: the input sequence is empty (shape ", input.shape(), ")");

  WEFT_ENFORCE(state.h.defined() == state.c.defined(), InvalidArgumentError,
               "LSTM: the initial state needs both h and c, or neither");
  Shape stateShape = batched ? Shape{o.numLayers, batch, o.hiddenSize} : Shape{o.numLayers, o.hiddenSize};
  Tensor h0, c0;
  if (state.h.defined()) {
    WEFT_ENFORCE(state.h.shape() == stateShape && state.c.shape() == stateShape, InvalidArgumentError,
                 "LSTM: expected h and c of shape ", stateShape, ", got ", state.h.shape(), " and ", state.c.shape());
    h0 = batched ? state.h : state.h.unsqueeze(1);
    c0 = batched ? state.c : state.c.unsqueeze(1);
  } else {
    h0 = zeros({o.numLayers, batch, o.hiddenSize}, {.dtype = x.dtype(), .device = x.device()});
    c0 = h0;
  }

  std::vector<Tensor> hN, cN;
  for (int64_t k = 0; k < o.numLayers; ++k) {
    const Layer& l = layers_[k];
    LstmLayerOutput layer = lstmLayer(x, h0.select(0, k), c0.select(0, k), l.wIh, l.wHh, l.bIh, l.bHh);
    hN.push_back(layer.h);
    cN.push_back(layer.c);
    x = layer.output;
    if (k + 1 < o.numLayers && o.dropout > 0 && isTraining()) x = dropout(x, o.dropout, true, gen_);
  }

  LstmOutput out;
  out.state.h = stack(hN, 0);
  out.state.c = stack(cN, 0);
  if (!batched) {
    out.output = x.squeeze(1);
    out.state.h = out.state.h.squeeze(1);
    out.state.c = out.state.c.squeeze(1);
  } else {
    out.output = o.batchFirst ? x.transpose(0, 1) : x;
  }
  return out;
}

Tensor LSTM::forward(const Tensor& input) { return forward(input, LstmState{}).output; }

std::string LSTM::extraRepr() const {
  const LstmOptions& o = options_;
  std::string s = detail::concat(o.inputSize, ", ", o.hiddenSize);
  if (o.numLayers != 1) s += detail::concat(", num_layers=", o.numLayers);
  if (!o.bias) s += ", bias=false";
  if (o.batchFirst) s += ", batch_first=true";
  if (o.dropout != 0) s += detail::concat(", dropout=", o.dropout);
  return s;
}

}  // namespace weft::nn
