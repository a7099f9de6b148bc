// 2-D convolution on a CUDA device, forward and backward: the functions of
// kernels/cpu/conv.h with the same signatures and semantics (float32 and
// float64, contiguous NCHW / OCHW device buffers, stride and zero padding).
//
//   kernels::cuda::conv2dForward(DType::Float32, geo, x, w, bias, out);   // device pointers
//
// Forward: im2col (a kernel) unfolds a chunk of images into cols [B, C*kh*kw,
// outH*outW], then one strided-batched cuBLAS GEMM per chunk computes
// weight · cols_n for every image n. A 1x1 kernel with unit stride and no
// padding multiplies the images directly. The chunk is as many images as fit
// a fixed scratch budget (at least one).
//
// Backward: the input gradient is weight^T · grad_n per image (strided
// batched), folded back by col2im, a gather (each input element sums the
// columns that read it, in the CPU kernel's order: no atomics, deterministic).
// The weight gradient: one strided-batched GEMM per chunk gives every
// image's grad_n · cols_n^T at once, then a kernel sums them in image order
// (in float64) onto the chunks before. The bias gradient is a per-channel
// block reduction in float64.
//
// Errors: a dtype other than float32/float64 is an InvalidArgumentError naming
// the op; a per-image GEMM dimension past the 32-bit cuBLAS range is an
// InvalidArgumentError (as on the CPU); CUDA and cuBLAS failures are
// DeviceErrors. Everything is enqueued on the current stream; nothing waits.
#pragma once

#include "kernels/cpu/conv.h"

namespace weft::kernels::cuda {

using cpu::Conv2dGeometry;

void conv2dForward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* bias,
                   void* out);

void conv2dBackward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* grad,
                    void* gradX, void* gradWeight, void* gradBias);

}  // namespace weft::kernels::cuda
