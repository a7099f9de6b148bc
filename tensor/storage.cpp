#include "tensor/storage.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "common/error.h"
#include "kernels/device.h"

namespace weft {

namespace {
constexpr size_t kHugePageBytes = size_t{2} << 20;
}  // namespace

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  if (device.isCuda()) {
    void* p = kernels::deviceAlloc(nbytes, device.index);
    int idx = device.index;
    return std::shared_ptr<Storage>(new Storage(p, nbytes, device, [idx](void* q) { kernels::deviceFree(q, idx); }));
  }
  // 64-byte alignment suits AVX-512 loads and keeps rows off shared cache lines.
  size_t rounded = (nbytes + 63) / 64 * 64;
  void* p = nullptr;
  if (rounded >= kHugePageBytes) {
    // Large buffers are 2 MiB aligned and backed by transparent huge pages where
    // the kernel offers them (madvise mode): filling a fresh 64 MiB buffer then
    // takes 32 page faults instead of 16384, which is most of the cost of
    // receiving a large tensor into new storage.
    rounded = (rounded + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p) ::madvise(p, rounded, MADV_HUGEPAGE);
  } else if (rounded) {
    p = std::aligned_alloc(64, rounded);
  }
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
