// Shared-memory links between pipeline stages on one machine: the
// activations and gradients of a step written by one stage's thread straight
// into memory the next stage's thread reads, with no socket, no loop thread
// and no waiter thread between them. Internal to the pipeline layer
// (PipelineExecutor, "Shared memory" in pipeline/executor.h).
//
//   auto ring = ShmRing::create(slots, capacity);        // the producing stage's
//   RingDescriptor d = ring->descriptor();               // sent to the consumer (over the group)
//   std::string why;
//   auto mapped = ShmRing::attach(d, slots, &why);       // the consuming stage's view; null: why
//   ring->publish(gen, slot, header, data, bytes);       // producer
//   const int64_t* h = mapped->await(gen, slot, peer, deadline, what);  // consumer
//   mapped->copyOut(slot, bytes, into);
//
// Layout: a page of ring header (a 128-bit token, the consumer's wait word),
// then `slots` message headers of 128 bytes (a ready word and up to 15 words
// the producer writes: PipelineExecutor's flag, dtype and shape), then the
// data area, where slot n's data starts at n · round_up(bytes, 64) for the
// step's message size `bytes`. Every message of a step has the same size; a
// slot is written once per step; the generation (the step's number) in its
// ready word tells one step's message from the last's. Memory: a memfd of
// the largest capacity, its pages allocated as they are first written (the
// messages of the largest step the link carried stay resident until the
// ring is destroyed; Storage::memoryStats does not count them).
//
// Ordering: the producer writes header words and data, then stores the
// ready word with release order; the consumer loads it with acquire order.
// The consumer spins for a few microseconds, then sleeps on the ring's wait
// word (a futex shared between the processes), waking every 10 ms to check
// that the producer's process still runs (pidfd) and the deadline; the
// producer wakes it only when it sleeps.
//
// Attaching: the consumer opens /proc/<pid>/fd/<fd> of the producer's memfd
// (the same user's processes on one machine; any other case fails to open or
// finds another file), checks its size and the token, and maps it read-only.
// The producer closes its descriptor once the consumer has mapped it
// (releaseFd), so nothing is left in /dev/shm or /proc when the processes
// end.
//
// Errors: DisconnectedError when the producer's process ended (naming its
// rank and pid), TimeoutError past the deadline; `what` prefixes both.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace weft::pipeline::detail {

// What the consumer needs to map a ring, as words for a message.
struct RingDescriptor {
  static constexpr int kWords = 8;
  int64_t pid = 0;  // 0: the producer offers no ring
  int64_t fd = -1;
  uint64_t tokenLo = 0, tokenHi = 0;
  int64_t slots = 0;
  int64_t capacity = 0;  // bytes of the data area
  void toWords(int64_t* out) const;  // kWords words, with a magic word first
  // Null-descriptor (pid 0) for words that are no descriptor.
  static RingDescriptor fromWords(const int64_t* words);
};

// A process on this machine, watched for its end.
class PeerProcess {
 public:
  PeerProcess(int64_t pid, int rank);
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  bool ended() const;
  int64_t pid() const { return pid_; }
  int rank() const { return rank_; }

 private:
  int64_t pid_;
  int rank_;
  int pidfd_ = -1;
};

class ShmRing {
 public:
  static constexpr int kHeaderWords = 15;
  static constexpr size_t kSlotHeaderBytes = 128;  // a message's header: the ready word and kHeaderWords
  using Clock = std::chrono::steady_clock;

  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // The producer's ring of `slots` message headers and `capacity` bytes of
  // data; Error naming the call when the system refuses it.
  static std::unique_ptr<ShmRing> create(int slots, size_t capacity);
  // The consumer's view of the ring `d` describes, which must have `slots`
  // slots; null, with the reason in *why, when it cannot be mapped (another
  // machine, another user, shared memory off).
  static std::unique_ptr<ShmRing> attach(const RingDescriptor& d, int slots, std::string* why);

  RingDescriptor descriptor() const;
  // Producer: closes the memfd's descriptor (the mapping stays).
  void releaseFd();
  int slots() const { return slots_; }
  // Whether every slot can hold a message of `bytes` bytes.
  bool fits(size_t bytes) const;

  // Producer: message `slot` of generation `gen` (>= 1): `header`
  // (kHeaderWords words), then `bytes` bytes of `data` (none when data is
  // null), then the ready word; wakes a sleeping consumer.
  void publish(uint64_t gen, int slot, const int64_t* header, const void* data, size_t bytes);
  // Consumer: waits for message `slot` of generation `gen` and returns its
  // header words. `peer` is the producer's process.
  const int64_t* await(uint64_t gen, int slot, const PeerProcess& peer, Clock::time_point deadline,
                       const std::string& what);
  // Consumer: copies the data of message `slot` (of `bytes` bytes) into `into`.
  void copyOut(int slot, size_t bytes, void* into) const;

 private:
  ShmRing() = default;
  // The layout both sides derive from the slot count and the data capacity.
  void setLayout(int slots, size_t capacity);
  uint8_t* slotHeader(int slot) const;
  const uint8_t* data(int slot, size_t bytes) const;

  uint8_t* base_ = nullptr;
  size_t mapped_ = 0;
  int slots_ = 0;
  size_t capacity_ = 0;
  size_t dataOffset_ = 0;
  int fd_ = -1;
  int64_t pid_ = 0;
  uint64_t tokenLo_ = 0, tokenHi_ = 0;
};

}  // namespace weft::pipeline::detail
