// 2-D max pooling on a CUDA device, forward and backward: the functions of
// kernels/cpu/pool.h with the same signatures and semantics (float32 and
// float64, contiguous [planes, H, W] device buffers; argmax is a device
// buffer of int64 plane offsets).
//
//   kernels::cuda::maxPool2dForward(DType::Float32, geo, x, out, argmax);   // device pointers
//
// Padding never wins, a NaN wins and propagates, ties keep the first position
// in row-major order, as on the CPU. Forward: one thread per output element.
// Backward: one thread per input element gathers the gradients of the
// windows whose argmax is that element, in output order (no atomics: the
// sums are deterministic and added in the CPU kernel's order). argmax must
// come from maxPool2dForward with the same geometry (its offsets are not
// checked again).
//
// Errors: a dtype other than float32/float64 is an InvalidArgumentError
// naming the op; launch failures are DeviceErrors. Everything is enqueued on
// the current stream.
#pragma once

#include "kernels/cpu/pool.h"

namespace weft::kernels::cuda {

using cpu::Pool2dGeometry;

void maxPool2dForward(DType type, const Pool2dGeometry& g, const void* x, void* out, int64_t* argmax);
void maxPool2dBackward(DType type, const Pool2dGeometry& g, const void* grad, const int64_t* argmax, void* gradX);

}  // namespace weft::kernels::cuda
