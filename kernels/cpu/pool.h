// 2-D max pooling over contiguous [planes, H, W] inputs (planes = N * C),
// forward and backward.
//
//   Pool2dGeometry geo{.planes = N * C, .height = 28, .width = 28, .kernelH = 2, .kernelW = 2,
//                      .strideH = 2, .strideW = 2, .outH = 14, .outW = 14};
//   maxPool2dForward(DType::Float32, geo, x, out, argmax);
//
// Positions in the padding never win (they act as -infinity). A NaN wins and
// propagates, as in PyTorch. Ties keep the first position in row-major order.
//
// The common 2x2 / stride 2 window without padding has a branch-free path
// (SSE2, four outputs at a time in float32).
//
// Threading: planes are split across the kernel threads; planes never share
// output or gradient elements, so the backward scatter has no races.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

struct Pool2dGeometry {
  int64_t planes = 0, height = 0, width = 0;
  int64_t kernelH = 1, kernelW = 1, strideH = 1, strideW = 1, padH = 0, padW = 0;
  int64_t outH = 0, outW = 0;
};

// out[p, oh, ow] = max of the window; argmax[p, oh, ow] = ih * W + iw of the
// winning input element within its plane.
void maxPool2dForward(DType type, const Pool2dGeometry& g, const void* x, void* out, int64_t* argmax);
// gradX [planes, H, W] (overwritten) receives each grad element at its argmax.
void maxPool2dBackward(DType type, const Pool2dGeometry& g, const void* grad, const int64_t* argmax, void* gradX);

}  // namespace weft::kernels::cpu
