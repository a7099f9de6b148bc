#include "pipeline/shm_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <thread>

#include "common/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace weft::pipeline::detail {

namespace {

constexpr int64_t kDescriptorMagic = 0x7765667472696e67;  // "weftring"
constexpr size_t kPage = 4096;
constexpr size_t kSlotHeaderBytes = ShmRing::kSlotHeaderBytes;
constexpr size_t kAlign = 64;
// In the ring's first page: the token, then (on its own cache line) the
// consumer's wait word.
constexpr size_t kTokenOffset = 0;
constexpr size_t kWaitOffset = 64;
// How long the consumer spins before it sleeps, and how long each sleep is
// at most before it checks the producer's process and the deadline.
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr auto kSleepSlice = std::chrono::milliseconds(10);

size_t roundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

std::string errnoText(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

std::atomic_ref<uint64_t> readyWord(uint8_t* header) { return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(header)); }

uint64_t readyValue(uint64_t gen, int slot) { return (gen << 32) | static_cast<uint64_t>(slot + 1); }

long futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace

void RingDescriptor::toWords(int64_t* out) const {
  out[0] = kDescriptorMagic;
  out[1] = pid;
  out[2] = fd;
  out[3] = static_cast<int64_t>(tokenLo);
  out[4] = static_cast<int64_t>(tokenHi);
  out[5] = slots;
  out[6] = capacity;
  out[7] = 0;
}

RingDescriptor RingDescriptor::fromWords(const int64_t* w) {
  RingDescriptor d;
  if (w[0] != kDescriptorMagic || w[1] <= 0 || w[2] < 0 || w[5] <= 0 || w[6] < 0) return RingDescriptor{};
  d.pid = w[1];
  d.fd = w[2];
  d.tokenLo = static_cast<uint64_t>(w[3]);
  d.tokenHi = static_cast<uint64_t>(w[4]);
  d.slots = w[5];
  d.capacity = w[6];
  return d;
}

// ---- PeerProcess --------------------------------------------------------------------------

PeerProcess::PeerProcess(int64_t pid, int rank) : pid_(pid), rank_(rank) {
#ifdef SYS_pidfd_open
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#endif
}

PeerProcess::~PeerProcess() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool PeerProcess::ended() const {
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  return ::kill(static_cast<pid_t>(pid_), 0) != 0 && errno == ESRCH;
}

// ---- ShmRing ------------------------------------------------------------------------------

ShmRing::~ShmRing() {
  if (base_ != nullptr) ::munmap(base_, mapped_);
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<ShmRing> ShmRing::create(int slots, size_t capacity) {
  WEFT_ENFORCE(slots > 0, InvalidArgumentError, "ShmRing: a ring needs at least one slot, got ", slots);
  std::unique_ptr<ShmRing> r(new ShmRing());
  r->setLayout(slots, capacity);
  r->fd_ = static_cast<int>(::syscall(SYS_memfd_create, "weft-pipeline-ring", MFD_CLOEXEC));
  if (r->fd_ < 0) throw Error("pipeline shared memory: " + errnoText("memfd_create"));
  if (::ftruncate(r->fd_, static_cast<off_t>(r->mapped_)) != 0) {
    throw Error("pipeline shared memory: " + errnoText("ftruncate"));
  }
  void* p = ::mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) throw Error("pipeline shared memory: " + errnoText("mmap"));
  r->base_ = static_cast<uint8_t*>(p);
  std::random_device rd;
  r->tokenLo_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  r->tokenHi_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::memcpy(r->base_ + kTokenOffset, &r->tokenLo_, 8);
  std::memcpy(r->base_ + kTokenOffset + 8, &r->tokenHi_, 8);
  r->pid_ = ::getpid();
  return r;
}

std::unique_ptr<ShmRing> ShmRing::attach(const RingDescriptor& d, int slots, std::string* why) {
  if (d.pid <= 0) {
    *why = "the peer offers no shared memory";
    return nullptr;
  }
  if (d.slots != slots) {
    *why = "the peer's ring has " + std::to_string(d.slots) + " slots, not " + std::to_string(slots);
    return nullptr;
  }
  const std::string path = "/proc/" + std::to_string(d.pid) + "/fd/" + std::to_string(d.fd);
  // Read-write: the consumer stores the ring's wait word (it never writes a message).
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *why = errnoText(("open " + path).c_str());
    return nullptr;
  }
  std::unique_ptr<ShmRing> r(new ShmRing());
  r->setLayout(slots, static_cast<size_t>(d.capacity));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != r->mapped_) {
    ::close(fd);
    *why = path + " is not the peer's ring";
    return nullptr;
  }
  void* p = ::mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    *why = errnoText("mmap");
    return nullptr;
  }
  r->base_ = static_cast<uint8_t*>(p);
  uint64_t lo = 0, hi = 0;
  std::memcpy(&lo, r->base_ + kTokenOffset, 8);
  std::memcpy(&hi, r->base_ + kTokenOffset + 8, 8);
  if (lo != d.tokenLo || hi != d.tokenHi) {
    *why = path + " holds another ring";
    return nullptr;  // unmapped by the destructor
  }
  r->pid_ = d.pid;
  r->tokenLo_ = lo;
  r->tokenHi_ = hi;
  return r;
}

void ShmRing::setLayout(int slots, size_t capacity) {
  slots_ = slots;
  capacity_ = capacity;
  dataOffset_ = kPage + roundUp(static_cast<size_t>(slots) * kSlotHeaderBytes, kPage);
  mapped_ = dataOffset_ + capacity_;
}

RingDescriptor ShmRing::descriptor() const {
  RingDescriptor d;
  d.pid = pid_;
  d.fd = fd_;
  d.tokenLo = tokenLo_;
  d.tokenHi = tokenHi_;
  d.slots = slots_;
  d.capacity = static_cast<int64_t>(capacity_);
  return d;
}

void ShmRing::releaseFd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool ShmRing::fits(size_t bytes) const {
  const size_t stride = roundUp(bytes, kAlign);
  return bytes == 0 || stride <= capacity_ / static_cast<size_t>(slots_);
}

uint8_t* ShmRing::slotHeader(int slot) const { return base_ + kPage + static_cast<size_t>(slot) * kSlotHeaderBytes; }

const uint8_t* ShmRing::data(int slot, size_t bytes) const {
  return base_ + dataOffset_ + static_cast<size_t>(slot) * roundUp(bytes, kAlign);
}

void ShmRing::publish(uint64_t gen, int slot, const int64_t* header, const void* src, size_t bytes) {
  uint8_t* h = slotHeader(slot);
  std::memcpy(h + 8, header, kHeaderWords * sizeof(int64_t));
  if (src != nullptr && bytes > 0) std::memcpy(const_cast<uint8_t*>(data(slot, bytes)), src, bytes);
  readyWord(h).store(readyValue(gen, slot), std::memory_order_seq_cst);
  std::atomic_ref<uint32_t> wait(*reinterpret_cast<uint32_t*>(base_ + kWaitOffset));
  if (wait.load(std::memory_order_seq_cst) != 0) {
    wait.store(0, std::memory_order_seq_cst);
    futex(reinterpret_cast<uint32_t*>(base_ + kWaitOffset), FUTEX_WAKE, INT_MAX, nullptr);
  }
}

const int64_t* ShmRing::await(uint64_t gen, int slot, const PeerProcess& peer, Clock::time_point deadline,
                              const std::string& what) {
  uint8_t* h = slotHeader(slot);
  const uint64_t want = readyValue(gen, slot);
  auto ready = [&] { return readyWord(h).load(std::memory_order_acquire) == want; };
  if (ready()) return reinterpret_cast<const int64_t*>(h + 8);
  const auto spinUntil = Clock::now() + kSpin;
  while (Clock::now() < spinUntil) {
    for (int i = 0; i < 64; ++i) cpuRelax();
    if (ready()) return reinterpret_cast<const int64_t*>(h + 8);
  }
  auto* waitWord = reinterpret_cast<uint32_t*>(base_ + kWaitOffset);
  std::atomic_ref<uint32_t> wait(*waitWord);
  for (;;) {
    wait.store(1, std::memory_order_seq_cst);
    if (readyWord(h).load(std::memory_order_seq_cst) == want) break;
    const auto now = Clock::now();
    if (now >= deadline) {
      throw TimeoutError(what + ": nothing arrived from rank " + std::to_string(peer.rank()) +
                         " within the group's timeout");
    }
    const auto slice = std::min<Clock::duration>(kSleepSlice, deadline - now);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    futex(waitWord, FUTEX_WAIT, 1, &ts);
    if (ready()) break;
    if (peer.ended()) {
      if (ready()) break;
      throw DisconnectedError(what + ": the connection to rank " + std::to_string(peer.rank()) +
                              " was lost: its process (pid " + std::to_string(peer.pid()) + ") ended");
    }
  }
  return reinterpret_cast<const int64_t*>(h + 8);
}

void ShmRing::copyOut(int slot, size_t bytes, void* into) const {
  if (bytes > 0) std::memcpy(into, data(slot, bytes), bytes);
}

}  // namespace weft::pipeline::detail
