// Scaled dot-product attention on a CUDA device: the FlashAttention-2
// forward and backward and the merge of two partial attentions, with the
// signatures, geometry and semantics of kernels/cpu/attention.h (causal
// masking with offsets, dropout from the same counter hash, so that a seed
// drops the same elements on either device; lse; fully masked rows give
// out = 0, lse = -inf and zero gradients). Pointers are device memory of the
// current device, contiguous; work is enqueued on its current stream.
//
//   // q [BH, Sq, D], k and v [BH, Sk, D]; out [BH, Sq, D], lse [BH, Sq]:
//   AttentionGeometry g{.batchHeads = BH, .queries = Sq, .keys = Sk, .headDim = D, .scale = 0.125};
//   attentionForward(DType::Float32, g, q, k, v, out, lse);
//
// Tiles are 32 queries by 32 keys, one key (or query) per lane of a warp,
// held in shared memory with rows padded to the head-dimension bucket
// (32, 64, 128 or 256; the padding is zeros). The forward keeps, per block
// of 32 queries, the running maximum, sum and output rows in registers and
// visits the key tiles that causality leaves visible. The backward is
// FlashAttention-2's split: delta_i = rowsum(dO ∘ O) - dLse_i, then one
// kernel whose blocks own 32 keys (dK, dV over the query tiles that see
// them) and one whose blocks own 32 queries (dQ over their key tiles), so
// every gradient row is written by one block: no atomics, and the bits do
// not depend on scheduling.
//
// Errors: InvalidArgumentError for a dtype other than float32/float64 and
// for a head dimension whose tiles do not fit the device's shared memory
// (above 256 for float32, above 128 for float64 on an H100); DeviceError
// (kernels/cuda/runtime.h) when a launch fails. The 16-bit types reach
// these kernels as float32 (tensor/ops_attention.cpp converts, as on the
// CPU).
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/cpu/attention.h"

namespace weft::kernels::cuda {

using cpu::AttentionGeometry;

// q [BH, Sq, D], k and v [BH, Sk, D] -> out [BH, Sq, D], lse [BH, Sq].
void attentionForward(DType type, const AttentionGeometry& g, const void* q, const void* k, const void* v, void* out,
                      void* lse);

// gradQ (skipped when null), gradK and gradV (both or neither) from what the
// forward read and wrote and gradOut, gradLse (null: zeros).
void attentionBackward(DType type, const AttentionGeometry& g, const void* q, const void* k, const void* v,
                       const void* out, const void* lse, const void* gradOut, const void* gradLse, void* gradQ,
                       void* gradK, void* gradV);

// out = a outA + b outB, lse = log(exp(lseA) + exp(lseB)), as the CPU's.
void mergeAttentionForward(DType type, int64_t rows, int64_t headDim, const void* outA, const void* lseA,
                           const void* outB, const void* lseB, void* out, void* lse);

// Gradients of the merge; any of the four outputs may be null (skipped).
void mergeAttentionBackward(DType type, int64_t rows, int64_t headDim, const void* outA, const void* lseA,
                            const void* outB, const void* lseB, const void* out, const void* lse,
                            const void* gradOut, const void* gradLse, void* gradOutA, void* gradLseA, void* gradOutB,
                            void* gradLseB);

}  // namespace weft::kernels::cuda
