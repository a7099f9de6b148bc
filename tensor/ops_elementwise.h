// Elementwise ops. Binary ops broadcast like NumPy/PyTorch (sizes aligned from
// the right; a size of 1 stretches) and require equal dtypes and devices.
// Gradients of broadcast inputs are summed back to the input's shape.
// Arithmetic takes the numeric dtypes (float32, float64, int64, int32, uint8;
// integer results wrap, integer division truncates); exp, log, sqrt, tanh,
// sigmoid, gelu, pow by a scalar and 1 / x take floating dtypes only; bool
// takes only the comparisons. Other dtypes are an InvalidArgumentError naming
// the op and the dtype (see common/dtype.h).
#pragma once

#include "tensor/tensor.h"

namespace weft {

// The shape two operands broadcast to; InvalidArgumentError naming `op` and
// both shapes when they cannot.
Shape broadcastShapes(const Shape& a, const Shape& b, const char* op);

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor square(const Tensor& a);
// min/max may be ±infinity for a one-sided clamp. Gradient 1 inside [min,max].
Tensor clamp(const Tensor& a, double min, double max);
Tensor relu(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor gelu(const Tensor& a);  // exact erf form

// Comparisons: not differentiable; bool masks (any dtype but float16/bfloat16).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);

// Selection, as torch.where / Tensor.masked_fill / torch.triu / torch.tril.
// Any dtype (the values are moved, never read); differentiable in a and b
// (where), x (the others): the gradient flows to the elements that were
// kept and is zero where a value or zero replaced them.
//
// out = cond ? a : b, the three broadcast together. cond must be Bool and a
// and b of one dtype and device (InvalidArgumentError naming the op, the
// dtypes or the shapes otherwise).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` where mask is true; mask is Bool and must broadcast to x's
// shape (the result has x's shape). value is converted to x's dtype as
// full() does; a non-finite value for an integer or bool x is an
// InvalidArgumentError.
Tensor maskedFill(const Tensor& x, const Tensor& mask, double value);
// The upper (triu) or lower (tril) triangle of the matrices in x's last two
// dimensions, [..., R, C]: element (i, j) is kept when j - i >= diagonal
// (triu) or j - i <= diagonal (tril), else zero; diagonal 0 is the main
// diagonal, positive above it. x must have at least two dimensions.
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);

// Element-wise closeness, as torch.allclose.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

}  // namespace weft
