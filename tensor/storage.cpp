#include "tensor/storage.h"

#include <cstdlib>
#include <new>

#include "common/error.h"
#include "kernels/device.h"

namespace weft {

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  if (device.isCuda()) {
    void* p = kernels::deviceAlloc(nbytes, device.index);
    int idx = device.index;
    return std::shared_ptr<Storage>(new Storage(p, nbytes, device, [idx](void* q) { kernels::deviceFree(q, idx); }));
  }
  // 64-byte alignment suits AVX-512 loads and keeps rows off shared cache lines.
  size_t rounded = (nbytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p) throw std::bad_alloc();
  return std::shared_ptr<Storage>(new Storage(p, nbytes, device, [](void* q) { std::free(q); }));
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Device device, Deleter deleter) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, std::move(deleter)));
}

Storage::~Storage() {
  if (deleter_ && data_) deleter_(data_);
}

}  // namespace weft
