#include "kernels/cpu/lstm.h"

#include <cmath>

#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

template <class T>
T sigmoid(T x) {
  return static_cast<T>(1) / (static_cast<T>(1) + std::exp(-x));
}

}  // namespace

void lstmCellForward(DType type, int64_t n, int64_t hidden, void* gates, const void* c, void* cNew, void* hNew) {
  WEFT_DISPATCH_FLOATING(type, "lstmCell", [&]<class T>() {
    T* pg = static_cast<T*>(gates);
    const T* pc = static_cast<const T*>(c);
    T* pcn = static_cast<T*>(cNew);
    T* phn = static_cast<T*>(hNew);
    const int64_t H = hidden;
    parallelFor(n, kParallelGrain / (4 * H + 1) + 1, [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        T* gi = pg + r * 4 * H;
        T* gf = gi + H;
        T* gg = gf + H;
        T* go = gg + H;
        const T* cr = pc + r * H;
        T* cn = pcn + r * H;
        T* hn = phn + r * H;
        for (int64_t j = 0; j < H; ++j) {
          T i = sigmoid(gi[j]), f = sigmoid(gf[j]), g = std::tanh(gg[j]), o = sigmoid(go[j]);
          gi[j] = i;
          gf[j] = f;
          gg[j] = g;
          go[j] = o;
          T cv = f * cr[j] + i * g;
          cn[j] = cv;
          hn[j] = o * std::tanh(cv);
        }
      }
    });
  });
}

void lstmCellBackward(DType type, int64_t n, int64_t hidden, const void* gates, const void* c, const void* cNew,
                      const void* gradH, const void* gradC, void* gradGates, void* gradCPrev) {
  WEFT_DISPATCH_FLOATING(type, "lstmCell backward", [&]<class T>() {
    const T* pg = static_cast<const T*>(gates);
    const T* pc = static_cast<const T*>(c);
    const T* pcn = static_cast<const T*>(cNew);
    const T* pgh = static_cast<const T*>(gradH);
    const T* pgc = static_cast<const T*>(gradC);
    T* pdg = static_cast<T*>(gradGates);
    T* pdc = static_cast<T*>(gradCPrev);
    const int64_t H = hidden;
    parallelFor(n, kParallelGrain / (4 * H + 1) + 1, [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        const T* a = pg + r * 4 * H;
        T* d = pdg + r * 4 * H;
        for (int64_t j = 0; j < H; ++j) {
          int64_t k = r * H + j;
          T i = a[j], f = a[H + j], g = a[2 * H + j], o = a[3 * H + j];
          T tc = std::tanh(pcn[k]);
          T gh = pgh[k];
          // d/dc' collects the direct gradient and the path through h' = o * tanh(c').
          T dc = pgc[k] + gh * o * (T(1) - tc * tc);
          d[j] = dc * g * i * (T(1) - i);
          d[H + j] = dc * pc[k] * f * (T(1) - f);
          d[2 * H + j] = dc * i * (T(1) - g * g);
          d[3 * H + j] = gh * tc * o * (T(1) - o);
          pdc[k] = dc * f;
        }
      }
    });
  });
}

}  // namespace weft::kernels::cpu
