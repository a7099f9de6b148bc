#include "kernels/cpu/pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <emmintrin.h>

#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

// Whether the running maximum v gives way to e, scanning a window in
// row-major order: a larger value, or the first NaN.
template <class T>
bool betterMax(T e, T v) {
  return (e > v) | ((e != e) & (v == v));
}

// One output row of a 2x2 / stride 2 window over input rows r0 and r1 (r0
// starts at plane offset `base`). Window values are unpredictable, so float
// rows go four outputs at a time with SSE2 compares and selects, no branches.
template <class T>
void maxPool2x2Row(const T* r0, const T* r1, int64_t outW, int64_t width, int64_t base, T* dst, int64_t* am) {
  int64_t ow = 0;
  if constexpr (std::is_same_v<T, float>) {
    for (; ow + 4 <= outW; ow += 4) {
      const __m128 a0 = _mm_loadu_ps(r0 + 2 * ow), a1 = _mm_loadu_ps(r0 + 2 * ow + 4);
      const __m128 b0 = _mm_loadu_ps(r1 + 2 * ow), b1 = _mm_loadu_ps(r1 + 2 * ow + 4);
      const __m128 cand[4] = {_mm_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)),
                              _mm_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1))};
      __m128 v = cand[0];
      __m128i k = _mm_setzero_si128();
      for (int j = 1; j < 4; ++j) {
        const __m128 e = cand[j];
        const __m128 take = _mm_or_ps(_mm_cmpgt_ps(e, v), _mm_and_ps(_mm_cmpunord_ps(e, e), _mm_cmpord_ps(v, v)));
        v = _mm_or_ps(_mm_and_ps(take, e), _mm_andnot_ps(take, v));
        const __m128i t = _mm_castps_si128(take);
        k = _mm_or_si128(_mm_and_si128(t, _mm_set1_epi32(j)), _mm_andnot_si128(t, k));
      }
      _mm_storeu_ps(dst + ow, v);
      alignas(16) int32_t pos[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(pos), k);
      for (int i = 0; i < 4; ++i) am[ow + i] = base + 2 * (ow + i) + (pos[i] & 1) + (pos[i] >> 1) * width;
    }
  }
  for (; ow < outW; ++ow) {
    const T cand[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
    T v = cand[0];
    int64_t k = 0;
    for (int64_t j = 1; j < 4; ++j) {
      if (betterMax(cand[j], v)) {
        v = cand[j];
        k = j;
      }
    }
    dst[ow] = v;
    am[ow] = base + 2 * ow + (k & 1) + (k >> 1) * width;
  }
}

}  // namespace

void maxPool2dForward(DType type, const Pool2dGeometry& g, const void* x, void* out, int64_t* argmax) {
  WEFT_DISPATCH_FLOATING(type, "maxPool2d", [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    const int64_t inPlane = g.height * g.width, outPlane = g.outH * g.outW;
    const int64_t work = outPlane * g.kernelH * g.kernelW;
    auto better = [](T e, T v) { return betterMax(e, v); };
    if (g.kernelH == 2 && g.kernelW == 2 && g.strideH == 2 && g.strideW == 2 && g.padH == 0 && g.padW == 0) {
      // The common 2x2 / stride 2 window, without bounds arithmetic.
      parallelFor(g.planes, kParallelGrain / (4 * outPlane + 1) + 1, [&](int64_t pb, int64_t pe) {
        for (int64_t p = pb; p < pe; ++p) {
          const T* src = px + p * inPlane;
          T* dst = po + p * outPlane;
          int64_t* am = argmax + p * outPlane;
          for (int64_t oh = 0; oh < g.outH; ++oh) {
            const T* r0 = src + 2 * oh * g.width;
            const T* r1 = r0 + g.width;
            maxPool2x2Row(r0, r1, g.outW, g.width, 2 * oh * g.width, dst + oh * g.outW, am + oh * g.outW);
          }
        }
      });
      return;
    }
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
                if (better(src[i], v)) {
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
