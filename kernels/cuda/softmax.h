// Softmax and log-softmax on CUDA, forward and backward: the functions of
// kernels/cpu/softmax.h, same names, signatures and results, over device
// buffers viewed as [outer, R, inner] with the softmax taken over R.
// Launches on the current stream; no host synchronisation.
//
//   // log_softmax over the classes of a contiguous [N, C] batch on the device:
//   softmaxForward(DType::Float32, logits, N, C, 1, true, logProbs);
//   softmaxBackward(DType::Float32, logProbs, gradOut, N, C, 1, true, gradLogits);
//
// Along the last axis (inner == 1) a warp (short rows) or a block (long rows)
// takes a row: one pass finds the maximum and the sum of exponentials
// together (the online softmax: the sum is rescaled whenever the maximum
// grows), a second writes the result. Along other axes each thread takes one
// column, adjacent threads adjacent columns. Float32 sums accumulate in
// float64, as on the CPU, and the special values agree with it: a row holding
// a NaN or +inf, or made only of -inf, comes out NaN. float32 and float64
// only (the tensor layer computes the 16-bit types in float32), other dtypes
// throw InvalidArgumentError.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cuda {

// out = softmax(in) (log: log_softmax(in)) along the middle axis; in and out
// distinct contiguous buffers of outer*R*inner elements, R >= 1.
void softmaxForward(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool log, void* out);

// gradIn from the forward output y and the output gradient g:
//   softmax:      gradIn = y * (g - sum_R(g * y))
//   log_softmax:  gradIn = g - exp(y) * sum_R(g)
// gradIn may alias g (not y).
void softmaxBackward(DType type, const void* y, const void* g, int64_t outer, int64_t R, int64_t inner, bool log,
                     void* gradIn);

}  // namespace weft::kernels::cuda
