// The bookkeeping of the CUDA caching allocator (kernels/cuda/runtime.h),
// kept free of CUDA so that it builds and is tested without a device: size
// classes, per-stream free lists, byte counters, and release on demand. The
// backend (cudaMalloc/cudaFree/device synchronisation, or a fake in tests)
// is passed in.
//
// Size classes: requests up to 1 MiB round up to a multiple of 512 bytes;
// larger ones to one of four steps per power of two (1.25, 1.5, 1.75, 2 x
// 2^k), rounded to 2 MiB pages from 8 MiB up; so a freed block serves later
// requests of its class, and at most a quarter of a large block is slack.
// A request whose class would not fit in size_t (above SIZE_MAX - 2^61)
// gets SIZE_MAX, which allocate refuses with std::bad_alloc without asking
// the backend.
// A block freed while other streams may still use it (recordStream) waits
// for those streams' events (the backend's eventDone) before reuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace weft::kernels {

class BlockCache {
 public:
  struct Backend {
    std::function<void*(size_t)> malloc;   // nullptr when out of memory
    std::function<void(void*)> free;
    std::function<void()> synchronize;     // waits for all work on the device
    // Records an event on `stream` now and returns it / whether it finished /
    // destroys it. May be left empty when recordStream is never used.
    std::function<void*(void* stream)> recordEvent;
    std::function<bool(void* event)> eventDone;
    std::function<void(void* event)> destroyEvent;
  };
  struct Stats {
    size_t allocatedBytes = 0, reservedBytes = 0, peakAllocatedBytes = 0, peakReservedBytes = 0;
    uint64_t mallocs = 0, frees = 0, cacheHits = 0;
  };

  explicit BlockCache(Backend backend) : backend_(std::move(backend)) {}
  ~BlockCache();

  static size_t roundSize(size_t nbytes);

  // A block of at least nbytes for use on `stream`; nullptr for 0 bytes.
  // Throws std::bad_alloc (caught and reworded by the caller) when the
  // backend fails even after the cache was released.
  void* allocate(size_t nbytes, void* stream);
  void deallocate(void* p);
  void recordStream(void* p, void* stream);
  // Frees every cached block (synchronising first); returns the bytes freed.
  size_t release();
  Stats stats() const;
  void resetPeak();
  size_t cachedBytes() const;

 private:
  struct Block {
    size_t size = 0;
    void* stream = nullptr;
    std::vector<void*> otherStreams;  // recordStream
  };
  struct Pending {
    void* p;
    std::vector<void*> events;
  };
  size_t releaseLocked();
  void collectPendingLocked();

  Backend backend_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  // Free blocks by (stream, size class).
  std::map<std::pair<void*, size_t>, std::vector<void*>> free_;
  std::unordered_map<void*, Block> freeInfo_;
  std::vector<Pending> pending_;
  Stats stats_;
};

}  // namespace weft::kernels
