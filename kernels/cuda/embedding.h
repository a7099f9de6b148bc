// CUDA versions of kernels/cpu/embedding.h: embedding lookups and bag
// reductions over a contiguous device table weight[num, dim], and their
// backward scatter-adds, with the CPU's signatures and semantics (the
// enums are the CPU's). Float32 and float64, as on the CPU (the tensor layer
// runs the 16-bit types in float32).
//
//   kernels::cuda::checkEmbeddingIndices("embedding", idx, n, num);  // idx on the device
//   kernels::cuda::embeddingForward(DType::Float32, w, num, dim, idx, n, out);
//
// bagStarts is a device buffer of bags + 1 entries. The backwards add into
// gradWeight with atomic additions (sums equal the CPU's up to their order).
// Max bags keep the CPU's tie and NaN rule: the first largest row, or the
// last NaN.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/cpu/embedding.h"

namespace weft::kernels::cuda {

using cpu::BagReduce;

// Reads back the smallest and largest index (two numbers); when one is
// outside [0, num), copies the indices to the host and throws the CPU's
// IndexError, naming the first offending index and its position.
void checkEmbeddingIndices(const char* op, const int64_t* indices, int64_t n, int64_t num);

void embeddingForward(DType type, const void* weight, int64_t num, int64_t dim, const int64_t* indices, int64_t n,
                      void* out);
void embeddingBackward(DType type, const void* grad, const int64_t* indices, int64_t n, int64_t num, int64_t dim,
                       void* gradWeight);

void embeddingBagForward(DType type, const void* weight, int64_t num, int64_t dim, const int64_t* indices,
                         const int64_t* bagStarts, int64_t bags, BagReduce mode, const void* perSampleWeights,
                         void* out, int64_t* maxIndices);
void embeddingBagBackward(DType type, const void* grad, const int64_t* indices, const int64_t* bagStarts,
                          int64_t bags, BagReduce mode, const void* perSampleWeights, const int64_t* maxIndices,
                          int64_t num, int64_t dim, void* gradWeight);
void embeddingBagSampleWeightsBackward(DType type, const void* grad, const void* weight, int64_t dim,
                                       const int64_t* indices, const int64_t* bagStarts, int64_t bags,
                                       void* gradSampleWeights);

}  // namespace weft::kernels::cuda
