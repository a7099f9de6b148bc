#include "kernels/cpu/scan.h"

#include <type_traits>

#include "common/error.h"
#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

// Columns of `inner` run in blocks of this many, each with its running sums
// on the stack.
constexpr int64_t kInnerBlock = 128;

// The running sum's type: float64 for float32, float32 for bfloat16/float16
// (each output rounded once from it), uint64 (which wraps) for the integer
// dtypes, the dtype itself for float64.
template <class T>
using Running = std::conditional_t<
    std::is_same_v<T, float>, double,
    std::conditional_t<kIsHalfType<T>, float, std::conditional_t<std::is_floating_point_v<T>, T, uint64_t>>>;

template <class T, class O>
void scan(const T* in, int64_t outer, int64_t R, int64_t inner, bool reverse, O* out) {
  using S = Running<T>;
  forEachColumnBlock<kInnerBlock>(outer, R, inner, [&](int64_t o, int64_t ib, int64_t n) {
    S run[kInnerBlock] = {};
    for (int64_t k = 0; k < R; ++k) {
      const int64_t r = reverse ? R - 1 - k : k;
      const int64_t at = (o * R + r) * inner + ib;
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_floating_point_v<T> || kIsHalfType<T>) {
          run[i] += static_cast<S>(in[at + i]);
        } else {
          // Sign-extended into uint64: two's complement sums wrap like int64.
          run[i] += static_cast<S>(static_cast<int64_t>(in[at + i]));
        }
        out[at + i] = static_cast<O>(run[i]);
      }
    }
  });
}

}  // namespace

void cumsum(DType type, const void* in, int64_t outer, int64_t R, int64_t inner, bool reverse, DType outType,
            void* out) {
  auto run = [&]<class T>() {
    using O = std::conditional_t<std::is_floating_point_v<T> || kIsHalfType<T>, T, int64_t>;
    WEFT_CHECK(outType == kDTypeOf<O>) << "cumsum of " << dtypeName(type) << " into " << dtypeName(outType);
    scan(static_cast<const T*>(in), outer, R, inner, reverse, static_cast<O*>(out));
  };
  if (type == DType::Bool) {
    run.template operator()<bool>();
  } else {
    WEFT_DISPATCH_NUMERIC_AND_HALF(type, "cumsum", run);
  }
}

}  // namespace weft::kernels::cpu
