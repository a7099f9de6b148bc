// WEFT_CUDA_CALL(device, fn(args...)): calls kernels::cuda::fn(args...) with
// cuda:<device> current (restored after). In builds without CUDA no CUDA
// tensor can exist (allocating one throws), so the macro throws instead of
// naming a function that is not there.
//
//   if (out.device().isCuda()) {
//     WEFT_CUDA_CALL(out.device().index, binary(op, type, a, as, b, bs, o, shape));
//   } else {
//     kernels::cpu::binary(op, type, a, as, b, bs, o, shape);
//   }
#pragma once

#include "common/error.h"

#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/runtime.h"
#define WEFT_CUDA_CALL(device, ...)                             \
  do {                                                          \
    ::weft::kernels::cuda::DeviceGuard weft_device_guard_(device); \
    ::weft::kernels::cuda::__VA_ARGS__;                         \
  } while (0)
#else
#define WEFT_CUDA_CALL(device, ...) \
  throw ::weft::InvalidArgumentError("a CUDA tensor reached a kernel in a build without CUDA")
#endif
