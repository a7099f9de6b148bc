#include "data/dataset.h"

#include <cstring>

#include "common/error.h"

namespace weft::data {
namespace {

Shape batchShape(const Shape& exampleShape, int64_t batch) {
  Shape s{batch};
  s.insert(s.end(), exampleShape.begin(), exampleShape.end());
  return s;
}

// Copies one example tensor into row `row` of the batch tensor `batch`,
// after checking it matches the first example's shape and dtype.
void copyIntoRow(const Tensor& batch, int64_t row, const Tensor& example, int64_t index, const char* what) {
  WEFT_ENFORCE(example.defined(), InvalidArgumentError, "Dataset::getBatch: example ", index, " has no ", what,
               " but earlier examples in the batch do");
  WEFT_ENFORCE(example.dtype() == batch.dtype() && Shape(batch.shape().begin() + 1, batch.shape().end()) == example.shape(),
               InvalidArgumentError, "Dataset::getBatch: example ", index, " has ", what, " of shape ",
               example.shape(), " and dtype ", dtypeName(example.dtype()), ", the batch's first example has shape ",
               Shape(batch.shape().begin() + 1, batch.shape().end()), " and dtype ", dtypeName(batch.dtype()));
  WEFT_ENFORCE(example.device().isCpu(), InvalidArgumentError, "Dataset::getBatch: example ", index, " ", what,
               " is on ", example.device().str(), "; datasets produce CPU tensors");
  const Tensor src = example.contiguous();
  const size_t bytes = src.nbytes();
  std::memcpy(static_cast<char*>(batch.rawData()) + static_cast<size_t>(row) * bytes, src.rawData(), bytes);
}

}  // namespace

Example Dataset::getBatch(std::span<const int64_t> indices) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  WEFT_ENFORCE(b > 0, InvalidArgumentError, "Dataset::getBatch: empty index list");
  Example first = get(indices[0]);
  WEFT_ENFORCE(first.data.defined(), InvalidArgumentError, "Dataset::getBatch: example ", indices[0], " has no data");
  Example out;
  out.data = empty(batchShape(first.data.shape(), b), {.dtype = first.data.dtype()});
  if (first.target.defined()) out.target = empty(batchShape(first.target.shape(), b), {.dtype = first.target.dtype()});
  for (int64_t r = 0; r < b; ++r) {
    Example e = r == 0 ? first : get(indices[r]);
    copyIntoRow(out.data, r, e.data, indices[r], "data");
    if (out.target.defined()) {
      copyIntoRow(out.target, r, e.target, indices[r], "target");
    } else {
      WEFT_ENFORCE(!e.target.defined(), InvalidArgumentError, "Dataset::getBatch: example ", indices[r],
                   " has a target but the batch's first example has none");
    }
  }
  return out;
}

Tensor gatherRows(const Tensor& source, std::span<const int64_t> indices, const char* op) {
  WEFT_ENFORCE(source.dim() >= 1, InvalidArgumentError, op, ": rows of a 0-d tensor");
  WEFT_ENFORCE(source.device().isCpu() && source.isContiguous(), InvalidArgumentError, op,
               ": expected a contiguous CPU tensor, got shape ", source.shape(), " on ", source.device().str());
  const int64_t n = source.size(0);
  for (int64_t i : indices) {
    WEFT_ENFORCE(i >= 0 && i < n, IndexError, op, ": index ", i, " out of range for ", n, " examples");
  }
  const int64_t b = static_cast<int64_t>(indices.size());
  Shape shape = source.shape();
  shape[0] = b;
  Tensor out = empty(shape, {.dtype = source.dtype()});
  const int64_t rowElems = n > 0 ? source.numel() / n : 0;
  const size_t rowBytes = static_cast<size_t>(rowElems) * elementSize(source.dtype());
  if (rowBytes == 0 || b == 0) return out;
  const char* src = static_cast<const char*>(source.rawData());
  char* dst = static_cast<char*>(out.rawData());
  // One thread: a row copy is bound by memory bandwidth, which a single core
  // nearly saturates; splitting it across threads adds the cost of waking them
  // and gains no bandwidth, which loses most on a busy machine.
  for (int64_t r = 0; r < b; ++r) {
    std::memcpy(dst + static_cast<size_t>(r) * rowBytes, src + static_cast<size_t>(indices[r]) * rowBytes, rowBytes);
  }
  return out;
}

TensorDataset::TensorDataset(Tensor data, Tensor target) {
  WEFT_ENFORCE(data.defined() && data.dim() >= 1, InvalidArgumentError,
               "TensorDataset: data must be a tensor with a leading example dimension, got ",
               data.defined() ? shapeString(data.shape()) : std::string("an undefined tensor"));
  WEFT_ENFORCE(data.device().isCpu(), InvalidArgumentError, "TensorDataset: data is on ", data.device().str(),
               "; datasets hold CPU tensors");
  size_ = data.size(0);
  data_ = data.detach().contiguous();
  if (target.defined()) {
    WEFT_ENFORCE(target.dim() >= 1 && target.size(0) == size_, InvalidArgumentError, "TensorDataset: data of shape ",
                 data.shape(), " and target of shape ", target.shape(), " disagree on the number of examples");
    WEFT_ENFORCE(target.device().isCpu(), InvalidArgumentError, "TensorDataset: target is on ",
                 target.device().str(), "; datasets hold CPU tensors");
    target_ = target.detach().contiguous();
  }
}

Example TensorDataset::get(int64_t i) const {
  WEFT_ENFORCE(i >= 0 && i < size_, IndexError, "TensorDataset::get: index ", i, " out of range for ", size_,
               " examples");
  Example e;
  e.data = data_.select(0, i);
  if (target_.defined()) e.target = target_.select(0, i);
  return e;
}

Example TensorDataset::getBatch(std::span<const int64_t> indices) const {
  WEFT_ENFORCE(!indices.empty(), InvalidArgumentError, "TensorDataset::getBatch: empty index list");
  Example e;
  e.data = gatherRows(data_, indices, "TensorDataset::getBatch");
  if (target_.defined()) e.target = gatherRows(target_, indices, "TensorDataset::getBatch");
  return e;
}

}  // namespace weft::data
