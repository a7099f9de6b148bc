#include "kernels/cpu/conv.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"

namespace weft::kernels::cpu {
namespace {

bool isPointwise(const Conv2dGeometry& g) {
  return g.kernelH == 1 && g.kernelW == 1 && g.strideH == 1 && g.strideW == 1 && g.padH == 0 && g.padW == 0;
}

// The output columns [lo, hi) whose input column ow * stride - pad + kj lies
// inside [0, width); the others read the zero padding.
struct ColumnRange {
  int64_t lo, hi;
};
ColumnRange validColumns(int64_t kj, int64_t stride, int64_t pad, int64_t width, int64_t outW) {
  // ow * stride >= pad - kj  and  ow * stride < width + pad - kj
  auto ceilDiv = [](int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; };
  int64_t lo = std::min(ceilDiv(pad - kj, stride), outW);
  int64_t hi = std::clamp<int64_t>(ceilDiv(width + pad - kj, stride), lo, outW);
  return {lo, hi};
}

// cols[(c*kh + ki)*kw + kj, oh*outW + ow] = x[c, oh*sh - ph + ki, ow*sw - pw + kj],
// zero where that position falls in the padding. Runs on the calling thread:
// callers parallelise over images, so one image's cols stay in that core's cache.
template <class T>
void im2col(const T* x, const Conv2dGeometry& g, T* cols) {
  const int64_t K = g.kernelH * g.kernelW, L = g.outH * g.outW;
  for (int64_t r = 0; r < g.inChannels * K; ++r) {
    const int64_t c = r / K, ki = (r % K) / g.kernelW, kj = r % g.kernelW;
    const T* plane = x + c * g.height * g.width;
    const auto [lo, hi] = validColumns(kj, g.strideW, g.padW, g.width, g.outW);
    T* dst = cols + r * L;
    for (int64_t oh = 0; oh < g.outH; ++oh) {
      const int64_t ih = oh * g.strideH - g.padH + ki;
      T* drow = dst + oh * g.outW;
      if (ih < 0 || ih >= g.height || lo == hi) {
        std::memset(drow, 0, sizeof(T) * g.outW);
        continue;
      }
      const T* srow = plane + ih * g.width - g.padW + kj;  // srow[ow * sw] is input column ow*sw - pw + kj
      std::fill(drow, drow + lo, T(0));
      if (g.strideW == 1) {
        std::memcpy(drow + lo, srow + lo, sizeof(T) * (hi - lo));
      } else {
        for (int64_t ow = lo; ow < hi; ++ow) drow[ow] = srow[ow * g.strideW];
      }
      std::fill(drow + hi, drow + g.outW, T(0));
    }
  }
}

// The adjoint of im2col: x[c, ih, iw] = sum of every cols entry that im2col
// read from (c, ih, iw). x [C, H, W] is overwritten. Calling thread only.
template <class T>
void col2im(const T* cols, const Conv2dGeometry& g, T* x) {
  const int64_t L = g.outH * g.outW, plane = g.height * g.width;
  std::memset(x, 0, sizeof(T) * g.inChannels * plane);
  for (int64_t c = 0; c < g.inChannels; ++c) {
    T* dst = x + c * plane;
    for (int64_t ki = 0; ki < g.kernelH; ++ki) {
      for (int64_t kj = 0; kj < g.kernelW; ++kj) {
        const T* src = cols + ((c * g.kernelH + ki) * g.kernelW + kj) * L;
        const auto [lo, hi] = validColumns(kj, g.strideW, g.padW, g.width, g.outW);
        for (int64_t oh = 0; oh < g.outH; ++oh) {
          const int64_t ih = oh * g.strideH - g.padH + ki;
          if (ih < 0 || ih >= g.height) continue;
          T* drow = dst + ih * g.width - g.padW + kj;
          const T* srow = src + oh * g.outW;
          if (g.strideW == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) drow[ow] += srow[ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) drow[ow * g.strideW] += srow[ow];
          }
        }
      }
    }
  }
}

// BLAS takes 32-bit sizes; checked before any parallel region, which an
// exception must not leave.
void checkConvRange(const Conv2dGeometry& g) {
  const int64_t ckk = g.inChannels * g.kernelH * g.kernelW, l = g.outH * g.outW;
  for (int64_t v : {ckk, l, g.outChannels}) {
    WEFT_ENFORCE(v <= static_cast<int64_t>(INT_MAX), InvalidArgumentError, "conv2d: a per-image product of [",
                 g.outChannels, ", ", ckk, "] x [", ckk, ", ", l, "] exceeds the 32-bit BLAS integer range");
  }
}

// Images are spread over the kernel threads in chunks (parallelForChunks):
// one chunk per image for the forward pass and gradX, which treat images
// independently. gradWeight sums over images: a fixed number of chunks, each
// with its own partial sum, added in chunk order. What a chunk computes does
// not depend on the thread that runs it, so the result does not depend on how
// many threads ran or which ran what.
constexpr int64_t kWeightChunks = 8;

}  // namespace

void conv2dForward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* bias,
                   void* out) {
  checkConvRange(g);
  WEFT_DISPATCH_FLOATING(type, "conv2d", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    const T* pb = static_cast<const T*>(bias);
    T* po = static_cast<T*>(out);
    const int64_t CKK = g.inChannels * g.kernelH * g.kernelW, L = g.outH * g.outW;
    const int64_t inImage = g.inChannels * g.height * g.width, outImage = g.outChannels * L;
    const bool direct = isPointwise(g);
    std::vector<std::unique_ptr<T[]>> cols(static_cast<size_t>(threadsFor(g.batch, numThreads())));
    if (!direct) {
      for (auto& c : cols) c.reset(new T[static_cast<size_t>(CKK * L)]);
    }
    parallelForChunks(g.batch, g.batch, [&](int64_t n, int64_t, int64_t, int t) {
      const T* xn = px + n * inImage;
      T* on = po + n * outImage;
      if (!direct) im2col(xn, g, cols[static_cast<size_t>(t)].get());
      double beta = 0.0;
      if (pb) {
        for (int64_t o = 0; o < g.outChannels; ++o) std::fill(on + o * L, on + (o + 1) * L, pb[o]);
        beta = 1.0;
      }
      gemm(type, {weight, false, CKK}, {direct ? xn : cols[static_cast<size_t>(t)].get(), false, L}, g.outChannels, L,
           CKK, 1.0, beta, on, L);
    });
  });
}

void conv2dBackward(DType type, const Conv2dGeometry& g, const void* x, const void* weight, const void* grad,
                    void* gradX, void* gradWeight, void* gradBias) {
  checkConvRange(g);
  WEFT_DISPATCH_FLOATING(type, "conv2d backward", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    const T* pg = static_cast<const T*>(grad);
    T* gx = static_cast<T*>(gradX);
    T* gw = static_cast<T*>(gradWeight);
    T* gb = static_cast<T*>(gradBias);
    const int64_t CKK = g.inChannels * g.kernelH * g.kernelW, L = g.outH * g.outW;
    const int64_t inImage = g.inChannels * g.height * g.width, outImage = g.outChannels * L;
    const int64_t weightSize = g.outChannels * CKK;
    const bool direct = isPointwise(g);
    // gradX needs one chunk per image; gradWeight a fixed number of chunks.
    const int64_t chunks = gw ? std::min(g.batch, kWeightChunks) : g.batch;
    const int threads = threadsFor(chunks, numThreads());
    // Per thread: an unfolded image (for gradWeight) and an unfolded gradient
    // (for gradX). Per chunk: a partial gradWeight.
    std::vector<std::unique_ptr<T[]>> cols(static_cast<size_t>(threads)), gcols(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t) {
      if (gw && !direct) cols[static_cast<size_t>(t)].reset(new T[static_cast<size_t>(CKK * L)]);
      if (gx && !direct) gcols[static_cast<size_t>(t)].reset(new T[static_cast<size_t>(CKK * L)]);
    }
    std::unique_ptr<T[]> partials(gw ? new T[static_cast<size_t>(weightSize * chunks)] : nullptr);
    parallelForChunks(g.batch, chunks, [&](int64_t c, int64_t first, int64_t end, int t) {
      T* tcols = cols[static_cast<size_t>(t)].get();
      T* tgcols = gcols[static_cast<size_t>(t)].get();
      for (int64_t n = first; n < end; ++n) {
        const T* xn = px + n * inImage;
        const T* gn = pg + n * outImage;
        if (gw) {  // partial gradWeight (+)= grad_n [O, L] · cols_n^T [L, CKK]
          if (!direct) im2col(xn, g, tcols);
          gemm(type, {gn, false, L}, {direct ? xn : tcols, true, L}, g.outChannels, CKK, L, 1.0,
               n == first ? 0.0 : 1.0, partials.get() + c * weightSize, CKK);
        }
        if (gx) {  // gradCols = weight^T [CKK, O] · grad_n [O, L], folded back onto the image
          T* gxn = gx + n * inImage;
          gemm(type, {weight, true, CKK}, {gn, false, L}, CKK, L, g.outChannels, 1.0, 0.0, direct ? gxn : tgcols, L);
          if (!direct) col2im(tgcols, g, gxn);
        }
      }
    });
    if (gw) {
      if (chunks == 0) std::memset(gw, 0, sizeof(T) * weightSize);
      if (chunks > 0) std::memcpy(gw, partials.get(), sizeof(T) * weightSize);
      for (int64_t c = 1; c < chunks; ++c) {
        const T* part = partials.get() + c * weightSize;
        for (int64_t i = 0; i < weightSize; ++i) gw[i] += part[i];
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
