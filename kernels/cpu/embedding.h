// Embedding lookups and bag reductions over a contiguous table
// weight[num, dim], with their backward scatter-adds.
//
//   checkEmbeddingIndices("embedding", idx, n, num);   // IndexError if any is out of range
//   embeddingForward(DType::Float32, w, num, dim, idx, n, out);     // out[n, dim]
//
// Bags are described by `bagStarts` (bags + 1 entries, non-decreasing,
// bagStarts[0] == 0 and bagStarts[bags] == n): bag b reduces rows
// indices[bagStarts[b] .. bagStarts[b+1]). An empty bag yields zeros.
// All buffers are contiguous; indices must have been checked first.
//
// Threading: forwards split output rows across threads; backwards split the
// rows of the weight gradient, so duplicate indices never race.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// Throws IndexError naming `op`, the offending index, its position and the
// table size when some indices[i] is outside [0, num).
void checkEmbeddingIndices(const char* op, const int64_t* indices, int64_t n, int64_t num);

// out[i, :] = weight[indices[i], :] for i < n.
void embeddingForward(DType type, const void* weight, int64_t num, int64_t dim, const int64_t* indices, int64_t n,
                      void* out);
// gradWeight[indices[i], :] += grad[i, :]; gradWeight [num, dim] must be zeroed.
void embeddingBackward(DType type, const void* grad, const int64_t* indices, int64_t n, int64_t num, int64_t dim,
                       void* gradWeight);

enum class BagReduce { Sum, Mean, Max };

// out[b, :] = reduction over the rows of bag b, each scaled by
// perSampleWeights[i] when given (Sum only). For Max, maxIndices[b, d] gets
// the table row that supplied out[b, d] (-1 for an empty bag); it may be null
// for the other modes.
void embeddingBagForward(DType type, const void* weight, int64_t num, int64_t dim, const int64_t* indices,
                         const int64_t* bagStarts, int64_t bags, BagReduce mode, const void* perSampleWeights,
                         void* out, int64_t* maxIndices);
// Scatter-adds grad [bags, dim] into the zeroed gradWeight [num, dim]: for Sum
// and Mean every row of a bag receives the bag's gradient (times its sample
// weight, or divided by the bag size); for Max only the rows in maxIndices.
void embeddingBagBackward(DType type, const void* grad, const int64_t* indices, const int64_t* bagStarts,
                          int64_t bags, BagReduce mode, const void* perSampleWeights, const int64_t* maxIndices,
                          int64_t num, int64_t dim, void* gradWeight);
// gradSampleWeights[i] = <grad[bag of i, :], weight[indices[i], :]> (Sum mode).
void embeddingBagSampleWeightsBackward(DType type, const void* grad, const void* weight, int64_t dim,
                                       const int64_t* indices, const int64_t* bagStarts, int64_t bags,
                                       void* gradSampleWeights);

}  // namespace weft::kernels::cpu
