#include "kernels/cpu/vec_math.h"

#include "common/error.h"

namespace weft::kernels::cpu::vecmath {
namespace {

// The operations as function objects, so that each is inlined into the
// per-instruction-set functions below and compiled for their target.
struct ExpOp {
  template <class V>
  WEFT_VEC_INLINE V operator()(V v) const { return vecmath::exp(v); }
};
struct SigmoidOp {
  template <class V>
  WEFT_VEC_INLINE V operator()(V v) const { return vecmath::sigmoid(v); }
};
struct TanhOp {
  template <class V>
  WEFT_VEC_INLINE V operator()(V v) const { return vecmath::tanh(v); }
};
struct ErfOp {
  template <class V>
  WEFT_VEC_INLINE V operator()(V v) const { return vecmath::erf(v); }
};
struct GeluOp {
  template <class V>
  WEFT_VEC_INLINE V operator()(V v) const { return vecmath::gelu(v); }
};

template <class V>
WEFT_VEC_INLINE void geluBackwardRowOf(const float* x, const float* g, float* gx, int64_t n) {
  forEachVector<V>(n, [&](int64_t j, int64_t count) WEFT_VEC_LAMBDA {
    store(gx + j, geluBackward(load<V>(x + j, count), load<V>(g + j, count)), count);
  });
}
void geluBackwardSse2(const float* x, const float* g, float* gx, int64_t n) { geluBackwardRowOf<F4>(x, g, gx, n); }
__attribute__((target("avx2,fma"))) void geluBackwardAvx2(const float* x, const float* g, float* gx, int64_t n) {
  geluBackwardRowOf<F8>(x, g, gx, n);
}
__attribute__((target("avx512f"))) void geluBackwardAvx512(const float* x, const float* g, float* gx, int64_t n) {
  geluBackwardRowOf<F16>(x, g, gx, n);
}

template <class Op>
void rowSse2(const float* in, float* out, int64_t n) {
  mapRow<F4>(in, out, n, Op{});
}
template <class Op>
__attribute__((target("avx2,fma"))) void rowAvx2(const float* in, float* out, int64_t n) {
  mapRow<F8>(in, out, n, Op{});
}
template <class Op>
__attribute__((target("avx512f"))) void rowAvx512(const float* in, float* out, int64_t n) {
  mapRow<F16>(in, out, n, Op{});
}

using RowFn = void (*)(const float*, float*, int64_t);

template <class Op>
RowFn pick(Isa isa) {
  WEFT_ENFORCE(supports(isa), InvalidArgumentError, "vecmath: this CPU does not support ", isaName(isa));
  return isa == Isa::Avx512 ? rowAvx512<Op> : isa == Isa::Avx2 ? rowAvx2<Op> : rowSse2<Op>;
}

}  // namespace

bool supports(Isa isa) {
  switch (isa) {
    case Isa::Sse2: return true;
    case Isa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::Avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

Isa bestIsa() {
  static const Isa best = supports(Isa::Avx512) ? Isa::Avx512 : supports(Isa::Avx2) ? Isa::Avx2 : Isa::Sse2;
  return best;
}

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::Sse2: return "SSE2";
    case Isa::Avx2: return "AVX2+FMA";
    case Isa::Avx512: return "AVX-512";
  }
  return "unknown";
}

void expRow(const float* in, float* out, int64_t n, Isa isa) { pick<ExpOp>(isa)(in, out, n); }
void sigmoidRow(const float* in, float* out, int64_t n, Isa isa) { pick<SigmoidOp>(isa)(in, out, n); }
void tanhRow(const float* in, float* out, int64_t n, Isa isa) { pick<TanhOp>(isa)(in, out, n); }
void erfRow(const float* in, float* out, int64_t n, Isa isa) { pick<ErfOp>(isa)(in, out, n); }
void geluRow(const float* in, float* out, int64_t n, Isa isa) { pick<GeluOp>(isa)(in, out, n); }

void geluBackwardRow(const float* x, const float* g, float* gx, int64_t n, Isa isa) {
  WEFT_ENFORCE(supports(isa), InvalidArgumentError, "vecmath: this CPU does not support ", isaName(isa));
  (isa == Isa::Avx512 ? geluBackwardAvx512 : isa == Isa::Avx2 ? geluBackwardAvx2 : geluBackwardSse2)(x, g, gx, n);
}

}  // namespace weft::kernels::cpu::vecmath
