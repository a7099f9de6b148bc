// The caching allocator's bookkeeping (kernels/block_cache.h) over a fake backend that hands out
// addresses without memory, keeps a byte budget like a device, and records every call in order:
// size classes, reuse on the same stream only, recordStream deferring reuse until the other
// stream's event is done, release() synchronising and freeing every cached block, a failed
// malloc releasing the cache and retrying, and the statistics.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <new>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/block_cache.h"

using weft::kernels::BlockCache;

namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

// A device in miniature: `capacity` bytes, events that finish when told to or when the device
// synchronises, and a log of the calls ("malloc 1024", "malloc-fail 2097152", "free 1024",
// "sync", "event 7 on 2", "destroy 7").
struct FakeDevice {
  size_t capacity = std::numeric_limits<size_t>::max();
  size_t used = 0;
  uintptr_t nextAddress = 0x10000;
  std::map<void*, size_t> blocks;
  std::map<void*, bool> events;  // event -> done
  uintptr_t nextEvent = 1;
  std::vector<std::string> log;

  BlockCache::Backend backend() {
    BlockCache::Backend b;
    b.malloc = [this](size_t n) -> void* {
      if (n > capacity - used) {
        log.push_back("malloc-fail " + std::to_string(n));
        return nullptr;
      }
      void* p = reinterpret_cast<void*>(nextAddress);
      nextAddress += n + 4096;
      used += n;
      blocks[p] = n;
      log.push_back("malloc " + std::to_string(n));
      return p;
    };
    b.free = [this](void* p) {
      REQUIRE(blocks.count(p) == 1);
      used -= blocks[p];
      log.push_back("free " + std::to_string(blocks[p]));
      blocks.erase(p);
    };
    b.synchronize = [this] {
      for (auto& [e, done] : events) done = true;
      log.push_back("sync");
    };
    b.recordEvent = [this](void* stream) -> void* {
      void* e = reinterpret_cast<void*>(nextEvent++);
      events[e] = false;
      log.push_back("event " + std::to_string(reinterpret_cast<uintptr_t>(e)) + " on " +
                    std::to_string(reinterpret_cast<uintptr_t>(stream)));
      return e;
    };
    b.eventDone = [this](void* e) { return events.at(e); };
    b.destroyEvent = [this](void* e) {
      REQUIRE(events.count(e) == 1);
      events.erase(e);
      log.push_back("destroy " + std::to_string(reinterpret_cast<uintptr_t>(e)));
    };
    return b;
  }

  size_t count(const std::string& prefix) const {
    size_t n = 0;
    for (const std::string& l : log) n += l.rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
  }
};

void* stream(uintptr_t id) { return reinterpret_cast<void*>(id); }

}  // namespace

TEST_CASE("block cache: size classes") {
  CHECK(BlockCache::roundSize(0) == 0);
  CHECK(BlockCache::roundSize(1) == 512);
  CHECK(BlockCache::roundSize(512) == 512);
  CHECK(BlockCache::roundSize(513) == 1024);
  CHECK(BlockCache::roundSize(kMiB) == kMiB);
  // Four steps per power of two above 1 MiB.
  CHECK(BlockCache::roundSize(kMiB + 1) == kMiB + kMiB / 4);
  CHECK(BlockCache::roundSize(3 * kMiB) == 3 * kMiB);
  CHECK(BlockCache::roundSize(3 * kMiB + 1) == 3 * kMiB + kMiB / 2);
  CHECK(BlockCache::roundSize(5 * kMiB + 1) == 6 * kMiB);
  CHECK(BlockCache::roundSize((size_t{1} << 30) + 1) == (size_t{5} << 30) / 4);

  // Every class holds its request with at most a quarter (or 511 bytes) of slack, is its own
  // class, and classes grow with the request; from 8 MiB up they are whole 2 MiB pages.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const int bits = static_cast<int>(rng() % 40);
    const size_t n = 1 + (rng() & ((size_t{1} << bits) - 1)) + (rng() % 2 ? (size_t{1} << bits) : 0);
    const size_t r = BlockCache::roundSize(n);
    INFO("n = " << n << ", class " << r);
    REQUIRE(r >= n);
    CHECK(r - n <= std::max<size_t>(511, n / 4));
    CHECK(BlockCache::roundSize(r) == r);
    CHECK(BlockCache::roundSize(n + 1) >= r);
    if (r >= 8 * kMiB) CHECK(r % (2 * kMiB) == 0);
  }

  // Requests whose class would not fit in size_t: no class rounds them down.
  const size_t max = std::numeric_limits<size_t>::max();
  for (size_t n : {max, max - 1, max - (size_t{1} << 60), (max >> 1) + (size_t{1} << 62) + 1}) {
    INFO("n = " << n);
    CHECK(BlockCache::roundSize(n) >= n);
  }
  CHECK(BlockCache::roundSize(size_t{1} << 63) == size_t{1} << 63);
}

TEST_CASE("block cache: a request too large for any class is refused without asking the backend") {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  CHECK_THROWS_AS(cache.allocate(std::numeric_limits<size_t>::max() - kMiB, stream(1)), std::bad_alloc);
  CHECK(dev.count("malloc") == 0);
  CHECK(cache.stats().allocatedBytes == 0);
  // The cache still works.
  void* p = cache.allocate(100, stream(1));
  CHECK(p != nullptr);
  cache.deallocate(p);
}

TEST_CASE("block cache: a freed block serves the next request of its class on its stream") {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  CHECK(cache.allocate(0, stream(1)) == nullptr);
  void* p = cache.allocate(1000, stream(1));
  REQUIRE(p != nullptr);
  CHECK(dev.blocks.at(p) == 1024);
  cache.deallocate(p);
  CHECK(dev.blocks.count(p) == 1);  // cached, not freed
  void* q = cache.allocate(900, stream(1));  // same class (1024)
  CHECK(q == p);
  CHECK(dev.count("malloc ") == 1);
  CHECK(cache.stats().cacheHits == 1);

  // Another class is another block; two live blocks of one class are two blocks.
  void* r = cache.allocate(2000, stream(1));
  void* s = cache.allocate(1000, stream(1));
  CHECK(r != p);
  CHECK(s != p);
  CHECK(s != r);
  CHECK(dev.count("malloc ") == 3);
  cache.deallocate(q);
  cache.deallocate(r);
  cache.deallocate(s);
  // Both 1024-byte blocks come back before a new one is made.
  std::set<void*> again{cache.allocate(1024, stream(1)), cache.allocate(513, stream(1))};
  CHECK(again == std::set<void*>{p, s});
  CHECK(dev.count("malloc ") == 3);
  CHECK(cache.stats().cacheHits == 3);

  // Freeing a pointer twice, or one the cache never gave, changes nothing.
  void* t = cache.allocate(4096, stream(1));
  cache.deallocate(t);
  cache.deallocate(t);
  cache.deallocate(reinterpret_cast<void*>(0x1));
  cache.deallocate(nullptr);
  CHECK(cache.allocate(4096, stream(1)) == t);
  CHECK(cache.allocate(4096, stream(1)) != t);
}

TEST_CASE("block cache: a block freed on one stream is not reused on another") {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  void* p = cache.allocate(kMiB, stream(1));
  cache.deallocate(p);
  void* q = cache.allocate(kMiB, stream(2));
  CHECK(q != p);
  CHECK(dev.count("malloc ") == 2);
  CHECK(cache.stats().cacheHits == 0);
  // Stream 1 still finds its own.
  CHECK(cache.allocate(kMiB, stream(1)) == p);
}

TEST_CASE("block cache: recordStream defers reuse until the other stream's work is done") {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  void* p = cache.allocate(kMiB, stream(1));
  cache.recordStream(p, stream(1));  // its own stream: nothing to wait for
  cache.recordStream(p, stream(2));
  cache.recordStream(p, stream(2));  // once per stream
  cache.recordStream(p, stream(3));
  CHECK(dev.count("event") == 0);  // events are recorded when the block is freed
  cache.deallocate(p);
  CHECK(dev.log == std::vector<std::string>{"malloc 1048576", "event 1 on 2", "event 2 on 3"});

  // Not reusable while either event is pending, on its own stream or any other.
  void* q = cache.allocate(kMiB, stream(1));
  CHECK(q != p);
  cache.deallocate(q);
  dev.events.at(reinterpret_cast<void*>(1)) = true;
  void* r = cache.allocate(kMiB, stream(1));
  CHECK(r == q);  // the ordinary cached block; p still waits for stream 3
  dev.events.at(reinterpret_cast<void*>(2)) = true;
  void* s = cache.allocate(kMiB, stream(1));
  CHECK(s == p);
  CHECK(dev.count("destroy") == 2);
  CHECK(dev.events.empty());
  CHECK(cache.stats().cacheHits == 2);

  // Reused, the block starts with no other stream: freeing it again records no event.
  cache.deallocate(s);
  CHECK(dev.count("event") == 2);
  CHECK(cache.allocate(kMiB, stream(1)) == p);

  // recordStream on a pointer the cache does not hand out (any more) is ignored.
  cache.recordStream(reinterpret_cast<void*>(0x1), stream(2));
  cache.deallocate(r);
  cache.recordStream(r, stream(2));
  CHECK(cache.allocate(kMiB, stream(1)) == r);
  CHECK(dev.count("event") == 2);
}

TEST_CASE("block cache: release frees every cached block after synchronising, and only those") {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  CHECK(cache.release() == 0);
  CHECK(dev.log.empty());  // nothing cached: no synchronisation either

  void* live = cache.allocate(512, stream(1));
  void* a = cache.allocate(kMiB, stream(1));
  void* b = cache.allocate(3 * kMiB, stream(2));
  void* pending = cache.allocate(2048, stream(1));
  cache.recordStream(pending, stream(2));
  cache.deallocate(a);
  cache.deallocate(b);
  cache.deallocate(pending);
  dev.log.clear();
  CHECK(cache.cachedBytes() == kMiB + 3 * kMiB + 2048);

  // The pending block's event finishes with the synchronisation, so it is freed too.
  CHECK(cache.release() == kMiB + 3 * kMiB + 2048);
  REQUIRE(!dev.log.empty());
  CHECK(dev.log.front() == "sync");
  CHECK(dev.count("free ") == 3);
  CHECK(dev.count("destroy") == 1);
  CHECK(dev.blocks.size() == 1);
  CHECK(dev.blocks.count(live) == 1);
  const BlockCache::Stats s = cache.stats();
  CHECK(s.reservedBytes == 512);
  CHECK(s.allocatedBytes == 512);
  CHECK(s.frees == 3);
  CHECK(cache.cachedBytes() == 0);

  // Freed blocks are gone from the cache: the next request is a new malloc.
  dev.log.clear();
  cache.allocate(kMiB, stream(1));
  CHECK(dev.log == std::vector<std::string>{"malloc 1048576"});
}

TEST_CASE("block cache: a failed malloc releases the cache and tries once more") {
  FakeDevice dev;
  dev.capacity = 4 * kMiB;
  BlockCache cache(dev.backend());
  void* keep = cache.allocate(kMiB, stream(1));
  void* cached = cache.allocate(2 * kMiB, stream(2));
  cache.deallocate(cached);
  dev.log.clear();

  // 2.5 MiB fits only once the cached 2 MiB block is returned.
  void* p = cache.allocate(2 * kMiB + kMiB / 2, stream(1));
  CHECK(p != nullptr);
  CHECK(dev.log == std::vector<std::string>{"malloc-fail 2621440", "sync", "free 2097152", "malloc 2621440"});
  CHECK(dev.blocks.count(keep) == 1);
  BlockCache::Stats s = cache.stats();
  CHECK(s.allocatedBytes == kMiB + 2 * kMiB + kMiB / 2);
  CHECK(s.reservedBytes == s.allocatedBytes);
  CHECK(s.mallocs == 3);
  CHECK(s.frees == 1);

  // When even the released cache is not enough: std::bad_alloc, and nothing changes.
  cache.deallocate(p);
  dev.log.clear();
  CHECK_THROWS_AS(cache.allocate(4 * kMiB, stream(1)), std::bad_alloc);
  CHECK(dev.log == std::vector<std::string>{"malloc-fail 4194304", "sync", "free 2621440", "malloc-fail 4194304"});
  s = cache.stats();
  CHECK(s.allocatedBytes == kMiB);
  CHECK(s.reservedBytes == kMiB);
  CHECK(s.mallocs == 3);
  // The live block is untouched and the cache keeps working.
  CHECK(dev.blocks.size() == 1);
  cache.deallocate(keep);
  CHECK(cache.allocate(kMiB, stream(1)) == keep);
}

TEST_CASE("block cache: statistics") {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  void* a = cache.allocate(1000, stream(1));        // 1024
  void* b = cache.allocate(kMiB + 1, stream(1));    // 1.25 MiB
  const size_t big = kMiB + kMiB / 4;
  BlockCache::Stats s = cache.stats();
  CHECK(s.allocatedBytes == 1024 + big);
  CHECK(s.reservedBytes == 1024 + big);
  CHECK(s.peakAllocatedBytes == 1024 + big);
  CHECK(s.peakReservedBytes == 1024 + big);
  CHECK(s.mallocs == 2);
  CHECK(s.frees == 0);
  CHECK(s.cacheHits == 0);

  cache.deallocate(b);
  s = cache.stats();
  CHECK(s.allocatedBytes == 1024);
  CHECK(s.reservedBytes == 1024 + big);  // cached bytes stay reserved
  CHECK(s.peakAllocatedBytes == 1024 + big);
  CHECK(cache.cachedBytes() == big);

  void* c = cache.allocate(kMiB + 2, stream(1));  // the cached block
  CHECK(c == b);
  s = cache.stats();
  CHECK(s.cacheHits == 1);
  CHECK(s.mallocs == 2);
  CHECK(s.allocatedBytes == 1024 + big);
  CHECK(cache.cachedBytes() == 0);

  // resetPeak starts the peaks again from the current figures.
  cache.deallocate(c);
  cache.deallocate(a);
  cache.resetPeak();
  s = cache.stats();
  CHECK(s.peakAllocatedBytes == 0);
  CHECK(s.peakReservedBytes == 1024 + big);
  void* d = cache.allocate(512, stream(2));
  s = cache.stats();
  CHECK(s.peakAllocatedBytes == 512);
  CHECK(s.peakReservedBytes == 1024 + big + 512);
  CHECK(cache.release() == 1024 + big);
  s = cache.stats();
  CHECK(s.reservedBytes == 512);
  CHECK(s.peakReservedBytes == 1024 + big + 512);  // peaks are not lowered by a release
  CHECK(s.frees == 2);
  cache.deallocate(d);
}
