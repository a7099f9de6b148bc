// Definitions of kernels/cuda/runtime.h and, for CUDA builds, of
// kernels/device.h.
#include "kernels/cuda/runtime.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <map>
#include <vector>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "common/error.h"
#include "kernels/block_cache.h"
#include "kernels/device.h"

namespace weft::kernels::cuda {

namespace {

constexpr int kMaxDevices = 16;

#define CHECK_CUDA(call, what, device)                                  \
  do {                                                                  \
    cudaError_t e_ = (call);                                            \
    if (e_ != cudaSuccess) throwError(static_cast<int>(e_), what, device); \
  } while (0)

int deviceCountChecked() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void checkDevice(int device, const char* what) {
  static const int count = deviceCountChecked();
  WEFT_ENFORCE(device >= 0 && device < count && device < kMaxDevices, InvalidArgumentError, what, ": cuda:", device,
               " does not exist (", count, " CUDA device(s) visible)");
}

// The shared per-device stream, created on first use.
std::array<std::atomic<cudaStream_t>, kMaxDevices> gSharedStream{};
std::mutex gStreamMu;
thread_local std::array<cudaStream_t, kMaxDevices> tStream{};

cudaStream_t sharedStream(int device) {
  cudaStream_t s = gSharedStream[device].load(std::memory_order_acquire);
  if (s) return s;
  std::lock_guard<std::mutex> lk(gStreamMu);
  s = gSharedStream[device].load(std::memory_order_relaxed);
  if (s) return s;
  DeviceGuard g(device);
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating the device's stream", device);
  gSharedStream[device].store(s, std::memory_order_release);
  return s;
}

BlockCache& cacheFor(int device) {
  static std::array<std::unique_ptr<BlockCache>, kMaxDevices>* caches = new std::array<std::unique_ptr<BlockCache>, kMaxDevices>();
  static std::mutex mu;
  std::lock_guard<std::mutex> lk(mu);
  auto& c = (*caches)[device];
  if (!c) {
    BlockCache::Backend b;
    b.malloc = [device](size_t n) -> void* {
      DeviceGuard g(device);
      void* p = nullptr;
      if (cudaMalloc(&p, n) != cudaSuccess) {
        cudaGetLastError();  // clear the error: the cache is released and the call retried
        return nullptr;
      }
      return p;
    };
    b.free = [device](void* p) {
      DeviceGuard g(device);
      cudaFree(p);
    };
    b.synchronize = [device] {
      DeviceGuard g(device);
      CHECK_CUDA(cudaDeviceSynchronize(), "synchronising before releasing cached memory", device);
    };
    b.recordEvent = [device](void* stream) -> void* {
      DeviceGuard g(device);
      cudaEvent_t e;
      CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event", device);
      CHECK_CUDA(cudaEventRecord(e, static_cast<cudaStream_t>(stream)), "recording an event", device);
      return e;
    };
    b.eventDone = [](void* e) { return cudaEventQuery(static_cast<cudaEvent_t>(e)) != cudaErrorNotReady; };
    b.destroyEvent = [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); };
    // Leaked on purpose: tensors in static storage may be freed after main returns.
    c.reset(new BlockCache(std::move(b)));
  }
  return *c;
}

// Pinned host blocks, cached by rounded size. An asynchronous copy from or
// to a block records an event; a freed block is reused only once its
// events have completed (the copy may still be reading it).
struct PinnedBlock {
  size_t size = 0;
  std::vector<std::pair<int, cudaEvent_t>> events;  // (device, event)
};
struct PinnedPool {
  std::mutex mu;
  std::map<uintptr_t, PinnedBlock> live;  // by start address
  std::unordered_multimap<size_t, void*> free;
  std::vector<std::pair<void*, PinnedBlock>> pending;  // freed, copies in flight

  // The live block holding p, or nullptr.
  PinnedBlock* find(const void* p) {
    auto u = reinterpret_cast<uintptr_t>(p);
    auto it = live.upper_bound(u);
    if (it == live.begin()) return nullptr;
    --it;
    return u < it->first + it->second.size ? &it->second : nullptr;
  }
  void collect() {
    for (size_t i = 0; i < pending.size();) {
      auto& evs = pending[i].second.events;
      bool done = true;
      for (auto& [d, e] : evs) done = done && cudaEventQuery(e) != cudaErrorNotReady;
      if (!done) {
        ++i;
        continue;
      }
      cudaGetLastError();
      for (auto& [d, e] : evs) cudaEventDestroy(e);
      free.emplace(pending[i].second.size, pending[i].first);
      pending[i] = std::move(pending.back());
      pending.pop_back();
    }
  }
};
PinnedPool& pinnedPool() {
  static PinnedPool* p = new PinnedPool();
  return *p;
}

// Records, on `stream` of `device`, that an asynchronous copy uses the
// pinned block holding `host` (nothing when `host` is not pinned by weft).
void notePinnedUse(const void* host, int device, cudaStream_t stream) {
  PinnedPool& pool = pinnedPool();
  std::lock_guard<std::mutex> lk(pool.mu);
  PinnedBlock* b = pool.find(host);
  if (!b) return;
  cudaEvent_t e;
  CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event", device);
  CHECK_CUDA(cudaEventRecord(e, stream), "recording an event", device);
  b->events.emplace_back(device, e);
}

std::atomic<int> gAllowTF32{-1};

}  // namespace

// ---- device --------------------------------------------------------------------

int currentDevice() {
  int d = 0;
  cudaError_t e = cudaGetDevice(&d);
  if (e != cudaSuccess) throwError(static_cast<int>(e), "cudaGetDevice", -1);
  return d;
}

DeviceGuard::DeviceGuard(int device) : previous_(-1), device_(device) {
  int cur = 0;
  if (cudaGetDevice(&cur) != cudaSuccess) {
    cudaGetLastError();
    cur = -1;
  }
  if (cur != device) {
    checkDevice(device, "selecting a device");
    CHECK_CUDA(cudaSetDevice(device), "cudaSetDevice", device);
    previous_ = cur;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

const DeviceProperties& properties(int device) {
  // Read before every launch (blocksFor): filled once per device under the
  // lock, then read without it.
  static std::array<std::atomic<const DeviceProperties*>, kMaxDevices> props{};
  static std::mutex mu;
  checkDevice(device, "reading device properties");
  if (const DeviceProperties* known = props[device].load(std::memory_order_acquire)) return *known;
  std::lock_guard<std::mutex> lk(mu);
  if (const DeviceProperties* known = props[device].load(std::memory_order_relaxed)) return *known;
  cudaDeviceProp dp;
  CHECK_CUDA(cudaGetDeviceProperties(&dp, device), "cudaGetDeviceProperties", device);
  auto* p = new DeviceProperties();  // kept for the process's life
  p->multiprocessors = dp.multiProcessorCount;
  p->maxThreadsPerBlock = dp.maxThreadsPerBlock;
  p->sharedMemPerBlockOptin = dp.sharedMemPerBlockOptin;
  p->major = dp.major;
  p->minor = dp.minor;
  p->totalMemory = dp.totalGlobalMem;
  std::memcpy(p->name, dp.name, std::min(sizeof(p->name) - 1, sizeof(dp.name)));
  props[device].store(p, std::memory_order_release);
  return *p;
}

// ---- streams and events ----------------------------------------------------------

Stream currentStream(int device) {
  checkDevice(device, "currentStream");
  cudaStream_t s = tStream[device];
  return s ? s : sharedStream(device);
}

void setCurrentStream(int device, Stream s) {
  checkDevice(device, "setCurrentStream");
  tStream[device] = static_cast<cudaStream_t>(s);
}

Stream createStream(int device) {
  checkDevice(device, "createStream");
  DeviceGuard g(device);
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", device);
  return s;
}

void destroyStream(int device, Stream s) {
  DeviceGuard g(device);
  CHECK_CUDA(cudaStreamDestroy(static_cast<cudaStream_t>(s)), "cudaStreamDestroy", device);
}

void synchronize(int device) {
  DeviceGuard g(device);
  CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(currentStream(device))), "synchronising the stream",
             device);
}

void synchronizeDevice(int device) {
  DeviceGuard g(device);
  CHECK_CUDA(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device);
}

StreamGuard::StreamGuard(int device, Stream s) : device_(device), previous_(nullptr) {
  checkDevice(device, "StreamGuard");
  previous_ = tStream[device];
  tStream[device] = static_cast<cudaStream_t>(s);
}

StreamGuard::~StreamGuard() { tStream[device_] = static_cast<cudaStream_t>(previous_); }

Event createEvent(int device, bool timing) {
  DeviceGuard g(device);
  cudaEvent_t e;
  CHECK_CUDA(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate",
             device);
  return e;
}

void destroyEvent(int device, Event e) {
  DeviceGuard g(device);
  cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void recordEvent(int device, Event e, Stream s) {
  DeviceGuard g(device);
  CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)), "cudaEventRecord", device);
}

void streamWaitEvent(int device, Stream s, Event e) {
  DeviceGuard g(device);
  CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0), "cudaStreamWaitEvent",
             device);
}

void synchronizeEvent(int device, Event e) {
  DeviceGuard g(device);
  CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize", device);
}

float elapsedMs(int device, Event start, Event end) {
  DeviceGuard g(device);
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
             "cudaEventElapsedTime", device);
  return ms;
}

// ---- allocator -------------------------------------------------------------------

void* allocate(size_t nbytes, int device) {
  checkDevice(device, "allocating device memory");
  if (nbytes == 0) return nullptr;
  BlockCache& c = cacheFor(device);
  try {
    return c.allocate(nbytes, currentStream(device));
  } catch (const std::bad_alloc&) {
    auto s = c.stats();
    throw DeviceError(detail::concat("out of memory on cuda:", device, ": allocating ", nbytes, " bytes (",
                                     BlockCache::roundSize(nbytes), " rounded) with ", s.allocatedBytes,
                                     " bytes in use by tensors and the cache released; free tensors or use a smaller batch"));
  }
}

void deallocate(void* p, int device) {
  if (!p) return;
  cacheFor(device).deallocate(p);
}

void recordStream(void* p, int device, Stream s) { cacheFor(device).recordStream(p, s); }

size_t releaseCachedMemory(int device) {
  checkDevice(device, "releaseCachedMemory");
  return cacheFor(device).release();
}

AllocatorStats allocatorStats(int device) {
  checkDevice(device, "allocatorStats");
  auto s = cacheFor(device).stats();
  AllocatorStats a;
  a.allocatedBytes = s.allocatedBytes;
  a.reservedBytes = s.reservedBytes;
  a.peakAllocatedBytes = s.peakAllocatedBytes;
  a.peakReservedBytes = s.peakReservedBytes;
  a.deviceMallocs = s.mallocs;
  a.deviceFrees = s.frees;
  a.cacheHits = s.cacheHits;
  return a;
}

void resetPeakStats(int device) {
  checkDevice(device, "resetPeakStats");
  cacheFor(device).resetPeak();
}

// ---- pinned memory and copies ------------------------------------------------------

void* allocatePinned(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = BlockCache::roundSize(nbytes);
  PinnedPool& pool = pinnedPool();
  {
    std::lock_guard<std::mutex> lk(pool.mu);
    if (!pool.pending.empty()) pool.collect();
    auto it = pool.free.find(size);
    if (it != pool.free.end()) {
      void* p = it->second;
      pool.free.erase(it);
      pool.live[reinterpret_cast<uintptr_t>(p)] = PinnedBlock{size, {}};
      return p;
    }
  }
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
  if (e != cudaSuccess) throwError(static_cast<int>(e), "allocating pinned host memory", -1);
  std::lock_guard<std::mutex> lk(pool.mu);
  pool.live[reinterpret_cast<uintptr_t>(p)] = PinnedBlock{size, {}};
  return p;
}

void deallocatePinned(void* p) {
  if (!p) return;
  PinnedPool& pool = pinnedPool();
  std::lock_guard<std::mutex> lk(pool.mu);
  auto it = pool.live.find(reinterpret_cast<uintptr_t>(p));
  if (it == pool.live.end()) return;
  PinnedBlock b = std::move(it->second);
  pool.live.erase(it);
  if (b.events.empty()) {
    pool.free.emplace(b.size, p);
  } else {
    pool.pending.emplace_back(p, std::move(b));
  }
}

bool isPinned(const void* p) {
  PinnedPool& pool = pinnedPool();
  std::lock_guard<std::mutex> lk(pool.mu);
  return pool.find(p) != nullptr;
}

void copyHostToDevice(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard g(device);
  auto s = static_cast<cudaStream_t>(currentStream(device));
  CHECK_CUDA(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s), "copying host to device", device);
  notePinnedUse(src, device, s);
}

void copyDeviceToHost(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard g(device);
  auto s = static_cast<cudaStream_t>(currentStream(device));
  CHECK_CUDA(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s), "copying device to host", device);
  CHECK_CUDA(cudaStreamSynchronize(s), "copying device to host", device);
}

void copyDeviceToDevice(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard g(device);
  CHECK_CUDA(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, static_cast<cudaStream_t>(currentStream(device))),
             "copying device to device", device);
}

// ---- errors --------------------------------------------------------------------

void throwError(int err, const char* what, int device) {
  auto e = static_cast<cudaError_t>(err);
  cudaGetLastError();  // clear a non-sticky error so that later calls are not blamed for it
  std::string where = device >= 0 ? detail::concat(" on cuda:", device) : std::string();
  if (e == cudaErrorMemoryAllocation) {
    throw DeviceError(detail::concat(what, where, ": out of memory (", cudaGetErrorName(e), ")"));
  }
  throw DeviceError(detail::concat(what, where, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

void checkLaunch(const char* op) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    int d = -1;
    cudaGetDevice(&d);
    throwError(static_cast<int>(e), detail::concat("launching the kernel of ", op).c_str(), d);
  }
}

void setAllowTF32(bool on) { gAllowTF32.store(on ? 1 : 0); }

bool allowTF32() {
  int v = gAllowTF32.load();
  if (v < 0) {
    const char* env = std::getenv("WEFT_ALLOW_TF32");
    v = env && std::strcmp(env, "1") == 0 ? 1 : 0;
    gAllowTF32.store(v);
  }
  return v == 1;
}

}  // namespace weft::kernels::cuda

// ---- kernels/device.h --------------------------------------------------------------

namespace weft::kernels {

bool cudaBuilt() { return true; }

int cudaDeviceCount() {
  static const int n = cuda::deviceCountChecked();
  return n;
}

void* deviceAlloc(size_t nbytes, int device) {
  int n = cudaDeviceCount();
  WEFT_ENFORCE(device >= 0 && device < n, InvalidArgumentError, "cannot allocate on cuda:", device, ": ", n,
               " CUDA device(s) visible");
  return cuda::allocate(nbytes, device);
}

void deviceFree(void* p, int device) { cuda::deallocate(p, device); }

void deviceMemcpy(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  cuda::DeviceGuard g(device);
  auto s = static_cast<cudaStream_t>(cuda::currentStream(device));
  cudaPointerAttributes ds{}, ss{};
  cudaPointerGetAttributes(&ds, dst);
  cudaPointerGetAttributes(&ss, src);
  cudaGetLastError();
  const bool dstDev = ds.type == cudaMemoryTypeDevice, srcDev = ss.type == cudaMemoryTypeDevice;
  if (dstDev && srcDev) return cuda::copyDeviceToDevice(dst, src, nbytes, device);
  if (dstDev) return cuda::copyHostToDevice(dst, src, nbytes, device);
  if (srcDev) return cuda::copyDeviceToHost(dst, src, nbytes, device);
  (void)s;
  std::memcpy(dst, src, nbytes);
}

}  // namespace weft::kernels
