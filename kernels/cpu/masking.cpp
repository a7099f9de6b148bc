#include "kernels/cpu/masking.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

// fn.template operator()<U>() with U an unsigned integer of the element's
// size: these kernels copy elements and never read them as numbers.
template <class F>
void byElementSize(DType type, const char* op, F&& fn) {
  switch (elementSize(type)) {
    case 1: fn.template operator()<uint8_t>(); break;
    case 2: fn.template operator()<uint16_t>(); break;
    case 4: fn.template operator()<uint32_t>(); break;
    case 8: fn.template operator()<uint64_t>(); break;
    default: throwUnsupportedDType(op, type);
  }
}

}  // namespace

void where(DType type, const bool* cond, std::span<const int64_t> condStrides, const void* a,
           std::span<const int64_t> aStrides, const void* b, std::span<const int64_t> bStrides, void* out,
           std::span<const int64_t> shape) {
  std::vector<int64_t> outStrides(shape.size());
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    outStrides[d] = step;
    step *= shape[d];
  }
  byElementSize(type, "where", [&]<class U>() {
    const U* ap = static_cast<const U*>(a);
    const U* bp = static_cast<const U*>(b);
    U* op = static_cast<U*>(out);
    const std::span<const int64_t> strides[4] = {condStrides, aStrides, bStrides, outStrides};
    forEachRow<4>(shape, strides, [&](const int64_t* off, int64_t n, const int64_t* inner) {
      const bool* c = cond + off[0];
      const U* x = ap + off[1];
      const U* y = bp + off[2];
      U* o = op + off[3];
      for (int64_t i = 0; i < n; ++i) o[i] = c[i * inner[0]] ? x[i * inner[1]] : y[i * inner[2]];
    });
  });
}

void triangle(DType type, const void* in, int64_t batch, int64_t R, int64_t C, int64_t diagonal, bool upper,
              void* out) {
  const int64_t es = static_cast<int64_t>(elementSize(type));
  const char* s = static_cast<const char*>(in);
  char* d = static_cast<char*>(out);
  parallelFor(batch * R, kParallelGrain / (C > 0 ? C : 1) + 1, [&](int64_t rb, int64_t re) {
    for (int64_t row = rb; row < re; ++row) {
      const int64_t i = row % R;
      // Columns [keepBegin, keepEnd) are kept, the rest zeroed.
      const int64_t keepBegin = upper ? std::clamp<int64_t>(i + diagonal, 0, C) : 0;
      const int64_t keepEnd = upper ? C : std::clamp<int64_t>(i + diagonal + 1, 0, C);
      const char* src = s + row * C * es;
      char* dst = d + row * C * es;
      std::memset(dst, 0, static_cast<size_t>(keepBegin * es));
      if (keepEnd > keepBegin && dst != src) {
        std::memcpy(dst + keepBegin * es, src + keepBegin * es, static_cast<size_t>((keepEnd - keepBegin) * es));
      }
      std::memset(dst + keepEnd * es, 0, static_cast<size_t>((C - keepEnd) * es));
    }
  });
}

}  // namespace weft::kernels::cpu
