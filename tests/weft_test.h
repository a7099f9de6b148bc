// Helpers for weft's tests.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/device.h"
#include "tensor/ops.h"

// Ends a GPU test case as skipped (CTest's SKIP_RETURN_CODE 77) with a clear
// message when no CUDA device is present.
#define WEFT_SKIP_WITHOUT_CUDA()                                                       \
  do {                                                                                 \
    if (::weft::kernels::cudaDeviceCount() == 0) {                                     \
      std::printf("SKIP: no CUDA device (weft built %s CUDA)\n",                       \
                  ::weft::kernels::cudaBuilt() ? "with" : "without");                   \
      std::fflush(stdout);                                                             \
      std::_Exit(77);                                                                  \
    }                                                                                  \
  } while (0)

namespace weft::testing {

// Element-wise closeness with a message showing both tensors on failure.
inline void expectClose(const Tensor& actual, const Tensor& expected, double rtol = 1e-5, double atol = 1e-6) {
  REQUIRE(actual.shape() == expected.shape());
  INFO("actual:   " << actual << "\nexpected: " << expected);
  CHECK(allclose(actual, expected, rtol, atol));
}

}  // namespace weft::testing
