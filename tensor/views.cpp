// View operations: new shape/strides over the same storage. contiguous() and
// clone() copy. Their gradient rules are in grad_rules/views.cpp.
#include <algorithm>
#include <numeric>

#include "kernels/cpu/copy.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/copy.h"
#endif
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/ops.h"

namespace weft {
namespace {

Tensor viewOf(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  return makeTensor(base.storage(), std::move(shape), std::move(strides), offset, base.dtype());
}

// Resolves one -1 entry and checks the element count.
Shape inferShape(Shape shape, int64_t numel, const char* op) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      WEFT_ENFORCE(infer < 0, InvalidArgumentError, op, ": only one dimension can be -1 in ", shape);
      infer = static_cast<int64_t>(i);
    } else {
      WEFT_ENFORCE(shape[i] >= 0, InvalidArgumentError, op, ": invalid size in shape ", shape);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    WEFT_ENFORCE(known != 0 && numel % known == 0, InvalidArgumentError, op, ": shape ", shape,
                 " is invalid for ", numel, " elements");
    shape[infer] = numel / known;
  }
  WEFT_ENFORCE(shapeNumel(shape) == numel, InvalidArgumentError, op, ": shape ", shape, " is invalid for ", numel,
               " elements");
  return shape;
}

// Strides for viewing (oldShape, oldStrides) as newShape without copying, or
// empty when impossible (the algorithm of PyTorch's computeStride).
bool viewStrides(const Shape& oldShape, const Shape& oldStrides, const Shape& newShape, Shape& out) {
  out.assign(newShape.size(), 0);
  if (shapeNumel(oldShape) == 0 || oldShape.empty()) {
    out = contiguousStrides(newShape);
    return true;
  }
  int64_t viewD = static_cast<int64_t>(newShape.size()) - 1;
  int64_t chunkBase = oldStrides.empty() ? 1 : oldStrides.back();
  int64_t tensorNumel = 1, viewNumel = 1;
  for (int64_t d = static_cast<int64_t>(oldShape.size()) - 1; d >= 0; --d) {
    tensorNumel *= oldShape[d];
    if (d == 0 || (oldShape[d - 1] != 1 && oldStrides[d - 1] != tensorNumel * chunkBase)) {
      while (viewD >= 0 && (viewNumel < tensorNumel || newShape[viewD] == 1)) {
        out[viewD] = viewNumel * chunkBase;
        viewNumel *= newShape[viewD];
        --viewD;
      }
      if (viewNumel != tensorNumel) return false;
      if (d > 0) {
        chunkBase = oldStrides[d - 1];
        tensorNumel = 1;
        viewNumel = 1;
      }
    }
  }
  return viewD == -1;
}

}  // namespace

Tensor Tensor::view(Shape s) const {
  s = inferShape(std::move(s), numel(), "view");
  Shape st;
  WEFT_ENFORCE(viewStrides(shape(), strides(), s, st), InvalidArgumentError, "view: shape ", s,
               " is incompatible with the strides ", strides(), " of a tensor of shape ", shape(),
               "; use reshape() (which copies when needed)");
  Tensor out = viewOf(*this, s, st, storageOffset());
  grad_rules::viewBackward(*this, out);
  return out;
}

Tensor Tensor::reshape(Shape s) const {
  s = inferShape(std::move(s), numel(), "reshape");
  Shape st;
  if (viewStrides(shape(), strides(), s, st)) return view(std::move(s));
  return contiguous().view(std::move(s));
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t n = dim();
  d0 = wrapDim(d0, n, "transpose");
  d1 = wrapDim(d1, n, "transpose");
  if (n == 0) return *this;
  Shape sh = shape(), st = strides();
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  Tensor out = viewOf(*this, sh, st, storageOffset());
  grad_rules::transposeBackward(*this, out, d0, d1);
  return out;
}

Tensor Tensor::t() const {
  WEFT_ENFORCE(dim() <= 2, InvalidArgumentError, "t: expected a tensor of at most 2 dimensions, got shape ", shape());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(Shape dims) const {
  int64_t n = dim();
  WEFT_ENFORCE(static_cast<int64_t>(dims.size()) == n, InvalidArgumentError, "permute: ", dims.size(),
               " dims given for a tensor of shape ", shape());
  std::vector<bool> seen(n, false);
  Shape sh(n), st(n), inverse(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrapDim(dims[i], n, "permute");
    WEFT_ENFORCE(!seen[d], InvalidArgumentError, "permute: dimension ", d, " repeated in ", dims);
    seen[d] = true;
    sh[i] = shape()[d];
    st[i] = strides()[d];
    inverse[d] = i;
  }
  Tensor out = viewOf(*this, sh, st, storageOffset());
  grad_rules::permuteBackward(*this, out, inverse);
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrapDim(d, dim(), "narrow");
  int64_t sz = shape()[d];
  if (start < 0) start += sz;
  WEFT_ENFORCE(start >= 0 && length >= 0 && start + length <= sz, IndexError, "narrow: range [", start, ", ",
               start + length, ") out of bounds for dimension ", d, " of size ", sz);
  Shape sh = shape();
  sh[d] = length;
  Tensor out = viewOf(*this, sh, strides(), storageOffset() + start * strides()[d]);
  grad_rules::narrowBackward(*this, out, d, start, length);
  return out;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  WEFT_ENFORCE(dim() > 0, IndexError, "select: cannot select from a 0-dimensional tensor");
  d = wrapDim(d, dim(), "select");
  int64_t sz = shape()[d];
  WEFT_ENFORCE(index >= -sz && index < sz, IndexError, "select: index ", index, " out of range for dimension ", d,
               " of size ", sz);
  if (index < 0) index += sz;
  Shape sh = shape(), st = strides();
  int64_t off = storageOffset() + index * st[d];
  sh.erase(sh.begin() + d);
  st.erase(st.begin() + d);
  Tensor out = viewOf(*this, sh, st, off);
  grad_rules::selectBackward(*this, out, d, index);
  return out;
}

Tensor Tensor::expand(Shape s) const {
  int64_t n = dim();
  int64_t m = static_cast<int64_t>(s.size());
  WEFT_ENFORCE(m >= n, InvalidArgumentError, "expand: cannot expand shape ", shape(), " to ", s);
  Shape st(m);
  for (int64_t i = m - 1; i >= 0; --i) {
    int64_t j = i - (m - n);
    if (j >= 0) {
      int64_t cur = shape()[j];
      if (s[i] == -1) s[i] = cur;
      WEFT_ENFORCE(cur == s[i] || cur == 1, InvalidArgumentError, "expand: cannot expand shape ", shape(), " to ", s,
                   " (dimension ", i, ")");
      st[i] = cur == s[i] ? strides()[j] : 0;
    } else {
      WEFT_ENFORCE(s[i] >= 0, InvalidArgumentError, "expand: -1 is not allowed in a new leading dimension: ", s);
      st[i] = 0;
    }
  }
  if (s == shape()) return *this;
  Tensor out = viewOf(*this, s, st, storageOffset());
  grad_rules::expandBackward(*this, out);
  return out;
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrapDim(d, dim(), "squeeze");
  if (dim() == 0 || shape()[d] != 1) return *this;
  Shape sh = shape();
  sh.erase(sh.begin() + d);
  return view(sh);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrapDim(d, dim() + 1, "unsqueeze");
  Shape sh = shape();
  sh.insert(sh.begin() + d, 1);
  return reshape(sh);
}

Tensor Tensor::flatten(int64_t startDim, int64_t endDim) const {
  if (dim() == 0) return reshape({1});
  startDim = wrapDim(startDim, dim(), "flatten");
  endDim = wrapDim(endDim, dim(), "flatten");
  WEFT_ENFORCE(startDim <= endDim, InvalidArgumentError, "flatten: startDim ", startDim, " after endDim ", endDim);
  Shape sh(shape().begin(), shape().begin() + startDim);
  int64_t mid = 1;
  for (int64_t d = startDim; d <= endDim; ++d) mid *= shape()[d];
  sh.push_back(mid);
  sh.insert(sh.end(), shape().begin() + endDim + 1, shape().end());
  return reshape(sh);
}

Tensor Tensor::contiguous() const {
  if (isContiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), {.dtype = dtype(), .device = device()});
  if (device().isCuda()) {
    if (numel()) {
      WEFT_CUDA_CALL(device().index,
                     copyStridedToContiguous(dtype(), rawData(), shape(), strides(), dtype(), out.rawData()));
    }
  } else if (numel()) {
    kernels::cpu::copyStridedToContiguous(dtype(), rawData(), shape(), strides(), dtype(), out.rawData());
  }
  grad_rules::cloneBackward(*this, out);
  return out;
}

}  // namespace weft
