#include "nn/embedding.h"

#include "nn/init.h"
#include "tensor/ops.h"

namespace weft::nn {

namespace {

void checkSizes(const char* module, int64_t num, int64_t dim) {
  WEFT_ENFORCE(num > 0 && dim > 0, InvalidArgumentError, module, ": sizes must be positive, got ", num,
               " embeddings of dimension ", dim);
}

const char* modeName(EmbeddingBagMode m) {
  switch (m) {
    case EmbeddingBagMode::Sum: return "sum";
    case EmbeddingBagMode::Mean: return "mean";
    case EmbeddingBagMode::Max: return "max";
  }
  return "?";
}

}  // namespace

Embedding::Embedding(int64_t numEmbeddings, int64_t embeddingDim)
    : Module("Embedding"), numEmbeddings_(numEmbeddings), embeddingDim_(embeddingDim) {
  checkSizes("Embedding", numEmbeddings, embeddingDim);
  weight_ = registerParameter("weight", empty({numEmbeddings, embeddingDim}));
  resetParameters();
}

Embedding::Embedding(const Tensor& weight) : Module("Embedding") {
  WEFT_ENFORCE(weight.defined() && weight.dim() == 2 && isFloating(weight.dtype()), InvalidArgumentError,
               "Embedding: expected a floating 2-D weight [num, dim], got ",
               weight.defined() ? shapeString(weight.shape()) + " " + dtypeName(weight.dtype())
                                : std::string("an undefined tensor"));
  numEmbeddings_ = weight.size(0);
  embeddingDim_ = weight.size(1);
  checkSizes("Embedding", numEmbeddings_, embeddingDim_);
  weight_ = registerParameter("weight", weight.detach().clone());
}

std::shared_ptr<Embedding> Embedding::fromPretrained(const Tensor& weight, bool freeze) {
  auto e = std::make_shared<Embedding>(weight);
  e->weight_.requiresGrad_(!freeze);
  return e;
}

void Embedding::resetParameters(Generator* gen) { init::normal_(weight_, 0.0, 1.0, gen); }

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight_, indices); }

std::string Embedding::extraRepr() const { return detail::concat(numEmbeddings_, ", ", embeddingDim_); }

EmbeddingBag::EmbeddingBag(int64_t numEmbeddings, int64_t embeddingDim, EmbeddingBagMode mode)
    : Module("EmbeddingBag"), numEmbeddings_(numEmbeddings), embeddingDim_(embeddingDim), mode_(mode) {
  checkSizes("EmbeddingBag", numEmbeddings, embeddingDim);
  weight_ = registerParameter("weight", empty({numEmbeddings, embeddingDim}));
  resetParameters();
}

void EmbeddingBag::resetParameters(Generator* gen) { init::normal_(weight_, 0.0, 1.0, gen); }

Tensor EmbeddingBag::forward(const Tensor& indices, const Tensor& offsets, const Tensor& perSampleWeights) {
  return embeddingBag(weight_, indices, offsets, mode_, perSampleWeights);
}

Tensor EmbeddingBag::forward(const Tensor& indices) {
  WEFT_ENFORCE(indices.defined() && indices.dim() == 2, InvalidArgumentError,
               "EmbeddingBag: forward(indices) takes 2-D indices [bags, n], got shape ",
               indices.defined() ? indices.shape() : Shape{}, "; pass offsets for 1-D indices");
  return embeddingBag(weight_, indices, Tensor(), mode_);
}

std::string EmbeddingBag::extraRepr() const {
  return detail::concat(numEmbeddings_, ", ", embeddingDim_, ", mode=", modeName(mode_));
}

}  // namespace weft::nn
