#include "kernels/cpu/pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {

void maxPool2dForward(DType type, const Pool2dGeometry& g, const void* x, void* out, int64_t* argmax) {
  WEFT_DISPATCH_FLOATING(type, "maxPool2d", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    const int64_t inPlane = g.height * g.width, outPlane = g.outH * g.outW;
    const int64_t work = outPlane * g.kernelH * g.kernelW;
    parallelFor(g.planes, kParallelGrain / (work > 0 ? work : 1) + 1, [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p) {
        const T* src = px + p * inPlane;
        T* dst = po + p * outPlane;
        int64_t* am = argmax + p * outPlane;
        for (int64_t oh = 0; oh < g.outH; ++oh) {
          int64_t h0 = oh * g.strideH - g.padH;
          int64_t hb = std::max<int64_t>(h0, 0), he = std::min(h0 + g.kernelH, g.height);
          for (int64_t ow = 0; ow < g.outW; ++ow) {
            int64_t w0 = ow * g.strideW - g.padW;
            int64_t wb = std::max<int64_t>(w0, 0), we = std::min(w0 + g.kernelW, g.width);
            // The window always holds an input element: padding <= kernel / 2.
            int64_t best = hb * g.width + wb;
            T v = src[best];
            for (int64_t ih = hb; ih < he; ++ih) {
              for (int64_t iw = wb; iw < we; ++iw) {
                int64_t i = ih * g.width + iw;
                if (src[i] > v || (std::isnan(src[i]) && !std::isnan(v))) {
                  v = src[i];
                  best = i;
                }
              }
            }
            dst[oh * g.outW + ow] = v;
            am[oh * g.outW + ow] = best;
          }
        }
      }
    });
  });
}

void maxPool2dBackward(DType type, const Pool2dGeometry& g, const void* grad, const int64_t* argmax, void* gradX) {
  WEFT_DISPATCH_FLOATING(type, "maxPool2d backward", [&]<class T>() {
    const T* pg = static_cast<const T*>(grad);
    T* gx = static_cast<T*>(gradX);
    const int64_t inPlane = g.height * g.width, outPlane = g.outH * g.outW;
    parallelFor(g.planes, kParallelGrain / (inPlane + outPlane + 1) + 1, [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p) {
        T* dst = gx + p * inPlane;
        std::memset(dst, 0, sizeof(T) * inPlane);
        const T* src = pg + p * outPlane;
        const int64_t* am = argmax + p * outPlane;
        for (int64_t i = 0; i < outPlane; ++i) dst[am[i]] += src[i];
      }
    });
  });
}

}  // namespace weft::kernels::cpu
