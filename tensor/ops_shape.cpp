// Joining (cat, stack), splitting (split, chunk), gathering (indexSelect,
// gather) and scattering (scatterAdd).
// split and chunk return views of their input that share one backward node.
// Their gradient rules are in grad_rules/shape.cpp.
#include "tensor/ops_shape.h"

#include <algorithm>

#include "kernels/cpu/index.h"
#include "kernels/cuda/index.h"
#include "kernels/cuda_call.h"
#include "tensor/autocast.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/op_checks.h"
#include "tensor/op_layout.h"

namespace weft {
namespace {

int64_t productOf(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t d = begin; d < end; ++d) p *= s[d];
  return p;
}

// The checks shared by cat and stack: a non-empty list of defined tensors of
// one dtype and device. Returns the first tensor.
const Tensor& checkJoinInputs(const std::vector<Tensor>& tensors, const char* op) {
  WEFT_ENFORCE(!tensors.empty(), InvalidArgumentError, op, ": expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    WEFT_ENFORCE(t.defined(), InvalidArgumentError, op, ": tensor ", k, " is undefined");
    WEFT_ENFORCE(t.dtype() == first.dtype(), InvalidArgumentError, op, ": tensor ", k, " has dtype ",
                 dtypeName(t.dtype()), " but tensor 0 has dtype ", dtypeName(first.dtype()));
    WEFT_ENFORCE(t.device() == first.device(), InvalidArgumentError, op, ": tensor ", k, " is on ", t.device().str(),
                 " but tensor 0 is on ", first.device().str());
  }
  return first;
}

// Copies each input, seen as [outer, rows_k] (contiguous), into `out` seen as
// [outer, sum of rows_k], side by side in list order.
void joinInto(const std::vector<Tensor>& tensors, const std::vector<int64_t>& rows, int64_t outer, Tensor& out) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  int64_t offset = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].numel() > 0) {
      Tensor x = tensors[k].contiguous();
      if (out.device().isCuda()) {
        WEFT_CUDA_CALL(out.device().index,
                       catForward(out.dtype(), x.rawData(), outer, rows[k], out.rawData(), total, offset));
      } else {
        kernels::cpu::catForward(out.dtype(), x.rawData(), outer, rows[k], out.rawData(), total, offset);
      }
    }
    offset += rows[k];
  }
}

Tensor viewOf(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  return makeTensor(base.storage(), std::move(shape), std::move(strides), offset, base.dtype());
}

// Views of `a` along dim with the given sizes (which sum to its size there),
// all produced by one SplitBackward node whose gradient is their cat.
std::vector<Tensor> splitBySizes(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t len : sizes) {
    Shape sh = a.shape();
    sh[dim] = len;
    pieces.push_back(viewOf(a, sh, a.strides(), a.storageOffset() + start * a.strides()[dim]));
    start += len;
  }
  grad_rules::splitBackward(a, pieces, dim);
  return pieces;
}

// Calls fail(j, index[j]) (which throws) for the first index of the
// contiguous Int64 `idx` outside [0, size). On a device only the smallest and
// largest index come back to the host, and all of them when one is out of range.
template <class F>
void checkIndexValues(const Tensor& idx, int64_t size, F&& fail) {
  if (idx.device().isCuda()) {
    int64_t lo = 0, hi = 0;
    WEFT_CUDA_CALL(idx.device().index, indexRange(idx.data<int64_t>(), idx.numel(), &lo, &hi));
    if (idx.numel() == 0 || (lo >= 0 && hi < size)) return;
    checkIndexValues(idx.to(Device::cpu()), size, fail);
    return;
  }
  const int64_t* ip = idx.data<int64_t>();
  for (int64_t j = 0; j < idx.numel(); ++j) {
    if (ip[j] < 0 || ip[j] >= size) fail(j, ip[j]);
  }
}

void requireDeviceOf(const char* op, const Tensor& index, const Tensor& x) {
  WEFT_ENFORCE(index.device() == x.device(), InvalidArgumentError, op, ": index on ", index.device().str(),
               " but the input on ", x.device().str(), "; both must be on one device");
}

// The checks gather and scatterAdd share: index Int64 on x's device with x's
// rank, no larger than x except along dim, and every value in [0, x.size(dim)).
// Returns dim wrapped; a 0-D x, index (and src) are handled as shape [1].
int64_t checkIndexing(const char* op, const Tensor& x, int64_t dim, const Tensor& index) {
  detail::checkDefined(op, x, "input");
  detail::checkDefined(op, index, "index");
  detail::requireDType(op, index, DType::Int64, "index");
  requireDeviceOf(op, index, x);
  WEFT_ENFORCE(index.dim() == x.dim(), InvalidArgumentError, op, ": index of shape ", index.shape(),
               " must have as many dimensions as the input of shape ", x.shape());
  dim = wrapDim(dim, std::max<int64_t>(x.dim(), 1), op);
  for (int64_t d = 0; d < x.dim(); ++d) {
    WEFT_ENFORCE(d == dim || index.size(d) <= x.size(d), InvalidArgumentError, op, ": index of shape ",
                 index.shape(), " is larger than the input of shape ", x.shape(), " in dimension ", d,
                 " (only dimension ", dim, " may be larger)");
  }
  const int64_t size = x.dim() == 0 ? 1 : x.size(dim);
  checkIndexValues(index.contiguous(), size, [&](int64_t j, int64_t v) {
    throw IndexError(::weft::detail::concat(op, ": index ", v, " (at flat position ", j, " of index shape ",
                                            index.shape(), ") is out of range for dimension ", dim, " of size ", size,
                                            " in input shape ", x.shape()));
  });
  return dim;
}

// A 0-D tensor as shape [1], others as they are: the kernels take rank >= 1.
Tensor atLeast1d(const Tensor& t) { return t.dim() == 0 ? t.view({1}) : t; }

}  // namespace

namespace {

std::vector<Tensor> castAll(const std::vector<Tensor>& tensors, DType d) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) out.push_back(autocast::detail::cast(t, d, true));
  return out;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (auto d = autocast::detail::promotedFor(tensors)) return cat(castAll(tensors, *d), dim);
  const Tensor& first = checkJoinInputs(tensors, "cat");
  WEFT_ENFORCE(first.dim() > 0, InvalidArgumentError, "cat: zero-dimensional tensors cannot be concatenated; use stack");
  dim = wrapDim(dim, first.dim(), "cat");
  Shape outShape = first.shape();
  outShape[dim] = 0;
  std::vector<int64_t> sizes;
  sizes.reserve(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Shape& s = tensors[k].shape();
    bool match = s.size() == outShape.size();
    for (size_t d = 0; match && d < s.size(); ++d) match = static_cast<int64_t>(d) == dim || s[d] == first.shape()[d];
    WEFT_ENFORCE(match, InvalidArgumentError, "cat: tensor ", k, " has shape ", s, " but tensor 0 has shape ",
                 first.shape(), "; all sizes must match except in dimension ", dim);
    sizes.push_back(s[dim]);
    outShape[dim] += s[dim];
  }
  Tensor out = empty(outShape, {.dtype = first.dtype(), .device = first.device()});
  int64_t outer = productOf(outShape, 0, dim), inner = productOf(outShape, dim + 1, outShape.size());
  if (out.numel() > 0) {
    std::vector<int64_t> rows(sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) rows[k] = sizes[k] * inner;
    joinInto(tensors, rows, outer, out);
  }
  grad_rules::catBackward(tensors, out, std::move(sizes), dim);
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (auto d = autocast::detail::promotedFor(tensors)) return stack(castAll(tensors, *d), dim);
  const Tensor& first = checkJoinInputs(tensors, "stack");
  dim = wrapDim(dim, first.dim() + 1, "stack");
  for (size_t k = 0; k < tensors.size(); ++k) {
    WEFT_ENFORCE(tensors[k].shape() == first.shape(), InvalidArgumentError, "stack: tensor ", k, " has shape ",
                 tensors[k].shape(), " but tensor 0 has shape ", first.shape(), "; stack needs equal shapes");
  }
  Shape outShape = first.shape();
  outShape.insert(outShape.begin() + dim, static_cast<int64_t>(tensors.size()));
  Tensor out = empty(outShape, {.dtype = first.dtype(), .device = first.device()});
  if (out.numel() > 0) {
    int64_t outer = productOf(first.shape(), 0, dim), inner = productOf(first.shape(), dim, first.shape().size());
    joinInto(tensors, std::vector<int64_t>(tensors.size(), inner), outer, out);
  }
  grad_rules::stackBackward(tensors, out, dim);
  return out;
}

std::vector<Tensor> split(const Tensor& a, int64_t splitSize, int64_t dim) {
  detail::checkDefined("split", a, "input");
  WEFT_ENFORCE(a.dim() > 0, InvalidArgumentError, "split: cannot split a zero-dimensional tensor");
  dim = wrapDim(dim, a.dim(), "split");
  int64_t size = a.shape()[dim];
  WEFT_ENFORCE(splitSize > 0 || (splitSize == 0 && size == 0), InvalidArgumentError, "split: split size ",
               splitSize, " is invalid for dimension ", dim, " of size ", size, " (it must be positive)");
  std::vector<int64_t> sizes;
  if (size == 0) sizes.push_back(0);
  for (int64_t start = 0; start < size; start += splitSize) sizes.push_back(std::min(splitSize, size - start));
  return splitBySizes(a, sizes, dim);
}

std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim) {
  detail::checkDefined("split", a, "input");
  WEFT_ENFORCE(a.dim() > 0, InvalidArgumentError, "split: cannot split a zero-dimensional tensor");
  dim = wrapDim(dim, a.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    WEFT_ENFORCE(s >= 0, InvalidArgumentError, "split: negative size in ", sizes);
    total += s;
  }
  WEFT_ENFORCE(total == a.shape()[dim], InvalidArgumentError, "split: sizes ", sizes, " sum to ", total,
               " but dimension ", dim, " of shape ", a.shape(), " has size ", a.shape()[dim]);
  return splitBySizes(a, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim) {
  detail::checkDefined("chunk", a, "input");
  WEFT_ENFORCE(chunks > 0, InvalidArgumentError, "chunk: the number of chunks must be positive, got ", chunks);
  WEFT_ENFORCE(a.dim() > 0, InvalidArgumentError, "chunk: cannot chunk a zero-dimensional tensor");
  dim = wrapDim(dim, a.dim(), "chunk");
  int64_t size = a.shape()[dim];
  // As torch.chunk: pieces of ceil(size / chunks), so fewer than `chunks`
  // may come back; an empty dimension gives `chunks` empty pieces.
  if (size == 0) return splitBySizes(a, std::vector<int64_t>(chunks, 0), dim);
  return split(a, (size + chunks - 1) / chunks, dim);
}

Tensor indexSelect(const Tensor& a, int64_t dim, const Tensor& index) {
  detail::checkDefined("indexSelect", a, "input");
  detail::requireDType("indexSelect", index, DType::Int64, "index");
  requireDeviceOf("indexSelect", index, a);
  WEFT_ENFORCE(index.dim() <= 1, InvalidArgumentError, "indexSelect: index must be 0-D or 1-D, got shape ",
               index.shape());
  dim = wrapDim(dim, a.dim(), "indexSelect");
  Tensor idx = index.contiguous();
  const int64_t* ip = idx.data<int64_t>();
  int64_t n = idx.numel();
  int64_t size = a.dim() == 0 ? 1 : a.shape()[dim];
  checkIndexValues(idx, size, [&](int64_t j, int64_t v) {
    throw IndexError(::weft::detail::concat("indexSelect: index ", v, " (at position ", j,
                                            ") is out of range for dimension ", dim, " of size ", size, " in shape ",
                                            a.shape()));
  });
  Shape outShape = a.shape();
  if (a.dim() == 0) {
    WEFT_ENFORCE(n == 1, InvalidArgumentError, "indexSelect: a zero-dimensional input takes exactly one index, got ",
                 n);
  } else {
    outShape[dim] = n;
  }
  int64_t outer = productOf(a.shape(), 0, dim), inner = a.dim() == 0 ? 1 : productOf(a.shape(), dim + 1, a.dim());
  Tensor out = empty(outShape, {.dtype = a.dtype(), .device = a.device()});
  if (out.numel() > 0) {
    Tensor x = a.contiguous();
    if (a.device().isCuda()) {
      WEFT_CUDA_CALL(a.device().index, indexSelectForward(a.dtype(), x.rawData(), outer, size, inner, ip, n,
                                                          out.rawData()));
    } else {
      kernels::cpu::indexSelectForward(a.dtype(), x.rawData(), outer, size, inner, ip, n, out.rawData());
    }
  }
  grad_rules::indexSelectBackward(a, out, idx, outer, size, inner);
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  dim = checkIndexing("gather", x, dim, index);
  Tensor idx = atLeast1d(index.contiguous()), xv = atLeast1d(x);
  Tensor out = empty(index.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (out.numel() > 0) {
    if (x.device().isCuda()) {
      WEFT_CUDA_CALL(x.device().index, gatherForward(x.dtype(), xv.rawData(), xv.strides(), dim, idx.data<int64_t>(),
                                                     idx.shape(), out.rawData()));
    } else {
      kernels::cpu::gatherForward(x.dtype(), xv.rawData(), xv.strides(), dim, idx.data<int64_t>(), idx.shape(),
                                  out.rawData());
    }
  }
  grad_rules::gatherBackward(x, out, idx, dim);
  return out;
}

Tensor scatterAdd(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatterAdd";
  dim = checkIndexing(op, x, dim, index);
  detail::checkSameKind(op, x, src);
  detail::requireNumeric(op, x);
  WEFT_ENFORCE(src.dim() == index.dim(), InvalidArgumentError, op, ": src of shape ", src.shape(),
               " must have as many dimensions as index of shape ", index.shape());
  for (int64_t d = 0; d < src.dim(); ++d) {
    WEFT_ENFORCE(index.size(d) <= src.size(d), InvalidArgumentError, op, ": index of shape ", index.shape(),
                 " is larger than src of shape ", src.shape(), " in dimension ", d);
  }
  if (isLowPrecision(x.dtype())) {  // accumulated in float32, rounded once
    return scatterAdd(x.to(DType::Float32), dim, index, src.to(DType::Float32)).to(x.dtype());
  }
  Tensor idx = atLeast1d(index.contiguous()), sv = atLeast1d(src);
  Tensor out = x.contiguous().clone().detach();
  Tensor ov = atLeast1d(out);
  if (idx.numel() > 0) {
    if (x.device().isCuda()) {
      WEFT_CUDA_CALL(x.device().index, scatterAddForward(x.dtype(), ov.rawData(), ov.strides(), dim,
                                                         idx.data<int64_t>(), idx.shape(), sv.rawData(),
                                                         sv.strides()));
    } else {
      kernels::cpu::scatterAddForward(x.dtype(), ov.rawData(), ov.strides(), dim, idx.data<int64_t>(), idx.shape(),
                                      sv.rawData(), sv.strides());
    }
  }
  grad_rules::scatterAddBackward(x, src, out, idx, dim);
  return out;
}

Tensor Tensor::indexSelect(int64_t dim, const Tensor& index) const { return weft::indexSelect(*this, dim, index); }

}  // namespace weft
