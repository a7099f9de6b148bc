// Gradient rules of joining, splitting and gathering (see grad_rules.h). g is
// the gradient of the output (of each piece, for split).
#include "kernels/cpu/index.h"
#include "kernels/cuda/index.h"
#include "kernels/cuda_call.h"
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
    Tensor gi = empty(inShape, {.dtype = go.dtype(), .device = go.device()});
    if (gi.numel() > 0) {
      if (go.device().isCuda()) {
        WEFT_CUDA_CALL(go.device().index, indexSelectBackward(go.dtype(), go.rawData(), outer, size, inner,
                                                              ix.data<int64_t>(), n, gi.rawData()));
      } else {
        kernels::cpu::indexSelectBackward(go.dtype(), go.rawData(), outer, size, inner, ix.data<int64_t>(), n,
                                          gi.rawData());
      }
    }
    return Grads{gi};
  });
}

// d/dx = g scatter-added back to where each element was gathered from
void gatherBackward(const Tensor& x, const Tensor& out, const Tensor& index, int64_t dim) {
  if (!anyRequiresGrad({&x})) return;
  SavedTensor si(index);
  Shape xShape = x.shape();
  recordOp("GatherBackward", {x}, {out}, [si, xShape, dim](const Grads& g) {
    Tensor ix = si.unpack("GatherBackward");
    Tensor gx = zeros(xShape, {.dtype = g[0].dtype(), .device = g[0].device()});
    Tensor gv = g[0].dim() == 0 ? g[0].view({1}) : g[0];
    Tensor gxv = gx.dim() == 0 ? gx.view({1}) : gx;
    if (ix.numel() > 0) {
      if (gx.device().isCuda()) {
        WEFT_CUDA_CALL(gx.device().index, scatterAddForward(gx.dtype(), gxv.rawData(), gxv.strides(), dim,
                                                            ix.data<int64_t>(), ix.shape(), gv.rawData(),
                                                            gv.strides()));
      } else {
        kernels::cpu::scatterAddForward(gx.dtype(), gxv.rawData(), gxv.strides(), dim, ix.data<int64_t>(),
                                        ix.shape(), gv.rawData(), gv.strides());
      }
    }
    return Grads{gx};
  });
}

// d/dx = g; d/dsrc = g gathered at index, zero beyond index's extent
void scatterAddBackward(const Tensor& x, const Tensor& src, const Tensor& out, const Tensor& index, int64_t dim) {
  if (!anyRequiresGrad({&x, &src})) return;
  bool needSrc = src.requiresGrad();
  SavedTensor si(needSrc ? index : Tensor());
  Shape srcShape = src.shape(), indexShape = index.shape();
  recordOp("ScatterAddBackward", {x, src}, {out}, [si, needSrc, srcShape, indexShape, dim](const Grads& g) {
    if (!needSrc) return Grads{g[0], Tensor()};
    Tensor ix = si.unpack("ScatterAddBackward");
    Tensor gv = g[0].dim() == 0 ? g[0].view({1}) : g[0];
    Tensor gs = gather(gv, dim, ix);
    if (gs.shape() != srcShape) {
      // index covers part of src (or src is 0-D and index [1]): place the
      // gathered block at src's origin.
      Tensor full = zeros(srcShape, {.dtype = gs.dtype(), .device = gs.device()});
      Tensor region = srcShape.empty() ? full.view({1}) : full;
      for (int64_t d = 0; d < static_cast<int64_t>(indexShape.size()); ++d) region = region.narrow(d, 0, indexShape[d]);
      region.copy_(gs);
      gs = full;
    }
    return Grads{g[0], gs};
  });
}

}  // namespace weft::grad_rules
