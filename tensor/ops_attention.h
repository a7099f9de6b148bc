// Scaled dot-product attention, computed FlashAttention-style: memory grows
// with the sequence length, never with its square.
//
//   using namespace weft;
//   Tensor q = randn({B, H, T, D}), k = randn({B, H, T, D}), v = randn({B, H, T, D});
//   Tensor y = scaledDotProductAttention(q, k, v, {.causal = true});   // [B, H, T, D]
//
//   // Ring attention: the same queries against two halves of the keys.
//   AttentionOutput a = scaledDotProductAttentionWithLse(q, k0, v0, {.causal = true});
//   AttentionOutput b = scaledDotProductAttentionWithLse(q, k1, v1, {.causal = true, .keyOffset = T0});
//   AttentionOutput all = mergeAttention(a, b);   // exactly attention over all keys
//
// softmax(q k^T * scale + mask) v for q [B, H, Sq, D] and k, v [B, H, Sk, D]
// (one floating dtype, the 16-bit ones computed in float32; on the CPU or
// one CUDA device, kernels/cuda/attention.h). The [Sq, Sk] scores are never held:
// a tiled forward with an online softmax keeps, per batch-head, O(Sq·D + Sk·D)
// memory plus one tile per thread; backward recomputes the tiles from q, k, v,
// the output and lse (kernels/cpu/attention.h has the algorithm, the masking
// rule, the dropout hash and the threading). Gradients flow to q, k and v,
// and, from scaledDotProductAttentionWithLse, through lse too.
//
// Layout (CPU): q, k and v are read in place whenever each row of D is
// contiguous (stride(3) == 1), so the heads of a fused QKV projection,
// qkv.view({B, T, 3, H, D}).select(2, i).transpose(1, 2), and blocks narrowed
// along the sequence cost no copy. When q's memory order is [B, S, H, D],
// out is returned as a [B, H, S, D] view of a [B, S, H, D] buffer, so that
// out.transpose(1, 2).reshape({B, S, H·D}) is free; gradients come out in
// their inputs' orders likewise. Otherwise out is contiguous. On CUDA the
// inputs are packed and out is contiguous.
//
// Causal masking: query i sees key j iff j + keyOffset <= i + queryOffset
// (with zero offsets the lower-triangular mask of torch.tril on [Sq, Sk]). A
// query that sees no key (a block of a causal sequence wholly in its future)
// gets out = 0 and lse = -inf; merging with such a block is exact.
//
// Dropout applies to the normalised probabilities (kept ones scaled by
// 1/(1-p)); pass 0 outside training. Each call with dropout draws one 64-bit
// seed from its generator (the default one, under its mutex, when null) and
// derives every element's keep bit from (seed, batch-head, i, j), so backward
// regenerates the mask without storing it, and a generator reset to the same
// state gives the same mask. A dropout frame places the call inside a larger
// attention (a tensor-parallel rank's heads, a sequence-parallel block): its
// element (b, h, i, j) takes the keep bit of element (b, headOffset + h,
// queryOffset + i, keyOffset + j) of an attention of frame.heads heads over
// frame.queries × frame.keys, so that calls given the same seed draw their
// parts of that attention's mask (CPU only).
//
// Errors (InvalidArgumentError naming the op and the shapes): tensors not
// 4-D, batch or head counts that differ, k and v of different shapes, a head
// dimension of 0 or differing between q and k, non-floating or mixed dtypes,
// a dropout probability outside [0, 1], on CUDA a head dimension above 256
// (float64: above what the device's shared memory holds, 128 on an H100);
// a dropout frame that does not hold the call (or given on CUDA); for
// mergeAttention, outputs or lses whose shapes differ or do not fit each
// other. A given seed drops the same elements on the CPU and on CUDA.
#pragma once

#include <cstdint>
#include <optional>

#include "tensor/tensor.h"

namespace weft {

class Generator;

struct AttentionOptions {
  bool causal = false;          // query i sees key j iff j + keyOffset <= i + queryOffset
  int64_t queryOffset = 0;      // absolute position of the first query
  int64_t keyOffset = 0;        // absolute position of the first key
  std::optional<double> scale = std::nullopt;  // default 1/sqrt(headDim)
  double dropout = 0.0;         // on the attention probabilities; 0 outside training
  Generator* generator = nullptr;  // the default generator when null
  struct DropoutFrame {
    int64_t heads = 0;       // of the whole attention, >= headOffset + H
    int64_t headOffset = 0;  // of this call's first head
    int64_t queries = 0;     // of the whole attention, >= queryOffset + Sq
    int64_t keys = 0;        // of the whole attention, >= keyOffset + Sk
  };
  std::optional<DropoutFrame> dropoutFrame = std::nullopt;  // see "Dropout"
  // The seed of the dropout mask; when unset, one is drawn from `generator`.
  std::optional<uint64_t> dropoutSeed = std::nullopt;
};

struct AttentionOutput {
  Tensor out;  // [B, H, Sq, D], q's dtype
  Tensor lse;  // [B, H, Sq], log-sum-exp of the scaled, masked scores per query row
};

Tensor scaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o = {});
AttentionOutput scaledDotProductAttentionWithLse(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const AttentionOptions& o = {});

// The exact merge of two attentions of the same queries over disjoint key
// sets: out = (exp(lseA-m)*outA + exp(lseB-m)*outB) / (exp(lseA-m) + exp(lseB-m)),
// lse = m + log(exp(lseA-m) + exp(lseB-m)), m = max(lseA, lseB); rows where
// both lses are -inf give out = 0, lse = -inf. Differentiable in all four
// tensors. Any leading shape: out [..., D], lse [...].
AttentionOutput mergeAttention(const AttentionOutput& a, const AttentionOutput& b);

}  // namespace weft
