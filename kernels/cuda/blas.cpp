#include "kernels/cuda/blas.h"

#include <array>

#include "common/error.h"
#include "kernels/cuda/runtime.h"

namespace weft::kernels::cuda {

void checkCublas(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw DeviceError(detail::concat(what, " on cuda:", currentDevice(), ": cuBLAS status ", cublasGetStatusName(st), " (",
                                   cublasGetStatusString(st), ")"));
}

cublasHandle_t cublasHandle() {
  thread_local std::array<cublasHandle_t, 16> handles{};
  const int d = currentDevice();
  WEFT_ENFORCE(d >= 0 && d < 16, InvalidArgumentError, "cublasHandle: cuda:", d, " is past the 16 devices weft supports");
  cublasHandle_t& h = handles[d];
  if (!h) checkCublas(cublasCreate(&h), "cublasCreate");
  checkCublas(cublasSetStream(h, static_cast<cudaStream_t>(currentStream(d))), "cublasSetStream");
  checkCublas(cublasSetMathMode(h, allowTF32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  return h;
}

}  // namespace weft::kernels::cuda
