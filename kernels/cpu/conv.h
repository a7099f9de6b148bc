// 2-D convolution (cross-correlation, as PyTorch's conv2d) by im2col + GEMM,
// forward and backward.
//
//   Conv2dGeometry geo{.batch = 8, .inChannels = 3, .height = 32, .width = 32, .outChannels = 16,
//                      .kernelH = 3, .kernelW = 3, .padH = 1, .padW = 1, .outH = 32, .outW = 32};
//   conv2dForward(DType::Float32, geo, x, w, bias, out);     // out [8, 16, 32, 32]
//
// For each image, im2col unfolds the zero-padded input into a matrix
// cols[C*kh*kw, outH*outW]; the output is weight[O, C*kh*kw] · cols. A 1x1
// kernel with unit stride and no padding skips the unfolding (cols is the
// image itself). All buffers are contiguous NCHW / OCHW.
//
// Threading: images are spread over the kernel threads (dynamically, one
// image or chunk of images at a time, so a thread the OS has descheduled
// delays only its own share); each image's unfolding and GEMM run on its
// thread, so its cols stay in that core's cache. The weight gradient is summed
// per chunk of images, a fixed number of chunks added in order, and a GEMM's
// blocks are fixed by its shape (kernels/cpu/gemm.h): results are the same
// bits for any thread count. A batch of one image runs on the calling thread,
// with its GEMMs' blocks spread over the threads.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

struct Conv2dGeometry {
  int64_t batch = 0, inChannels = 0, height = 0, width = 0;
  int64_t outChannels = 0, kernelH = 0, kernelW = 0;
  int64_t strideH = 1, strideW = 1, padH = 0, padW = 0;
  int64_t outH = 0, outW = 0;  // (height + 2 * padH - kernelH) / strideH + 1, likewise for W
};

// out [N, O, outH, outW] = conv(x [N, C, H, W], weight [O, C, kh, kw]) + bias [O]
// (bias may be null).
void conv2dForward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* bias,
                   void* out);

// Given grad [N, O, outH, outW], writes whichever of gradX [N, C, H, W],
// gradWeight [O, C, kh, kw] and gradBias [O] is non-null (each overwritten).
void conv2dBackward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* grad,
                    void* gradX, void* gradWeight, void* gradBias);

}  // namespace weft::kernels::cpu
