#include "collectives/gloo/process_group_gloo.h"
#include "collectives/gloo/detail/group.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "collectives/gloo/detail/call_check.h"
#include "collectives/gloo/detail/device.h"
#include "collectives/gloo/detail/traffic.h"
#include "common/error.h"
#include "rpc/options.h"

namespace weft::collectives {

namespace {

using detail::CallExchange;
using detail::CallHeader;
using detail::blockSigpipeOnThisThread;
using detail::Clock;
using detail::createTcpDevice;
using detail::Deadline;
using detail::OpCode;
using detail::SigpipeBlock;
using detail::opName;
using detail::timeoutUntil;
using Millis = std::chrono::milliseconds;

// ---- argument checks ---------------------------------------------------------------

void checkReducible(DType t, ReduceOp op, const char* name) {
  bool ok = t == DType::Float32 || t == DType::Float64 || t == DType::Int64 || t == DType::Int32 ||
            t == DType::UInt8 || t == DType::Float16;
  WEFT_ENFORCE(ok, InvalidArgumentError, name,
               ": the gloo backend reduces float32, float64, int64, int32, uint8 and float16, not ", dtypeName(t),
               t == DType::Bool ? " (convert a mask to uint8: Max is any, Min is all)" : "");
  WEFT_ENFORCE(op != ReduceOp::Avg || isFloating(t), InvalidArgumentError, name,
               ": ReduceOp avg needs a floating dtype, got ", dtypeName(t));
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// float16 reductions on the bits: gloo::float16's assignment skips the store
// when the destination's old bits, read as an integer, round to the new
// value, which corrupts in-place reductions (out aliasing an input).
template <class Combine>
void halfReduce(void* c, const void* a, const void* b, size_t n, Combine combine) {
  auto* out = static_cast<gloo::float16*>(c);
  const auto* x = static_cast<const gloo::float16*>(a);
  const auto* y = static_cast<const gloo::float16*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i].x = gloo::cpu_float2half_rn(combine(gloo::cpu_half2float(x[i]), gloo::cpu_half2float(y[i]))).x;
  }
}
void halfSum(void* c, const void* a, const void* b, size_t n) {
  halfReduce(c, a, b, n, [](float u, float v) { return u + v; });
}
void halfProduct(void* c, const void* a, const void* b, size_t n) {
  halfReduce(c, a, b, n, [](float u, float v) { return u * v; });
}
void halfMin(void* c, const void* a, const void* b, size_t n) {
  halfReduce(c, a, b, n, [](float u, float v) { return std::min(u, v); });
}
void halfMax(void* c, const void* a, const void* b, size_t n) {
  halfReduce(c, a, b, n, [](float u, float v) { return std::max(u, v); });
}

template <class T>
ReduceFn reduceFunction(ReduceOp op) {
  if constexpr (std::is_same_v<T, gloo::float16>) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return &halfSum;
      case ReduceOp::Product: return &halfProduct;
      case ReduceOp::Min: return &halfMin;
      case ReduceOp::Max: return &halfMax;
    }
  }
  ReduceFn fn = nullptr;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: fn = &gloo::sum<T>; break;
    case ReduceOp::Product: fn = &gloo::product<T>; break;
    case ReduceOp::Min: fn = &gloo::min<T>; break;
    case ReduceOp::Max: fn = &gloo::max<T>; break;
  }
  return fn;
}

template <class T>
const gloo::ReductionFunction<T>* legacyReduceFunction(ReduceOp op) {
  if constexpr (std::is_same_v<T, gloo::float16>) {
    // In place: a = a op b, as Gloo's legacy algorithms take it.
    using Half = gloo::float16;
    static const gloo::ReductionFunction<T> sum(gloo::SUM, [](Half* a, const Half* b, size_t n) { halfSum(a, a, b, n); });
    static const gloo::ReductionFunction<T> product(
        gloo::PRODUCT, [](Half* a, const Half* b, size_t n) { halfProduct(a, a, b, n); });
    static const gloo::ReductionFunction<T> min(gloo::MIN, [](Half* a, const Half* b, size_t n) { halfMin(a, a, b, n); });
    static const gloo::ReductionFunction<T> max(gloo::MAX, [](Half* a, const Half* b, size_t n) { halfMax(a, a, b, n); });
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return &sum;
      case ReduceOp::Product: return &product;
      case ReduceOp::Min: return &min;
      case ReduceOp::Max: return &max;
    }
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return gloo::ReductionFunction<T>::sum;
    case ReduceOp::Product: return gloo::ReductionFunction<T>::product;
    case ReduceOp::Min: return gloo::ReductionFunction<T>::min;
    case ReduceOp::Max: return gloo::ReductionFunction<T>::max;
  }
  return nullptr;
}

// Calls fn.template operator()<T>() with T the Gloo element type of t (checked reducible).
template <class F>
void dispatchReducible(DType t, F&& fn) {
  switch (t) {
    case DType::Float32: fn.template operator()<float>(); break;
    case DType::Float64: fn.template operator()<double>(); break;
    case DType::Int64: fn.template operator()<int64_t>(); break;
    case DType::Int32: fn.template operator()<int32_t>(); break;
    case DType::UInt8: fn.template operator()<uint8_t>(); break;
    case DType::Float16: fn.template operator()<gloo::float16>(); break;
    default: WEFT_CHECK(false) << "unchecked dtype " << dtypeName(t);
  }
}

void divideInPlace(void* data, DType t, size_t n, int by) {
  switch (t) {
    case DType::Float32: {
      auto* p = static_cast<float*>(data);
      const auto d = static_cast<float>(by);
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case DType::Float64: {
      auto* p = static_cast<double*>(data);
      const auto d = static_cast<double>(by);
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case DType::Float16: {
      auto* p = static_cast<gloo::float16*>(data);
      const auto d = static_cast<float>(by);
      for (size_t i = 0; i < n; ++i) p[i].x = gloo::cpu_float2half_rn(gloo::cpu_half2float(p[i]) / d).x;
      break;
    }
    default: WEFT_CHECK(false) << "avg on " << dtypeName(t);
  }
}

uint8_t* bytesOf(const Tensor& t) { return static_cast<uint8_t*>(t.rawData()); }

// ---- progress posting -------------------------------------------------------------

// Posts the number of the last collective this rank started to the store, so
// that a rank whose collective times out can tell what the others were doing.
// Starting a collective only records the number (an atomic store, nothing on
// the hot path); a thread of its own posts "<number> <wall-clock ms>" every
// kProgressPeriod when the number changed, and every kProgressRefresh anyway,
// so a reader knows how long ago a rank was last heard from. A post the store
// does not take (a partition, a store reconnecting) is retried once it
// completes or fails; the number is never lost, only late, and its age says so.
constexpr Millis kProgressPeriod{50};
constexpr Millis kProgressRefresh{1000};
// A rank heard from within this long is known to be alive and posting: its
// number is its progress as of then.
constexpr Millis kProgressFresh{3000};

int64_t wallClockMs() {
  return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class ProgressPoster {
 public:
  ProgressPoster(rpc::StoreClient& store, std::string key)
      : store_(store), key_(std::move(key)), thread_([this] { run(); }) {}
  ~ProgressPoster() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopped_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  ProgressPoster(const ProgressPoster&) = delete;
  ProgressPoster& operator=(const ProgressPoster&) = delete;

  void record(int64_t seq) { latest_.store(seq, std::memory_order_relaxed); }

 private:
  void run() {
    int64_t posted = -2;  // -1 is "none started yet", which is posted too
    int64_t sending = 0;
    Clock::time_point lastTry{};
    std::optional<Future<void>> inFlight;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopped_) {
      wake_.wait_for(lock, kProgressPeriod, [&] { return stopped_; });
      if (stopped_) break;
      if (inFlight) {
        // Never waited on: a store that does not answer holds up no one.
        if (!inFlight->isReady()) continue;
        if (!inFlight->hasError()) posted = sending;
        inFlight.reset();
      }
      const int64_t latest = latest_.load(std::memory_order_relaxed);
      const Clock::time_point now = Clock::now();
      const bool due = now - lastTry >= kProgressRefresh;
      // After a failed post (posted != sending), wait for the refresh period.
      if (!due && (latest == posted || posted != sending)) continue;
      lastTry = now;
      sending = latest;
      lock.unlock();
      try {
        inFlight = store_.setAsync(key_, std::to_string(latest) + " " + std::to_string(wallClockMs()));
      } catch (const std::exception&) {
        inFlight.reset();
      }
      lock.lock();
    }
  }

  rpc::StoreClient& store_;
  const std::string key_;
  std::atomic<int64_t> latest_{-1};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopped_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

// ---- the size protocol of point-to-point transfers ---------------------------------------

// A sender's header: magic, seq, bytes, dtype, elements, and 1 when the data
// follows the header in the same message (at most kP2pInlineBytes of it),
// else 0. A receiver's verdict: magic, the bytes, dtype and elements of its
// tensor, 0, 0. The transfer succeeds when the byte counts are equal.
constexpr size_t kP2pWords = 6;
constexpr size_t kP2pBytes = kP2pWords * sizeof(int64_t);
constexpr size_t kP2pInlineBytes = size_t{1} << 20;
constexpr int64_t kP2pHeaderMagic = 0x7765667470320001;   // "weftp2" + 1
constexpr int64_t kP2pVerdictMagic = 0x7765667470320002;  // "weftp2" + 2

uint64_t p2pSlot(uint64_t base, uint64_t seq, uint32_t tag) {
  return base | ((seq & detail::kP2pSeqMask) << 32) | tag;
}

// "12 elements of float32 (48 bytes)", from a peer's words (checked to be non-negative).
std::string sizeText(int64_t bytes, int64_t dtype, int64_t numel) {
  std::string name = dtype >= 0 && dtype <= 255 ? dtypeName(static_cast<DType>(dtype)) : "unknown";
  if (name == "unknown") name = "dtype code " + std::to_string(dtype);
  return std::to_string(numel) + " elements of " + name + " (" + std::to_string(bytes) + " bytes)";
}

// The two sides of a transfer disagree on its size: the data was discarded,
// both sides stay in step and the group usable (unlike any other failure of a
// transfer).
class SizeMismatch : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

std::string sizeText(const Tensor& t) {
  return sizeText(static_cast<int64_t>(t.nbytes()), static_cast<int64_t>(t.dtype()), t.numel());
}

// What a rank's progress key says: the last collective it started (-1: none)
// and when it posted that, by its wall clock (absent from a bare number).
struct RankProgress {
  int rank = 0;
  bool heard = false;
  int64_t seq = -1;
  std::optional<int64_t> postedAtMs;
};

RankProgress parseProgress(int rank, const std::string& value) {
  RankProgress p;
  p.rank = rank;
  std::istringstream in(value);
  int64_t seq = 0;
  if (!(in >> seq)) return p;
  p.heard = true;
  p.seq = seq;
  int64_t at = 0;
  if (in >> at) p.postedAtMs = at;
  return p;
}

// For a collective that timed out: what the other ranks' posts say about it.
// A rank heard from recently (kProgressFresh) is reported as not having
// started it as of then; an older post is only reported with its age, since
// the rank may have started it after (its posts may not reach the store);
// ranks that posted nothing are named as such. When every rank has started
// it, names the rank heard from longest ago (a rank stalled inside the
// collective stops posting); empty when nothing was read.
std::string describeProgress(int64_t seq, const std::vector<RankProgress>& ranks, int64_t nowMs) {
  auto position = [](const RankProgress& p) {
    return p.seq < 0 ? std::string("before any collective") : "at #" + std::to_string(p.seq);
  };
  auto age = [&](const RankProgress& p) {
    return rpc::store::describeDuration(Millis(std::max<int64_t>(0, nowMs - *p.postedAtMs))) + " ago";
  };
  std::vector<int> behind;
  std::string behindDetail;
  std::vector<std::string> stale;
  std::vector<int> silent;
  const RankProgress* quietest = nullptr;  // of those that started it
  for (const RankProgress& p : ranks) {
    if (!p.heard) {
      silent.push_back(p.rank);
    } else if (p.seq >= seq) {
      if (p.postedAtMs && (quietest == nullptr || *p.postedAtMs < *quietest->postedAtMs)) quietest = &p;
      continue;
    } else if (p.postedAtMs && nowMs - *p.postedAtMs <= kProgressFresh.count()) {
      behind.push_back(p.rank);
      behindDetail += (behindDetail.empty() ? "" : "; ") + ("rank " + std::to_string(p.rank)) + " " + position(p) +
                      ", " + age(p);
    } else {
      stale.push_back("rank " + std::to_string(p.rank) + " was last heard " + position(p) + ", " +
                      (p.postedAtMs ? age(p) : std::string("at an unknown time")) +
                      " (whether it has started it since is unknown)");
    }
  }
  std::vector<std::string> parts;
  if (!behind.empty()) {
    parts.push_back("ranks " + rankList(behind) + " had not started it when last heard (" + behindDetail + ")");
  }
  parts.insert(parts.end(), stale.begin(), stale.end());
  if (!silent.empty()) {
    parts.push_back("ranks " + rankList(silent) + " have posted no progress to the store");
  }
  std::string msg;
  for (const std::string& part : parts) msg += (msg.empty() ? "" : "; ") + part;
  if (msg.empty() && quietest != nullptr) {
    msg = "every rank has started it; the one heard from longest ago is rank " + std::to_string(quietest->rank) +
          ", " + age(*quietest);
  }
  return msg;
}

// See ProcessGroupGloo::fusedLimit(): a rank sends each peer at most this
// much, kFusedSendBytes in all.
size_t fusedLimitFor(int size) {
  if (size <= 1) return ProcessGroupGloo::kFusedSendBytes;
  return ProcessGroupGloo::kFusedSendBytes / static_cast<size_t>(size - 1) / 64 * 64;
}

// A collective the call exchange carries (its data, or all it needs, comes
// with the call headers), decided by the op from its size alone, so that every
// rank whose call matches decides alike. attach sends this rank's data when
// the op runs (null: the bare header, sent when it is issued); finish
// completes the op once every rank's header matched.
struct ExchangeCarriedOp {
  std::function<void(CallExchange&, CallExchange::Outgoing&)> attach;
  std::function<void(const CallExchange&)> finish;
};

}  // namespace

// ==== Impl ================================================================================

class ProcessGroupGloo::Impl {
 public:
  Impl(rpc::StoreClient& store, int rank, int size, Options options, std::string name,
       std::shared_ptr<gloo::transport::Device> device);
  ~Impl();

  // ---- collectives: issue side (any thread) ----
  // Numbers the collective, queues it and returns its Work. body runs on the
  // collective thread with the op's deadline; for a collective the call
  // exchange carries (carried.finish set), carried.finish runs instead.
  Work enqueue(CallHeader header, std::vector<Tensor> keep, std::function<void(Deadline)> body,
               ExchangeCarriedOp carried = {});

  // ---- Gloo ops, collective thread only ----
  void allreduceRaw(void* data, size_t n, DType t, ReduceOp op, AllreduceAlgorithm algorithm, Deadline d);
  // naive and parallel (see "Allreduce algorithms"): on the group's connections.
  void allreduceNaive(void* data, size_t n, DType t, ReduceOp op, Deadline d);
  void allreduceParallel(void* data, size_t n, DType t, ReduceOp op, Deadline d);
  // Ring-chunked and halving-doubling, Gloo's pair-buffer algorithms.
  void allreduceLegacy(void* data, size_t n, DType t, ReduceOp op, AllreduceAlgorithm algorithm, Deadline d);
  void reduceScatterRing(const std::vector<Tensor>& inputs, const Tensor& output, ReduceOp op, Deadline d);
  // Waits for one receive (isRecv) or send of `buffer` posted by the
  // hand-written algorithms; a lost connection to any peer fails it at once
  // (the context's ConnectionWatch), so a rank blocked on a live peer learns
  // of a death elsewhere in the ring then, not at the deadline.
  void waitAlgorithm(gloo::transport::UnboundBuffer& buffer, bool isRecv, Deadline d);
  // The algorithm a call asking for `requested` runs for `bytes` (never Auto).
  AllreduceAlgorithm resolve(AllreduceAlgorithm requested, size_t bytes) const;
  void reduceRaw(void* data, size_t n, DType t, ReduceOp op, int root, Deadline d);
  void broadcastRaw(void* data, size_t nbytes, int root, Deadline d);
  void allgatherRaw(void* in, void* out, size_t nbytes, Deadline d);
  void gatherRaw(void* in, void* out, size_t nbytes, int root, Deadline d);
  void scatterRaw(const std::vector<uint8_t*>& ins, void* out, size_t nbytes, int root, Deadline d);
  void alltoallRaw(void* in, void* out, size_t nbytes, Deadline d);
  void barrierRaw(Deadline d);

  // ---- point to point ----
  Work startTransfer(const Tensor& tensor, bool isRecv, const std::vector<int>& peers, uint32_t tag);

  // Empty while usable; else the first fatal failure.
  std::string brokenReason();
  std::string describe(const CallHeader& h) const;

  rpc::StoreClient& store_;
  const int rank_;
  const int size_;
  const Options options_;
  const std::string name_;
  const std::string prefix_;  // "weft/pg/<name>/"
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<detail::MeshContext> context_;
  detail::TrafficCounter* traffic_ = nullptr;  // context_'s counter
  AllreduceAlgorithm algorithm_ = AllreduceAlgorithm::Auto;  // the group's (options, else environment)
  std::unique_ptr<ProgressPoster> progress_;

  std::mutex mutex_;  // guards the queue, nextSeq_, stopping_
  int64_t nextSeq_ = 0;
  std::atomic<int64_t> started_{0};
  std::atomic<int64_t> fused_{0};
  const size_t fusedLimit_;  // ProcessGroupGloo::fusedLimit()

 private:
  struct Task {
    Work work;
    CallHeader header;
    std::function<void(Deadline)> body;
    ExchangeCarriedOp carried;
    std::unique_ptr<CallExchange::Outgoing> outgoing;  // this rank's message of the call exchange, if any
  };
  // One point-to-point transfer (see "Point to point" in the header): the
  // messages of its size protocol and the buffers they live in, on the heap so
  // that Gloo's pointers into them stay valid while the Transfer moves.
  struct Transfer {
    Work work;
    bool isRecv = false;
    std::vector<int> peers;  // send: the destination; recv: who may send
    uint32_t tag = 0;
    uint64_t seq = 0;        // send: this transfer's number to its destination
    Tensor tensor;
    Deadline deadline;
    // send: the header (and inline data) that leaves; recv: room for the
    // largest header message a sender sends.
    std::unique_ptr<uint8_t[]> message;
    std::array<int64_t, kP2pWords> verdict{};  // recv: what leaves; send: what came
    std::vector<uint8_t> scratch;              // recv of another size: drains the sender's bytes
    std::unique_ptr<gloo::transport::UnboundBuffer> headerBuffer;
    std::unique_ptr<gloo::transport::UnboundBuffer> dataBuffer;
    std::unique_ptr<gloo::transport::UnboundBuffer> verdictBuffer;
  };

  void rendezvous();
  void runCollectives();
  void runTask(Task& task);
  // Finishes the call exchange of `task`: empty when every rank called the
  // same thing; else the message.
  std::string exchangeCalls(Task& task, Deadline d);
  // The peers whose connection Gloo knows to be lost.
  std::vector<int> lostPeers();
  // What the progress keys tell of the ranks that may not have started
  // collective `seq` (see describeProgress).
  std::string progressReport(int64_t seq);
  void waitTransfers();
  // Runs the rest of a transfer's size protocol on a waiter thread: false when
  // the group's destruction aborted it; throws ProtocolError for sizes that
  // differ (the group stays usable), else what Gloo throws.
  bool finishSend(Transfer& t);
  bool finishRecv(Transfer& t);
  // Waits for one send or receive of `buffer` (registered so that the
  // destructor can abort it): false when aborted.
  bool waitOn(gloo::transport::UnboundBuffer* buffer, bool isRecv, int* peer, Deadline d);
  // Records the first fatal failure; returns the exception to fail the op with.
  std::exception_ptr fatal(const std::string& what, const std::exception& e, const std::string& detail);

  uint32_t nextTag_ = 0;  // collective thread only
  // Made at the first collective that uses it (under mutex_); posted to under
  // mutex_, finished on the collective thread.
  std::unique_ptr<CallExchange> exchange_;

  std::condition_variable queued_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread collectiveThread_;

  // Point-to-point completions are waited for by a pool of threads that grows
  // to the number of transfers in flight: a transfer's completion never waits
  // behind another's (a send may need the peer to post a receive that the
  // peer's program issues only after one of ours completed).
  std::mutex transferMutex_;  // guards everything down to transferWaiters_
  std::condition_variable transferQueued_;
  std::deque<std::unique_ptr<Transfer>> transfers_;
  std::vector<std::pair<gloo::transport::UnboundBuffer*, bool>> waitingOn_;  // buffer, isRecv
  size_t freeWaiters_ = 0;  // waiter threads not handling a transfer; >= transfers_.size()
  bool transfersStopping_ = false;
  std::vector<std::thread> transferWaiters_;
  // Transfers started to each rank so far (a send's number, see kP2pSeqMask).
  std::unique_ptr<std::atomic<uint64_t>[]> sendsTo_;

  std::mutex brokenMutex_;
  std::string broken_;
};

ProcessGroupGloo::Impl::Impl(rpc::StoreClient& store, int rank, int size, Options options, std::string name,
                             std::shared_ptr<gloo::transport::Device> device)
    : store_(store),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      name_(std::move(name)),
      prefix_("weft/pg/" + name_ + "/"),
      device_(std::move(device)),
      fusedLimit_(fusedLimitFor(size)),
      sendsTo_(std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(size))) {
  WEFT_ENFORCE(options_.timeout.count() > 0, InvalidArgumentError, "ProcessGroupGloo: timeout must be > 0, got ",
               options_.timeout.count(), " ms");
  algorithm_ = options_.allreduceAlgorithm;
  if (algorithm_ == AllreduceAlgorithm::Auto) {
    const char* env = std::getenv("WEFT_ALLREDUCE_ALGORITHM");
    if (env != nullptr && *env != '\0') {
      try {
        algorithm_ = parseAllreduceAlgorithm(env, "WEFT_ALLREDUCE_ALGORITHM");
      } catch (const InvalidArgumentError& e) {
        throw InvalidArgumentError(std::string("ProcessGroupGloo: ") + e.what());
      }
    }
  }
  if (!device_) {
    std::string host = options_.hostname;
    if (host.empty()) {
      try {
        host = detail::defaultDeviceAddress(store_.endpoint());
      } catch (const InvalidArgumentError& e) {
        throw InvalidArgumentError(std::string("ProcessGroupGloo: ") + e.what());
      }
    }
    try {
      device_ = createTcpDevice(host);
    } catch (const Error& e) {
      throw Error(std::string("ProcessGroupGloo: ") + e.what());
    }
  }
  rendezvous();
  progress_ = std::make_unique<ProgressPoster>(store_, prefix_ + "progress/" + std::to_string(rank_));
  collectiveThread_ = std::thread([this] { runCollectives(); });
}

ProcessGroupGloo::Impl::~Impl() {
  ProcessGroupGloo::cancelQueued(mutex_, queue_, stopping_, queued_, "the collective ran", [this](Task& t) {
    if (t.outgoing) exchange_->abandon(std::move(t.outgoing));
  });
  if (collectiveThread_.joinable()) collectiveThread_.join();

  std::deque<std::unique_ptr<Transfer>> dropped;
  {
    std::lock_guard<std::mutex> lock(transferMutex_);
    transfersStopping_ = true;
    dropped.swap(transfers_);
    for (auto& [buffer, isRecv] : waitingOn_) {
      if (isRecv) {
        buffer->abortWaitRecv();
      } else {
        buffer->abortWaitSend();
      }
    }
  }
  transferQueued_.notify_all();
  for (auto& t : dropped) {
    t->work.fail(std::make_exception_ptr(
        StateError(t->work.description() + ": the process group was destroyed before the transfer completed")));
  }
  for (std::thread& t : transferWaiters_) t.join();
  progress_.reset();
  if (context_) {
    context_->stopWatching();
    context_->closeConnections();
  }
}

std::string ProcessGroupGloo::Impl::describe(const CallHeader& h) const {
  return std::string(opName(h.op)) + " #" + std::to_string(h.seq) + " on group '" + name_ + "'";
}

std::string ProcessGroupGloo::Impl::brokenReason() {
  std::lock_guard<std::mutex> lock(brokenMutex_);
  return broken_;
}

// ---- rendezvous --------------------------------------------------------------------------

void ProcessGroupGloo::Impl::rendezvous() {
  store_.set(prefix_ + "joined/" + std::to_string(rank_), "1");
  auto context = std::make_shared<detail::MeshContext>(rank_, size_);
  context->setTimeout(options_.timeout);
  SigpipeBlock block;
  context->connectMesh(store_, prefix_, device_, options_.timeout,
                       "group '" + name_ + "' (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")");
  traffic_ = &context->traffic();
  context_ = std::move(context);
}

// ---- the collective thread ----------------------------------------------------------------

Work ProcessGroupGloo::Impl::enqueue(CallHeader header, std::vector<Tensor> keep, std::function<void(Deadline)> body,
                                     ExchangeCarriedOp carried) {
  std::lock_guard<std::mutex> lock(mutex_);
  header.seq = nextSeq_++;
  Work work = Work::start(describe(header), std::move(keep));
  if (stopping_) {
    work.fail(std::make_exception_ptr(StateError(work.description() + ": the process group is being destroyed")));
    return work;
  }
  Task task{work, header, std::move(body), std::move(carried), nullptr};
  if ((options_.checkCalls || task.carried.finish) && brokenReason().empty()) {
    // Numbered in call order (under mutex_); a bare header leaves now, so
    // that the peers' are usually in when the collective thread gets here.
    if (!exchange_) exchange_ = std::make_unique<CallExchange>(context_, rank_, size_, fusedLimit_);
    SigpipeBlock block;
    task.outgoing = exchange_->post(header, static_cast<bool>(task.carried.attach));
  }
  queue_.push_back(std::move(task));
  queued_.notify_one();
  return work;
}

void ProcessGroupGloo::Impl::runCollectives() {
  blockSigpipeOnThisThread();
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    runTask(task);
  }
}

void ProcessGroupGloo::Impl::runTask(Task& task) {
  const std::string what = task.work.description();
  std::string broken = brokenReason();
  if (!broken.empty()) {
    if (task.outgoing) exchange_->abandon(std::move(task.outgoing));
    task.work.fail(std::make_exception_ptr(
        StateError(what + ": the group is unusable after an earlier failure: " + broken)));
    return;
  }
  // enqueue posts a message for every such op while the group is usable.
  WEFT_CHECK(task.outgoing || !(options_.checkCalls || task.carried.finish)) << what << " has no call exchange message";
  started_.store(task.header.seq + 1, std::memory_order_relaxed);
  progress_->record(task.header.seq);
  const Deadline deadline = Clock::now() + options_.timeout;
  try {
    if (task.outgoing) {
      std::string mismatch = exchangeCalls(task, deadline);
      if (!mismatch.empty()) {
        task.work.fail(std::make_exception_ptr(InvalidArgumentError(mismatch)));
        return;
      }
      if (task.carried.finish) {
        // The headers match, so every rank's data (or all the op needs) came
        // along; a peer whose data does not fit its header broke the protocol
        // (the exchange is over: the group stays usable).
        try {
          task.carried.finish(*exchange_);
        } catch (const ProtocolError& e) {
          task.work.fail(std::make_exception_ptr(ProtocolError(what + ": " + e.what())));
          return;
        }
        fused_.fetch_add(1, std::memory_order_relaxed);
        task.work.complete();
        return;
      }
    }
    task.body(deadline);
  } catch (const weft::Error& e) {
    // A weft error from the body (e.g. a bad size found late) is not a transport failure.
    task.work.fail(std::current_exception());
    return;
  } catch (const std::exception& e) {
    // Which ranks never started the op explains a timeout; after a lost
    // connection it would only reflect how fast the survivors failed.
    const bool io = dynamic_cast<const gloo::IoException*>(&e) != nullptr &&
                    std::string(e.what()).find("Timed out") == std::string::npos;
    task.work.fail(fatal(what, e, io ? "" : progressReport(task.header.seq)));
    return;
  }
  task.work.complete();
}

std::string ProcessGroupGloo::Impl::exchangeCalls(Task& task, Deadline d) {
  const CallHeader& mine = task.header;
  if (task.carried.attach) task.carried.attach(*exchange_, *task.outgoing);
  exchange_->finish(std::move(task.outgoing), d);
  bool same = true;
  std::vector<std::string> calls;
  for (int r = 0; r < size_; ++r) {
    const CallHeader* theirs = exchange_->headerOf(r);
    if (theirs == nullptr) {
      same = false;
      calls.push_back("rank " + std::to_string(r) + " sent no call header of this weft version");
      continue;
    }
    same = same && *theirs == mine;
    calls.push_back("rank " + std::to_string(r) + " called " + theirs->describe());
  }
  if (same) return "";
  std::string msg = describe(mine) + ": the ranks' calls do not match:";
  for (const std::string& c : calls) msg += "\n  " + c;
  return msg;
}

std::string ProcessGroupGloo::Impl::progressReport(int64_t seq) {
  std::vector<std::pair<int, Future<std::string>>> gets;
  try {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      gets.emplace_back(r, store_.getAsync(prefix_ + "progress/" + std::to_string(r), Millis(300)));
    }
  } catch (const std::exception& e) {
    return std::string("which ranks started it is unknown (store: ") + e.what() + ")";
  }
  std::vector<RankProgress> ranks;
  std::vector<int> unread;  // ranks whose progress the store did not give
  std::string why;          // the first reason
  auto until = Clock::now() + Millis(2000);
  for (auto& [r, f] : gets) {
    if (!f.waitUntil(until)) {
      unread.push_back(r);
      if (why.empty()) why = "the store did not answer within 2.0 s";
    } else if (f.hasError() && f.status().code() != StatusCode::Timeout) {
      unread.push_back(r);
      if (why.empty()) why = f.status().message();
    } else {
      // A rank that never posted has no key: the get times out.
      ranks.push_back(parseProgress(r, f.hasError() ? std::string() : f.get()));
    }
  }
  std::string known = describeProgress(seq, ranks, wallClockMs());
  if (unread.empty()) return known.empty() ? "every rank has started it" : known;
  const std::string all = "every rank has started it";
  if (known.rfind(all, 0) == 0) known = "the others have started it" + known.substr(all.size());
  std::string msg = "whether ranks " + rankList(unread) + " started it is unknown: their progress could not be read (" +
                    why + ")";
  return known.empty() ? msg : known + "; " + msg;
}

std::exception_ptr ProcessGroupGloo::Impl::fatal(const std::string& what, const std::exception& e,
                                                 const std::string& detail) {
  const std::string glooMessage = e.what();
  const bool timedOut = glooMessage.find("Timed out") != std::string::npos;
  const bool io = dynamic_cast<const gloo::IoException*>(&e) != nullptr;
  // A peer's bytes that broke weft's protocol, or a check of Gloo's that
  // failed on this thread (what a peer sent did not fit what this rank posted).
  const bool protocol = dynamic_cast<const ProtocolError*>(&e) != nullptr ||
                        dynamic_cast<const gloo::EnforceNotMet*>(&e) != nullptr;
  if (dynamic_cast<const ProtocolError*>(&e) != nullptr) {
    std::string msg = glooMessage + " (on rank " + std::to_string(rank_) + "; the group is unusable now)";
    {
      std::lock_guard<std::mutex> lock(brokenMutex_);
      if (broken_.empty()) broken_ = msg;
    }
    return std::make_exception_ptr(ProtocolError(msg));
  }
  std::string msg = what + " failed on rank " + std::to_string(rank_) + ": ";
  if (timedOut) {
    msg += "timed out after " + std::to_string(options_.timeout.count()) + " ms; " + detail;
  } else if (io) {
    const std::vector<int> lost = lostPeers();
    if (lost.size() == 1) {
      msg += "the connection to rank " + std::to_string(lost[0]) + " was lost (its process may have died)";
    } else if (!lost.empty()) {
      msg += "the connections to ranks " + rankList(lost) + " were lost (their processes may have died)";
    } else {
      msg += "the connection to a peer was lost (its process may have died)";
    }
  } else {
    msg += detail;
  }
  msg += " (gloo: " + glooMessage + ")";
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    if (broken_.empty()) broken_ = msg;
  }
  if (timedOut) return std::make_exception_ptr(TimeoutError(msg));
  if (io) return std::make_exception_ptr(DisconnectedError(msg));
  if (protocol) return std::make_exception_ptr(ProtocolError(msg));
  return std::make_exception_ptr(Error(msg));
}

std::vector<int> ProcessGroupGloo::Impl::lostPeers() {
  // Gloo marks a pair failed as soon as its loop thread sees the connection
  // close (a dead process's sockets close at once), and anything posted on a
  // failed pair throws at once. A live pair takes a receive on a slot nothing
  // ever sends to: harmless, the group is unusable after a lost connection.
  std::vector<int> lost;
  uint8_t byte = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> probe = context_->createUnboundBuffer(&byte, 1);
  SigpipeBlock block;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    try {
      probe->recv(r, detail::kProbeSlot);
    } catch (const std::exception&) {
      lost.push_back(r);
    }
  }
  return lost;
}

// ---- Gloo calls -----------------------------------------------------------------------------

AllreduceAlgorithm ProcessGroupGloo::Impl::resolve(AllreduceAlgorithm requested, size_t bytes) const {
  if (requested == AllreduceAlgorithm::Auto) requested = algorithm_;
  if (requested != AllreduceAlgorithm::Auto) return requested;
  return bytes <= kBcubeMaxBytes ? AllreduceAlgorithm::Bcube : AllreduceAlgorithm::Ring;
}

void ProcessGroupGloo::Impl::allreduceRaw(void* data, size_t n, DType t, ReduceOp op, AllreduceAlgorithm algorithm,
                                          Deadline d) {
  if (n == 0) return;
  switch (algorithm) {
    case AllreduceAlgorithm::Naive: allreduceNaive(data, n, t, op, d); break;
    case AllreduceAlgorithm::Parallel: allreduceParallel(data, n, t, op, d); break;
    case AllreduceAlgorithm::RingChunked:
    case AllreduceAlgorithm::HalvingDoubling: allreduceLegacy(data, n, t, op, algorithm, d); break;
    case AllreduceAlgorithm::Ring:
    case AllreduceAlgorithm::Bcube:
    case AllreduceAlgorithm::Auto: {
      gloo::AllreduceOptions opts(context_);
      dispatchReducible(t, [&]<class T>() {
        opts.setOutput(static_cast<T*>(data), n);
        opts.setReduceFunction(reduceFunction<T>(op));
      });
      opts.setAlgorithm(algorithm == AllreduceAlgorithm::Bcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                                                               : gloo::AllreduceOptions::Algorithm::RING);
      opts.setTag(nextTag_++);
      opts.setTimeout(timeoutUntil(d));
      gloo::allreduce(opts);
      break;
    }
  }
  if (op == ReduceOp::Avg) divideInPlace(data, t, n, size_);
}

namespace {
// Slots of the hand-written algorithms (naive, parallel, the reduce-scatter
// ring): top byte 0x7C, then the collective's tag and a step number, apart
// from Gloo's (prefixes 1 to 8 in the top byte) and weft's other slots
// (call_check.h).
constexpr uint64_t kAlgorithmSlotBase = uint64_t{0x7C} << 56;
uint64_t algorithmSlot(uint32_t tag, uint64_t step) { return kAlgorithmSlotBase | (uint64_t{tag} << 24) | step; }
}  // namespace

void ProcessGroupGloo::Impl::waitAlgorithm(gloo::transport::UnboundBuffer& buffer, bool isRecv, Deadline d) {
  // Nothing aborts these waits; a lost connection makes them throw.
  const bool done = isRecv ? buffer.waitRecv(nullptr, timeoutUntil(d)) : buffer.waitSend(nullptr, timeoutUntil(d));
  WEFT_CHECK(done) << (isRecv ? "a receive" : "a send") << " of a hand-written algorithm was aborted";
}

void ProcessGroupGloo::Impl::allreduceNaive(void* data, size_t n, DType t, ReduceOp op, Deadline d) {
  const size_t bytes = n * elementSize(t);
  const uint32_t tag = nextTag_++;
  auto mine = context_->createUnboundBuffer(data, bytes);
  if (rank_ != 0) {
    mine->send(0, algorithmSlot(tag, 0));
    mine->recv(0, algorithmSlot(tag, 1));
    waitAlgorithm(*mine, false, d);
    waitAlgorithm(*mine, true, d);
    return;
  }
  // The root: every rank's tensor, reduced in rank order, back to every rank.
  std::vector<uint8_t> others(bytes * static_cast<size_t>(size_ - 1));
  auto in = context_->createUnboundBuffer(others.data(), others.size());
  for (int r = 1; r < size_; ++r) in->recv(r, algorithmSlot(tag, 0), bytes * static_cast<size_t>(r - 1), bytes);
  for (int r = 1; r < size_; ++r) waitAlgorithm(*in, true, d);
  dispatchReducible(t, [&]<class T>() {
    const ReduceFn fn = reduceFunction<T>(op);
    for (int r = 1; r < size_; ++r) fn(data, data, others.data() + bytes * static_cast<size_t>(r - 1), n);
  });
  for (int r = 1; r < size_; ++r) mine->send(r, algorithmSlot(tag, 1));
  for (int r = 1; r < size_; ++r) waitAlgorithm(*mine, false, d);
}

void ProcessGroupGloo::Impl::allreduceParallel(void* data, size_t n, DType t, ReduceOp op, Deadline d) {
  const size_t bytes = n * elementSize(t);
  const uint32_t tag = nextTag_++;
  // Rank r's tensor at r * bytes, this rank's included.
  std::vector<uint8_t> all(bytes * static_cast<size_t>(size_));
  auto in = context_->createUnboundBuffer(all.data(), all.size());
  auto mine = context_->createUnboundBuffer(data, bytes);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) in->recv(r, algorithmSlot(tag, 0), bytes * static_cast<size_t>(r), bytes);
  }
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) mine->send(r, algorithmSlot(tag, 0));
  }
  for (int r = 0; r < size_ - 1; ++r) waitAlgorithm(*in, true, d);
  for (int r = 0; r < size_ - 1; ++r) waitAlgorithm(*mine, false, d);
  std::memcpy(all.data() + bytes * static_cast<size_t>(rank_), data, bytes);
  std::memcpy(data, all.data(), bytes);
  dispatchReducible(t, [&]<class T>() {
    const ReduceFn fn = reduceFunction<T>(op);
    for (int r = 1; r < size_; ++r) fn(data, data, all.data() + bytes * static_cast<size_t>(r), n);
  });
}

void ProcessGroupGloo::Impl::allreduceLegacy(void* data, size_t n, DType t, ReduceOp op,
                                             AllreduceAlgorithm algorithm, Deadline d) {
  WEFT_ENFORCE(n <= static_cast<size_t>(INT_MAX), InvalidArgumentError, "allReduce: ",
               allreduceAlgorithmName(algorithm), " takes at most ", INT_MAX, " elements, got ", n);
  std::shared_ptr<gloo::Context> context = context_;
  dispatchReducible(t, [&]<class T>() {
    const std::vector<T*> ptrs{static_cast<T*>(data)};
    const int count = static_cast<int>(n);
    std::unique_ptr<gloo::Algorithm> run;
    if (algorithm == AllreduceAlgorithm::RingChunked) {
      run = std::make_unique<gloo::AllreduceRingChunked<T>>(context, ptrs, count, legacyReduceFunction<T>(op));
    } else {
      run = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context, ptrs, count, legacyReduceFunction<T>(op));
    }
    // Every rank has registered its buffers before any data moves.
    barrierRaw(d);
    run->run();
  });
}

void ProcessGroupGloo::Impl::reduceScatterRing(const std::vector<Tensor>& inputs, const Tensor& output, ReduceOp op,
                                               Deadline d) {
  const DType t = output.dtype();
  const size_t es = elementSize(t);
  const int n = size_;
  auto count = [&](int chunk) { return static_cast<size_t>(inputs[static_cast<size_t>(chunk)].numel()); };
  if (n == 1) {
    if (output.nbytes() > 0) std::memcpy(output.rawData(), inputs[0].rawData(), output.nbytes());
    return;
  }
  size_t most = 0;
  for (int i = 0; i < n; ++i) most = std::max(most, count(i));
  // recv: the partial reduction that arrives; acc: the one that leaves next.
  std::vector<uint8_t> recv(most * es), acc(most * es);
  auto recvBuffer = context_->createUnboundBuffer(recv.data(), recv.size());
  auto accBuffer = context_->createUnboundBuffer(acc.data(), acc.size());
  const int left = (rank_ - 1 + n) % n;
  const int right = (rank_ + 1) % n;
  const uint32_t tag = nextTag_++;
  ReduceFn fn = nullptr;
  dispatchReducible(t, [&]<class T>() { fn = reduceFunction<T>(op); });
  // Step s: send the partial of shard rank-s-1 (at step 0, this rank's input
  // of it) to the right, receive the partial of shard rank-s-2 from the left
  // and add this rank's input of it. The last step's shard is this rank's.
  for (int s = 0; s < n - 1; ++s) {
    const int out = ((rank_ - s - 1) % n + n) % n;
    const int in = ((rank_ - s - 2) % n + n) % n;
    const size_t outBytes = count(out) * es;
    const size_t inBytes = count(in) * es;
    std::unique_ptr<gloo::transport::UnboundBuffer> first;
    if (inBytes > 0) recvBuffer->recv(left, algorithmSlot(tag, static_cast<uint64_t>(s)), 0, inBytes);
    if (outBytes > 0) {
      if (s == 0) {
        first = context_->createUnboundBuffer(inputs[static_cast<size_t>(out)].rawData(), outBytes);
        first->send(right, algorithmSlot(tag, static_cast<uint64_t>(s)), 0, outBytes);
      } else {
        accBuffer->send(right, algorithmSlot(tag, static_cast<uint64_t>(s)), 0, outBytes);
      }
    }
    if (inBytes > 0) waitAlgorithm(*recvBuffer, true, d);
    if (outBytes > 0) waitAlgorithm(s == 0 ? *first : *accBuffer, false, d);
    if (inBytes == 0) continue;
    void* into = s == n - 2 ? output.rawData() : static_cast<void*>(acc.data());
    fn(into, recv.data(), inputs[static_cast<size_t>(in)].rawData(), count(in));
  }
  if (op == ReduceOp::Avg) divideInPlace(output.rawData(), t, static_cast<size_t>(output.numel()), n);
}

void ProcessGroupGloo::Impl::reduceRaw(void* data, size_t n, DType t, ReduceOp op, int root, Deadline d) {
  if (n == 0) return;
  // Gloo's reduce uses the output as scratch on every rank: non-roots reduce
  // into a scratch buffer so that their tensor is left as it was.
  std::vector<uint8_t> scratch(rank_ == root ? 0 : n * elementSize(t));
  gloo::ReduceOptions opts(context_);
  dispatchReducible(t, [&]<class T>() {
    if (rank_ == root) {
      opts.setOutput(static_cast<T*>(data), n);
    } else {
      opts.setInput(static_cast<T*>(data), n);
      opts.setOutput(reinterpret_cast<T*>(scratch.data()), n);
    }
    opts.setReduceFunction(reduceFunction<T>(op));
  });
  opts.setRoot(root);
  opts.setTag(nextTag_++);
  opts.setTimeout(timeoutUntil(d));
  gloo::reduce(opts);
  if (op == ReduceOp::Avg && rank_ == root) divideInPlace(data, t, n, size_);
}

void ProcessGroupGloo::Impl::broadcastRaw(void* data, size_t nbytes, int root, Deadline d) {
  if (nbytes == 0) return;
  gloo::BroadcastOptions opts(context_);
  opts.setOutput(static_cast<uint8_t*>(data), nbytes);
  opts.setRoot(root);
  opts.setTag(nextTag_++);
  opts.setTimeout(timeoutUntil(d));
  gloo::broadcast(opts);
}

void ProcessGroupGloo::Impl::allgatherRaw(void* in, void* out, size_t nbytes, Deadline d) {
  if (nbytes == 0) return;
  gloo::AllgatherOptions opts(context_);
  opts.setInput(static_cast<uint8_t*>(in), nbytes);
  opts.setOutput(static_cast<uint8_t*>(out), nbytes * static_cast<size_t>(size_));
  opts.setTag(nextTag_++);
  opts.setTimeout(timeoutUntil(d));
  gloo::allgather(opts);
}

void ProcessGroupGloo::Impl::gatherRaw(void* in, void* out, size_t nbytes, int root, Deadline d) {
  if (nbytes == 0) return;
  gloo::GatherOptions opts(context_);
  opts.setInput(static_cast<uint8_t*>(in), nbytes);
  if (rank_ == root) opts.setOutput(static_cast<uint8_t*>(out), nbytes * static_cast<size_t>(size_));
  opts.setRoot(root);
  opts.setTag(nextTag_++);
  opts.setTimeout(timeoutUntil(d));
  gloo::gather(opts);
}

void ProcessGroupGloo::Impl::scatterRaw(const std::vector<uint8_t*>& ins, void* out, size_t nbytes, int root,
                                        Deadline d) {
  if (nbytes == 0) return;
  gloo::ScatterOptions opts(context_);
  if (rank_ == root) opts.setInputs(const_cast<uint8_t**>(ins.data()), ins.size(), nbytes);
  opts.setOutput(static_cast<uint8_t*>(out), nbytes);
  opts.setRoot(root);
  opts.setTag(nextTag_++);
  opts.setTimeout(timeoutUntil(d));
  gloo::scatter(opts);
}

void ProcessGroupGloo::Impl::alltoallRaw(void* in, void* out, size_t nbytes, Deadline d) {
  if (nbytes == 0) return;
  gloo::AlltoallOptions opts(context_);
  opts.setInput(static_cast<uint8_t*>(in), nbytes);
  opts.setOutput(static_cast<uint8_t*>(out), nbytes);
  opts.setTag(nextTag_++);
  opts.setTimeout(timeoutUntil(d));
  gloo::alltoall(opts);
}

void ProcessGroupGloo::Impl::barrierRaw(Deadline d) {
  gloo::BarrierOptions opts(context_);
  opts.setTag(nextTag_++);
  opts.setTimeout(timeoutUntil(d));
  gloo::barrier(opts);
}

// ---- point to point ---------------------------------------------------------------------------

Work ProcessGroupGloo::Impl::startTransfer(const Tensor& tensor, bool isRecv, const std::vector<int>& peers,
                                           uint32_t tag) {
  std::string what = isRecv ? "recv from " : "send to ";
  what += peers.size() == 1 ? "rank " + std::to_string(peers[0]) : "any of ranks " + rankList(peers);
  what += " (tag " + std::to_string(tag) + ") on group '" + name_ + "'";
  std::string broken = brokenReason();
  if (!broken.empty()) {
    return Work::failed(what, std::make_exception_ptr(
                                  StateError(what + ": the group is unusable after an earlier failure: " + broken)));
  }
  Work work = Work::start(what, {tensor});
  auto t = std::make_unique<Transfer>();
  t->work = work;
  t->isRecv = isRecv;
  t->peers = peers;
  t->tag = tag;
  t->tensor = tensor;
  t->deadline = Clock::now() + options_.timeout;
  const bool inlined = !isRecv && tensor.nbytes() <= kP2pInlineBytes;
  const size_t messageBytes = kP2pBytes + (isRecv ? kP2pInlineBytes : inlined ? tensor.nbytes() : 0);
  t->message.reset(new uint8_t[messageBytes]);
  t->headerBuffer = context_->createPeerBuffer(t->message.get(), messageBytes);
  t->verdictBuffer = context_->createPeerBuffer(t->verdict.data(), kP2pBytes);
  try {
    SigpipeBlock block;
    if (!isRecv) {
      // The receive of the verdict, the header with small data after it, or
      // the header and the data on its own slot (it leaves once the receiver,
      // having read the header, posts a receive of that size).
      const int dst = peers[0];
      t->seq = sendsTo_[static_cast<size_t>(dst)].fetch_add(1, std::memory_order_relaxed) & detail::kP2pSeqMask;
      const std::array<int64_t, kP2pWords> header = {kP2pHeaderMagic, static_cast<int64_t>(t->seq),
                                                     static_cast<int64_t>(tensor.nbytes()),
                                                     static_cast<int64_t>(tensor.dtype()), tensor.numel(),
                                                     inlined ? 1 : 0};
      std::memcpy(t->message.get(), header.data(), kP2pBytes);
      if (inlined && tensor.nbytes() > 0) std::memcpy(t->message.get() + kP2pBytes, tensor.rawData(), tensor.nbytes());
      t->verdictBuffer->recv(dst, p2pSlot(detail::kP2pVerdictBase, t->seq, tag));
      t->headerBuffer->send(dst, detail::kP2pHeaderBase | tag);
      if (!inlined) {
        t->dataBuffer = context_->createPeerBuffer(tensor.rawData(), tensor.nbytes());
        t->dataBuffer->send(dst, p2pSlot(detail::kP2pDataBase, t->seq, tag));
      }
    } else if (peers.size() == 1) {
      work.setSourceRank(peers[0]);
      t->headerBuffer->recv(peers[0], detail::kP2pHeaderBase | tag);
    } else {
      t->headerBuffer->recv(peers, detail::kP2pHeaderBase | tag);
    }
  } catch (const std::exception& e) {
    work.fail(fatal(what, e, "the transfer could not start"));
    return work;
  }
  {
    std::lock_guard<std::mutex> lock(transferMutex_);
    if (!transfersStopping_) {
      transfers_.push_back(std::move(t));
      if (transfers_.size() > freeWaiters_) {
        ++freeWaiters_;
        transferWaiters_.emplace_back([this] { waitTransfers(); });
      }
      transferQueued_.notify_one();
      return work;
    }
  }
  work.fail(std::make_exception_ptr(StateError(what + ": the process group is being destroyed")));
  return work;
}

bool ProcessGroupGloo::Impl::waitOn(gloo::transport::UnboundBuffer* buffer, bool isRecv, int* peer, Deadline d) {
  {
    std::lock_guard<std::mutex> lock(transferMutex_);
    if (transfersStopping_) return false;
    waitingOn_.emplace_back(buffer, isRecv);
  }
  bool done = false;
  std::exception_ptr error;
  try {
    done = isRecv ? buffer->waitRecv(peer, timeoutUntil(d)) : buffer->waitSend(peer, timeoutUntil(d));
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(transferMutex_);
    auto it = std::find(waitingOn_.begin(), waitingOn_.end(), std::make_pair(buffer, isRecv));
    waitingOn_.erase(it);
  }
  if (error) std::rethrow_exception(error);
  return done;
}

bool ProcessGroupGloo::Impl::finishSend(Transfer& t) {
  const int dst = t.peers[0];
  if (!waitOn(t.headerBuffer.get(), false, nullptr, t.deadline)) return false;
  if (!waitOn(t.verdictBuffer.get(), true, nullptr, t.deadline)) return false;
  const auto& v = t.verdict;
  if (v[0] != kP2pVerdictMagic || v[1] < 0 || v[3] < 0) {
    throw ProtocolError(t.work.description() + ": rank " + std::to_string(dst) +
                        " answered the size header with bytes that are no weft verdict");
  }
  // The receiver takes the data whatever its size (into a scratch buffer when
  // the sizes differ), so both sides stay in step.
  if (t.dataBuffer && !waitOn(t.dataBuffer.get(), false, nullptr, t.deadline)) return false;
  if (static_cast<uint64_t>(v[1]) != t.tensor.nbytes()) {
    throw SizeMismatch(weft::detail::concat(t.work.description(), ": rank ", dst, " received it into a tensor of ",
                                            sizeText(v[1], v[2], v[3]), ", but this send has ", sizeText(t.tensor),
                                            "; the data was discarded and the group stays usable"));
  }
  return true;
}

bool ProcessGroupGloo::Impl::finishRecv(Transfer& t) {
  int peer = -1;
  if (!waitOn(t.headerBuffer.get(), true, &peer, t.deadline)) return false;
  std::array<int64_t, kP2pWords> h;
  std::memcpy(h.data(), t.message.get(), kP2pBytes);
  const bool inlined = h[5] == 1;
  if (h[0] != kP2pHeaderMagic || h[2] < 0 || h[4] < 0 || (h[5] != 0 && h[5] != 1) ||
      (inlined && static_cast<uint64_t>(h[2]) > kP2pInlineBytes)) {
    throw ProtocolError(t.work.description() + ": rank " + std::to_string(peer) +
                        " sent bytes that are no weft size header");
  }
  t.work.setSourceRank(peer);
  // Posted with room for the most inline data; this is what came.
  detail::countReceivedAs(*t.headerBuffer, kP2pBytes + (inlined ? static_cast<size_t>(h[2]) : 0));
  const uint64_t seq = static_cast<uint64_t>(h[1]);
  const uint64_t theirs = static_cast<uint64_t>(h[2]);
  const bool same = theirs == t.tensor.nbytes();
  {
    SigpipeBlock block;
    t.verdict = {kP2pVerdictMagic, static_cast<int64_t>(t.tensor.nbytes()), static_cast<int64_t>(t.tensor.dtype()),
                 t.tensor.numel(), 0, 0};
    t.verdictBuffer->send(peer, p2pSlot(detail::kP2pVerdictBase, seq, t.tag));
    if (inlined) {
      if (same && theirs > 0) std::memcpy(t.tensor.rawData(), t.message.get() + kP2pBytes, theirs);
    } else if (theirs > 0) {
      void* into = t.tensor.rawData();
      if (!same) {
        try {
          t.scratch.resize(theirs);
        } catch (const std::exception&) {
          throw ProtocolError(t.work.description() + ": rank " + std::to_string(peer) + " announced " +
                              sizeText(h[2], h[3], h[4]) + ", more than this process can hold to discard");
        }
        into = t.scratch.data();
      }
      t.dataBuffer = context_->createPeerBuffer(into, theirs);
      t.dataBuffer->recv(peer, p2pSlot(detail::kP2pDataBase, seq, t.tag));
    }
  }
  if (t.dataBuffer && !waitOn(t.dataBuffer.get(), true, nullptr, t.deadline)) return false;
  if (!waitOn(t.verdictBuffer.get(), false, nullptr, t.deadline)) return false;
  if (!same) {
    throw SizeMismatch(weft::detail::concat(t.work.description(), ": rank ", peer, " sent ",
                                            sizeText(h[2], h[3], h[4]), ", but this receive's tensor holds ",
                                            sizeText(t.tensor), "; the data was discarded and the group stays usable"));
  }
  return true;
}

void ProcessGroupGloo::Impl::waitTransfers() {
  blockSigpipeOnThisThread();
  for (;;) {
    std::unique_ptr<Transfer> t;
    {
      std::unique_lock<std::mutex> lock(transferMutex_);
      transferQueued_.wait(lock, [&] { return transfersStopping_ || !transfers_.empty(); });
      if (transfers_.empty()) return;
      t = std::move(transfers_.front());
      transfers_.pop_front();
      --freeWaiters_;
    }
    const std::string what = t->work.description();
    bool done = false;
    std::exception_ptr error;
    try {
      done = t->isRecv ? finishRecv(*t) : finishSend(*t);
    } catch (const SizeMismatch&) {
      error = std::current_exception();
    } catch (const std::exception& e) {
      error = fatal(what, e, t->isRecv ? "no matching send arrived" : "the receiver did not take it");
    }
    {
      std::lock_guard<std::mutex> lock(transferMutex_);
      ++freeWaiters_;
    }
    if (error) {
      t->work.fail(error);
    } else if (!done) {
      t->work.fail(std::make_exception_ptr(StateError(what + ": aborted: the process group was destroyed")));
    } else {
      t->work.complete();
    }
  }
}

// ==== ProcessGroupGloo ==========================================================================

namespace {
constexpr std::array<const char*, 7> kAlgorithmNames = {"auto",  "ring",  "ring-chunked", "halving-doubling",
                                                        "bcube", "naive", "parallel"};
}  // namespace

const char* allreduceAlgorithmName(AllreduceAlgorithm algorithm) {
  const auto i = static_cast<size_t>(algorithm);
  return i < kAlgorithmNames.size() ? kAlgorithmNames[i] : "unknown";
}

AllreduceAlgorithm parseAllreduceAlgorithm(const std::string& name, const std::string& what) {
  std::string known;
  for (size_t i = 0; i < kAlgorithmNames.size(); ++i) {
    if (name == kAlgorithmNames[i]) return static_cast<AllreduceAlgorithm>(i);
    known += std::string(i == 0 ? "" : ", ") + kAlgorithmNames[i];
  }
  throw InvalidArgumentError(what + ": unknown allreduce algorithm '" + name + "' (known: " + known + ")");
}

Work allReduceWith(ProcessGroup& pg, const Tensor& tensor, ReduceOp op, AllreduceAlgorithm algorithm) {
  auto* gloo = dynamic_cast<ProcessGroupGloo*>(&pg);
  WEFT_ENFORCE(gloo != nullptr, InvalidArgumentError, "allReduceWith: the ", pg.backendName(), " group '", pg.name(),
               "' has no choice of allreduce algorithm (gloo groups have)");
  return gloo->allReduce(tensor, op, algorithm);
}

std::unique_ptr<ProcessGroup> createGlooGroup(rpc::StoreClient& store, int rank, int size, GlooOptions options) {
  return ProcessGroupGloo::create(store, rank, size, std::move(options));
}

std::unique_ptr<ProcessGroupGloo> ProcessGroupGloo::create(rpc::StoreClient& store, int rank, int size,
                                                           Options options) {
  return std::make_unique<ProcessGroupGloo>(store, rank, size, std::move(options));
}

ProcessGroupGloo::ProcessGroupGloo(rpc::StoreClient& store, int rank, int size, Options options)
    : ProcessGroup(rank, size) {
  checkGroupName("ProcessGroupGloo", options.name);
  std::string name = options.name;
  impl_ = std::make_unique<Impl>(store, rank, size, std::move(options), std::move(name), nullptr);
}

ProcessGroupGloo::ProcessGroupGloo(std::unique_ptr<Impl> impl, int rank, int size)
    : ProcessGroup(rank, size), impl_(std::move(impl)) {}

ProcessGroupGloo::~ProcessGroupGloo() = default;

void ProcessGroupGloo::keepAlive(std::shared_ptr<void> owned) { owned_.push_back(std::move(owned)); }

const std::string& ProcessGroupGloo::name() const { return impl_->name_; }
TrafficStats ProcessGroupGloo::trafficStats() const { return impl_->traffic_->read(); }
void ProcessGroupGloo::resetTrafficStats() { impl_->traffic_->reset(); }
AllreduceAlgorithm ProcessGroupGloo::allreduceAlgorithm() const { return impl_->algorithm_; }
const ProcessGroupGloo::Options& ProcessGroupGloo::options() const { return impl_->options_; }
int64_t ProcessGroupGloo::collectivesStarted() const { return impl_->started_.load(std::memory_order_relaxed); }
int64_t ProcessGroupGloo::fusedCollectives() const { return impl_->fused_.load(std::memory_order_relaxed); }
size_t ProcessGroupGloo::fusedLimit() const { return impl_->fusedLimit_; }

void ProcessGroupGloo::checkTensor(const Tensor& t, const char* op, const std::string& what) const {
  WEFT_ENFORCE(t.defined(), InvalidArgumentError, op, ": ", what, " is an undefined tensor");
  WEFT_ENFORCE(t.device().isCpu(), InvalidArgumentError, op, ": ", what,
               " must be a CPU tensor for the gloo backend, got one on ", t.device().str(), " of shape ",
               shapeString(t.shape()));
  WEFT_ENFORCE(t.isContiguous(), InvalidArgumentError, op, ": ", what, " must be contiguous, got shape ",
               shapeString(t.shape()), " with strides ", shapeString(t.strides()));
}

Work ProcessGroupGloo::broadcast(const Tensor& tensor, int root) {
  checkTensor(tensor, "broadcast", "tensor");
  checkRoot(root, "broadcast");
  CallHeader h{OpCode::Broadcast, 0, static_cast<int64_t>(tensor.dtype()), tensor.numel(), root, -1};
  Impl* impl = impl_.get();
  auto tree = [impl, tensor, root](Deadline d) { impl->broadcastRaw(tensor.rawData(), tensor.nbytes(), root, d); };
  if (tensor.nbytes() > impl->fusedLimit_) return impl->enqueue(h, {tensor}, std::move(tree));
  // Carried by the call exchange: the root's data comes with its header.
  const bool isRoot = rank_ == root;
  ExchangeCarriedOp carried;
  carried.attach = [tensor, isRoot](CallExchange& ex, CallExchange::Outgoing& out) {
    ex.send(out, tensor.rawData(), isRoot ? tensor.nbytes() : 0);
  };
  carried.finish = [tensor, root, isRoot](const CallExchange& ex) {
    WEFT_ENFORCE(ex.dataBytesOf(root) == tensor.nbytes(), ProtocolError, "rank ", root, " (the root) sent ",
                 ex.dataBytesOf(root), " bytes of data with a header for ", sizeText(tensor));
    if (!isRoot && tensor.nbytes() > 0) std::memcpy(tensor.rawData(), ex.dataOf(root), tensor.nbytes());
  };
  return impl->enqueue(h, {tensor}, std::move(tree), std::move(carried));
}

Work ProcessGroupGloo::allReduce(const Tensor& tensor, ReduceOp op) {
  return allReduce(tensor, op, AllreduceAlgorithm::Auto);
}

Work ProcessGroupGloo::allReduce(const Tensor& tensor, ReduceOp op, AllreduceAlgorithm algorithm) {
  checkTensor(tensor, "allReduce", "tensor");
  checkReducible(tensor.dtype(), op, "allReduce");
  WEFT_ENFORCE(static_cast<uint8_t>(algorithm) <= static_cast<uint8_t>(AllreduceAlgorithm::Parallel),
               InvalidArgumentError, "allReduce: unknown algorithm code ", static_cast<int>(algorithm));
  Impl* impl = impl_.get();
  const bool carriable = algorithm == AllreduceAlgorithm::Auto && impl->algorithm_ == AllreduceAlgorithm::Auto &&
                         tensor.nbytes() <= impl->fusedLimit_;
  const AllreduceAlgorithm chosen = impl->resolve(algorithm, tensor.nbytes());
  CallHeader h{OpCode::AllReduce, 0, static_cast<int64_t>(tensor.dtype()), tensor.numel(), -1, static_cast<int64_t>(op)};
  if (!carriable) h.algorithm = static_cast<int64_t>(chosen);
  auto ring = [impl, tensor, op, chosen](Deadline d) {
    impl->allreduceRaw(tensor.rawData(), static_cast<size_t>(tensor.numel()), tensor.dtype(), op, chosen, d);
  };
  if (!carriable) return impl->enqueue(h, {tensor}, std::move(ring));
  // Carried by the call exchange: every rank reduces the ranks' copies in
  // rank order, so all get the same bits.
  const int n = size_;
  ExchangeCarriedOp carried;
  carried.attach = [tensor](CallExchange& ex, CallExchange::Outgoing& out) {
    ex.send(out, tensor.rawData(), tensor.nbytes());
  };
  carried.finish = [tensor, op, n](const CallExchange& ex) {
    const size_t count = static_cast<size_t>(tensor.numel());
    for (int r = 0; r < n; ++r) {
      WEFT_ENFORCE(ex.dataBytesOf(r) == tensor.nbytes(), ProtocolError, "rank ", r, " sent ", ex.dataBytesOf(r),
                   " bytes of data with a header for ", sizeText(tensor));
    }
    if (count == 0) return;
    void* out = tensor.rawData();
    std::memcpy(out, ex.dataOf(0), tensor.nbytes());
    dispatchReducible(tensor.dtype(), [&]<class T>() {
      const ReduceFn fn = reduceFunction<T>(op);
      for (int r = 1; r < n; ++r) fn(out, out, ex.dataOf(r), count);
    });
    if (op == ReduceOp::Avg) divideInPlace(out, tensor.dtype(), count, n);
  };
  return impl->enqueue(h, {tensor}, std::move(ring), std::move(carried));
}

Work ProcessGroupGloo::reduce(const Tensor& tensor, int root, ReduceOp op) {
  checkTensor(tensor, "reduce", "tensor");
  checkRoot(root, "reduce");
  checkReducible(tensor.dtype(), op, "reduce");
  CallHeader h{OpCode::Reduce, 0, static_cast<int64_t>(tensor.dtype()), tensor.numel(), root, static_cast<int64_t>(op)};
  Impl* impl = impl_.get();
  return impl->enqueue(h, {tensor}, [impl, tensor, root, op](Deadline d) {
    impl->reduceRaw(tensor.rawData(), static_cast<size_t>(tensor.numel()), tensor.dtype(), op, root, d);
  });
}

namespace {
// Copies rank i's chunk of `flat` into outputs[i].
void unpack(const std::vector<uint8_t>& flat, const std::vector<Tensor>& outputs, size_t nbytes) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (nbytes > 0) std::memcpy(outputs[i].rawData(), flat.data() + i * nbytes, nbytes);
  }
}
}  // namespace

Work ProcessGroupGloo::allGather(std::vector<Tensor>& outputs, const Tensor& input) {
  checkTensor(input, "allGather", "input");
  prepareOutputs(outputs, input, "allGather");
  CallHeader h{OpCode::AllGather, 0, static_cast<int64_t>(input.dtype()), input.numel(), -1, -1};
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  Impl* impl = impl_.get();
  const int n = size_;
  return impl->enqueue(h, std::move(keep), [impl, input, outs = outputs, n](Deadline d) {
    const size_t nbytes = input.nbytes();
    std::vector<uint8_t> flat(nbytes * static_cast<size_t>(n));
    impl->allgatherRaw(input.rawData(), flat.data(), nbytes, d);
    unpack(flat, outs, nbytes);
  });
}

Work ProcessGroupGloo::allGatherInto(const Tensor& output, const Tensor& input) {
  checkTensor(input, "allGatherInto", "input");
  checkTensor(output, "allGatherInto", "output");
  WEFT_ENFORCE(output.dtype() == input.dtype() && output.numel() == input.numel() * size_, InvalidArgumentError,
               "allGatherInto: output (", dtypeName(output.dtype()), ", shape ", shapeString(output.shape()),
               ") must hold ", size_, " x ", input.numel(), " elements of ", dtypeName(input.dtype()),
               " (input shape ", shapeString(input.shape()), ")");
  CallHeader h{OpCode::AllGather, 0, static_cast<int64_t>(input.dtype()), input.numel(), -1, -1};
  Impl* impl = impl_.get();
  return impl->enqueue(h, {output, input}, [impl, input, output](Deadline d) {
    impl->allgatherRaw(input.rawData(), output.rawData(), input.nbytes(), d);
  });
}

Work ProcessGroupGloo::gather(std::vector<Tensor>& outputs, const Tensor& input, int root) {
  checkTensor(input, "gather", "input");
  checkRoot(root, "gather");
  if (rank_ == root) {
    prepareOutputs(outputs, input, "gather");
  } else {
    WEFT_ENFORCE(outputs.empty(), InvalidArgumentError, "gather: only the root (rank ", root,
                 ") passes outputs; rank ", rank_, " passed ", outputs.size());
  }
  CallHeader h{OpCode::Gather, 0, static_cast<int64_t>(input.dtype()), input.numel(), root, -1};
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  Impl* impl = impl_.get();
  const int n = size_;
  const bool isRoot = rank_ == root;
  return impl->enqueue(h, std::move(keep), [impl, input, outs = outputs, n, root, isRoot](Deadline d) {
    const size_t nbytes = input.nbytes();
    std::vector<uint8_t> flat(isRoot ? nbytes * static_cast<size_t>(n) : 0);
    impl->gatherRaw(input.rawData(), flat.data(), nbytes, root, d);
    if (isRoot) unpack(flat, outs, nbytes);
  });
}

Work ProcessGroupGloo::scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) {
  checkTensor(output, "scatter", "output");
  checkRoot(root, "scatter");
  if (rank_ == root) {
    WEFT_ENFORCE(inputs.size() == static_cast<size_t>(size_), InvalidArgumentError, "scatter: the root passes ", size_,
                 " inputs (one per rank), got ", inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkLike(inputs[i], output, "scatter", "inputs[" + std::to_string(i) + "]", "the output");
    }
  } else {
    WEFT_ENFORCE(inputs.empty(), InvalidArgumentError, "scatter: only the root (rank ", root,
                 ") passes inputs; rank ", rank_, " passed ", inputs.size());
  }
  CallHeader h{OpCode::Scatter, 0, static_cast<int64_t>(output.dtype()), output.numel(), root, -1};
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  Impl* impl = impl_.get();
  return impl->enqueue(h, std::move(keep), [impl, output, inputs, root](Deadline d) {
    std::vector<uint8_t*> ptrs;
    for (const Tensor& t : inputs) ptrs.push_back(bytesOf(t));
    impl->scatterRaw(ptrs, output.rawData(), output.nbytes(), root, d);
  });
}

Work ProcessGroupGloo::reduceScatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  checkTensor(output, "reduceScatter", "output");
  checkReducible(output.dtype(), op, "reduceScatter");
  WEFT_ENFORCE(inputs.size() == static_cast<size_t>(size_), InvalidArgumentError, "reduceScatter: expected ", size_,
               " inputs (one per rank), got ", inputs.size());
  int64_t total = 0;
  uint64_t split = 1469598103934665603ull;  // FNV-1a over the shard sizes
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string what = "inputs[" + std::to_string(i) + "]";
    checkTensor(inputs[i], "reduceScatter", what);
    WEFT_ENFORCE(inputs[i].dtype() == output.dtype(), InvalidArgumentError, "reduceScatter: ", what, " is ",
                 dtypeName(inputs[i].dtype()), ", the output ", dtypeName(output.dtype()));
    total += inputs[i].numel();
    split = (split ^ static_cast<uint64_t>(inputs[i].numel())) * 1099511628211ull;
  }
  const Tensor& own = inputs[static_cast<size_t>(rank_)];
  WEFT_ENFORCE(own.numel() == output.numel(), InvalidArgumentError, "reduceScatter: the output (shape ",
               shapeString(output.shape()), ", ", output.numel(), " elements) must hold this rank's shard, inputs[",
               rank_, "] (shape ", shapeString(own.shape()), ", ", own.numel(), " elements)");
  CallHeader h{OpCode::ReduceScatter, 0, static_cast<int64_t>(output.dtype()), total, -1, static_cast<int64_t>(op)};
  h.split = static_cast<int64_t>(split >> 1);
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  Impl* impl = impl_.get();
  return impl->enqueue(h, std::move(keep),
                       [impl, output, inputs, op](Deadline d) { impl->reduceScatterRing(inputs, output, op, d); });
}

Work ProcessGroupGloo::allToAll(const Tensor& output, const Tensor& input) {
  checkTensor(input, "allToAll", "input");
  checkLike(output, input, "allToAll", "output", "the input");
  WEFT_ENFORCE(input.dim() >= 1 && input.size(0) % size_ == 0, InvalidArgumentError, "allToAll: dim 0 of the input (shape ",
               shapeString(input.shape()), ") must split into ", size_, " equal chunks");
  CallHeader h{OpCode::AllToAll, 0, static_cast<int64_t>(input.dtype()), input.numel(), -1, -1};
  Impl* impl = impl_.get();
  return impl->enqueue(h, {output, input}, [impl, input, output](Deadline d) {
    impl->alltoallRaw(input.rawData(), output.rawData(), input.nbytes(), d);
  });
}

Work ProcessGroupGloo::barrier() {
  Impl* impl = impl_.get();
  // Carried by the call exchange, which is itself a barrier: a rank has every
  // other rank's header only once they have all called.
  ExchangeCarriedOp carried;
  carried.finish = [](const CallExchange&) {};
  return impl->enqueue(CallHeader{OpCode::Barrier, 0, -1, -1, -1, -1}, {}, [impl](Deadline d) { impl->barrierRaw(d); },
                       std::move(carried));
}

Work ProcessGroupGloo::isend(const Tensor& tensor, int dst, uint32_t tag) {
  checkTensor(tensor, "isend", "tensor");
  checkPeer(dst, "isend", "destination");
  return impl_->startTransfer(tensor, false, {dst}, tag);
}

Work ProcessGroupGloo::irecv(const Tensor& tensor, int src, uint32_t tag) {
  checkTensor(tensor, "irecv", "tensor");
  checkPeer(src, "irecv", "source");
  return impl_->startTransfer(tensor, true, {src}, tag);
}

Work ProcessGroupGloo::irecvFrom(const Tensor& tensor, const std::vector<int>& srcs, uint32_t tag) {
  checkTensor(tensor, "irecvFrom", "tensor");
  WEFT_ENFORCE(!srcs.empty(), InvalidArgumentError, "irecvFrom: the list of source ranks is empty");
  for (int s : srcs) checkPeer(s, "irecvFrom", "source");
  return impl_->startTransfer(tensor, true, srcs, tag);
}

std::unique_ptr<ProcessGroup> ProcessGroupGloo::newGroup(const std::vector<int>& ranks) {
  const int index = agreeOnSubgroup(impl_->store_, impl_->prefix_, impl_->options_.timeout, ranks);
  const int newRank = rankIn(ranks);
  if (newRank < 0) return nullptr;
  std::string subName = subgroupName(impl_->name_, index, ranks);
  const int subSize = static_cast<int>(ranks.size());
  auto impl = std::make_unique<Impl>(impl_->store_, newRank, subSize, impl_->options_, std::move(subName),
                                     impl_->device_);
  auto sub = std::unique_ptr<ProcessGroupGloo>(new ProcessGroupGloo(std::move(impl), newRank, subSize));
  sub->owned_ = owned_;
  return sub;
}

}  // namespace weft::collectives
