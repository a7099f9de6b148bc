#include "tensor/autocast.h"

namespace weft::autocast {
namespace {

thread_local bool tEnabled = false;
thread_local DType tDType = DType::BFloat16;

// float64 > float32 > the 16-bit types; two different 16-bit types meet in float32.
DType wider(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  return DType::Float32;
}

}  // namespace

Scope::Scope(DType dtype, bool enabled) : prevEnabled_(tEnabled), prevDType_(tDType) {
  WEFT_ENFORCE(isLowPrecision(dtype), InvalidArgumentError, "autocast::Scope: dtype must be bfloat16 or float16, got ",
               dtypeName(dtype));
  tEnabled = enabled;
  tDType = dtype;
}

Scope::~Scope() {
  tEnabled = prevEnabled_;
  tDType = prevDType_;
}

bool isEnabled() { return tEnabled; }
DType dtype() { return tDType; }

namespace detail {

std::optional<DType> lowFor(std::initializer_list<const Tensor*> operands) {
  if (!tEnabled) return std::nullopt;
  for (const Tensor* t : operands) {
    if (!t->defined()) continue;
    DType d = t->dtype();
    if (d == DType::Float32 || (isLowPrecision(d) && d != tDType)) return tDType;
  }
  return std::nullopt;
}

std::optional<DType> float32For(std::initializer_list<const Tensor*> operands) {
  if (!tEnabled) return std::nullopt;
  for (const Tensor* t : operands) {
    if (t->defined() && isLowPrecision(t->dtype())) return DType::Float32;
  }
  return std::nullopt;
}

std::optional<DType> promotedFor(std::initializer_list<const Tensor*> operands) {
  if (!tEnabled) return std::nullopt;
  std::vector<Tensor> all;
  for (const Tensor* t : operands) all.push_back(*t);
  return promotedFor(all);
}

std::optional<DType> promotedFor(const std::vector<Tensor>& operands) {
  if (!tEnabled) return std::nullopt;
  std::optional<DType> widest;
  bool differ = false;
  for (const Tensor& t : operands) {
    if (!t.defined() || !isFloating(t.dtype())) continue;
    if (widest && *widest != t.dtype()) differ = true;
    widest = widest ? wider(*widest, t.dtype()) : t.dtype();
  }
  return differ ? widest : std::nullopt;
}

Tensor cast(const Tensor& t, DType d, bool castDouble) {
  if (!t.defined() || !isFloating(t.dtype()) || t.dtype() == d) return t;
  if (t.dtype() == DType::Float64 && !castDouble) return t;
  return t.to(d);
}

}  // namespace detail

}  // namespace weft::autocast
