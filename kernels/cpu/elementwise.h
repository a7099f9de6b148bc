// Elementwise kernels: binary ops over broadcast strided operands, unary ops
// (optionally with scalar parameters) over contiguous buffers. bfloat16 and
// float16 operands are converted to float32 in blocks (kernels/cpu/copy.h),
// computed by the float32 code and rounded back once per result.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"

namespace weft::kernels::cpu {

enum class BinaryOp { Add, Sub, Mul, Div, Pow, Maximum, Minimum };

// out (contiguous, `shape`) = a op b. aStrides/bStrides are element strides
// broadcast to `shape` (0 on broadcast dimensions). All three share `type`.
void binary(BinaryOp op, DType type, const void* a, std::span<const int64_t> aStrides, const void* b,
            std::span<const int64_t> bStrides, void* out, std::span<const int64_t> shape);

enum class UnaryOp {
  Neg,
  Exp,
  Log,
  Sqrt,
  Abs,
  Sign,
  Relu,
  Tanh,
  Sigmoid,
  Gelu,       // exact (erf) form, as PyTorch's default
  PowScalar,  // x ^ p0
  Clamp,      // min(max(x, p0), p1)
  AddScalar,  // x + p0
  MulScalar,  // x * p0
  Square,
  Reciprocal,
};

// out[i] = op(in[i]) for n contiguous elements; in and out may alias.
// Numeric dtypes; integer results wrap. Float32 Tanh, Sigmoid and Gelu run
// the vectorised functions of kernels/cpu/vec_math.h (tanh within 3 ulp,
// sigmoid within 2, GELU within 16); the other floating ops and dtypes call
// the C library per value (float64 throughout for Sigmoid of 32-bit types
// otherwise). p0/p1 are converted to the dtype
// first (integers through int64: a non-finite scalar is an
// InvalidArgumentError).
void unary(UnaryOp op, DType type, const void* in, void* out, int64_t n, double p0 = 0, double p1 = 0);

// a[i] += alpha * b[i] for n contiguous elements (the gradient accumulator's
// and optimizers' workhorse).
void axpy(DType type, double alpha, const void* b, void* a, int64_t n);

// x[i] *= scale for n contiguous floating elements (scale as float32 for the
// float32 and 16-bit dtypes), in one pass that also reports whether any x[i]
// was inf or NaN before scaling: a loss scaler's unscale and overflow check.
bool scaleAndCheckFinite(DType type, void* x, int64_t n, double scale);

}  // namespace weft::kernels::cpu

namespace weft::kernels::cpu {

// Gradient of a unary op: gx[i] = g[i] * op'(x[i]) for n contiguous elements.
// `y` is the forward output (used by Exp, Sqrt, Tanh, Sigmoid; may be null for
// the others). p0/p1 as in unary().
void unaryBackward(UnaryOp op, DType type, const void* x, const void* y, const void* g, void* gx, int64_t n,
                   double p0 = 0, double p1 = 0);

enum class CompareOp { Eq, Gt, Lt };
// out (contiguous bool, `shape`) = a op b, with broadcast strides as binary().
void compare(CompareOp op, DType type, const void* a, std::span<const int64_t> aStrides, const void* b,
             std::span<const int64_t> bStrides, bool* out, std::span<const int64_t> shape);

}  // namespace weft::kernels::cpu
