// Stages: a model cut into P consecutive pieces, one per pipeline stage.
// A Sequential is split at cut points (each stage a Sequential of the
// original layers, sharing their parameters); the GPT (nn/transformer.h) is
// first viewed as a Sequential of its layers (embedding, blocks, head).
//
//   auto net = nn::makeSequential({lin1, relu, lin2, relu, lin3});
//   auto stages = pipeline::splitSequential(*net, {2, 4});         // [0, 2) [2, 4) [4, 5)
//   auto cuts = pipeline::cutsByParameterCount(*net, 3);           // equal parameter counts
//   auto layers = pipeline::gptLayers(gpt);                        // "embed", "h_0" ... "head"
//   auto mine = pipeline::splitSequential(*layers, cuts)[stage];  // this process's stage
//   auto tied = pipeline::gptTiedParameters(*gpt, stage, P);       // for PipelineExecutor
//
// Cut points. cuts[i] is the index of the first layer of stage i + 1: strictly
// increasing, each in [1, n) for a Sequential of n layers, so that every
// stage holds at least one layer (P = cuts.size() + 1 <= n). Otherwise
// InvalidArgumentError naming the cut and n.
//
// Balancing. balancedCuts(costs, P) returns the cut points that minimise the
// largest stage's summed cost, stages contiguous and non-empty (dynamic
// programming over prefixes, O(P·n²)); among equally good cuts it takes, from
// the last stage backwards, the latest possible start of each stage. With parameter counts as costs (cutsByParameterCount) this is the
// "equal parameter counts" split; with measured forward+backward times per
// layer (measureLayerTimes) it is a time-balanced split. A re-balancing
// policy (as layers freeze, say) calls it again with new costs and rebuilds
// the stages.
//
// Measuring. measureLayerTimes(seq, sample, repeats) feeds `sample` through
// the layers once to get each layer's input, then times each layer alone:
// its forward on a detached copy of its input (requiring grad when
// floating), and its backward from a gradient of ones, the median of
// `repeats` runs each. Parameters' .grad are restored afterwards. The times
// are seconds on this process's CPUs at the moment of measuring: measure
// with the micro-batch size the pipeline will use.
//
// Names. A stage keeps the names its layers had in the Sequential ("2.weight"
// stays "2.weight" in the stage that holds layer 2), so state dicts of the
// stages together are the model's.
//
// GPT. gptLayers(gpt) is a Sequential sharing gpt's modules: "embed"
// (GPTEmbedding: token + position embeddings, then dropout; Int64 [B, T] ->
// [B, T, width]), "h_0" ... "h_{L-1}" (the blocks; a Sequential's names hold
// no '.'), and "head" (GPTHead: ln_f, then the head tied to
// wte; [B, T, width] -> logits [B, T, vocab]). Its forward equals
// gpt->forward. The tied head makes wte a parameter of the first and the last
// stage: each process builds the whole GPT from the same seed and keeps its
// stage, and gptTiedParameters names wte.weight on both, so the executor sums
// its two gradients (PipelineExecutor, "Tied parameters") and both copies
// stay equal under the same optimizer. The layers do not apply
// GPTConfig::checkpoint: the executor checkpoints whole stages instead
// (ExecutorOptions::checkpoint, pipeline/executor.h).
//
// Tensor-parallel GPT (pp × tp, and × sp). gptLayers(tpGpt) views a
// collectives::TensorParallelGPT the same way: "embed"
// (TensorParallelGPTEmbedding: TensorParallelGPT::embed, the
// vocabulary-parallel token embedding plus the position embedding, then
// dropout), the parallel blocks "h_k", and "head" (TensorParallelGPTHead:
// TensorParallelGPT::head, ln_f, then the head tied to the
// vocabulary-parallel wte: this rank's vocabulary slice of the logits), whose
// loss is TensorParallelGPT::lossOfLogits. Its forward equals tpGpt->forward
// on every rank of the tp group, which run it together: each layer's
// collectives are over that group. A pipeline of such layers runs one
// executor per tp rank, over the pp group of the processes that hold that tp
// rank of every stage, so activations pass between the same tp rank of
// adjacent stages; every tp rank of a stage cuts the layers alike (the ranks'
// parameter counts are equal) and runs the same schedule. gptTiedParameters
// names this rank's shard of wte.weight on the first and the last stage, the
// same rows on both. A model built with SpOptions takes its rank's tokens
// (TensorParallelGPT::shardTokens), the micro-batches split the batch, and
// the stage's gradients are this rank's tokens' share until summed over the
// sequence-parallel groups (TensorParallelGPT::allReduceGradients sums the
// whole model's; a stage sums its own).
//
// Threading: as nn/module.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/sequential.h"
#include "nn/transformer.h"

namespace weft::collectives {
class TensorParallelGPT;  // collectives/tensor_parallel_gpt.h
}  // namespace weft::collectives

namespace weft::pipeline {

// The stages of `seq` cut before the layers at `cuts` (see "Cut points").
std::vector<std::shared_ptr<nn::Sequential>> splitSequential(const nn::Sequential& seq,
                                                             const std::vector<size_t>& cuts);

// Cut points for `stages` contiguous stages minimising the largest summed
// cost (see "Balancing"). costs non-empty and >= 0, 1 <= stages <=
// costs.size(); InvalidArgumentError otherwise.
std::vector<size_t> balancedCuts(const std::vector<double>& costs, int stages);

// Each layer's forward+backward seconds (see "Measuring"); repeats >= 1.
std::vector<double> measureLayerTimes(nn::Sequential& seq, const Tensor& sample, int repeats = 3);

// The number of parameter elements of each layer of `seq`.
std::vector<int64_t> layerParameterCounts(const nn::Sequential& seq);
// balancedCuts over layerParameterCounts.
std::vector<size_t> cutsByParameterCount(const nn::Sequential& seq, int stages);

// The GPT's token and position embeddings with dropout (shares gpt's wte, wpe).
class GPTEmbedding : public nn::Module {
 public:
  explicit GPTEmbedding(const nn::GPT& gpt);
  // idx Int64 [B, T], 1 <= T <= blockSize -> [B, T, width]; InvalidArgumentError otherwise.
  Tensor forward(const Tensor& idx) override;

 private:
  std::shared_ptr<nn::Embedding> wte_;
  std::shared_ptr<nn::Embedding> wpe_;
  double dropout_;
};

// The GPT's final LayerNorm and its head tied to wte (shares gpt's ln_f, wte).
class GPTHead : public nn::Module {
 public:
  explicit GPTHead(const nn::GPT& gpt);
  // x [B, T, width] -> logits [B, T, vocabSize].
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<nn::LayerNorm> lnF_;
  std::shared_ptr<nn::Embedding> wte_;
};

// "embed", "h_0" ... "h_{L-1}", "head" (see "GPT").
std::shared_ptr<nn::Sequential> gptLayers(const std::shared_ptr<nn::GPT>& gpt);

// The tensor-parallel GPT's embeddings with dropout (shares gpt's wte, wpe):
// TensorParallelGPT::embed, in this module's train or eval mode.
class TensorParallelGPTEmbedding : public nn::Module {
 public:
  explicit TensorParallelGPTEmbedding(std::shared_ptr<collectives::TensorParallelGPT> gpt);
  // idx Int64 [B, T] as TensorParallelGPT::forward takes it -> [B, T, width],
  // replicated over the tp group; InvalidArgumentError otherwise.
  Tensor forward(const Tensor& idx) override;

 private:
  std::shared_ptr<collectives::TensorParallelGPT> gpt_;
};

// The tensor-parallel GPT's final LayerNorm and its head tied to the
// vocabulary-parallel wte (shares gpt's ln_f, wte): TensorParallelGPT::head.
class TensorParallelGPTHead : public nn::Module {
 public:
  explicit TensorParallelGPTHead(std::shared_ptr<collectives::TensorParallelGPT> gpt);
  // x [B, T, width], replicated -> this rank's vocabulary slice of the logits
  // [B, T, L]; TensorParallelGPT::lossOfLogits takes them.
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<collectives::TensorParallelGPT> gpt_;
};

// "embed", "h_0" ... "h_{L-1}", "head" of a tensor-parallel GPT (see
// "Tensor-parallel GPT").
std::shared_ptr<nn::Sequential> gptLayers(const std::shared_ptr<collectives::TensorParallelGPT>& gpt);

// A parameter that lives on this stage and, as a copy, on stage `peerStage`:
// the executor adds the two gradients so that the copies receive the same
// update. Both stages list their tied parameters in the same order.
struct TiedParameter {
  Tensor parameter;
  int peerStage;
};
// wte.weight on the first and the last of `stages` stages when they differ;
// empty otherwise.
std::vector<TiedParameter> gptTiedParameters(const nn::GPT& gpt, int stage, int stages);
// The same for a tensor-parallel GPT: this rank's shard of wte.weight.
std::vector<TiedParameter> gptTiedParameters(const collectives::TensorParallelGPT& gpt, int stage, int stages);

}  // namespace weft::pipeline
