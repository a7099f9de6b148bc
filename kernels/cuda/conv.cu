#include "kernels/cuda/conv.h"

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/strided_gemm.cuh"

namespace weft::kernels::cuda {
namespace {

// Scratch for a chunk's unfolded images (and, in backward, their partial
// weight gradients): chunks are as many images as fit, at least one.
constexpr size_t kScratchBudget = size_t(256) << 20;

bool isPointwise(const Conv2dGeometry& g) {
  return g.kernelH == 1 && g.kernelW == 1 && g.strideH == 1 && g.strideW == 1 && g.padH == 0 && g.padW == 0;
}

// The geometry as the kernels read it (by value, in registers).
struct ConvDims {
  int64_t C, H, W, kh, kw, sh, sw, ph, pw, outH, outW;
};

ConvDims dimsOf(const Conv2dGeometry& g) {
  return {g.inChannels, g.height, g.width, g.kernelH, g.kernelW, g.strideH, g.strideW, g.padH, g.padW, g.outH, g.outW};
}

// One thread per (image n, channel c, output position l): writes the kh*kw
// entries cols[n * imageStride + ((c*kh + ki)*kw + kj) * rowStride + l] =
// x[n, c, oh*sh - ph + ki, ow*sw - pw + kj] (0 in the padding). Consecutive
// threads write consecutive l of one row: coalesced.
template <class T>
__global__ void im2colKernel(const T* __restrict__ x, int64_t total, ConvDims d, int64_t imageStride,
                             int64_t rowStride, T* __restrict__ cols) {
  const int64_t L = d.outH * d.outW;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t l = i % L, nc = i / L;
    const int64_t c = nc % d.C, n = nc / d.C;
    const int64_t oh = l / d.outW, ow = l - oh * d.outW;
    const T* plane = x + nc * d.H * d.W;
    T* dst = cols + n * imageStride + c * d.kh * d.kw * rowStride + l;
    for (int64_t ki = 0; ki < d.kh; ++ki) {
      const int64_t ih = oh * d.sh - d.ph + ki;
      const bool rowIn = ih >= 0 && ih < d.H;
      for (int64_t kj = 0; kj < d.kw; ++kj) {
        const int64_t iw = ow * d.sw - d.pw + kj;
        *dst = rowIn && iw >= 0 && iw < d.W ? plane[ih * d.W + iw] : T(0);
        dst += rowStride;
      }
    }
  }
}

template <class T>
void launchIm2col(const T* x, int64_t images, const ConvDims& d, int64_t imageStride, int64_t rowStride, T* cols) {
  const int64_t total = images * d.C * d.outH * d.outW;
  if (total <= 0) return;
  im2colKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(x, total, d, imageStride, rowStride, cols);
  checkLaunch("conv2d im2col");
}

// The adjoint of im2col as a gather: one thread per input element (n, c, ih,
// iw) sums cols[n][(c*kh + ki)*kw + kj][oh*outW + ow] over the (ki, kj), in
// row-major order, whose output position (oh, ow) read it: the order in which
// the CPU's col2im adds them, and no atomics (the result is deterministic).
template <class T>
__global__ void col2imKernel(const T* __restrict__ cols, int64_t total, ConvDims d, T* __restrict__ x) {
  const int64_t L = d.outH * d.outW, K = d.kh * d.kw;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t iw = i % d.W, t = i / d.W;
    const int64_t ih = t % d.H, nc = t / d.H;
    const int64_t c = nc % d.C, n = nc / d.C;
    const T* src = cols + (n * d.C + c) * K * L;
    T acc = T(0);
    for (int64_t ki = 0; ki < d.kh; ++ki) {
      const int64_t hh = ih + d.ph - ki;  // oh * sh
      if (hh < 0) break;
      const int64_t oh = hh / d.sh;
      if (oh * d.sh != hh || oh >= d.outH) continue;
      for (int64_t kj = 0; kj < d.kw; ++kj) {
        const int64_t ww = iw + d.pw - kj;  // ow * sw
        if (ww < 0) break;
        const int64_t ow = ww / d.sw;
        if (ow * d.sw != ww || ow >= d.outW) continue;
        acc += src[(ki * d.kw + kj) * L + oh * d.outW + ow];
      }
    }
    x[i] = acc;
  }
}

template <class T>
void launchCol2im(const T* cols, int64_t images, const ConvDims& d, T* x) {
  const int64_t total = images * d.C * d.H * d.W;
  if (total <= 0) return;
  col2imKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(cols, total, d, x);
  checkLaunch("conv2d col2im");
}

// out[n, o, l] = bias[o] over `total` = images * O * L elements.
template <class T>
__global__ void fillBiasKernel(const T* __restrict__ bias, int64_t total, int64_t O, int64_t L, T* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = bias[(i / L) % O];
  }
}

// gw[i] (+)= the sum over the chunk's images n of partial[n * size + i], in
// image order, accumulated in float64 (onto gw's value when `accumulate`).
template <class T>
__global__ void sumImagesKernel(const T* __restrict__ partial, int64_t images, int64_t size, bool accumulate,
                                T* __restrict__ gw) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < size;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = accumulate ? static_cast<double>(gw[i]) : 0.0;
    for (int64_t n = 0; n < images; ++n) acc += static_cast<double>(partial[n * size + i]);
    gw[i] = static_cast<T>(acc);
  }
}

// gradBias[o] = the sum of grad[n, o, l] over n and l: one block per channel,
// accumulated in float64 (as the CPU kernel), a warp-shuffle block reduction.
template <class T>
__global__ void biasGradKernel(const T* __restrict__ grad, int64_t N, int64_t O, int64_t L, T* __restrict__ gradBias) {
  const int64_t o = blockIdx.x;
  double acc = 0;
  const int64_t count = N * L;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t n = j / L, l = j - n * L;
    acc += static_cast<double>(grad[(n * O + o) * L + l]);
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  __shared__ double warpSums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warpSums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < static_cast<int>(blockDim.x / 32) ? warpSums[lane] : 0.0;
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) gradBias[o] = static_cast<T>(acc);
  }
}

// As on the CPU: each per-image GEMM dimension must fit cuBLAS's int.
void checkConvRange(const Conv2dGeometry& g) {
  const int64_t ckk = g.inChannels * g.kernelH * g.kernelW, l = g.outH * g.outW;
  for (int64_t v : {ckk, l, g.outChannels}) {
    WEFT_ENFORCE(fitsBlasInt(v), InvalidArgumentError, "conv2d: a per-image product of [", g.outChannels, ", ", ckk,
                 "] x [", ckk, ", ", l, "] exceeds the 32-bit BLAS integer range");
  }
}

// Images per chunk: the scratch of `perImage` elements each within the
// budget, and the chunk (a GEMM batch count) within int.
int64_t chunkImages(const Conv2dGeometry& g, int64_t perImage, size_t elementBytes) {
  if (g.batch == 0) return 1;
  int64_t b = perImage > 0 ? static_cast<int64_t>(kScratchBudget / (static_cast<size_t>(perImage) * elementBytes))
                           : g.batch;
  b = std::min<int64_t>(b, INT_MAX);
  return std::clamp<int64_t>(b, 1, g.batch);
}

}  // namespace

void conv2dForward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* bias,
                   void* out) {
  checkConvRange(g);
  WEFT_DISPATCH_FLOATING(type, "conv2d", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(weight);
    const T* pb = static_cast<const T*>(bias);
    T* po = static_cast<T*>(out);
    const int64_t O = g.outChannels, CKK = g.inChannels * g.kernelH * g.kernelW, L = g.outH * g.outW;
    const int64_t inImage = g.inChannels * g.height * g.width, outImage = O * L;
    const int64_t total = g.batch * outImage;
    if (total == 0) return;
    if (pb) {
      fillBiasKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(pb, total, O, L, po);
      checkLaunch("conv2d bias");
    }
    const T beta = pb ? T(1) : T(0);
    const ConvDims d = dimsOf(g);
    if (isPointwise(g)) {  // out_n [O, L] = weight [O, C] · x_n [C, L], every image in one call
      stridedGemm<T>({pw, false, CKK, 0}, {px, false, L, inImage}, O, L, CKK, T(1), beta, {po, L, outImage}, g.batch);
      return;
    }
    const int64_t B = chunkImages(g, CKK * L, sizeof(T));
    Scratch cols(static_cast<size_t>(B * CKK * L) * sizeof(T));
    for (int64_t n0 = 0; n0 < g.batch; n0 += B) {
      const int64_t b = std::min(B, g.batch - n0);
      launchIm2col(px + n0 * inImage, b, d, CKK * L, L, cols.as<T>());
      stridedGemm<T>({pw, false, CKK, 0}, {cols.as<T>(), false, L, CKK * L}, O, L, CKK, T(1), beta,
                     {po + n0 * outImage, L, outImage}, b);
    }
  });
}

void conv2dBackward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* grad,
                    void* gradX, void* gradWeight, void* gradBias) {
  checkConvRange(g);
  WEFT_DISPATCH_FLOATING(type, "conv2d backward", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(weight);
    const T* pg = static_cast<const T*>(grad);
    T* gx = static_cast<T*>(gradX);
    T* gw = static_cast<T*>(gradWeight);
    T* gb = static_cast<T*>(gradBias);
    const int64_t O = g.outChannels, CKK = g.inChannels * g.kernelH * g.kernelW, L = g.outH * g.outW;
    const int64_t inImage = g.inChannels * g.height * g.width, outImage = O * L;
    const ConvDims d = dimsOf(g);
    const bool direct = isPointwise(g);
    if (gb && O > 0) {
      biasGradKernel<T><<<static_cast<unsigned>(O), kThreads, 0, stream()>>>(pg, g.batch, O, L, gb);
      checkLaunch("conv2d backward bias");
    }
    if (gw && g.batch == 0 && O * CKK > 0) WEFT_CUDA_CHECK(cudaMemsetAsync(gw, 0, sizeof(T) * O * CKK, stream()));
    if (gx && O == 0 && g.batch * inImage > 0) {
      WEFT_CUDA_CHECK(cudaMemsetAsync(gx, 0, sizeof(T) * g.batch * inImage, stream()));
    }
    if (g.batch == 0 || O == 0 || CKK == 0 || (!gx && !gw)) return;
    if (gx && direct) {  // gx_n [C, L] = weight^T [C, O] · grad_n [O, L]
      stridedGemm<T>({pw, true, CKK, 0}, {pg, false, L, outImage}, CKK, L, O, T(1), T(0), {gx, L, inImage}, g.batch);
    }
    // Per image of a chunk: its unfolding (for gw, then reused as gx's
    // unfolded gradient; a pointwise kernel reads the image itself) and its
    // partial weight gradient. The partials are one strided-batched GEMM, so
    // every image's product runs at once, then summed in image order.
    const int64_t perImage = (direct ? 0 : CKK * L) + (gw ? O * CKK : 0);
    const int64_t B = chunkImages(g, perImage, sizeof(T));
    Scratch cols(direct ? 0 : static_cast<size_t>(B * CKK * L) * sizeof(T));
    Scratch partial(gw ? static_cast<size_t>(B * O * CKK) * sizeof(T) : 0);
    for (int64_t n0 = 0; n0 < g.batch; n0 += B) {
      const int64_t b = std::min(B, g.batch - n0);
      const T* gn = pg + n0 * outImage;
      if (gw) {  // partial_n [O, CKK] = grad_n [O, L] · cols_n^T [L, CKK]; gw (+)= their sum
        const T* cn = px + n0 * inImage;
        if (!direct) {
          launchIm2col(cn, b, d, CKK * L, L, cols.as<T>());
          cn = cols.as<T>();
        }
        stridedGemm<T>({gn, false, L, outImage}, {cn, true, L, CKK * L}, O, CKK, L, T(1), T(0),
                       {partial.as<T>(), CKK, O * CKK}, b);
        const int64_t size = O * CKK;
        sumImagesKernel<T><<<blocksFor(size), kThreads, 0, stream()>>>(partial.as<T>(), b, size, n0 > 0, gw);
        checkLaunch("conv2d backward weight sum");
      }
      if (gx && !direct) {  // gcols_n [CKK, L] = weight^T · grad_n, folded back onto the images
        stridedGemm<T>({pw, true, CKK, 0}, {gn, false, L, outImage}, CKK, L, O, T(1), T(0),
                       {cols.as<T>(), L, CKK * L}, b);
        launchCol2im(cols.as<T>(), b, d, gx + n0 * inImage);
      }
    }
  });
}

}  // namespace weft::kernels::cuda
