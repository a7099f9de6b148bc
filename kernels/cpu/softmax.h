// Softmax and log-softmax along one axis, forward and backward, over
// contiguous buffers viewed as [outer, R, inner] with the softmax taken over R.
//
//   // log_softmax over the classes of a contiguous [N, C] batch:
//   softmaxForward(DType::Float32, logits, N, C, 1, true, logProbs);
//   softmaxBackward(DType::Float32, logProbs, gradOut, N, C, 1, true, gradLogits);
//
// Numerically stable: the maximum along the axis is subtracted before
// exponentiating, so large logits never overflow. Float32 sums accumulate in
// float64.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// out = softmax(in) (log: log_softmax(in)) along the middle axis. in and out
// are distinct contiguous buffers of outer*R*inner elements; R >= 1.
void softmaxForward(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool log, void* out);

// gradIn from the forward output y and the gradient g of the output:
//   softmax:      gradIn = y * (g - sum_R(g * y))
//   log_softmax:  gradIn = g - exp(y) * sum_R(g)
// gradIn may alias g (not y).
void softmaxBackward(DType type, const void* y, const void* g, int64_t outer, int64_t R, int64_t inner, bool log,
                     void* gradIn);

}  // namespace weft::kernels::cpu
