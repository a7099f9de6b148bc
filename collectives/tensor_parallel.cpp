#include "collectives/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "nn/init.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::collectives {

// ---- the group and the conjugate functions ------------------------------------------

TpGroup::Traffic TpGroup::traffic() const {
  Traffic t;
  t.forwardAllReduces = forwardAllReduces_.load();
  t.forwardBytes = forwardBytes_.load();
  t.backwardAllReduces = backwardAllReduces_.load();
  t.backwardBytes = backwardBytes_.load();
  return t;
}

void TpGroup::resetTraffic() {
  forwardAllReduces_ = 0;
  forwardBytes_ = 0;
  backwardAllReduces_ = 0;
  backwardBytes_ = 0;
}

void TpGroup::allReduce(const Tensor& t, ReduceOp op, bool backward) {
  (backward ? backwardAllReduces_ : forwardAllReduces_) += 1;
  (backward ? backwardBytes_ : forwardBytes_) += static_cast<int64_t>(t.nbytes());
  group_.allReduce(t, op).wait();
}

Tensor copyToTp(TpGroup& tp, const Tensor& x) {
  Tensor out;
  {
    NoGradGuard noGrad;
    out = x.detach();
  }
  recordOp("copyToTp", {x}, {out}, [&tp](const std::vector<Tensor>& g) {
    Tensor sum;
    {
      NoGradGuard noGrad;
      sum = g[0].contiguous().clone();
    }
    tp.allReduce(sum, ReduceOp::Sum, /*backward=*/true);
    return std::vector<Tensor>{sum};
  });
  return out;
}

Tensor reduceFromTp(TpGroup& tp, const Tensor& x) {
  Tensor out;
  {
    NoGradGuard noGrad;
    out = x.contiguous().clone();
  }
  tp.allReduce(out, ReduceOp::Sum, /*backward=*/false);
  recordOp("reduceFromTp", {x}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

namespace {

int64_t divided(const char* layer, const char* what, int64_t n, int64_t t) {
  WEFT_ENFORCE(n > 0, InvalidArgumentError, layer, ": ", what, " must be positive, got ", n);
  WEFT_ENFORCE(n % t == 0, InvalidArgumentError, layer, ": ", what, " (", n,
               ") must be divisible by the tensor-parallel size ", t);
  return n / t;
}

void checkFull(const char* layer, const std::string& param, const Tensor& full, const Shape& want) {
  WEFT_ENFORCE(full.defined() && full.shape() == want, InvalidArgumentError, layer, ": the whole layer's ", param,
               " must have shape ", want, ", got ", full.defined() ? full.shape() : Shape{});
}

// Rows [r·n/T, (r+1)·n/T) of each of `parts` equal blocks of `full`'s dim 0, concatenated.
Tensor sliceParts(const Tensor& full, int64_t parts, int rank, int size) {
  const int64_t block = full.size(0) / parts, slice = block / size;
  std::vector<Tensor> pieces;
  for (int64_t p = 0; p < parts; ++p) pieces.push_back(full.narrow(0, p * block + rank * slice, slice));
  return cat(pieces, 0).contiguous().clone();
}

// The inverse of sliceParts: rank i's shard holds, per part, rows
// [i·slice, (i+1)·slice) of that part.
Tensor joinParts(const std::vector<Tensor>& shards, int64_t parts) {
  std::vector<Tensor> pieces;
  for (int64_t p = 0; p < parts; ++p) {
    for (const Tensor& s : shards) {
      const int64_t slice = s.size(0) / parts;
      pieces.push_back(s.narrow(0, p * slice, slice));
    }
  }
  return cat(pieces, 0).contiguous();
}

void checkShards(const char* layer, const std::vector<Tensor>& shards, int size) {
  WEFT_ENFORCE(static_cast<int>(shards.size()) == size, InvalidArgumentError, layer, ": unshard takes ", size,
               " shards, one per rank, got ", shards.size());
}

void copyInto(Tensor param, const Tensor& value) {
  NoGradGuard noGrad;
  param.copy_(value);
}

}  // namespace

// ---- ColumnParallelLinear ---------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(std::shared_ptr<TpGroup> tp, int64_t in, int64_t out, bool bias,
                                           int64_t parts)
    : Module("ColumnParallelLinear"), tp_(std::move(tp)), in_(in), out_(out), parts_(parts) {
  WEFT_ENFORCE(in > 0 && parts > 0, InvalidArgumentError, "ColumnParallelLinear: in and parts must be positive, got ",
               in, " and ", parts);
  divided("ColumnParallelLinear", "out / parts", out % parts == 0 ? out / parts : -1, tp_->size());
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight_ = registerParameter("weight", nn::init::uniform_(empty({out / tp_->size(), in}), -bound, bound));
  if (bias) bias_ = registerParameter("bias", nn::init::uniform_(empty({out / tp_->size()}), -bound, bound));
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  WEFT_ENFORCE(x.defined() && x.dim() >= 1 && x.size(x.dim() - 1) == in_, InvalidArgumentError,
               "ColumnParallelLinear: expected input [*, ", in_, "], got shape ", x.defined() ? x.shape() : Shape{});
  return linear(copyToTp(*tp_, x), weight_, bias_);
}

Tensor ColumnParallelLinear::shard(const std::string& param, const Tensor& full) const {
  if (param == "weight") {
    checkFull("ColumnParallelLinear", param, full, {out_, in_});
  } else {
    WEFT_ENFORCE(param == "bias" && bias_.defined(), NotFoundError, "ColumnParallelLinear: no parameter '", param,
                 "'");
    checkFull("ColumnParallelLinear", param, full, {out_});
  }
  return sliceParts(full, parts_, tp_->rank(), tp_->size());
}

Tensor ColumnParallelLinear::unshard(const std::string& param, const std::vector<Tensor>& shards) const {
  checkShards("ColumnParallelLinear", shards, tp_->size());
  Tensor full = joinParts(shards, parts_);
  shard(param, full);  // checks the name and the whole shape
  return full;
}

void ColumnParallelLinear::loadFull(const Tensor& weight, const Tensor& bias) {
  copyInto(weight_, shard("weight", weight));
  if (bias_.defined()) copyInto(bias_, shard("bias", bias));
}

// ---- RowParallelLinear --------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(std::shared_ptr<TpGroup> tp, int64_t in, int64_t out, bool bias)
    : Module("RowParallelLinear"), tp_(std::move(tp)), in_(in), out_(out) {
  WEFT_ENFORCE(out > 0, InvalidArgumentError, "RowParallelLinear: out must be positive, got ", out);
  const int64_t local = divided("RowParallelLinear", "in", in, tp_->size());
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight_ = registerParameter("weight", nn::init::uniform_(empty({out, local}), -bound, bound));
  if (bias) bias_ = registerParameter("bias", nn::init::uniform_(empty({out}), -bound, bound));
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  const int64_t local = in_ / tp_->size();
  WEFT_ENFORCE(x.defined() && x.dim() >= 1 && x.size(x.dim() - 1) == local, InvalidArgumentError,
               "RowParallelLinear: expected this rank's input features [*, ", local, "], got shape ",
               x.defined() ? x.shape() : Shape{});
  Tensor y = reduceFromTp(*tp_, linear(x, weight_));
  return bias_.defined() ? add(y, bias_) : y;
}

Tensor RowParallelLinear::shard(const std::string& param, const Tensor& full) const {
  if (param == "bias") {
    WEFT_ENFORCE(bias_.defined(), NotFoundError, "RowParallelLinear: no parameter 'bias'");
    checkFull("RowParallelLinear", param, full, {out_});
    return full.contiguous().clone();
  }
  WEFT_ENFORCE(param == "weight", NotFoundError, "RowParallelLinear: no parameter '", param, "'");
  checkFull("RowParallelLinear", param, full, {out_, in_});
  const int64_t local = in_ / tp_->size();
  return full.narrow(1, tp_->rank() * local, local).contiguous().clone();
}

Tensor RowParallelLinear::unshard(const std::string& param, const std::vector<Tensor>& shards) const {
  checkShards("RowParallelLinear", shards, tp_->size());
  Tensor full = param == "bias" ? shards[0].contiguous().clone() : cat(shards, 1).contiguous();
  shard(param, full);
  return full;
}

void RowParallelLinear::loadFull(const Tensor& weight, const Tensor& bias) {
  copyInto(weight_, shard("weight", weight));
  if (bias_.defined()) copyInto(bias_, shard("bias", bias));
}

// ---- VocabParallelEmbedding ------------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(std::shared_ptr<TpGroup> tp, int64_t vocab, int64_t dim)
    : Module("VocabParallelEmbedding"), tp_(std::move(tp)), vocab_(vocab), dim_(dim) {
  WEFT_ENFORCE(dim > 0, InvalidArgumentError, "VocabParallelEmbedding: dim must be positive, got ", dim);
  WEFT_ENFORCE(vocab > 0, InvalidArgumentError, "VocabParallelEmbedding: vocab must be positive, got ", vocab);
  const int64_t t = tp_->size();
  const int64_t local = (vocab + t - 1) / t;
  start_ = tp_->rank() * local;
  real_ = std::clamp<int64_t>(vocab - start_, 0, local);
  weight_ = registerParameter("weight", nn::init::normal_(empty({local, dim}), 0.0, 1.0));
  if (real_ < local) copyInto(weight_.narrow(0, real_, local - real_), zeros({local - real_, dim}));
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  WEFT_ENFORCE(ids.defined() && ids.dtype() == DType::Int64, InvalidArgumentError,
               "VocabParallelEmbedding: ids must be Int64, got ",
               ids.defined() ? dtypeName(ids.dtype()) : std::string("undefined"));
  std::vector<int64_t> v = ids.contiguous().toVector<int64_t>();
  std::vector<double> keep(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    WEFT_ENFORCE(v[i] >= 0 && v[i] < vocab_, IndexError, "VocabParallelEmbedding: id ", v[i], " at flat position ", i,
                 " is outside the vocabulary [0, ", vocab_, ")");
    const bool mine = v[i] >= start_ && v[i] < start_ + real_;
    keep[i] = mine ? 1.0 : 0.0;
    v[i] = mine ? v[i] - start_ : 0;
  }
  Shape maskShape = ids.shape();
  maskShape.push_back(1);
  Tensor mask = fromVector(keep, maskShape).to(weight_.dtype());
  Tensor rows = mul(embedding(weight_, fromVector(v, ids.shape())), mask);
  return reduceFromTp(*tp_, rows);
}

Tensor VocabParallelEmbedding::shard(const std::string& param, const Tensor& full) const {
  WEFT_ENFORCE(param == "weight", NotFoundError, "VocabParallelEmbedding: no parameter '", param, "'");
  checkFull("VocabParallelEmbedding", param, full, {vocab_, dim_});
  const int64_t local = weight_.size(0);
  Tensor mine = full.narrow(0, std::min(start_, vocab_), real_).contiguous().clone();
  if (real_ == local) return mine;
  return cat({mine, zeros({local - real_, dim_}, {.dtype = full.dtype()})}, 0).contiguous();
}

Tensor VocabParallelEmbedding::unshard(const std::string& param, const std::vector<Tensor>& shards) const {
  WEFT_ENFORCE(param == "weight", NotFoundError, "VocabParallelEmbedding: no parameter '", param, "'");
  checkShards("VocabParallelEmbedding", shards, tp_->size());
  Tensor padded = cat(shards, 0);
  WEFT_ENFORCE(padded.dim() == 2 && padded.size(0) == paddedVocabSize() && padded.size(1) == dim_,
               InvalidArgumentError, "VocabParallelEmbedding: the shards make ", padded.shape(), ", expected [",
               paddedVocabSize(), ", ", dim_, "]");
  return padded.narrow(0, 0, vocab_).contiguous();
}

void VocabParallelEmbedding::loadFull(const Tensor& weight) { copyInto(weight_, shard("weight", weight)); }

// ---- vocabulary-parallel cross-entropy ------------------------------------------------------

Tensor vocabParallelCrossEntropy(TpGroup& tp, const Tensor& logits, const Tensor& targets, int64_t vocabStart,
                                 Reduction reduction, int64_t vocabSize) {
  WEFT_ENFORCE(reduction != Reduction::None, InvalidArgumentError,
               "vocabParallelCrossEntropy: the reduction must be Mean or Sum");
  WEFT_ENFORCE(logits.defined() && logits.dim() == 2 && isFloating(logits.dtype()), InvalidArgumentError,
               "vocabParallelCrossEntropy: logits must be a floating [N, V/T] tensor, got ",
               logits.defined() ? shapeString(logits.shape()) + " " + dtypeName(logits.dtype())
                                : std::string("undefined"));
  const int64_t n = logits.size(0), local = logits.size(1), padded = local * tp.size();
  const int64_t vocab = vocabSize < 0 ? padded : vocabSize;
  WEFT_ENFORCE(vocab > 0 && (vocab + tp.size() - 1) / tp.size() == local, InvalidArgumentError,
               "vocabParallelCrossEntropy: a vocabulary of ", vocab, " does not split into ", tp.size(),
               " slices of ", local, " columns (padded to ", padded, ")");
  WEFT_ENFORCE(targets.defined() && targets.dtype() == DType::Int64 && targets.shape() == Shape{n},
               InvalidArgumentError, "vocabParallelCrossEntropy: targets must be Int64 [", n, "], got ",
               targets.defined() ? shapeString(targets.shape()) + " " + dtypeName(targets.dtype())
                                 : std::string("undefined"));
  std::vector<int64_t> t = targets.contiguous().toVector<int64_t>();
  std::vector<double> owned(t.size()), counted(t.size());
  std::vector<int64_t> column(t.size());
  double rows = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const bool ignored = t[i] == -100;
    WEFT_ENFORCE(ignored || (t[i] >= 0 && t[i] < vocab), IndexError, "vocabParallelCrossEntropy: target ", t[i],
                 " at row ", i, " is outside the vocabulary [0, ", vocab, ")");
    const bool mine = !ignored && t[i] >= vocabStart && t[i] < vocabStart + local;
    owned[i] = mine ? 1.0 : 0.0;
    column[i] = mine ? t[i] - vocabStart : 0;
    counted[i] = ignored ? 0.0 : 1.0;
    rows += counted[i];
  }
  const DType dt = logits.dtype();
  // Padding columns (whole-vocabulary index >= vocab) are masked out: -inf adds nothing to any
  // row's sum of exponentials and takes no gradient.
  const int64_t real = std::clamp<int64_t>(vocab - vocabStart, 0, local);
  Tensor masked = logits;
  if (real < local) {
    std::vector<double> pad(static_cast<size_t>(local), 0.0);
    for (int64_t j = real; j < local; ++j) pad[static_cast<size_t>(j)] = -std::numeric_limits<double>::infinity();
    masked = add(logits, fromVector(pad, {1, local}).to(dt));
  }
  // The row maxima shift the exponentials; being constants of the loss, they
  // carry no gradient.
  Tensor rowMax;
  {
    NoGradGuard noGrad;
    rowMax = max(masked, 1, /*keepDim=*/true).first.contiguous().clone();
    tp.allReduce(rowMax, ReduceOp::Max, /*backward=*/false);
  }
  Tensor shifted = sub(masked, rowMax);
  Tensor sumExp = reduceFromTp(tp, sum(exp(shifted), {1}));
  // Rows whose target another rank holds pick 0 (a where, not a product: a padding column's -inf
  // times 0 would be NaN).
  std::vector<uint8_t> ownedMask(owned.size());
  for (size_t i = 0; i < owned.size(); ++i) ownedMask[i] = owned[i] != 0.0;
  Tensor picked = where(fromVector(ownedMask, {n}).to(DType::Bool), gather(shifted, 1, fromVector(column, {n, 1})).view({n}),
                        zeros({}, {.dtype = dt}));
  Tensor target = reduceFromTp(tp, picked);
  Tensor perRow = mul(sub(log(sumExp), target), fromVector(counted, {n}).to(dt));
  if (reduction == Reduction::Sum) return sum(perRow);
  return div(sum(perRow), full({}, rows, {.dtype = dt}));
}

}  // namespace weft::collectives
