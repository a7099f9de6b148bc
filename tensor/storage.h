// Storage: a reference-counted, 64-byte aligned byte buffer on one device.
// Tensors are views (offset, shape, strides) into a Storage; several tensors
// may share one.
//
//   auto s = weft::Storage::allocate(1024, weft::Device::cpu());
//   auto ext = weft::Storage::wrap(ptr, n, Device::cpu(), [](void* p) { free(p); });
//
// The version counter counts in-place writes through any view; autograd uses
// it to detect a saved tensor that was modified before backward read it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "common/dtype.h"

namespace weft {

class Storage {
 public:
  using Deleter = std::function<void(void*)>;

  // Uninitialised memory of `nbytes` on `device`. CUDA devices need a build
  // with WEFT_CUDA; otherwise InvalidArgumentError names the device. On the CPU,
  // 64-byte aligned; from 2 MiB up, 2 MiB aligned and advised for transparent
  // huge pages (fewer page faults when a large buffer is first filled, e.g. a
  // tensor received over RPC); from 64 KiB up, page aligned. Freed CPU
  // buffers of 64 KiB and more are kept (process-wide, up to the larger of
  // 256 MiB and the most CPU bytes ever live at once) and handed to the next
  // allocation of the same rounded size, so a training
  // loop's activations do not pay fresh page faults every step; contents are
  // then not zeroed.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device);
  // Frees the kept buffers (returns how many bytes that was) / the bytes kept now.
  static size_t releaseCachedMemory();
  static size_t cachedBytes();

  // Bytes held by live storages on `device` (every Storage counts its
  // nbytes() from construction to destruction, wrapped ones included; the
  // kept buffers above do not count), and the most that was held at once
  // since the process started or the last resetPeakBytes(device). Counters
  // are process-wide and lock-free; a CUDA index at or past 16 is an
  // InvalidArgumentError. What activation checkpointing and ZeRO report as
  // "memory held by tensors".
  struct MemoryStats {
    size_t liveBytes = 0;
    size_t peakBytes = 0;
  };
  static MemoryStats memoryStats(Device device = Device::cpu());
  // Sets the peak to the bytes live now.
  static void resetPeakBytes(Device device = Device::cpu());
  // Adopts memory allocated elsewhere (e.g. a receive buffer); `deleter` runs
  // when the last reference goes.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Device device, Deleter deleter);

  // Frees the buffer while the Storage itself, and so every tensor viewing it
  // (those autograd saved for backward included), lives on: data() is null,
  // nbytes() 0 and the bytes leave memoryStats() until reallocate(). Reading
  // a tensor of a released storage is a StateError (Tensor::rawData). The
  // version is unchanged. How fully sharded data parallelism frees gathered
  // parameters between a unit's forward and its backward.
  void release();
  // Gives the storage a fresh, uninitialised buffer of `nbytes` on its device
  // (allocate()'s rules), freeing the one it had; the version is unchanged,
  // so tensors saved for backward stay valid once the caller refills it.
  void reallocate(size_t nbytes);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bumpVersion() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  Storage(void* data, size_t nbytes, Device device, Deleter deleter);

  void* data_;
  size_t nbytes_;  // 0 once released
  Device device_;
  Deleter deleter_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace weft
