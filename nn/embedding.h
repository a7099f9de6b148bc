// Lookup tables, as torch.nn.Embedding and torch.nn.EmbeddingBag.
//
//   auto emb = std::make_shared<nn::Embedding>(10000, 64);
//   Tensor v = emb->forward(tokens);                       // Int64 [B, T] -> [B, T, 64]
//
//   auto bag = std::make_shared<nn::EmbeddingBag>(10000, 64, EmbeddingBagMode::Sum);
//   Tensor s = bag->forward(indices, offsets);             // 1-D indices, bag starts -> [bags, 64]
//   Tensor t = bag->forward(indices2d);                    // [bags, n] -> [bags, 64]
//
// The parameter is "weight" [num, dim], initialised N(0, 1) as in PyTorch.
// Index checking (Int64, within [0, num)) is the ops' (tensor/ops_nn.h).
#pragma once

#include "nn/module.h"
#include "tensor/generator.h"
#include "tensor/ops_nn.h"

namespace weft::nn {

class Embedding : public Module {
 public:
  // Sizes must be positive (InvalidArgumentError).
  Embedding(int64_t numEmbeddings, int64_t embeddingDim);
  // A table holding a copy of the floating 2-D `weight` [num, dim] (same
  // dtype and device); nothing is drawn at random.
  explicit Embedding(const Tensor& weight);
  // A table holding a copy of `weight` [num, dim]; frozen (requiresGrad
  // false) unless `freeze` is false.
  static std::shared_ptr<Embedding> fromPretrained(const Tensor& weight, bool freeze = true);

  // Int64 indices of any shape -> [*indices.shape, dim].
  Tensor forward(const Tensor& indices) override;
  // Re-draws the weight N(0, 1) from `gen` (the default generator when null).
  void resetParameters(Generator* gen = nullptr);

  int64_t numEmbeddings() const { return numEmbeddings_; }
  int64_t embeddingDim() const { return embeddingDim_; }
  const Tensor& weight() const { return weight_; }

 protected:
  std::string extraRepr() const override;

 private:
  int64_t numEmbeddings_;
  int64_t embeddingDim_;
  Tensor weight_;
};

class EmbeddingBag : public Module {
 public:
  // Sizes must be positive (InvalidArgumentError). Mean is PyTorch's default.
  EmbeddingBag(int64_t numEmbeddings, int64_t embeddingDim, EmbeddingBagMode mode = EmbeddingBagMode::Mean);

  // 1-D indices with bag starts in `offsets`, or 2-D indices [bags, n] with
  // offsets undefined; perSampleWeights (same shape as indices) only with
  // Sum. Returns [bags, dim]; empty bags give zeros.
  Tensor forward(const Tensor& indices, const Tensor& offsets, const Tensor& perSampleWeights = Tensor());
  // The 2-D form: indices [bags, n] -> [bags, dim].
  Tensor forward(const Tensor& indices) override;
  void resetParameters(Generator* gen = nullptr);

  int64_t numEmbeddings() const { return numEmbeddings_; }
  int64_t embeddingDim() const { return embeddingDim_; }
  EmbeddingBagMode mode() const { return mode_; }
  const Tensor& weight() const { return weight_; }

 protected:
  std::string extraRepr() const override;

 private:
  int64_t numEmbeddings_;
  int64_t embeddingDim_;
  EmbeddingBagMode mode_;
  Tensor weight_;
};

}  // namespace weft::nn
