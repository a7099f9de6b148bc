#include "kernels/block_cache.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <new>

namespace weft::kernels {

namespace {
constexpr size_t kSmall = size_t(1) << 20;
constexpr size_t kPage = size_t(2) << 20;
constexpr size_t kNoClass = std::numeric_limits<size_t>::max();
}  // namespace

size_t BlockCache::roundSize(size_t n) {
  if (n == 0) return 0;
  if (n <= kSmall) return (n + 511) / 512 * 512;
  // Four steps per power of two.
  const size_t pow2 = std::bit_floor(n);
  const size_t step = pow2 / 4;
  if (n > kNoClass - (step - 1)) return kNoClass;
  size_t r = (n + step - 1) / step * step;
  if (r >= 4 * kPage) r = (r + kPage - 1) / kPage * kPage;
  return r;
}

BlockCache::~BlockCache() {
  // Blocks still live belong to tensors that outlive the cache (process
  // exit): leave them to the driver.
  std::lock_guard<std::mutex> lk(mu_);
  try {
    releaseLocked();
  } catch (...) {
  }
}

void BlockCache::collectPendingLocked() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool done = std::all_of(p.events.begin(), p.events.end(), [&](void* e) { return backend_.eventDone(e); });
    if (!done) {
      ++i;
      continue;
    }
    for (void* e : p.events) backend_.destroyEvent(e);
    const Block& b = freeInfo_.at(p.p);
    free_[{b.stream, b.size}].push_back(p.p);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

void* BlockCache::allocate(size_t nbytes, void* stream) {
  if (nbytes == 0) return nullptr;
  const size_t size = roundSize(nbytes);
  // No device holds it: refused before the cache is released for nothing.
  if (size == kNoClass) throw std::bad_alloc();
  std::lock_guard<std::mutex> lk(mu_);
  if (!pending_.empty()) collectPendingLocked();
  void* p = nullptr;
  auto it = free_.find({stream, size});
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    freeInfo_.erase(p);
    ++stats_.cacheHits;
  } else {
    p = backend_.malloc(size);
    if (!p) {
      releaseLocked();
      p = backend_.malloc(size);
      if (!p) throw std::bad_alloc();
    }
    ++stats_.mallocs;
    stats_.reservedBytes += size;
    stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
  }
  live_[p] = Block{size, stream, {}};
  stats_.allocatedBytes += size;
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  return p;
}

void BlockCache::recordStream(void* p, void* stream) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(p);
  if (it == live_.end() || it->second.stream == stream) return;
  auto& o = it->second.otherStreams;
  if (std::find(o.begin(), o.end(), stream) == o.end()) o.push_back(stream);
}

void BlockCache::deallocate(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // not ours (a double free is ignored rather than corrupting the cache)
  Block b = std::move(it->second);
  live_.erase(it);
  stats_.allocatedBytes -= b.size;
  if (b.otherStreams.empty()) {
    free_[{b.stream, b.size}].push_back(p);
    freeInfo_[p] = Block{b.size, b.stream, {}};
    return;
  }
  Pending pend{p, {}};
  for (void* s : b.otherStreams) pend.events.push_back(backend_.recordEvent(s));
  freeInfo_[p] = Block{b.size, b.stream, {}};
  pending_.push_back(std::move(pend));
}

size_t BlockCache::releaseLocked() {
  if (free_.empty() && pending_.empty()) return 0;
  backend_.synchronize();
  if (!pending_.empty()) collectPendingLocked();
  size_t freed = 0;
  for (auto& [key, blocks] : free_) {
    for (void* p : blocks) {
      backend_.free(p);
      freeInfo_.erase(p);
      freed += key.second;
      ++stats_.frees;
    }
  }
  free_.clear();
  stats_.reservedBytes -= freed;
  return freed;
}

size_t BlockCache::release() {
  std::lock_guard<std::mutex> lk(mu_);
  return releaseLocked();
}

BlockCache::Stats BlockCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void BlockCache::resetPeak() {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
  stats_.peakReservedBytes = stats_.reservedBytes;
}

size_t BlockCache::cachedBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_.reservedBytes - stats_.allocatedBytes;
}

}  // namespace weft::kernels
