#include "pipeline/stage.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <utility>

#include "collectives/tensor_parallel_gpt.h"
#include "common/error.h"
#include "tensor/ops.h"

namespace weft::pipeline {

std::vector<std::shared_ptr<nn::Sequential>> splitSequential(const nn::Sequential& seq,
                                                             const std::vector<size_t>& cuts) {
  const size_t n = seq.size();
  WEFT_ENFORCE(n >= 1, InvalidArgumentError, "splitSequential: the Sequential has no layer");
  size_t previous = 0;
  for (size_t i = 0; i < cuts.size(); ++i) {
    WEFT_ENFORCE(cuts[i] > previous && cuts[i] < n, InvalidArgumentError, "splitSequential: cut ", i, " is ",
                 cuts[i], ", but cuts must increase strictly within [1, ", n, ") for a Sequential of ", n,
                 " layers, got ", cuts);
    previous = cuts[i];
  }
  const auto children = seq.namedChildren();
  WEFT_CHECK(children.size() == n) << children.size() << " " << n;
  std::vector<std::shared_ptr<nn::Sequential>> stages;
  size_t begin = 0;
  for (size_t s = 0; s <= cuts.size(); ++s) {
    const size_t end = s < cuts.size() ? cuts[s] : n;
    auto stage = std::make_shared<nn::Sequential>();
    for (size_t i = begin; i < end; ++i) stage->push_back(children[i].first, children[i].second);
    stages.push_back(std::move(stage));
    begin = end;
  }
  return stages;
}

std::vector<size_t> balancedCuts(const std::vector<double>& costs, int stages) {
  const size_t n = costs.size();
  WEFT_ENFORCE(n >= 1, InvalidArgumentError, "balancedCuts: no layer costs given");
  WEFT_ENFORCE(stages >= 1 && static_cast<size_t>(stages) <= n, InvalidArgumentError,
               "balancedCuts: stages must lie in [1, ", n, "] for ", n, " layers, got ", stages);
  for (size_t i = 0; i < n; ++i)
    WEFT_ENFORCE(costs[i] >= 0.0, InvalidArgumentError, "balancedCuts: cost of layer ", i, " is ", costs[i],
                 ", must be >= 0");
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  const auto p = static_cast<size_t>(stages);
  // best[k][j]: the least largest stage cost splitting layers [0, j) into k stages;
  // from[k][j]: where the k-th stage starts in that split.
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<size_t>> from(p + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0.0;
  for (size_t k = 1; k <= p; ++k) {
    for (size_t j = k; j <= n; ++j) {
      for (size_t i = k - 1; i < j; ++i) {
        const double c = std::max(best[k - 1][i], prefix[j] - prefix[i]);
        if (c <= best[k][j]) {
          best[k][j] = c;
          from[k][j] = i;
        }
      }
    }
  }
  std::vector<size_t> cuts(p - 1);
  size_t j = n;
  for (size_t k = p; k > 1; --k) {
    j = from[k][j];
    cuts[k - 2] = j;
  }
  return cuts;
}

std::vector<double> measureLayerTimes(nn::Sequential& seq, const Tensor& sample, int repeats) {
  WEFT_ENFORCE(repeats >= 1, InvalidArgumentError, "measureLayerTimes: repeats must be >= 1, got ", repeats);
  WEFT_ENFORCE(sample.defined(), InvalidArgumentError, "measureLayerTimes: the sample input is undefined");
  using Clock = std::chrono::steady_clock;
  // Every parameter's gradient as it was, restored at the end.
  std::vector<std::pair<Tensor, Tensor>> saved;
  for (const Tensor& p : seq.parameters()) saved.emplace_back(p, p.grad().defined() ? p.grad().clone() : Tensor());
  std::vector<double> times;
  Tensor x = sample;
  for (size_t i = 0; i < seq.size(); ++i) {
    const auto& layer = seq.at(i);
    std::vector<double> runs;
    Tensor out;
    for (int r = 0; r < repeats; ++r) {
      Tensor in = x.detach();
      if (isFloating(in.dtype())) in.requiresGrad_();
      const auto t0 = Clock::now();
      out = layer->forward(in);
      if (out.requiresGrad()) out.backward(onesLike(out));
      runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(runs.begin(), runs.end());
    times.push_back(runs[runs.size() / 2]);
    x = out.detach();
  }
  for (auto& [p, g] : saved) p.setGrad(g);
  return times;
}

std::vector<int64_t> layerParameterCounts(const nn::Sequential& seq) {
  std::vector<int64_t> counts;
  for (const auto& layer : seq.children()) {
    int64_t c = 0;
    for (const Tensor& t : layer->parameters()) c += t.numel();
    counts.push_back(c);
  }
  return counts;
}

std::vector<size_t> cutsByParameterCount(const nn::Sequential& seq, int stages) {
  std::vector<double> costs;
  for (int64_t c : layerParameterCounts(seq)) costs.push_back(static_cast<double>(c));
  return balancedCuts(costs, stages);
}

// ---- GPT ------------------------------------------------------------------------

GPTEmbedding::GPTEmbedding(const nn::GPT& gpt) : Module("GPTEmbedding"), dropout_(gpt.config().dropout) {
  wte_ = registerModule("wte", gpt.wte());
  wpe_ = registerModule("wpe", gpt.wpe());
}

Tensor GPTEmbedding::forward(const Tensor& idx) {
  WEFT_ENFORCE(idx.defined() && idx.dtype() == DType::Int64 && idx.dim() == 2 && idx.size(1) >= 1 &&
                   idx.size(1) <= wpe_->weight().size(0),
               InvalidArgumentError, "GPTEmbedding: expected Int64 token ids [B, T] with 1 <= T <= ",
               wpe_->weight().size(0), ", got ",
               idx.defined() ? shapeString(idx.shape()) + " " + dtypeName(idx.dtype()) : std::string("undefined"));
  Tensor x = add(wte_->forward(idx), wpe_->weight().narrow(0, 0, idx.size(1)));
  return dropout(x, dropout_, isTraining());
}

GPTHead::GPTHead(const nn::GPT& gpt) : Module("GPTHead") {
  lnF_ = registerModule("ln_f", gpt.lnF());
  wte_ = registerModule("wte", gpt.wte());
}

Tensor GPTHead::forward(const Tensor& x) { return linear(lnF_->forward(x), wte_->weight()); }

std::shared_ptr<nn::Sequential> gptLayers(const std::shared_ptr<nn::GPT>& gpt) {
  WEFT_ENFORCE(gpt != nullptr, InvalidArgumentError, "gptLayers: null GPT");
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back("embed", std::make_shared<GPTEmbedding>(*gpt));
  for (size_t b = 0; b < gpt->blocks().size(); ++b) seq->push_back("h_" + std::to_string(b), gpt->blocks()[b]);
  seq->push_back("head", std::make_shared<GPTHead>(*gpt));
  seq->train(gpt->isTraining());
  return seq;
}

namespace {

// wte's weight tied between the first and the last of `stages` stages.
std::vector<TiedParameter> tiedEnds(const Tensor& wte, int stage, int stages) {
  WEFT_ENFORCE(stages >= 1 && stage >= 0 && stage < stages, InvalidArgumentError, "gptTiedParameters: stage ", stage,
               " outside [0, ", stages, ")");
  if (stages == 1) return {};
  if (stage == 0) return {{wte, stages - 1}};
  if (stage == stages - 1) return {{wte, 0}};
  return {};
}

}  // namespace

std::vector<TiedParameter> gptTiedParameters(const nn::GPT& gpt, int stage, int stages) {
  return tiedEnds(gpt.wte()->weight(), stage, stages);
}

// ---- tensor-parallel GPT --------------------------------------------------------

TensorParallelGPTEmbedding::TensorParallelGPTEmbedding(std::shared_ptr<collectives::TensorParallelGPT> gpt)
    : Module("TensorParallelGPTEmbedding"), gpt_(std::move(gpt)) {
  registerModule("wte", gpt_->wte());
  registerModule("wpe", gpt_->wpe());
}

Tensor TensorParallelGPTEmbedding::forward(const Tensor& idx) { return gpt_->embed(idx, isTraining()); }

TensorParallelGPTHead::TensorParallelGPTHead(std::shared_ptr<collectives::TensorParallelGPT> gpt)
    : Module("TensorParallelGPTHead"), gpt_(std::move(gpt)) {
  registerModule("ln_f", gpt_->lnF());
  registerModule("wte", gpt_->wte());
}

Tensor TensorParallelGPTHead::forward(const Tensor& x) { return gpt_->head(x); }

std::shared_ptr<nn::Sequential> gptLayers(const std::shared_ptr<collectives::TensorParallelGPT>& gpt) {
  WEFT_ENFORCE(gpt != nullptr, InvalidArgumentError, "gptLayers: null TensorParallelGPT");
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back("embed", std::make_shared<TensorParallelGPTEmbedding>(gpt));
  for (size_t b = 0; b < gpt->blocks().size(); ++b) seq->push_back("h_" + std::to_string(b), gpt->blocks()[b]);
  seq->push_back("head", std::make_shared<TensorParallelGPTHead>(gpt));
  seq->train(gpt->isTraining());
  return seq;
}

std::vector<TiedParameter> gptTiedParameters(const collectives::TensorParallelGPT& gpt, int stage, int stages) {
  return tiedEnds(gpt.wte()->weight(), stage, stages);
}

}  // namespace weft::pipeline
