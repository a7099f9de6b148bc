#include "gradient_check.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/error.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

#include "model.h"

namespace weft::examples::rnn {

void bindGradientOf(rpc::Agent& agent) {
  agent.registry().impl(gradientOf, [&agent](RRef<Tensor> param, int64_t contextId) {
    return dist_autograd::gradients(agent, contextId).get(*param.localValue());
  });
}

double relativeDifference(const Tensor& a, const Tensor& b) {
  NoGradGuard noGrad;
  const double diff = max(abs(sub(a, b))).to(DType::Float64).item<double>();
  const double scale = max(abs(b)).to(DType::Float64).item<double>();
  if (diff == 0) return 0;
  return scale > 0 ? diff / scale : INFINITY;
}

GradientCheck::GradientCheck(const nn::LstmOptions& lstm, DType dtype, int64_t ntoken, double dropout)
    : lstm_(std::make_unique<nn::LSTM>(lstm)), ntoken_(ntoken), dropout_(dropout) {
  lstm_->to(dtype);
}

void GradientCheck::copyWeights(const std::vector<RRef<Tensor>>& params, const std::vector<Tensor>& lstmParams) {
  auto leaf = [](const Tensor& t) { return t.detach().clone().requiresGrad_(); };
  embW_ = leaf(params[0].toHere());
  decW_ = leaf(params[params.size() - 2].toHere());
  decB_ = leaf(params[params.size() - 1].toHere());
  NoGradGuard noGrad;
  std::vector<Tensor> copies = lstm_->parameters();
  for (size_t i = 0; i < copies.size(); ++i) copies[i].copy_(lstmParams[i]);
  lstm_->zeroGrad(true);
}

double GradientCheck::replay(rpc::Agent& agent, const dist_autograd::Context& ctx, const ReplayBatch& batch,
                             const Tensor& loss, const std::vector<RRef<Tensor>>& params,
                             const std::vector<Tensor>& lstmParams) {
  // The same batch on this process alone: same weights, same masks, plain autograd.
  Generator embGen(static_cast<uint64_t>(batch.embSeed)), decGen(static_cast<uint64_t>(batch.decSeed)),
      replayGen(static_cast<uint64_t>(batch.lstmSeed));
  lstm_->setGenerator(&replayGen);
  Tensor le = embedTokens(embW_, batch.x, dropout_, &embGen);
  nn::LstmOutput lout = lstm_->forward(le, batch.state);
  lstm_->setGenerator(nullptr);
  Tensor llogits = decode(decW_, decB_, lout.output, dropout_, &decGen);
  Tensor lloss = crossEntropy(llogits.reshape({-1, ntoken_}), batch.y.reshape({-1}));
  lloss.backward();
  double diff = std::max(0.0, relativeDifference(loss.detach(), lloss.detach()));
  const dist_autograd::GradientMap local = ctx.gradients();
  const std::vector<Tensor> replayParams = lstm_->parameters();
  for (size_t i = 0; i < lstmParams.size(); ++i) {
    Tensor g = local.get(lstmParams[i]);
    if (!g.defined()) throw Error("gradient check: LSTM parameter " + std::to_string(i) + " has no gradient");
    diff = std::max(diff, relativeDifference(g, replayParams[i].grad()));
  }
  const std::vector<std::pair<size_t, Tensor>> remote = {
      {0, embW_.grad()}, {params.size() - 2, decW_.grad()}, {params.size() - 1, decB_.grad()}};
  for (const auto& [index, expected] : remote) {
    Tensor g = agent.call("ps", gradientOf, params[index], ctx.id());
    if (!g.defined()) throw Error("gradient check: parameter " + std::to_string(index) + " has no gradient on ps");
    diff = std::max(diff, relativeDifference(g, expected));
  }
  return diff;
}

}  // namespace weft::examples::rnn
