// LSTM: a multi-layer long short-term memory network over a sequence, as
// torch.nn.LSTM (unidirectional), one fused lstmLayer op per layer (the whole
// sequence in one autograd node; see tensor/ops_nn.h).
//
//   auto lstm = std::make_shared<nn::LSTM>(nn::LstmOptions{.inputSize = 32, .hiddenSize = 64, .numLayers = 2});
//   auto [out, state] = lstm->forward(x, {});      // x [T, N, 32] -> out [T, N, 64]
//   auto next = lstm->forward(x2, state);          // carry (h, c) across calls
//   Tensor y = lstm->forward(x);                   // output only, from a zero state
//
// Shapes (batchFirst false, PyTorch's default): input [T, N, in], output
// [T, N, hidden], h and c [numLayers, N, hidden]. With batchFirst the input
// and output are [N, T, *] (h and c keep their layout). An unbatched input
// [T, in] gives output [T, hidden] and h, c [numLayers, hidden].
//
// Parameters per layer k, with PyTorch's names and gate order (i, f, g, o):
// "weight_ih_l<k>" [4·hidden, in_k], "weight_hh_l<k>" [4·hidden, hidden],
// "bias_ih_l<k>" and "bias_hh_l<k>" [4·hidden] (absent when bias is false);
// in_0 = inputSize, in_k = hidden above. All are initialised
// U(±1/sqrt(hidden)), as in PyTorch.
//
// In training mode, dropout with probability `dropout` is applied to the
// output of every layer except the last (PyTorch's semantics); eval() turns
// it off.
#pragma once

#include "nn/module.h"
#include "tensor/generator.h"

namespace weft::nn {

struct LstmOptions {
  int64_t inputSize = 0;   // required, > 0
  int64_t hiddenSize = 0;  // required, > 0
  int64_t numLayers = 1;
  bool bias = true;
  bool batchFirst = false;
  double dropout = 0.0;  // in [0, 1]
};

// Hidden and cell state of every layer; both undefined means zeros.
struct LstmState {
  Tensor h;
  Tensor c;
};

struct LstmOutput {
  Tensor output;     // the last layer's h at every step
  LstmState state;   // (h_n, c_n) of every layer after the last step
};

class LSTM : public Module {
 public:
  // InvalidArgumentError on non-positive sizes or layers, or dropout outside
  // [0, 1].
  explicit LSTM(LstmOptions options);
  LSTM(int64_t inputSize, int64_t hiddenSize, int64_t numLayers = 1)
      : LSTM(LstmOptions{.inputSize = inputSize, .hiddenSize = hiddenSize, .numLayers = numLayers}) {}

  // Runs the sequence from `state` (zeros when both tensors are undefined).
  // InvalidArgumentError names the expected and actual shapes when the input
  // or state do not fit.
  LstmOutput forward(const Tensor& input, const LstmState& state);
  // The output sequence, from a zero state.
  Tensor forward(const Tensor& input) override;
  void resetParameters(Generator* gen = nullptr);
  // The generator dropout draws from (the default generator when null); not
  // owned, must outlive its use here.
  void setGenerator(Generator* gen) { gen_ = gen; }

  const LstmOptions& options() const { return options_; }
  // The parameters of layer k (bias tensors undefined without bias).
  const Tensor& weightIh(int64_t k) const { return layers_.at(k).wIh; }
  const Tensor& weightHh(int64_t k) const { return layers_.at(k).wHh; }
  const Tensor& biasIh(int64_t k) const { return layers_.at(k).bIh; }
  const Tensor& biasHh(int64_t k) const { return layers_.at(k).bHh; }

 protected:
  std::string extraRepr() const override;

 private:
  struct Layer {
    Tensor wIh, wHh, bIh, bHh;
  };

  LstmOptions options_;
  std::vector<Layer> layers_;
  Generator* gen_ = nullptr;
};

}  // namespace weft::nn
