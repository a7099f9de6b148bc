// The data of the ddp_rpc example: batches of bags of ids for a sum-mode EmbeddingBag, with a
// target class per bag, drawn from a Generator (after PyTorch's
// examples/distributed/rpc/ddp_rpc, get_next_batch).
//
//   Generator gen(seed);
//   Teacher teacher(initialTable, seed);                  // the learnable target's rule
//   Batch b = makeBatch(gen, TargetMode::Learnable, &teacher);
//   Tensor bags = table.forward(b.indices, b.offsets);   // [b.bags, 16]
//
// A batch holds 20 to 50 ids drawn uniformly from [0, kNumEmbeddings); the bags start at offset 0
// and each next bag starts 1 to 9 ids after the previous one (so a bag holds 1 to 9 ids, the last
// one possibly fewer). Each bag gets one target in [0, kClasses):
//  - TargetMode::Random (upstream's): uniform, independent of the ids. No model can do better than
//    ln 8 on it; it is kept for timing comparisons with upstream.
//  - TargetMode::Learnable (the default): a fixed function of the bag's ids, the class c that
//    maximises sum_k (sum over the bag's ids i of E0[i][k]) * P[k][c], where E0 is the
//    embedding table as it was before training and P a 16 x 8 matrix of N(0, 1) values drawn from
//    the run's seed (ties: the smallest c). The model can represent this rule from its first step
//    (the table as it is, the Linear's weight a multiple of P's transpose), so the loss can fall
//    far below ln 8; the classes are roughly balanced (Teacher::classEntropy measures it).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace weft::examples::ddp_rpc {

inline constexpr int64_t kNumEmbeddings = 100;
inline constexpr int64_t kEmbeddingDim = 16;
inline constexpr int64_t kClasses = 8;
inline constexpr int64_t kMinIds = 20;
inline constexpr int64_t kMaxIds = 50;
inline constexpr int64_t kMaxBagStep = 9;

enum class TargetMode { Learnable, Random };

inline const char* targetModeName(TargetMode m) { return m == TargetMode::Learnable ? "learnable" : "random"; }

// "learnable" or "random"; InvalidArgumentError naming `s` otherwise.
inline TargetMode parseTargetMode(const std::string& s) {
  if (s == "learnable") return TargetMode::Learnable;
  if (s == "random") return TargetMode::Random;
  throw InvalidArgumentError("unknown target mode '" + s + "' (learnable or random)");
}

// The learnable target's rule (see the top of this file).
class Teacher {
 public:
  // `initialTable`: the embedding table before training, Float32 [kNumEmbeddings, kEmbeddingDim];
  // InvalidArgumentError for another shape or dtype. P is drawn from `seed`.
  Teacher(const Tensor& initialTable, uint64_t seed) {
    WEFT_ENFORCE(initialTable.dtype() == DType::Float32 && initialTable.dim() == 2 &&
                     initialTable.size(0) == kNumEmbeddings && initialTable.size(1) == kEmbeddingDim,
                 InvalidArgumentError, "Teacher: the initial table must be Float32 [", kNumEmbeddings, ", ",
                 kEmbeddingDim, "], got ", dtypeName(initialTable.dtype()), " ",
                 shapeString(initialTable.shape()));
    Tensor t = initialTable.contiguous();
    table_.resize(static_cast<size_t>(kNumEmbeddings * kEmbeddingDim));
    std::memcpy(table_.data(), t.rawData(), table_.size() * sizeof(float));
    Generator gen(seed ^ 0x7ea7c4e5d15c0ffeULL);
    projection_.resize(static_cast<size_t>(kEmbeddingDim * kClasses));
    for (double& p : projection_) p = gen.nextNormal();
  }

  // The class of the bag holding `ids[begin, end)`.
  int64_t classOf(const int64_t* ids, int64_t begin, int64_t end) const {
    double sum[kEmbeddingDim] = {};
    for (int64_t i = begin; i < end; ++i) {
      const float* row = &table_[static_cast<size_t>(ids[i] * kEmbeddingDim)];
      for (int64_t k = 0; k < kEmbeddingDim; ++k) sum[k] += row[k];
    }
    int64_t best = 0;
    double bestScore = -INFINITY;
    for (int64_t c = 0; c < kClasses; ++c) {
      double score = 0;
      for (int64_t k = 0; k < kEmbeddingDim; ++k) score += sum[k] * projection_[static_cast<size_t>(k * kClasses + c)];
      if (score > bestScore) {
        bestScore = score;
        best = c;
      }
    }
    return best;
  }

 private:
  std::vector<float> table_;
  std::vector<double> projection_;  // [kEmbeddingDim][kClasses]
};

struct Batch {
  Tensor indices;  // Int64 [n], n in [kMinIds, kMaxIds]
  Tensor offsets;  // Int64 [bags], the start of each bag
  Tensor target;   // Int64 [bags], in [0, kClasses)
  int64_t bags = 0;
};

// The next batch from `gen` (see the top of this file). `teacher` is needed for
// TargetMode::Learnable (InvalidArgumentError when null).
inline Batch makeBatch(Generator& gen, TargetMode mode, const Teacher* teacher) {
  WEFT_ENFORCE(mode == TargetMode::Random || teacher != nullptr, InvalidArgumentError,
               "makeBatch: the learnable target needs a Teacher");
  const int64_t n = kMinIds + static_cast<int64_t>(gen.nextBelow(kMaxIds - kMinIds + 1));
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t& id : ids) id = static_cast<int64_t>(gen.nextBelow(kNumEmbeddings));
  std::vector<int64_t> offsets;
  for (int64_t start = 0; start < n; start += 1 + static_cast<int64_t>(gen.nextBelow(kMaxBagStep))) {
    offsets.push_back(start);
  }
  const int64_t bags = static_cast<int64_t>(offsets.size());
  std::vector<int64_t> target(static_cast<size_t>(bags));
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t end = b + 1 < bags ? offsets[static_cast<size_t>(b + 1)] : n;
    target[static_cast<size_t>(b)] = mode == TargetMode::Random
                                         ? static_cast<int64_t>(gen.nextBelow(kClasses))
                                         : teacher->classOf(ids.data(), offsets[static_cast<size_t>(b)], end);
  }
  return {fromVector(ids), fromVector(offsets), fromVector(target), bags};
}

// The entropy (nats) of the class frequencies in `counts`: ln 8 when balanced; the loss of the
// best constant prediction.
inline double classEntropy(const std::vector<int64_t>& counts) {
  double total = 0;
  for (int64_t c : counts) total += static_cast<double>(c);
  double h = 0;
  for (int64_t c : counts) {
    if (c > 0) h -= static_cast<double>(c) / total * std::log(static_cast<double>(c) / total);
  }
  return h;
}

}  // namespace weft::examples::ddp_rpc
