#include "tensor/storage.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <utility>

#include "common/error.h"
#include "kernels/device.h"

namespace weft {

namespace {
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kPageBytes = 4096;
// From this size up, freed blocks are kept for reuse.
constexpr size_t kCachedFromBytes = size_t{64} << 10;
// Freed blocks are kept up to the larger of this and the most CPU bytes
// ever live at once.
constexpr size_t kBlockCacheFloorBytes = size_t{256} << 20;
std::atomic<size_t> gCpuHighWater{0};

// Freed CPU blocks of 64 KiB and more, kept by size for the next allocation
// of the same size. A training step allocates the same activations and
// gradients every iteration; the C heap hands blocks this large out as fresh
// mappings (or trims them back to the system), so each costs a page fault and
// a zeroed page per 4 KiB (per 2 MiB with huge pages), which on small models
// is a large share of the step. The cache holds at most the larger of
// 256 MiB and the process's high-water mark of live CPU bytes: a training
// loop gets a whole step's activations back, and what is cached never
// exceeds what the process once held live. Process-wide, like the C heap it
// sits on; never destroyed, so storages freed during static destruction
// still find it.
class LargeBlockCache {
 public:
  static LargeBlockCache& instance() {
    static LargeBlockCache* cache = new LargeBlockCache();
    return *cache;
  }

  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end()) return nullptr;
    void* p = it->second;
    free_.erase(it);
    cached_ -= bytes;
    return p;
  }

  void give(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_ + bytes <= std::max(kBlockCacheFloorBytes, gCpuHighWater.load(std::memory_order_relaxed))) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  size_t release() {
    std::multimap<size_t, void*> blocks;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks.swap(free_);
      bytes = cached_;
      cached_ = 0;
    }
    for (auto& [size, p] : blocks) std::free(p);
    return bytes;
  }

  size_t cachedBytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

 private:
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

// Live and peak bytes per device: slot 0 is the CPU, 1 + i is cuda:i.
constexpr int kCountedCudaDevices = 16;
struct ByteCounter {
  std::atomic<size_t> live{0};
  std::atomic<size_t> peak{0};
};
ByteCounter gCounters[1 + kCountedCudaDevices];

ByteCounter* counterFor(Device d) {
  if (d.isCpu()) return &gCounters[0];
  if (d.index < 0 || d.index >= kCountedCudaDevices) return nullptr;
  return &gCounters[1 + d.index];
}

void countAlloc(Device d, size_t n) {
  ByteCounter* c = counterFor(d);
  if (!c || n == 0) return;
  size_t now = c->live.fetch_add(n, std::memory_order_relaxed) + n;
  size_t peak = c->peak.load(std::memory_order_relaxed);
  while (now > peak && !c->peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  if (d.isCpu()) {
    size_t high = gCpuHighWater.load(std::memory_order_relaxed);
    while (now > high && !gCpuHighWater.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
    }
  }
}

void countFree(Device d, size_t n) {
  ByteCounter* c = counterFor(d);
  if (!c || n == 0) return;
  c->live.fetch_sub(n, std::memory_order_relaxed);
}

ByteCounter& checkedCounter(Device d, const char* op) {
  ByteCounter* c = counterFor(d);
  WEFT_ENFORCE(c != nullptr, InvalidArgumentError, op, ": device ", d.str(), " is not counted (CUDA indices below ",
               kCountedCudaDevices, ")");
  return *c;
}

}  // namespace

Storage::Storage(void* data, size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {
  countAlloc(device_, nbytes_);
}

Storage::MemoryStats Storage::memoryStats(Device device) {
  ByteCounter& c = checkedCounter(device, "Storage::memoryStats");
  return {c.live.load(std::memory_order_relaxed), c.peak.load(std::memory_order_relaxed)};
}

void Storage::resetPeakBytes(Device device) {
  ByteCounter& c = checkedCounter(device, "Storage::resetPeakBytes");
  c.peak.store(c.live.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  if (device.isCuda()) {
    void* p = kernels::deviceAlloc(nbytes, device.index);
    int idx = device.index;
    return std::shared_ptr<Storage>(new Storage(p, nbytes, device, [idx](void* q) { kernels::deviceFree(q, idx); }));
  }
  // 64-byte alignment suits AVX-512 loads and keeps rows off shared cache lines.
  size_t rounded = (nbytes + 63) / 64 * 64;
  if (rounded < kCachedFromBytes) {
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (rounded && !p) throw std::bad_alloc();
    return std::shared_ptr<Storage>(new Storage(p, nbytes, device, [](void* q) { std::free(q); }));
  }
  // Large buffers are 2 MiB aligned and backed by transparent huge pages where
  // the kernel offers them (madvise mode): filling a fresh 64 MiB buffer then
  // takes 32 page faults instead of 16384, which is most of the cost of
  // receiving a large tensor into new storage. Smaller ones are whole pages.
  // Either kind is reused once freed.
  const size_t align = rounded >= kHugePageBytes ? kHugePageBytes : kPageBytes;
  rounded = (rounded + align - 1) / align * align;
  void* p = LargeBlockCache::instance().take(rounded);
  if (!p) {
    p = std::aligned_alloc(align, rounded);
    if (!p) throw std::bad_alloc();
    if (align == kHugePageBytes) ::madvise(p, rounded, MADV_HUGEPAGE);
  }
  return std::shared_ptr<Storage>(
      new Storage(p, nbytes, device, [rounded](void* q) { LargeBlockCache::instance().give(q, rounded); }));
}

size_t Storage::releaseCachedMemory() { return LargeBlockCache::instance().release(); }
size_t Storage::cachedBytes() { return LargeBlockCache::instance().cachedBytes(); }

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Device device, Deleter deleter) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, std::move(deleter)));
}

void Storage::release() {
  countFree(device_, nbytes_);
  if (deleter_ && data_) deleter_(data_);
  data_ = nullptr;
  nbytes_ = 0;
  deleter_ = nullptr;
}

void Storage::reallocate(size_t nbytes) {
  WEFT_ENFORCE(deleter_ || data_ == nullptr, InvalidArgumentError,
               "Storage::reallocate: the storage wraps memory it does not own");
  std::shared_ptr<Storage> fresh = allocate(nbytes, device_);
  release();
  // Take the fresh buffer and its count; the emptied Storage frees nothing.
  data_ = std::exchange(fresh->data_, nullptr);
  nbytes_ = std::exchange(fresh->nbytes_, 0);
  deleter_ = std::move(fresh->deleter_);
  fresh->deleter_ = nullptr;
}

Storage::~Storage() {
  countFree(device_, nbytes_);
  if (deleter_ && data_) deleter_(data_);
}

}  // namespace weft
