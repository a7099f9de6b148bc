#include "kernels/cpu/reduce.h"

#include <vector>

#include "kernels/cpu/loops.h"

namespace weft::kernels::cpu {
namespace {

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, float>, double, T>;

}  // namespace

void sumRows(DType type, const void* in, int64_t K, int64_t R, void* out) {
  WEFT_DISPATCH_ALL(type, "sum", [&]<class T>() {
    const T* p = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    if (K == 1 && R >= kParallelGrain) {
      // One long row: per-thread partial sums.
      int nt = omp_get_max_threads();
      std::vector<Acc<T>> partial(nt, Acc<T>(0));
      parallelFor(R, kParallelGrain, [&](int64_t b, int64_t e) {
        Acc<T> s = 0;
        for (int64_t i = b; i < e; ++i) s += p[i];
        partial[omp_get_thread_num()] = s;
      });
      Acc<T> s = 0;
      for (auto v : partial) s += v;
      o[0] = static_cast<T>(s);
      return;
    }
    parallelFor(K, kParallelGrain / (R > 0 ? R : 1) + 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const T* row = p + k * R;
        Acc<T> s = 0;
        for (int64_t r = 0; r < R; ++r) s += row[r];
        o[k] = static_cast<T>(s);
      }
    });
  });
}

void sumCols(DType type, const void* in, int64_t R, int64_t K, void* out) {
  WEFT_DISPATCH_ALL(type, "sum", [&]<class T>() {
    const T* p = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    // Each thread owns a slice of columns and walks all rows over it.
    parallelFor(K, kParallelGrain / (R > 0 ? R : 1) + 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) o[k] = T(0);
      for (int64_t r = 0; r < R; ++r) {
        const T* row = p + r * K;
        for (int64_t k = b; k < e; ++k) o[k] += row[k];
      }
    });
  });
}

}  // namespace weft::kernels::cpu
