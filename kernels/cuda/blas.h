// The cuBLAS handle of the current device, bound to the current stream: one
// handle per device and thread (cuBLAS handles are not thread-safe), created
// on first use, with TF32 math as allowTF32() says (kernels/cuda/runtime.h)
// and a 32 MiB workspace of its own for each (device, stream) it is used on.
// CUDA builds only.
#pragma once

#include <cublas_v2.h>

namespace weft::kernels::cuda {

cublasHandle_t cublasHandle();

// Throws DeviceError "<what> on cuda:<d>: cuBLAS status <name>" when st fails.
void checkCublas(cublasStatus_t st, const char* what);

}  // namespace weft::kernels::cuda
