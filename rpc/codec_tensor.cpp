// The tensor codec and the per-frame contexts: how tensors become out-of-band buffers and back.
#include <limits>

#include "rpc/codec.h"

namespace weft::rpc {

// ---- contexts -----------------------------------------------------------------------------

uint32_t EncodeContext::addTensor(const Tensor& t) {
  WEFT_ENFORCE(t.defined(), InvalidArgumentError, "rpc codec: addTensor on an undefined tensor");
  WEFT_ENFORCE(t.device().isCpu(), InvalidArgumentError, "rpc codec: cannot send a tensor on ", t.device(),
               " (shape ", shapeString(t.shape()), "); move it to the CPU first");
  // The only copy the codec makes: a view that is not contiguous is sent as its own bytes.
  Tensor c = t.isContiguous() ? t : t.detach().contiguous();
  size_t size = c.nbytes();
  size_t offset = static_cast<size_t>(c.storageOffset()) * elementSize(c.dtype());
  const std::shared_ptr<Storage>& storage = c.storage();
  if (size == 0) return writer_.addBuffer(nullptr, 0, 0);
  SentKey key{storage.get(), offset, size};
  auto [it, inserted] = sent_.try_emplace(key, 0);
  if (inserted) it->second = writer_.addBuffer(storage, offset, size);
  return it->second;
}

const std::shared_ptr<Storage>& DecodeContext::buffer(uint32_t index, uint64_t byteLength) const {
  if (index >= buffers_.size()) {
    throw ProtocolError("tensor names out-of-band buffer " + std::to_string(index) + ", but the frame has " +
                        std::to_string(buffers_.size()));
  }
  const auto& storage = buffers_[index];
  uint64_t actual = storage ? storage->nbytes() : 0;
  if (actual != byteLength) {
    throw ProtocolError("tensor of " + std::to_string(byteLength) + " bytes names out-of-band buffer " +
                        std::to_string(index) + ", which holds " + std::to_string(actual));
  }
  return storage;
}

DecodeContext::NestingGuard::NestingGuard(DecodeContext& ctx) : ctx_(ctx) {
  if (ctx_.depth_ >= ctx_.maxNesting_) {
    throw ProtocolError("values nested deeper than the limit of " + std::to_string(ctx_.maxNesting_) + " levels");
  }
  ++ctx_.depth_;
}

// ---- tensors ----------------------------------------------------------------------------------

namespace detail {

void encodeTensor(const Tensor& t, wire::Value::Builder out, EncodeContext& ctx) {
  if (!t.defined()) {
    out.setNone();
    return;
  }
  uint32_t index = ctx.addTensor(t);
  auto desc = out.initTensor();
  desc.setDtype(static_cast<wire::DType>(static_cast<uint16_t>(t.dtype())));
  const Shape& shape = t.shape();
  auto dims = desc.initShape(static_cast<unsigned>(shape.size()));
  for (size_t i = 0; i < shape.size(); ++i) dims.set(static_cast<unsigned>(i), shape[i]);
  desc.setByteLength(t.nbytes());
  desc.setBuffer(index);
  if (t.requiresGrad()) {
    desc.setRequiresGrad(true);
    desc.setGradSlot(ctx.noteGradTensor(t));
  }
}

Tensor decodeTensor(wire::Value::Reader in, DecodeContext& ctx) {
  if (in.which() == wire::Value::NONE) return Tensor();
  if (in.which() != wire::Value::TENSOR) throwKindMismatch("tensor", in);
  auto desc = in.getTensor();

  auto wireDtype = static_cast<uint16_t>(desc.getDtype());
  if (wireDtype > static_cast<uint16_t>(kLastDType)) {
    throw ProtocolError("tensor has unknown dtype " + std::to_string(wireDtype));
  }
  auto dtype = static_cast<DType>(wireDtype);

  auto dims = desc.getShape();
  if (dims.size() > static_cast<unsigned>(kMaxDims)) {
    throw ProtocolError("tensor has " + std::to_string(dims.size()) + " dimensions, more than the " +
                        std::to_string(kMaxDims) + " weft supports");
  }
  Shape shape(dims.size());
  uint64_t numel = 1;
  for (unsigned i = 0; i < dims.size(); ++i) {
    int64_t d = dims[i];
    if (d < 0) throw ProtocolError("tensor has negative size " + std::to_string(d) + " in dimension " + std::to_string(i));
    shape[i] = d;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) numel = std::numeric_limits<uint64_t>::max();
  }
  uint64_t bytes = 0;
  bool overflow = numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
                  __builtin_mul_overflow(numel, uint64_t{elementSize(dtype)}, &bytes);
  if (overflow || bytes != desc.getByteLength()) {
    throw ProtocolError("tensor of shape " + shapeString(shape) + " and dtype " + dtypeName(dtype) + " cannot be " +
                        std::to_string(desc.getByteLength()) + " bytes long");
  }
  const std::shared_ptr<Storage>& storage = ctx.buffer(desc.getBuffer(), bytes);
  if (dtype == DType::Bool && bytes != 0) {
    // A bool holds 0 or 1: any other byte would be read as an invalid bool.
    const auto* p = static_cast<const uint8_t*>(storage->data());
    for (uint64_t i = 0; i < bytes; ++i) {
      if (p[i] > 1) {
        throw ProtocolError("bool tensor of shape " + shapeString(shape) + " has byte " + std::to_string(p[i]) +
                            " at element " + std::to_string(i) + " (a bool is 0 or 1)");
      }
    }
  }
  Shape strides = contiguousStrides(shape);
  Tensor t = makeTensor(storage, std::move(shape), std::move(strides), 0, dtype);
  if (desc.getRequiresGrad()) {
    if (!isFloating(dtype)) {
      throw ProtocolError(std::string("tensor of dtype ") + dtypeName(dtype) + " claims to require grad");
    }
    FrameAutograd* link = ctx.frame() != nullptr ? ctx.frame()->attachment<FrameAutograd>() : nullptr;
    if (link != nullptr) {
      link->link(t, desc.getGradSlot());
    } else {
      t.requiresGrad_(true);
    }
  }
  return t;
}

}  // namespace detail
}  // namespace weft::rpc
