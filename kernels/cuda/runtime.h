// The CUDA runtime layer's host API: the device of the calling thread,
// streams and events, the caching allocator, pinned host memory and copies.
// Plain C++ (no CUDA headers), declared in every build; defined only in
// builds with CUDA (kernels/cuda/runtime.cpp). Code outside kernels/ reaches
// the kernels through WEFT_CUDA_CALL (kernels/cuda_call.h), which makes a
// tensor's device current for the call.
//
//   kernels::cuda::DeviceGuard g(1);              // cuda:1 current until g ends
//   auto s = kernels::cuda::createStream(1);
//   kernels::cuda::StreamGuard sg(1, s);          // ops on cuda:1 enqueue on s
//
// Every failure is a DeviceError naming what was being done and the device.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weft::kernels::cuda {

using Stream = void*;  // a cudaStream_t
using Event = void*;   // a cudaEvent_t

// The calling thread's current device (cudaGetDevice).
int currentDevice();

// Makes `device` current for the guard's lifetime and restores the previous
// one after (only calls cudaSetDevice when they differ).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  int device_;
};

// ---- streams and events --------------------------------------------------------

// The stream ops on `device` enqueue on, for the calling thread. Unless set,
// every thread shares one non-blocking stream per device, created on first
// use (not the legacy default stream, which synchronises with all others).
Stream currentStream(int device);
// Sets the calling thread's stream for `device`; nullptr restores the shared one.
void setCurrentStream(int device, Stream s);
// A new non-blocking stream on `device`; destroyStream releases it.
Stream createStream(int device);
void destroyStream(int device, Stream s);
// Waits until everything enqueued on the current stream of `device` finished.
void synchronize(int device);
// Waits for every stream of `device`.
void synchronizeDevice(int device);

// Makes `s` the current stream of `device` for the guard's lifetime.
class StreamGuard {
 public:
  StreamGuard(int device, Stream s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  Stream previous_;
};

// Events order work across streams: record on one, wait on another.
Event createEvent(int device, bool timing = false);
void destroyEvent(int device, Event e);
void recordEvent(int device, Event e, Stream s);
void streamWaitEvent(int device, Stream s, Event e);
void synchronizeEvent(int device, Event e);
// Milliseconds between two recorded timing events (both finished).
float elapsedMs(int device, Event start, Event end);

// ---- the caching allocator -------------------------------------------------------

// Device memory for tensors. A freed block goes back to a per-device cache,
// keyed by its size class and the stream it was allocated on, and the next
// request of that class on that stream takes it without cudaMalloc (cudaFree
// synchronises the whole device). Reuse on the same stream is ordered by the
// stream itself; a block used on another stream must be recorded there
// (recordStream) so that it is not reused before that stream is done with it.
// When cudaMalloc fails, the cache is released and the allocation tried once
// more; a second failure is a DeviceError naming the request, the bytes in
// use and the bytes cached. Size classes: kernels/block_cache.h.
void* allocate(size_t nbytes, int device);
void deallocate(void* p, int device);
// Marks block `p` as used on stream `s` too: it goes back to the cache only
// after the work enqueued on `s` at deallocation time has finished.
void recordStream(void* p, int device, Stream s);
// Returns every cached block of `device` to the driver (after synchronising
// the device); returns the bytes freed.
size_t releaseCachedMemory(int device);

struct AllocatorStats {
  size_t allocatedBytes = 0;      // bytes in blocks handed out now
  size_t reservedBytes = 0;       // bytes obtained from cudaMalloc (allocated + cached)
  size_t peakAllocatedBytes = 0;  // since start or resetPeakStats
  size_t peakReservedBytes = 0;
  uint64_t deviceMallocs = 0;     // cudaMalloc calls
  uint64_t deviceFrees = 0;       // cudaFree calls
  uint64_t cacheHits = 0;         // allocations served from the cache
};
AllocatorStats allocatorStats(int device);
void resetPeakStats(int device);

// ---- pinned host memory and copies -----------------------------------------------

// Page-locked host memory (cached like device blocks): copies from it to a
// device are asynchronous. A freed block is reused only after the copies
// that read it have finished (each records an event).
void* allocatePinned(size_t nbytes);
void deallocatePinned(void* p);
// True when p lies in a live block of allocatePinned.
bool isPinned(const void* p);

// Host to device on the current stream of `device`. From pinned memory the
// copy is asynchronous; from pageable memory the call returns once the
// source has been read (the driver stages it), so the source may be reused.
void copyHostToDevice(void* dst, const void* src, size_t nbytes, int device);
// Device to host: waits for the current stream, so the result is readable.
void copyDeviceToHost(void* dst, const void* src, size_t nbytes, int device);
// Within one device or between devices (peer), on the current stream of `device`.
void copyDeviceToDevice(void* dst, const void* src, size_t nbytes, int device);

// ---- errors --------------------------------------------------------------------

// Throws DeviceError "<what> on cuda:<device>: <error name>: <error string>".
[[noreturn]] void throwError(int cudaError, const char* what, int device);
// After a kernel launch: a launch error (bad configuration, no kernel image
// for the device) becomes a DeviceError naming `op` and the current device.
void checkLaunch(const char* op);

// Multiprocessor count and the like, cached per device.
struct DeviceProperties {
  int multiprocessors = 0;
  int maxThreadsPerBlock = 0;
  size_t sharedMemPerBlockOptin = 0;
  int major = 0, minor = 0;
  size_t totalMemory = 0;
  char name[256] = {};
};
const DeviceProperties& properties(int device);

// TF32 tensor-core math for float32 GEMMs: off by default (float32 results as
// a CPU computes them, to rounding); WEFT_ALLOW_TF32=1 in the environment or
// setAllowTF32(true) turns it on (about 8x the float32 rate on an H100, with
// 10-bit mantissas in the products).
void setAllowTF32(bool on);
bool allowTF32();

}  // namespace weft::kernels::cuda
