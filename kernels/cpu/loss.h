// Loss kernels: negative log-likelihood (and its fusion with log-softmax, the
// cross-entropy gradient) and mean squared error, forward and backward.
//
// Layout: class scores are a contiguous [N, C, D] buffer (D = the product of
// any trailing spatial dimensions, 1 for a plain [N, C] batch) and targets a
// contiguous Int64 [N, D] buffer. Targets are validated by the caller: every
// entry is in [0, C) or equals ignoreIndex.
//
//   NllTotals t = nllLossForward(DType::Float32, logProbs, target, N, C, 1, -100, nullptr);
//   float meanLoss = static_cast<float>(t.sum / t.count);
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

struct NllTotals {
  double sum = 0;      // sum of the per-element losses
  int64_t count = 0;   // number of targets not equal to ignoreIndex
};

// loss[n, d] = -input[n, target[n, d], d], or 0 where target == ignoreIndex.
// Writes them to `losses` (N*D elements of `type`) unless it is null, and
// returns their sum (accumulated in float64) and the non-ignored count.
NllTotals nllLossForward(DType type, const void* input, const int64_t* target, int64_t N, int64_t C, int64_t D,
                         int64_t ignoreIndex, void* losses);

// gradInput [N, C, D] (overwritten) is zero except
// gradInput[n, target[n, d], d] = -scale * g(n, d) for non-ignored targets,
// where g(n, d) = gradOut[n*D + d] when perElement, else gradOut[0].
void nllLossBackward(DType type, const int64_t* target, int64_t N, int64_t C, int64_t D, int64_t ignoreIndex,
                     const void* gradOut, bool perElement, double scale, void* gradInput);

// The gradient of nllLoss(logSoftmax(x, 1)) with respect to x in one pass,
// given the forward's log-probabilities:
//   gradInput[n, c, d] = w(n, d) * (exp(logProbs[n, c, d]) - [c == target[n, d]])
// with w(n, d) = scale * g(n, d) (g as in nllLossBackward), 0 where ignored.
void crossEntropyBackward(DType type, const void* logProbs, const int64_t* target, int64_t N, int64_t C, int64_t D,
                          int64_t ignoreIndex, const void* gradOut, bool perElement, double scale, void* gradInput);

// loss[i] = (input[i] - target[i])^2 over n contiguous elements; written to
// `losses` unless null. Returns the sum, accumulated in float64.
double mseLossForward(DType type, const void* input, const void* target, int64_t n, void* losses);

// gradInput[i] = 2 * scale * g(i) * (input[i] - target[i]) and gradTarget[i] =
// -gradInput[i], with g(i) = gradOut[i] when perElement, else gradOut[0].
// Either output may be null (not wanted).
void mseLossBackward(DType type, const void* input, const void* target, int64_t n, const void* gradOut,
                     bool perElement, double scale, void* gradInput, void* gradTarget);

}  // namespace weft::kernels::cpu
