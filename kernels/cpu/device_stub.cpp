// Host-only definitions of kernels/device.h for builds without CUDA. With CUDA
// the definitions come from kernels/cuda/device.cu instead.
#ifndef WEFT_HAVE_CUDA

#include "common/error.h"
#include "kernels/device.h"

namespace weft::kernels {

bool cudaBuilt() { return false; }
int cudaDeviceCount() { return 0; }

void* deviceAlloc(size_t, int device) {
  throw InvalidArgumentError(detail::concat("cannot allocate on cuda:", device,
                                            ": weft was built without CUDA (configure with -DWEFT_CUDA=ON on a machine with nvcc)"));
}
void deviceFree(void*, int) {}
void deviceMemcpy(void*, const void*, size_t, int device) {
  throw InvalidArgumentError(detail::concat("cannot copy to or from cuda:", device, ": weft was built without CUDA"));
}

}  // namespace weft::kernels

#endif
