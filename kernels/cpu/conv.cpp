#include "kernels/cpu/conv.h"

#include <cstring>
#include <memory>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

bool isPointwise(const Conv2dGeometry& g) {
  return g.kernelH == 1 && g.kernelW == 1 && g.strideH == 1 && g.strideW == 1 && g.padH == 0 && g.padW == 0;
}

// cols[(c*kh + ki)*kw + kj, oh*outW + ow] = x[c, oh*sh - ph + ki, ow*sw - pw + kj],
// zero where that position falls in the padding.
template <class T>
void im2col(const T* x, const Conv2dGeometry& g, T* cols) {
  const int64_t K = g.kernelH * g.kernelW, L = g.outH * g.outW;
  parallelFor(g.inChannels * K, kParallelGrain / (L > 0 ? L : 1) + 1, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      int64_t c = r / K, ki = (r % K) / g.kernelW, kj = r % g.kernelW;
      const T* plane = x + c * g.height * g.width;
      T* dst = cols + r * L;
      for (int64_t oh = 0; oh < g.outH; ++oh) {
        int64_t ih = oh * g.strideH - g.padH + ki;
        T* drow = dst + oh * g.outW;
        if (ih < 0 || ih >= g.height) {
          std::memset(drow, 0, sizeof(T) * g.outW);
          continue;
        }
        const T* srow = plane + ih * g.width;
        for (int64_t ow = 0; ow < g.outW; ++ow) {
          int64_t iw = ow * g.strideW - g.padW + kj;
          drow[ow] = iw >= 0 && iw < g.width ? srow[iw] : T(0);
        }
      }
    }
  });
}

// The adjoint of im2col: x[c, ih, iw] = sum of every cols entry that
// im2col read from (c, ih, iw). x [C, H, W] is overwritten.
template <class T>
void col2im(const T* cols, const Conv2dGeometry& g, T* x) {
  const int64_t L = g.outH * g.outW, plane = g.height * g.width;
  const int64_t perChannel = g.kernelH * g.kernelW * L;
  parallelFor(g.inChannels, kParallelGrain / (perChannel > 0 ? perChannel : 1) + 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      T* dst = x + c * plane;
      std::memset(dst, 0, sizeof(T) * plane);
      for (int64_t ki = 0; ki < g.kernelH; ++ki) {
        for (int64_t kj = 0; kj < g.kernelW; ++kj) {
          const T* src = cols + ((c * g.kernelH + ki) * g.kernelW + kj) * L;
          for (int64_t oh = 0; oh < g.outH; ++oh) {
            int64_t ih = oh * g.strideH - g.padH + ki;
            if (ih < 0 || ih >= g.height) continue;
            T* drow = dst + ih * g.width;
            const T* srow = src + oh * g.outW;
            for (int64_t ow = 0; ow < g.outW; ++ow) {
              int64_t iw = ow * g.strideW - g.padW + kj;
              if (iw >= 0 && iw < g.width) drow[iw] += srow[ow];
            }
          }
        }
      }
    }
  });
}

}  // namespace

void conv2dForward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* bias,
                   void* out) {
  WEFT_DISPATCH_FLOATING(type, "conv2d", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    const T* pb = static_cast<const T*>(bias);
    T* po = static_cast<T*>(out);
    const int64_t CKK = g.inChannels * g.kernelH * g.kernelW, L = g.outH * g.outW;
    const int64_t inImage = g.inChannels * g.height * g.width, outImage = g.outChannels * L;
    const bool direct = isPointwise(g);
    std::unique_ptr<T[]> cols(direct ? nullptr : new T[CKK * L]);
    for (int64_t n = 0; n < g.batch; ++n) {
      const T* xn = px + n * inImage;
      T* on = po + n * outImage;
      if (!direct) im2col(xn, g, cols.get());
      double beta = 0.0;
      if (pb) {
        for (int64_t o = 0; o < g.outChannels; ++o) {
          T* row = on + o * L;
          for (int64_t l = 0; l < L; ++l) row[l] = pb[o];
        }
        beta = 1.0;
      }
      gemm(type, {weight, false, CKK}, {direct ? xn : cols.get(), false, L}, g.outChannels, L, CKK, 1.0, beta, on, L);
    }
  });
}

void conv2dBackward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* grad,
                    void* gradX, void* gradWeight, void* gradBias) {
  WEFT_DISPATCH_FLOATING(type, "conv2d backward", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    const T* pg = static_cast<const T*>(grad);
    T* gx = static_cast<T*>(gradX);
    T* gw = static_cast<T*>(gradWeight);
    T* gb = static_cast<T*>(gradBias);
    const int64_t CKK = g.inChannels * g.kernelH * g.kernelW, L = g.outH * g.outW;
    const int64_t inImage = g.inChannels * g.height * g.width, outImage = g.outChannels * L;
    const bool direct = isPointwise(g);
    std::unique_ptr<T[]> cols(direct || !gw ? nullptr : new T[CKK * L]);
    std::unique_ptr<T[]> gcols(direct || !gx ? nullptr : new T[CKK * L]);
    if (gw && g.batch == 0) std::memset(gw, 0, sizeof(T) * g.outChannels * CKK);
    for (int64_t n = 0; n < g.batch; ++n) {
      const T* xn = px + n * inImage;
      const T* gn = pg + n * outImage;
      if (gw) {  // gradWeight += grad_n [O, L] · cols_n^T [L, CKK]
        if (!direct) im2col(xn, g, cols.get());
        gemm(type, {gn, false, L}, {direct ? xn : cols.get(), true, L}, g.outChannels, CKK, L, 1.0, n == 0 ? 0.0 : 1.0,
             gw, CKK);
      }
      if (gx) {  // gradCols = weight^T [CKK, O] · grad_n [O, L], folded back onto the image
        T* gxn = gx + n * inImage;
        gemm(type, {weight, true, CKK}, {gn, false, L}, CKK, L, g.outChannels, 1.0, 0.0, direct ? gxn : gcols.get(), L);
        if (!direct) col2im(gcols.get(), g, gxn);
      }
    }
    if (gb) {
      parallelFor(g.outChannels, kParallelGrain / (g.batch * L > 0 ? g.batch * L : 1) + 1, [&](int64_t ob, int64_t oe) {
        for (int64_t o = ob; o < oe; ++o) {
          double acc = 0;
          for (int64_t n = 0; n < g.batch; ++n) {
            const T* row = pg + n * outImage + o * L;
            for (int64_t l = 0; l < L; ++l) acc += row[l];
          }
          gb[o] = static_cast<T>(acc);
        }
      });
    }
  });
}

}  // namespace weft::kernels::cpu
