// Tensor: an n-dimensional, strided view into a shared Storage, with the
// autograd metadata of define-by-run differentiation.
//
//   using namespace weft;
//   Tensor w = randn({784, 256}).requiresGrad_();
//   Tensor x = rand({32, 784});
//   Tensor loss = relu(matmul(x, w)).sum();
//   loss.backward();                 // w.grad() now holds d loss / d w
//   std::cout << w.grad().narrow(0, 0, 2);
//
// Value semantics: a Tensor is a cheap handle (one shared_ptr); copies share
// the same data and metadata. `clone()` copies data. Views (view, transpose,
// narrow, ...) share storage with their base and are differentiable.
//
// Threading: reading a tensor from several threads is safe; writing to one
// (in-place ops, setGrad, hooks) while another thread uses it is not.
//
// Ops live in tensor/ops.h (free functions, e.g. weft::matmul); the methods
// here are the metadata, views and the common ops as shorthand.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "tensor/storage.h"

namespace weft {

using Shape = std::vector<int64_t>;

class Node;
class AccumulateGrad;
class Generator;
struct TensorImpl;

// Scalar-or-tensor arguments to binary ops are written as Tensor overloads plus
// `double` overloads in ops.h.
class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false, most calls throw
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }

  // ---- metadata -------------------------------------------------------
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  int64_t storageOffset() const;    // in elements
  DType dtype() const;
  Device device() const;
  bool isContiguous() const;
  const std::shared_ptr<Storage>& storage() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * elementSize(dtype()); }

  // Pointer to the first element. data<T>() checks that T matches dtype().
  void* rawData() const;
  template <class T>
  T* data() const {
    WEFT_ENFORCE(kDTypeOf<T> == dtype(), InvalidArgumentError, "data<", dtypeName(kDTypeOf<T>),
                 ">() on a tensor of dtype ", dtypeName(dtype()));
    return static_cast<T*>(rawData());
  }
  // The single element of a one-element tensor, converted to T (one of the
  // element types of common/dtype.h; another type does not compile).
  template <class T>
  T item() const {
    static_assert(kIsElementType<T>,
                  "item<T>: T must be float, double, BFloat16, Float16, int64_t, int32_t, uint8_t or bool (see weft::DTypeOf)");
    WEFT_ENFORCE(numel() == 1, InvalidArgumentError, "item: expected a one-element tensor, got shape ", shape());
    return toVector<T>()[0];
  }
  // All elements in row-major order, converted to T (conversions as in
  // common/dtype.h; T as for item).
  template <class T>
  std::vector<T> toVector() const {
    static_assert(kIsElementType<T>,
                  "toVector<T>: T must be float, double, BFloat16, Float16, int64_t, int32_t, uint8_t or bool (see weft::DTypeOf)");
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<uint8_t> bytes(static_cast<size_t>(numel()));
      copyTo(DType::Bool, bytes.data());
      return std::vector<bool>(bytes.begin(), bytes.end());
    } else if constexpr (kIsElementType<T>) {
      std::vector<T> out(static_cast<size_t>(numel()));
      copyTo(kDTypeOf<T>, out.data());
      return out;
    } else {
      return {};
    }
  }
  // Writes all elements in row-major order, converted to `as`, to `out`
  // (room for numel() elements of `as`).
  void copyTo(DType as, void* out) const;

  // ---- autograd -------------------------------------------------------
  bool requiresGrad() const;
  // Marks a leaf as requiring grad (returns *this). Only leaves of floating
  // dtype may; elsewhere InvalidArgumentError.
  Tensor& requiresGrad_(bool on = true);
  bool isLeaf() const;
  // Accumulated gradient of a leaf (undefined until a backward reached it).
  Tensor grad() const;
  void setGrad(const Tensor& g) const;
  // The node that produced this tensor (null for leaves).
  const std::shared_ptr<Node>& gradFn() const;
  uint32_t outputNr() const;
  // The AccumulateGrad node of a leaf that requires grad: created on first use
  // and kept for the tensor's life, so hooks on it persist across iterations.
  std::shared_ptr<AccumulateGrad> gradAccumulator() const;
  // Back-propagates from this tensor. `grad` defaults to 1 for a one-element
  // tensor; otherwise it is required. Frees the graph unless retainGraph.
  void backward(const Tensor& grad = Tensor(), bool retainGraph = false) const;
  // A tensor sharing the data but not the history (requiresGrad false).
  Tensor detach() const;
  // Registers fn(grad) -> grad run when this tensor's gradient is computed; a
  // defined return value replaces the gradient. Returns an id for removeHook.
  int registerHook(std::function<Tensor(const Tensor&)> fn) const;
  void removeHook(int id) const;

  // ---- views (share storage; differentiable) -----------------------------
  Tensor view(Shape shape) const;     // one dim may be -1; needs compatible strides
  Tensor reshape(Shape shape) const;  // a view when possible, else a copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;                   // transpose of a 2-D tensor
  Tensor permute(Shape dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(Shape shape) const;   // -1 keeps a size
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t startDim = 0, int64_t endDim = -1) const;
  Tensor contiguous() const;          // *this when already contiguous
  Tensor clone() const;
  Tensor to(DType t) const;
  Tensor to(Device d) const;
  // A CPU copy in page-locked (pinned) memory: its to(Device::cuda(i)) is
  // asynchronous, so a data loader can fill the next batch while the device
  // works. Needs a build with CUDA (InvalidArgumentError otherwise).
  Tensor pinMemory() const;
  bool isPinned() const;
  Tensor indexSelect(int64_t dim, const Tensor& index) const;

  // ---- common ops as methods (see ops.h) -----------------------------------
  Tensor sum() const;
  Tensor sum(std::vector<int64_t> dims, bool keepDim = false) const;
  Tensor mean() const;
  Tensor mean(std::vector<int64_t> dims, bool keepDim = false) const;
  Tensor matmul(const Tensor& other) const;

  // ---- in-place (bump the version; refused on tensors that require grad
  //      while grad mode is on; use NoGradGuard in optimizers) -------------
  Tensor& zero_();
  Tensor& fill_(double v);
  Tensor& copy_(const Tensor& src);            // broadcasts src, converts dtype
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double v);
  Tensor& mul_(const Tensor& other);
  Tensor& addcmul_(const Tensor& a, const Tensor& b, double value = 1.0);  // += value*a*b
  Tensor& addcdiv_(const Tensor& a, const Tensor& b, double value = 1.0);  // += value*a/b

  uint64_t version() const;
  std::string toString() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& implPtr() const { return impl_; }
  // True when both handles refer to the same tensor (not just equal values).
  bool sameAs(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // elements
  Shape shape;
  Shape strides;  // elements
  DType dtype = DType::Float32;
  // autograd
  bool requiresGrad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> gradFn;
  uint32_t outputNr = 0;
  std::shared_ptr<AccumulateGrad> accumulator;
};

// ---- construction -------------------------------------------------------
struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  bool requiresGrad = false;
};

Shape contiguousStrides(const Shape& shape);
int64_t shapeNumel(const Shape& shape);
std::string shapeString(const Shape& shape);

// A tensor over existing storage (no copy).
Tensor makeTensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);
Tensor empty(Shape shape, TensorOptions o = {});
Tensor zeros(Shape shape, TensorOptions o = {});
Tensor ones(Shape shape, TensorOptions o = {});
Tensor full(Shape shape, double value, TensorOptions o = {});
Tensor zerosLike(const Tensor& t);
Tensor onesLike(const Tensor& t);
Tensor emptyLike(const Tensor& t);
Tensor scalarTensor(double v, DType dtype = DType::Float32);
// [start, end) with step, like torch.arange. Int64 unless o.dtype says.
Tensor arange(double start, double end, double step = 1, TensorOptions o = {.dtype = DType::Int64});
Tensor arange(int64_t end, TensorOptions o = {.dtype = DType::Int64});
// Random factories draw from `gen`, or the process default generator
// (see tensor/generator.h) when null.
Tensor rand(Shape shape, TensorOptions o = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(Shape shape, TensorOptions o = {}, Generator* gen = nullptr);  // N(0, 1)
Tensor randint(int64_t low, int64_t high, Shape shape, TensorOptions o = {.dtype = DType::Int64},
               Generator* gen = nullptr);  // [low, high)
Tensor uniform(Shape shape, double low, double high, TensorOptions o = {}, Generator* gen = nullptr);
namespace detail {
// A new CPU tensor of `dtype` holding `count` contiguous elements copied from
// `data`; shapeNumel(shape) must be count (InvalidArgumentError otherwise).
Tensor tensorFromHost(DType dtype, const void* data, size_t count, Shape shape);
}  // namespace detail

// Copies host values into a new CPU tensor of the given shape (numel must
// match) whose dtype is T's: float, double, BFloat16, Float16, int64_t,
// int32_t, uint8_t or bool.
// Another element type is a compile-time error.
template <class T>
Tensor fromVector(const std::vector<T>& values, Shape shape) {
  static_assert(kIsElementType<T>,
                "fromVector: the element type must be float, double, BFloat16, Float16, int64_t, int32_t, uint8_t or bool "
                "(see weft::DTypeOf); convert the values first");
  if constexpr (std::is_same_v<T, bool>) {
    const std::vector<uint8_t> bytes(values.begin(), values.end());  // std::vector<bool> packs bits
    return detail::tensorFromHost(DType::Bool, bytes.data(), bytes.size(), std::move(shape));
  } else if constexpr (kIsElementType<T>) {
    return detail::tensorFromHost(kDTypeOf<T>, values.data(), values.size(), std::move(shape));
  } else {
    return Tensor();
  }
}
template <class T>
Tensor fromVector(const std::vector<T>& values) {
  return fromVector(values, Shape{static_cast<int64_t>(values.size())});
}

// Normalises a possibly negative dimension index; IndexError names `op`.
int64_t wrapDim(int64_t d, int64_t ndim, const char* op);

}  // namespace weft
