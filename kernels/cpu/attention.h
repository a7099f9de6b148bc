// Memory-efficient scaled dot-product attention (the FlashAttention-2
// algorithm on the CPU) and the exact merge of two partial attentions.
//
//   // q [BH, Sq, D], k and v [BH, Sk, D], contiguous; out [BH, Sq, D], lse [BH, Sq]:
//   AttentionGeometry g{.batchHeads = BH, .queries = Sq, .keys = Sk, .headDim = D, .scale = 0.125};
//   attentionForward(DType::Float32, g, q, k, v, out, lse);
//
// Forward: for each (batch-head, block of kAttentionQueryBlock queries) the
// keys are visited in blocks of kAttentionKeyBlock: S = scale * Q K^T (one
// GEMM), masked, then an online softmax keeps each row's running maximum m
// and sum l, rescales the output accumulator when m grows, and adds P V (one
// GEMM). At the end out = acc / l and lse = m + log l. Nothing of size
// [Sq, Sk] is ever held: beyond q, k, v, out and lse, each thread has one
// [query block, key block] tile. Key blocks that causality masks entirely are
// skipped. Tasks are (batch-head, query block), spread over the kernel threads.
//
// Masking (causal): query i sees key j iff j + keyOffset <= i + queryOffset,
// i, j counted from 0 in this call; the offsets are the absolute positions of
// the first query and key, so that blocks of a longer sequence (ring or
// sequence-parallel attention) mask exactly. A row that sees no key has
// out = 0 and lse = -inf, and its gradients are 0.
//
// Dropout (probability p on the normalised probabilities, kept ones scaled
// by 1/(1-p)): no mask is stored. Element (bh, i, j) is kept iff
// attentionDropoutBits(seed, (bh * Sq + i) * Sk + j) >> 11 >= ceil(p * 2^53),
// a counter-based hash (splitmix64's output function at that counter), so the
// forward and both backward passes regenerate the same mask from the seed.
// lse is that of the probabilities before dropout.
//
// Backward: D_i = rowsum(dO ∘ O) - dLse_i; per tile S and P = exp(S - lse)
// are recomputed, dP = (dO V^T) ∘ Z (Z the dropout scale), dS = P ∘ (dP - D_i).
// Two passes, each with every output row owned by one task, so that no
// gradient is summed across threads and the results are the same bits for
// any thread count: pass 1, tasks (batch-head, key block), accumulates
// dV += (P∘Z)^T dO and dK += scale dS^T Q; pass 2, tasks (batch-head, query
// block), recomputes dS and accumulates dQ += scale dS K. The price is the
// recomputation of S and dP in the second pass (seven tile GEMMs instead of
// five) against per-thread dQ copies or atomics. When there are at least
// twice as many batch-heads as kernel threads, and both dQ and dK/dV are
// wanted, one pass with tasks (batch-head) does both (five tile GEMMs): a
// task owns all of its batch-head's gradient rows, and it adds each dQ
// row's terms in pass 2's order, so the bits are those of the two passes.
//
// float32 uses the vectorised exp of kernels/cpu/vec_math.h; the running
// sums are float64. float32 and float64 only.
//
// Layouts: by default every buffer is contiguous [BH, S, D]. A buffer whose
// AttentionLayout has row != 0 is strided instead: row i of batch-head
// bh = b·heads + h starts at b·batch + h·head + i·row (heads from the
// geometry), its D elements contiguous. So q, k and v can be read where a
// fused QKV projection wrote them ([B, S, 3, H, D]) and out and the
// gradients written as [B, S, H, D], with no transposing copies. lse is
// always contiguous [BH, Sq]. The CUDA kernels take contiguous buffers only.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

inline constexpr int64_t kAttentionQueryBlock = 128;
inline constexpr int64_t kAttentionKeyBlock = 128;

// A strided buffer (see "Layouts" above); all zero: contiguous [BH, S, D].
struct AttentionLayout {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t row = 0;
};

struct AttentionGeometry {
  int64_t batchHeads = 0;  // B * H
  int64_t queries = 0;     // Sq
  int64_t keys = 0;        // Sk
  int64_t headDim = 0;     // D
  double scale = 1.0;
  bool causal = false;
  int64_t queryOffset = 0;
  int64_t keyOffset = 0;
  double dropout = 0.0;  // probability of dropping, in [0, 1]
  uint64_t seed = 0;     // of the dropout mask
  // The dropout frame (AttentionOptions::DropoutFrame): with frameHeads > 0,
  // element (bh, i, j) with bh = b·heads + h takes the keep bit of counter
  // ((b·frameHeads + frameHeadOffset + h)·frameQueries + queryOffset + i)
  // ·frameKeys + keyOffset + j.
  int64_t heads = 0;  // H, to split bh into b and h (with a frame or a strided layout)
  int64_t frameHeads = 0;
  int64_t frameHeadOffset = 0;
  int64_t frameQueries = 0;
  int64_t frameKeys = 0;
  // Where each buffer's rows lie (contiguous by default).
  AttentionLayout qLayout{}, kLayout{}, vLayout{}, outLayout{}, gradOutLayout{}, gradQLayout{}, gradKLayout{},
      gradVLayout{};
};

// The dropout hash of element `counter` = (bh * Sq + i) * Sk + j.
inline uint64_t attentionDropoutBits(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + (counter + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// q [BH, Sq, D], k and v [BH, Sk, D] -> out [BH, Sq, D], lse [BH, Sq].
void attentionForward(DType type, const AttentionGeometry& g, const void* q, const void* k, const void* v, void* out,
                      void* lse);

// From what the forward read and wrote and the gradients gradOut [BH, Sq, D]
// and gradLse [BH, Sq] (null: zeros), writes gradQ [BH, Sq, D] (skipped when
// null) and gradK, gradV [BH, Sk, D] (skipped when both null; both or
// neither).
void attentionBackward(DType type, const AttentionGeometry& g, const void* q, const void* k, const void* v,
                       const void* out, const void* lse, const void* gradOut, const void* gradLse, void* gradQ,
                       void* gradK, void* gradV);

// The merge of two attentions of the same `rows` query rows over disjoint key
// sets: with a = exp(lseA - lse), b = exp(lseB - lse) and
// lse = log(exp(lseA) + exp(lseB)) (computed around the larger of the two),
// out = a * outA + b * outB. A row where both are -inf gets out = 0 and
// lse = -inf. outs are [rows, D], lses [rows].
void mergeAttentionForward(DType type, int64_t rows, int64_t headDim, const void* outA, const void* lseA,
                           const void* outB, const void* lseB, void* out, void* lse);

// d/doutA = a gradOut, d/dlseA = a (gradLse + gradOut · (outA - out)), and
// likewise for B; any of the four outputs may be null (skipped).
void mergeAttentionBackward(DType type, int64_t rows, int64_t headDim, const void* outA, const void* lseA,
                            const void* outB, const void* lseB, const void* out, const void* lse,
                            const void* gradOut, const void* gradLse, void* gradOutA, void* gradLseA, void* gradOutB,
                            void* gradLseB);

}  // namespace weft::kernels::cpu
