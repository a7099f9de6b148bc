// Gradient rules of joining, splitting and gathering (see grad_rules.h). g is
// the gradient of the output (of each piece, for split).
#include "kernels/cpu/index.h"
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/ops_shape.h"

namespace weft::grad_rules {

using Grads = std::vector<Tensor>;

// d/d(input k) = the slice of g along dim where input k was placed
void catBackward(const std::vector<Tensor>& inputs, const Tensor& out, std::vector<int64_t> sizes, int64_t dim) {
  if (!anyRequiresGrad(inputs)) return;
  recordOp("CatBackward", inputs, {out}, [sizes = std::move(sizes), dim](const Grads& g) {
    Grads grads;
    grads.reserve(sizes.size());
    int64_t start = 0;
    for (int64_t len : sizes) {
      grads.push_back(g[0].narrow(dim, start, len));
      start += len;
    }
    return grads;
  });
}

// d/d(input k) = g selected at k along dim
void stackBackward(const std::vector<Tensor>& inputs, const Tensor& out, int64_t dim) {
  if (!anyRequiresGrad(inputs)) return;
  int64_t count = static_cast<int64_t>(inputs.size());
  recordOp("StackBackward", inputs, {out}, [count, dim](const Grads& g) {
    Grads grads;
    grads.reserve(count);
    for (int64_t k = 0; k < count; ++k) grads.push_back(g[0].select(dim, k));
    return grads;
  });
}

// d/da = the pieces' gradients joined along dim
void splitBackward(const Tensor& a, const std::vector<Tensor>& pieces, int64_t dim) {
  if (!anyRequiresGrad({&a})) return;
  recordOp("SplitBackward", {a}, pieces, [dim](const Grads& g) { return Grads{cat(g, dim)}; });
}

// d/da = g scattered back (and summed) to the selected rows
void indexSelectBackward(const Tensor& a, const Tensor& out, const Tensor& index, int64_t outer, int64_t size,
                         int64_t inner) {
  if (!anyRequiresGrad({&a})) return;
  SavedTensor savedIndex(index);
  Shape inShape = a.shape();
  int64_t n = index.numel();
  recordOp("IndexSelectBackward", {a}, {out}, [savedIndex, inShape, outer, size, inner, n](const Grads& g) {
    Tensor ix = savedIndex.unpack("IndexSelectBackward");
    Tensor go = g[0].contiguous();
    Tensor gi = empty(inShape, {.dtype = go.dtype()});
    if (gi.numel() > 0) {
      kernels::cpu::indexSelectBackward(go.dtype(), go.rawData(), outer, size, inner, ix.data<int64_t>(), n,
                                        gi.rawData());
    }
    return Grads{gi};
  });
}

}  // namespace weft::grad_rules
