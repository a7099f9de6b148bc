#include "kernels/cuda/blas.h"

#include <array>
#include <map>
#include <utility>

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
  // One workspace per (device, stream): cublasSetStream resets the handle to
  // a default workspace that two streams would share, racing when products
  // on both run at once. 32 MiB is cuBLAS's recommendation for Hopper.
  constexpr size_t kWorkspaceBytes = size_t(32) << 20;
  thread_local std::map<std::pair<int, Stream>, void*> workspaces;
  const Stream s = currentStream(d);
  void*& ws = workspaces[{d, s}];
  if (!ws) ws = allocate(kWorkspaceBytes, d);  // kept for the thread's life
  checkCublas(cublasSetStream(h, static_cast<cudaStream_t>(s)), "cublasSetStream");
  checkCublas(cublasSetWorkspace(h, ws, kWorkspaceBytes), "cublasSetWorkspace");
  checkCublas(cublasSetMathMode(h, allowTF32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  return h;
}

}  // namespace weft::kernels::cuda
