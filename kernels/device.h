// Device memory and device queries, whatever the build: without CUDA the
// functions report that no device exists and allocation fails with a clear
// error instead of a link error.
#pragma once

#include <cstddef>

namespace weft::kernels {

// True when weft was built with CUDA kernels (WEFT_CUDA).
bool cudaBuilt();
// Number of CUDA devices visible; 0 when none or not built with CUDA.
int cudaDeviceCount();

void* deviceAlloc(size_t nbytes, int device);
void deviceFree(void* p, int device);
// Copies between host and device memory (kind inferred from the pointers).
void deviceMemcpy(void* dst, const void* src, size_t nbytes, int device);

}  // namespace weft::kernels
