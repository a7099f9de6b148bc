// CUDA definitions of kernels/device.h.
#include <cuda_runtime.h>

#include "common/error.h"
#include "kernels/cuda/check.h"
#include "kernels/device.h"

namespace weft::kernels {

bool cudaBuilt() { return true; }

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void* deviceAlloc(size_t nbytes, int device) {
  int n = cudaDeviceCount();
  WEFT_ENFORCE(device >= 0 && device < n, InvalidArgumentError, "cannot allocate on cuda:", device, ": ", n,
               " CUDA device(s) visible");
  if (nbytes == 0) return nullptr;
  CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, nbytes);
  WEFT_ENFORCE(e == cudaSuccess, Error, "cudaMalloc of ", nbytes, " bytes on cuda:", device, " failed: ",
               cudaGetErrorString(e));
  return p;
}

void deviceFree(void* p, int device) {
  if (!p) return;
  cudaSetDevice(device);
  cudaFree(p);
}

void deviceMemcpy(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
}

}  // namespace weft::kernels
