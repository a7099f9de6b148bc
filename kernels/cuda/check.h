// CUDA_CHECK / CUBLAS_CHECK: a failed CUDA runtime or cuBLAS call is a bug or a
// broken device; print the call, file:line and the error string, then abort.
#pragma once

#include <cuda_runtime.h>

#include "common/error.h"

#define CUDA_CHECK(call)                                                    \
  do {                                                                      \
    cudaError_t weft_cuda_err_ = (call);                                    \
    WEFT_CHECK(weft_cuda_err_ == cudaSuccess) << #call << ": " << cudaGetErrorString(weft_cuda_err_); \
  } while (0)

#define CUBLAS_CHECK(call)                                                  \
  do {                                                                      \
    auto weft_cublas_st_ = (call);                                          \
    WEFT_CHECK(weft_cublas_st_ == 0) << #call << ": cuBLAS status " << static_cast<int>(weft_cublas_st_); \
  } while (0)
