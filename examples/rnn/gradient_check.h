// --check-gradients of the rnn example (main.cpp): each batch replayed on the trainer alone, on
// copies of the weights taken before the batch's step, with the same dropout masks and plain
// autograd, and the gradients compared with those distributed autograd computed (the LSTM's here,
// the embedding's and the decoder's fetched from ps through gradientOf).
//
//   bindGradientOf(agent);                       // both ranks, before agent.start()
//   GradientCheck check(lstmOptions, dtype, ntoken, dropout);
//   check.copyWeights(params, lstmParams);       // before the batch
//   ...  distributed forward and ctx.backward({loss})
//   double diff = check.replay(agent, ctx, batch, loss, params, lstmParams);   // before the step
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dist_autograd/dist_autograd.h"
#include "nn/rnn.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "tensor/tensor.h"

namespace weft::examples::rnn {

// The gradient a parameter owned by the callee holds in distributed autograd context
// `contextId` (undefined when it has none).
inline const Function<Tensor(RRef<Tensor>, int64_t)> gradientOf{"rnn.gradientOf"};

void bindGradientOf(rpc::Agent& agent);

// max |a - b| / max |b| (0 when both are zero).
double relativeDifference(const Tensor& a, const Tensor& b);

// One batch as the trainer ran it: its tokens, targets, the state it started from and the
// dropout seeds of its three sites (embedding, LSTM, decoder).
struct ReplayBatch {
  Tensor x, y;
  nn::LstmState state;
  int64_t embSeed = 0, lstmSeed = 0, decSeed = 0;
};

class GradientCheck {
 public:
  GradientCheck(const nn::LstmOptions& lstm, DType dtype, int64_t ntoken, double dropout);

  // Copies of the current weights (params: embedding, LSTM..., decoder weight, decoder bias).
  void copyWeights(const std::vector<RRef<Tensor>>& params, const std::vector<Tensor>& lstmParams);

  // Replays `batch` on the copies and returns the largest relative difference of the loss and
  // of every parameter's gradient; Error when a parameter has no gradient in `ctx`.
  double replay(rpc::Agent& agent, const dist_autograd::Context& ctx, const ReplayBatch& batch, const Tensor& loss,
                const std::vector<RRef<Tensor>>& params, const std::vector<Tensor>& lstmParams);

 private:
  std::unique_ptr<nn::LSTM> lstm_;
  int64_t ntoken_;
  double dropout_;
  Tensor embW_, decW_, decB_;
};

}  // namespace weft::examples::rnn
