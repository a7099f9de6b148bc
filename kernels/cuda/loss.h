// Loss kernels on CUDA: the functions of kernels/cpu/loss.h, same names,
// signatures and results, over device buffers (scores a contiguous
// [N, C, D] buffer, targets a contiguous Int64 [N, D] buffer, as there).
//
//   NllTotals t = nllLossForward(DType::Float32, logProbs, target, N, C, 1, -100, nullptr);
//
// The functions that return a total (nllLossForward, and mseLossForward
// without per-element output) reduce on the device and read the total back:
// they wait for the current stream. The others only enqueue work. Sums
// accumulate in float64, as on the CPU (in another order: a tree over
// blocks). float32 and float64 only, as on the CPU (the tensor layer computes
// the 16-bit types in float32); other dtypes throw InvalidArgumentError.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/cpu/loss.h"

namespace weft::kernels::cuda {

using cpu::NllTotals;

// *position = the first i in [0, n) whose target[i] is neither ignoreIndex
// nor in [0, C), and *value = target[i]; *position = -1 when every target is
// valid. Reads the answer back (waits for the current stream). The check the
// tensor layer makes before a loss, as it makes it on the host for the CPU.
void firstInvalidTarget(const int64_t* target, int64_t n, int64_t C, int64_t ignoreIndex, int64_t* position,
                        int64_t* value);

// loss[n, d] = -input[n, target[n, d], d], or 0 where target == ignoreIndex;
// written to `losses` unless null; returns their sum and the non-ignored
// count (read back from the device). Targets must have been validated.
NllTotals nllLossForward(DType type, const void* input, const int64_t* target, int64_t N, int64_t C, int64_t D,
                         int64_t ignoreIndex, void* losses);
// The same, the totals stored in *totals (for WEFT_CUDA_CALL, which discards results).
void nllLossForward(DType type, const void* input, const int64_t* target, int64_t N, int64_t C, int64_t D,
                    int64_t ignoreIndex, void* losses, NllTotals* totals);

// gradInput [N, C, D] (overwritten) is zero except
// gradInput[n, target[n, d], d] = -scale * g(n, d) for non-ignored targets,
// g(n, d) = gradOut[n*D + d] when perElement, else gradOut[0] (device memory).
void nllLossBackward(DType type, const int64_t* target, int64_t N, int64_t C, int64_t D, int64_t ignoreIndex,
                     const void* gradOut, bool perElement, double scale, void* gradInput);

// gradInput[n, c, d] = w(n, d) * (exp(logProbs[n, c, d]) - [c == target[n, d]]),
// w(n, d) = scale * g(n, d) (g as in nllLossBackward), 0 where ignored.
void crossEntropyBackward(DType type, const void* logProbs, const int64_t* target, int64_t N, int64_t C, int64_t D,
                          int64_t ignoreIndex, const void* gradOut, bool perElement, double scale, void* gradInput);

// loss[i] = (input[i] - target[i])^2 written to `losses` (returns 0), or,
// when losses is null, their sum read back from the device.
double mseLossForward(DType type, const void* input, const void* target, int64_t n, void* losses);
// The same, the sum (or 0) stored in *total.
void mseLossForward(DType type, const void* input, const void* target, int64_t n, void* losses, double* total);

// gradInput[i] = 2 * scale * g(i) * (input[i] - target[i]), gradTarget[i] =
// -gradInput[i], g(i) = gradOut[i] when perElement, else gradOut[0]; either
// output may be null.
void mseLossBackward(DType type, const void* input, const void* target, int64_t n, const void* gradOut,
                     bool perElement, double scale, void* gradInput, void* gradTarget);

}  // namespace weft::kernels::cuda
