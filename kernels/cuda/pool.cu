#include "kernels/cuda/pool.h"

#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda {
namespace {

struct PoolDims {
  int64_t H, W, kh, kw, sh, sw, ph, pw, outH, outW;
};

PoolDims dimsOf(const Pool2dGeometry& g) {
  return {g.height, g.width, g.kernelH, g.kernelW, g.strideH, g.strideW, g.padH, g.padW, g.outH, g.outW};
}

// Whether the running maximum v gives way to e, scanning a window in
// row-major order: a larger value, or the first NaN.
template <class T>
__device__ __forceinline__ bool betterMax(T e, T v) {
  return (e > v) | ((e != e) & (v == v));
}

// One thread per output element (plane p, oh, ow).
template <class T>
__global__ void maxPoolForwardKernel(const T* __restrict__ x, int64_t total, PoolDims d, T* __restrict__ out,
                                     int64_t* __restrict__ argmax) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ow = i % d.outW, t = i / d.outW;
    const int64_t oh = t % d.outH, p = t / d.outH;
    const T* src = x + p * d.H * d.W;
    const int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    const int64_t hb = max(h0, int64_t(0)), he = min(h0 + d.kh, d.H);
    const int64_t wb = max(w0, int64_t(0)), we = min(w0 + d.kw, d.W);
    // The window always holds an input element: padding <= kernel / 2.
    int64_t best = hb * d.W + wb;
    T v = src[best];
    for (int64_t ih = hb; ih < he; ++ih) {
      for (int64_t iw = wb; iw < we; ++iw) {
        const int64_t k = ih * d.W + iw;
        const T e = src[k];
        if (betterMax(e, v)) {
          v = e;
          best = k;
        }
      }
    }
    out[i] = v;
    argmax[i] = best;
  }
}

// One thread per input element (plane p, ih, iw): the sum, in row-major
// output order, of grad over the windows that hold it and chose it.
template <class T>
__global__ void maxPoolBackwardKernel(const T* __restrict__ grad, const int64_t* __restrict__ argmax, int64_t total,
                                      PoolDims d, T* __restrict__ gradX) {
  const int64_t outPlane = d.outH * d.outW;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t iw = i % d.W, t = i / d.W;
    const int64_t ih = t % d.H, p = t / d.H;
    const int64_t self = ih * d.W + iw;
    // Windows oh with oh*sh - ph <= ih < oh*sh - ph + kh, likewise ow.
    const int64_t hh = ih + d.ph, ww = iw + d.pw;
    const int64_t ohBegin = hh < d.kh ? 0 : (hh - d.kh) / d.sh + 1, ohEnd = min(hh / d.sh + 1, d.outH);
    const int64_t owBegin = ww < d.kw ? 0 : (ww - d.kw) / d.sw + 1, owEnd = min(ww / d.sw + 1, d.outW);
    const T* gp = grad + p * outPlane;
    const int64_t* ap = argmax + p * outPlane;
    T acc = T(0);
    for (int64_t oh = ohBegin; oh < ohEnd; ++oh) {
      for (int64_t ow = owBegin; ow < owEnd; ++ow) {
        const int64_t o = oh * d.outW + ow;
        if (ap[o] == self) acc += gp[o];
      }
    }
    gradX[i] = acc;
  }
}

}  // namespace

void maxPool2dForward(DType type, const Pool2dGeometry& g, const void* x, void* out, int64_t* argmax) {
  WEFT_DISPATCH_FLOATING(type, "maxPool2d", [&]<class T>() {
    const int64_t total = g.planes * g.outH * g.outW;
    if (total <= 0) return;
    maxPoolForwardKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(static_cast<const T*>(x), total, dimsOf(g),
                                                                         static_cast<T*>(out), argmax);
    checkLaunch("maxPool2d");
  });
}

void maxPool2dBackward(DType type, const Pool2dGeometry& g, const void* grad, const int64_t* argmax, void* gradX) {
  WEFT_DISPATCH_FLOATING(type, "maxPool2d backward", [&]<class T>() {
    const int64_t total = g.planes * g.height * g.width;
    if (total <= 0) return;
    maxPoolBackwardKernel<T><<<blocksFor(total), kThreads, 0, stream()>>>(
        static_cast<const T*>(grad), argmax, total, dimsOf(g), static_cast<T*>(gradX));
    checkLaunch("maxPool2d backward");
  });
}

}  // namespace weft::kernels::cuda
