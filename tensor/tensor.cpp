// Tensor metadata, element access, autograd entry points, in-place ops and
// factories. Views are in views.cpp, printing in print.cpp.
#include "tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda_call.h"
#include "kernels/device.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/copy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/random.h"
#endif
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace weft {

// ---- shapes -------------------------------------------------------------------

Shape contiguousStrides(const Shape& shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    s[d] = acc;
    acc *= std::max<int64_t>(shape[d], 1);
  }
  return s;
}

int64_t shapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shapeString(const Shape& shape) { return detail::concat(shape); }

int64_t wrapDim(int64_t d, int64_t ndim, const char* op) {
  int64_t n = ndim == 0 ? 1 : ndim;  // a scalar accepts dim 0 and -1
  WEFT_ENFORCE(d >= -n && d < n, IndexError, op, ": dimension ", d, " out of range for a tensor of ", ndim,
               " dimension(s)");
  return d < 0 ? d + n : d;
}

namespace {

void checkShape(const Shape& shape, const char* op) {
  WEFT_ENFORCE(static_cast<int>(shape.size()) <= kMaxDims, InvalidArgumentError, op, ": ", shape.size(),
               " dimensions exceed the maximum of ", kMaxDims);
  for (int64_t s : shape) WEFT_ENFORCE(s >= 0, InvalidArgumentError, op, ": negative size in shape ", shape);
}

void checkInplace(const Tensor& t, const char* op) {
  WEFT_ENFORCE(!(GradMode::enabled() && t.requiresGrad()), InvalidArgumentError, op,
               ": in-place operation on a tensor that requires grad; do the update inside a NoGradGuard");
}

}  // namespace

Tensor makeTensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype) {
  checkShape(shape, "makeTensor");
  WEFT_CHECK(shape.size() == strides.size()) << "shape " << shape << " strides " << strides;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

// ---- metadata -------------------------------------------------------------

TensorImpl& Tensor::checked() const {
  WEFT_ENFORCE(impl_ != nullptr, InvalidArgumentError, "use of an undefined tensor");
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
const Shape& Tensor::strides() const { return checked().strides; }
int64_t Tensor::dim() const { return static_cast<int64_t>(checked().shape.size()); }
int64_t Tensor::size(int64_t d) const { return shape()[wrapDim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrapDim(d, dim(), "stride")]; }
int64_t Tensor::numel() const { return shapeNumel(shape()); }
int64_t Tensor::storageOffset() const { return checked().offset; }
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const { return checked().storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked().storage; }
uint64_t Tensor::version() const { return checked().storage->version(); }

bool Tensor::isContiguous() const {
  const auto& im = checked();
  int64_t expect = 1;
  for (int64_t d = static_cast<int64_t>(im.shape.size()) - 1; d >= 0; --d) {
    if (im.shape[d] == 1) continue;
    if (im.strides[d] != expect) return false;
    expect *= im.shape[d];
  }
  return true;
}

void* Tensor::rawData() const {
  const auto& im = checked();
  if (im.storage->data() == nullptr && numel() > 0) {
    throw StateError(detail::concat("a tensor of shape ", shapeString(im.shape),
                                    " views a released storage (Storage::release: e.g. a parameter that fully "
                                    "sharded data parallelism holds only as shards between uses)"));
  }
  return static_cast<char*>(im.storage->data()) + im.offset * static_cast<int64_t>(elementSize(im.dtype));
}

void Tensor::copyTo(DType as, void* out) const {
  if (device().isCuda()) {
    to(Device::cpu()).copyTo(as, out);
    return;
  }
  if (numel() == 0) return;
  kernels::cpu::copyStridedToContiguous(dtype(), rawData(), shape(), strides(), as, out);
}

// ---- autograd -----------------------------------------------------------------

bool Tensor::requiresGrad() const { return checked().requiresGrad; }

Tensor& Tensor::requiresGrad_(bool on) {
  auto& im = checked();
  WEFT_ENFORCE(im.gradFn == nullptr || on, InvalidArgumentError,
               "requiresGrad_(false) on a non-leaf tensor; use detach() instead");
  WEFT_ENFORCE(!on || isFloating(im.dtype), InvalidArgumentError, "only floating-point tensors can require grad, got ",
               dtypeName(im.dtype));
  im.requiresGrad = on;
  return *this;
}

bool Tensor::isLeaf() const { return checked().gradFn == nullptr; }

Tensor Tensor::grad() const {
  const auto& g = checked().grad;
  return g ? Tensor(g) : Tensor();
}

void Tensor::setGrad(const Tensor& g) const {
  auto& im = checked();
  if (g.defined()) {
    WEFT_ENFORCE(g.shape() == im.shape && g.dtype() == im.dtype, InvalidArgumentError,
                 "setGrad: gradient of shape ", g.shape(), " and dtype ", dtypeName(g.dtype()),
                 " for a tensor of shape ", im.shape, " and dtype ", dtypeName(im.dtype));
  }
  im.grad = g.implPtr();
}

const std::shared_ptr<Node>& Tensor::gradFn() const { return checked().gradFn; }
uint32_t Tensor::outputNr() const { return checked().outputNr; }

std::shared_ptr<AccumulateGrad> Tensor::gradAccumulator() const {
  auto& im = checked();
  WEFT_ENFORCE(im.gradFn == nullptr && im.requiresGrad, InvalidArgumentError,
               "gradAccumulator: only leaves that require grad have one");
  if (!im.accumulator) im.accumulator = std::make_shared<AccumulateGrad>(impl_);
  return im.accumulator;
}

void Tensor::backward(const Tensor& grad, bool retainGraph) const {
  WEFT_ENFORCE(requiresGrad(), InvalidArgumentError,
               "backward: the tensor does not require grad and has no grad_fn (shape ", shape(), ")");
  Tensor g = grad;
  if (!g.defined()) {
    WEFT_ENFORCE(numel() == 1, InvalidArgumentError,
                 "backward: a gradient is required for a tensor of shape ", shape(),
                 " (it is implicit only for one-element outputs)");
    g = onesLike(*this);
  }
  WEFT_ENFORCE(g.shape() == shape(), InvalidArgumentError, "backward: gradient of shape ", g.shape(),
               " for a tensor of shape ", shape());
  BackwardOptions o;
  o.retainGraph = retainGraph;
  runBackward({gradientEdge(*this)}, {g}, o);
}

Tensor Tensor::detach() const {
  const auto& im = checked();
  return makeTensor(im.storage, im.shape, im.strides, im.offset, im.dtype);
}

int Tensor::registerHook(std::function<Tensor(const Tensor&)> fn) const {
  WEFT_ENFORCE(requiresGrad(), InvalidArgumentError, "registerHook: the tensor does not require grad");
  Edge e = gradientEdge(*this);
  uint32_t nr = e.inputNr;
  return e.fn->registerPreHook([nr, fn = std::move(fn)](std::vector<Tensor>& grads) {
    if (nr < grads.size() && grads[nr].defined()) {
      Tensor r = fn(grads[nr]);
      if (r.defined()) grads[nr] = r;
    }
  });
}

void Tensor::removeHook(int id) const {
  Edge e = gradientEdge(*this);
  if (e.fn) e.fn->removeHook(id);
}

// ---- conversions --------------------------------------------------------------

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = empty(shape(), {.dtype = t, .device = device()});
  if (numel() && device().isCuda()) {
    WEFT_CUDA_CALL(device().index, copyStridedToContiguous(dtype(), rawData(), shape(), strides(), t, out.rawData()));
  } else if (numel()) {
    kernels::cpu::copyStridedToContiguous(dtype(), rawData(), shape(), strides(), t, out.rawData());
  }
  grad_rules::toDTypeBackward(*this, out);
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor src = contiguous();  // on the source device
  Tensor out = empty(shape(), {.dtype = dtype(), .device = d});
  if (nbytes() && src.device().isCuda() && d.isCuda()) {
    // Between devices: the source's stream must have produced it first.
    WEFT_CUDA_CALL(src.device().index, synchronize(src.device().index));
    WEFT_CUDA_CALL(d.index, copyDeviceToDevice(out.rawData(), src.rawData(), nbytes(), d.index));
  } else if (nbytes() && d.isCuda()) {
    WEFT_CUDA_CALL(d.index, copyHostToDevice(out.rawData(), src.rawData(), nbytes(), d.index));
  } else if (nbytes()) {
    WEFT_CUDA_CALL(src.device().index, copyDeviceToHost(out.rawData(), src.rawData(), nbytes(), src.device().index));
  }
  grad_rules::toDeviceBackward(*this, out);
  return out;
}

Tensor Tensor::pinMemory() const {
  WEFT_ENFORCE(device().isCpu(), InvalidArgumentError, "pinMemory: the tensor is on ", device().str(),
               "; only CPU tensors can be pinned");
  if (isPinned()) return *this;
#ifdef WEFT_HAVE_CUDA
  Tensor src = contiguous();
  const size_t n = nbytes();
  void* p = kernels::cuda::allocatePinned(n);
  auto storage = Storage::wrap(p, n, Device::cpu(), [](void* q) { kernels::cuda::deallocatePinned(q); });
  if (n) std::memcpy(p, src.rawData(), n);
  return makeTensor(std::move(storage), shape(), contiguousStrides(shape()), 0, dtype());
#else
  throw InvalidArgumentError("pinMemory: weft was built without CUDA");
#endif
}

bool Tensor::isPinned() const {
#ifdef WEFT_HAVE_CUDA
  return device().isCpu() && numel() > 0 && kernels::cuda::isPinned(rawData());
#else
  return false;
#endif
}

// ---- in-place -----------------------------------------------------------------

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double v) {
  checkInplace(*this, "fill_");
  if (isContiguous()) {
    if (device().isCuda()) {
      WEFT_CUDA_CALL(device().index, fill(dtype(), rawData(), numel(), v));
    } else {
      kernels::cpu::fill(dtype(), rawData(), numel(), v);
    }
    storage()->bumpVersion();
    return *this;
  }
  return copy_(full(shape(), v, {.dtype = dtype(), .device = device()}));
}

Tensor& Tensor::copy_(const Tensor& src) {
  checkInplace(*this, "copy_");
  Tensor s = src.expand(shape());
  if (device().isCuda() || s.device().isCuda()) {
    if (s.device() != device()) s = s.contiguous().to(device());
    if (numel() == 0) {
    } else if (device().isCpu()) {
      // Moved to the host above: the CPU paths below.
      if (isContiguous()) {
        kernels::cpu::copyStridedToContiguous(s.dtype(), s.rawData(), s.shape(), s.strides(), dtype(), rawData());
      } else {
        Tensor c = s.to(dtype()).contiguous();
        kernels::cpu::copyContiguousToStrided(dtype(), c.rawData(), shape(), rawData(), strides());
      }
    } else if (isContiguous()) {
      WEFT_CUDA_CALL(device().index,
                     copyStridedToContiguous(s.dtype(), s.rawData(), s.shape(), s.strides(), dtype(), rawData()));
    } else {
      Tensor c = s.to(dtype()).contiguous();
      WEFT_CUDA_CALL(device().index, copyContiguousToStrided(dtype(), c.rawData(), shape(), rawData(), strides()));
    }
  } else if (isContiguous()) {
    if (numel()) kernels::cpu::copyStridedToContiguous(s.dtype(), s.rawData(), s.shape(), s.strides(), dtype(), rawData());
  } else {
    Tensor c = s.to(dtype()).contiguous();
    if (numel()) kernels::cpu::copyContiguousToStrided(dtype(), c.rawData(), shape(), rawData(), strides());
  }
  storage()->bumpVersion();
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  checkInplace(*this, "add_");
  WEFT_ENFORCE(other.dtype() == dtype(), InvalidArgumentError, "add_: dtype ", dtypeName(other.dtype()),
               " added to ", dtypeName(dtype()));
  if (isContiguous() && other.isContiguous() && other.shape() == shape() && other.device() == device()) {
    if (device().isCuda()) {
      WEFT_CUDA_CALL(device().index, axpy(dtype(), alpha, other.rawData(), rawData(), numel()));
    } else {
      kernels::cpu::axpy(dtype(), alpha, other.rawData(), rawData(), numel());
    }
    storage()->bumpVersion();
    return *this;
  }
  NoGradGuard ng;
  return copy_(add(*this, other, alpha));
}

Tensor& Tensor::mul_(double v) {
  checkInplace(*this, "mul_");
  if (isContiguous()) {
    if (device().isCuda()) {
      WEFT_CUDA_CALL(device().index, unary(kernels::cpu::UnaryOp::MulScalar, dtype(), rawData(), rawData(), numel(), v));
    } else {
      kernels::cpu::unary(kernels::cpu::UnaryOp::MulScalar, dtype(), rawData(), rawData(), numel(), v);
    }
    storage()->bumpVersion();
    return *this;
  }
  NoGradGuard ng;
  return copy_(mul(*this, v));
}

Tensor& Tensor::mul_(const Tensor& other) {
  checkInplace(*this, "mul_");
  NoGradGuard ng;
  return copy_(mul(*this, other));
}

Tensor& Tensor::addcmul_(const Tensor& a, const Tensor& b, double value) {
  NoGradGuard ng;
  return add_(mul(a, b).expand(shape()).contiguous(), value);
}

Tensor& Tensor::addcdiv_(const Tensor& a, const Tensor& b, double value) {
  NoGradGuard ng;
  return add_(div(a, b).expand(shape()).contiguous(), value);
}

// ---- method shorthands ----------------------------------------------------------

Tensor Tensor::sum() const { return weft::sum(*this); }
Tensor Tensor::sum(std::vector<int64_t> dims, bool keepDim) const { return weft::sum(*this, std::move(dims), keepDim); }
Tensor Tensor::mean() const { return weft::mean(*this); }
Tensor Tensor::mean(std::vector<int64_t> dims, bool keepDim) const {
  return weft::mean(*this, std::move(dims), keepDim);
}
// Tensor::matmul and Tensor::indexSelect are defined beside their ops
// (ops_linalg.cpp, ops_shape.cpp).

// ---- factories ------------------------------------------------------------------

Tensor empty(Shape shape, TensorOptions o) {
  checkShape(shape, "empty");
  int64_t n = shapeNumel(shape);
  auto storage = Storage::allocate(static_cast<size_t>(n) * elementSize(o.dtype), o.device);
  Shape strides = contiguousStrides(shape);
  Tensor t = makeTensor(std::move(storage), std::move(shape), std::move(strides), 0, o.dtype);
  if (o.requiresGrad) t.requiresGrad_();
  return t;
}

namespace {

// Fills a fresh tensor on the host and moves it to o.device.
template <class F>
Tensor hostFilled(Shape shape, TensorOptions o, F fill) {
  TensorOptions host = o;
  host.device = Device::cpu();
  host.requiresGrad = false;
  Tensor t = empty(std::move(shape), host);
  fill(t);
  if (o.device.isCuda()) t = t.to(o.device);
  if (o.requiresGrad) t.requiresGrad_();
  return t;
}

}  // namespace

Tensor full(Shape shape, double value, TensorOptions o) {
  if (o.device.isCuda()) {
    Tensor t = empty(std::move(shape), {.dtype = o.dtype, .device = o.device});
    t.fill_(value);
    if (o.requiresGrad) t.requiresGrad_();
    return t;
  }
  return hostFilled(std::move(shape), o, [value](Tensor& t) { kernels::cpu::fill(t.dtype(), t.rawData(), t.numel(), value); });
}
Tensor zeros(Shape shape, TensorOptions o) { return full(std::move(shape), 0.0, o); }
Tensor ones(Shape shape, TensorOptions o) { return full(std::move(shape), 1.0, o); }
Tensor zerosLike(const Tensor& t) { return zeros(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor onesLike(const Tensor& t) { return ones(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor emptyLike(const Tensor& t) { return empty(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor scalarTensor(double v, DType dtype) { return full({}, v, {.dtype = dtype}); }

Tensor arange(double start, double end, double step, TensorOptions o) {
  WEFT_ENFORCE(step != 0, InvalidArgumentError, "arange: step must be non-zero");
  double span = (end - start) / step;
  int64_t n = span > 0 ? static_cast<int64_t>(std::ceil(span)) : 0;
  return hostFilled({n}, o, [start, step](Tensor& t) {
    WEFT_DISPATCH_NUMERIC_AND_HALF(t.dtype(), "arange", [&]<class T>() {
      T* p = t.data<T>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        const double v = start + step * static_cast<double>(i);
        // Integers wrap like a cast from int64 (arange(250, 260) in uint8 is 250..255, 0..3).
        if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(static_cast<int64_t>(v));
        else p[i] = static_cast<T>(v);
      }
    });
  });
}
Tensor arange(int64_t end, TensorOptions o) { return arange(0.0, static_cast<double>(end), 1.0, o); }

namespace {

template <class F>
Tensor randomFilled(Shape shape, TensorOptions o, Generator* gen, F draw) {
  return hostFilled(std::move(shape), o, [gen, &draw](Tensor& t) {
    std::unique_lock<std::mutex> lock;
    Generator* g = gen;
    if (!g) {
      lock = std::unique_lock<std::mutex>(defaultGeneratorMutex());
      g = &defaultGenerator();
    }
    WEFT_DISPATCH_ALL_AND_HALF(t.dtype(), "random", [&]<class T>() {
      T* p = t.data<T>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(draw(*g));
    });
  });
}

// A tensor on a device, filled there by fill(t, key) from Philox counters
// reserved from gen (at most one per element, kernels/cuda/random.h).
template <class F>
Tensor deviceRandom(Shape shape, TensorOptions o, Generator* gen, F fill) {
  TensorOptions d = o;
  d.requiresGrad = false;
  Tensor t = empty(std::move(shape), d);
  const PhiloxKey key = reservePhilox(gen, static_cast<uint64_t>(t.numel()));
  fill(t, key);
  if (o.requiresGrad) t.requiresGrad_();
  return t;
}

}  // namespace

Tensor rand(Shape shape, TensorOptions o, Generator* gen) {
  return uniform(std::move(shape), 0.0, 1.0, o, gen);
}

Tensor uniform(Shape shape, double low, double high, TensorOptions o, Generator* gen) {
  WEFT_ENFORCE(isFloating(o.dtype), InvalidArgumentError, "uniform: needs a floating dtype");
  WEFT_ENFORCE(low <= high, InvalidArgumentError, "uniform: low ", low, " > high ", high);
  if (o.device.isCuda()) {
    return deviceRandom(std::move(shape), o, gen, [&](Tensor& t, PhiloxKey k) {
      WEFT_CUDA_CALL(o.device.index, uniformFill(t.dtype(), t.rawData(), t.numel(), low, high, k.seed, k.offset));
    });
  }
  return randomFilled(std::move(shape), o, gen, [low, high](Generator& g) { return low + (high - low) * g.nextDouble(); });
}

Tensor randn(Shape shape, TensorOptions o, Generator* gen) {
  WEFT_ENFORCE(isFloating(o.dtype), InvalidArgumentError, "randn: needs a floating dtype");
  if (o.device.isCuda()) {
    return deviceRandom(std::move(shape), o, gen, [&](Tensor& t, PhiloxKey k) {
      WEFT_CUDA_CALL(o.device.index, normalFill(t.dtype(), t.rawData(), t.numel(), 0.0, 1.0, k.seed, k.offset));
    });
  }
  return randomFilled(std::move(shape), o, gen, [](Generator& g) { return g.nextNormal(); });
}

Tensor randint(int64_t low, int64_t high, Shape shape, TensorOptions o, Generator* gen) {
  WEFT_ENFORCE(low < high, InvalidArgumentError, "randint: low ", low, " must be below high ", high);
  WEFT_DISPATCH_ALL_AND_HALF(o.dtype, "randint", [&]<class T>() {
    if constexpr (std::is_integral_v<T>) {
      WEFT_ENFORCE(low >= static_cast<int64_t>(std::numeric_limits<T>::lowest()) &&
                       high - 1 <= static_cast<int64_t>(std::numeric_limits<T>::max()),
                   InvalidArgumentError, "randint: [", low, ", ", high, ") does not fit dtype ", dtypeName(o.dtype));
    }
  });
  if (o.device.isCuda()) {
    return deviceRandom(std::move(shape), o, gen, [&](Tensor& t, PhiloxKey k) {
      WEFT_CUDA_CALL(o.device.index, randintFill(t.dtype(), t.rawData(), t.numel(), low, high, k.seed, k.offset));
    });
  }
  uint64_t range = static_cast<uint64_t>(high - low);
  return randomFilled(std::move(shape), o, gen,
                      [low, range](Generator& g) { return static_cast<double>(low + static_cast<int64_t>(g.nextBelow(range))); });
}

Tensor detail::tensorFromHost(DType dtype, const void* data, size_t count, Shape shape) {
  WEFT_ENFORCE(shapeNumel(shape) == static_cast<int64_t>(count), InvalidArgumentError, "fromVector: ", count,
               " values for shape ", shape);
  Tensor t = empty(std::move(shape), {.dtype = dtype});
  if (count != 0) std::memcpy(t.rawData(), data, count * elementSize(dtype));
  return t;
}

}  // namespace weft
