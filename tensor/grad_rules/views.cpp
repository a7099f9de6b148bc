// Gradient rules of the view ops, clone and the conversions (see
// grad_rules.h). g is the gradient of the output; each rule undoes its view.
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/ops.h"

namespace weft::grad_rules {

using Grads = std::vector<Tensor>;

// d/din = g reshaped to in's shape
void viewBackward(const Tensor& in, const Tensor& out) {
  if (!anyRequiresGrad({&in})) return;
  Shape inShape = in.shape();
  recordOp("ViewBackward", {in}, {out}, [inShape](const Grads& g) { return Grads{g[0].reshape(inShape)}; });
}

// d/din = g transposed back
void transposeBackward(const Tensor& in, const Tensor& out, int64_t d0, int64_t d1) {
  if (!anyRequiresGrad({&in})) return;
  recordOp("TransposeBackward", {in}, {out}, [d0, d1](const Grads& g) { return Grads{g[0].transpose(d0, d1)}; });
}

// d/din = g permuted by the inverse permutation
void permuteBackward(const Tensor& in, const Tensor& out, const Shape& inverse) {
  if (!anyRequiresGrad({&in})) return;
  recordOp("PermuteBackward", {in}, {out}, [inverse](const Grads& g) { return Grads{g[0].permute(inverse)}; });
}

// d/din = zeros with g in the narrowed range
void narrowBackward(const Tensor& in, const Tensor& out, int64_t dim, int64_t start, int64_t length) {
  if (!anyRequiresGrad({&in})) return;
  Shape inShape = in.shape();
  DType dt = in.dtype();
  Device dev = in.device();
  recordOp("NarrowBackward", {in}, {out}, [inShape, dt, dev, dim, start, length](const Grads& g) {
    Tensor gi = zeros(inShape, {.dtype = dt, .device = dev});
    gi.narrow(dim, start, length).copy_(g[0]);
    return Grads{gi};
  });
}

// d/din = zeros with g at the selected index
void selectBackward(const Tensor& in, const Tensor& out, int64_t dim, int64_t index) {
  if (!anyRequiresGrad({&in})) return;
  Shape inShape = in.shape();
  DType dt = in.dtype();
  Device dev = in.device();
  recordOp("SelectBackward", {in}, {out}, [inShape, dt, dev, dim, index](const Grads& g) {
    Tensor gi = zeros(inShape, {.dtype = dt, .device = dev});
    gi.select(dim, index).copy_(g[0]);
    return Grads{gi};
  });
}

// d/din = g summed over the expanded dimensions
void expandBackward(const Tensor& in, const Tensor& out) {
  if (!anyRequiresGrad({&in})) return;
  Shape inShape = in.shape();
  recordOp("ExpandBackward", {in}, {out}, [inShape](const Grads& g) { return Grads{sumTo(g[0], inShape)}; });
}

// d/din = g
void cloneBackward(const Tensor& in, const Tensor& out) {
  if (!anyRequiresGrad({&in})) return;
  recordOp("CloneBackward", {in}, {out}, [](const Grads& g) { return Grads{g[0]}; });
}

// d/din = g converted back to in's dtype
void toDTypeBackward(const Tensor& in, const Tensor& out) {
  if (!anyRequiresGrad({&in}) || !isFloating(out.dtype())) return;
  DType from = in.dtype();
  recordOp("ToDTypeBackward", {in}, {out}, [from](const Grads& g) { return Grads{g[0].to(from)}; });
}

// d/din = g moved back to in's device
void toDeviceBackward(const Tensor& in, const Tensor& out) {
  if (!anyRequiresGrad({&in})) return;
  Device from = in.device();
  recordOp("ToDeviceBackward", {in}, {out}, [from](const Grads& g) { return Grads{g[0].to(from)}; });
}

}  // namespace weft::grad_rules
