// Datasets: indexable collections of (data, target) examples, and the
// tensor-backed dataset every in-memory data set (Fashion-MNIST, synthetic
// data) is built on.
//
//   using namespace weft::data;
//   TensorDataset ds(rand({100, 784}), randint(0, 10, {100}));
//   Example e = ds.get(3);                        // data [784], target [] (views)
//   std::vector<int64_t> idx{5, 0, 42};
//   Example b = ds.getBatch(idx);                 // data [3, 784], target [3] (copies)
//
// A Dataset is read-only once built; get() and getBatch() may be called from
// several threads at once. Indices outside [0, size()) are an IndexError.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/tensor.h"

namespace weft::data {

// One example, or a batch of them stacked along a new leading dimension.
struct Example {
  Tensor data;
  // The label(s); undefined for a dataset without targets.
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i, 0 <= i < size().
  virtual Example get(int64_t i) const = 0;
  // The examples at `indices`, stacked: data [B, ...], target [B, ...]. The
  // default calls get() per index and copies each example straight into the
  // batch tensors; every example must have the same shapes and dtypes (an
  // InvalidArgumentError names the first index that differs).
  virtual Example getBatch(std::span<const int64_t> indices) const;
};

// A dataset over tensors whose first dimension indexes examples. The tensors
// are kept contiguous on the CPU, so a batch is one memcpy per row.
class TensorDataset : public Dataset {
 public:
  // data: [N, ...]; target: [N, ...] or undefined. Both must be CPU tensors
  // with the same N (InvalidArgumentError otherwise); non-contiguous ones are
  // copied once here.
  explicit TensorDataset(Tensor data, Tensor target = Tensor());

  int64_t size() const override { return size_; }
  // Views (select) of row i; no copy.
  Example get(int64_t i) const override;
  Example getBatch(std::span<const int64_t> indices) const override;

  const Tensor& data() const { return data_; }
  const Tensor& targets() const { return target_; }

 private:
  Tensor data_;
  Tensor target_;
  int64_t size_ = 0;
};

// Rows `indices` of the contiguous CPU tensor `source` ([N, ...]) copied into
// a new contiguous [B, ...] tensor. An index outside [0, N) is an IndexError
// naming `op`, the index and N; nothing is copied in that case.
Tensor gatherRows(const Tensor& source, std::span<const int64_t> indices, const char* op);

}  // namespace weft::data
