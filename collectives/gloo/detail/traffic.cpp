#include "collectives/gloo/detail/traffic.h"

#include <utility>
#include <vector>

#include "common/error.h"

namespace weft::collectives::detail {

TrafficStats TrafficCounter::read() const {
  TrafficStats s;
  s.bytesSent = bytesSent_.load(std::memory_order_relaxed);
  s.bytesReceived = bytesReceived_.load(std::memory_order_relaxed);
  s.messagesSent = messagesSent_.load(std::memory_order_relaxed);
  s.messagesReceived = messagesReceived_.load(std::memory_order_relaxed);
  s.dataMessagesSent = dataMessagesSent_.load(std::memory_order_relaxed);
  return s;
}

void TrafficCounter::reset() {
  bytesSent_.store(0, std::memory_order_relaxed);
  bytesReceived_.store(0, std::memory_order_relaxed);
  messagesSent_.store(0, std::memory_order_relaxed);
  messagesReceived_.store(0, std::memory_order_relaxed);
  dataMessagesSent_.store(0, std::memory_order_relaxed);
}

namespace {

size_t bytesOf(size_t offset, size_t nbytes, size_t size) {
  return nbytes == gloo::transport::UnboundBuffer::kUnspecifiedByteCount ? size - offset : nbytes;
}

class CountingUnboundBuffer final : public gloo::transport::UnboundBuffer {
 public:
  CountingUnboundBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> inner, std::shared_ptr<TrafficCounter> counter)
      : UnboundBuffer(inner->ptr, inner->size), inner_(std::move(inner)), counter_(std::move(counter)) {}

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    const bool done = inner_->waitRecv(rank, timeout);
    if (done) {
      std::lock_guard<std::mutex> lock(mutex_);
      // Completions of one buffer's receives come in posting order per
      // peer; the sizes summed over completed receives are exact either way
      // once every posted receive has completed.
      size_t bytes = 0;
      if (!pending_.empty()) {
        bytes = pending_.front();
        pending_.pop_front();
      }
      lastReceived_ = bytes;
      counter_->received(bytes);
    }
    return done;
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override { return inner_->waitSend(rank, timeout); }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }

  void send(int dstRank, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->send(dstRank, slot, offset, nbytes);
    counter_->sent(bytesOf(offset, nbytes, size));
  }
  void recv(int srcRank, uint64_t slot, size_t offset, size_t nbytes) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(bytesOf(offset, nbytes, size));
    }
    try {
      inner_->recv(srcRank, slot, offset, nbytes);
    } catch (...) {
      dropLastPending();
      throw;
    }
  }
  void recv(std::vector<int> srcRanks, uint64_t slot, size_t offset, size_t nbytes) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(bytesOf(offset, nbytes, size));
    }
    try {
      inner_->recv(std::move(srcRanks), slot, offset, nbytes);
    } catch (...) {
      dropLastPending();
      throw;
    }
  }

  gloo::transport::UnboundBuffer* inner() { return inner_.get(); }

  void restate(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes < lastReceived_) counter_->receivedLess(lastReceived_ - bytes);
    lastReceived_ = bytes;
  }

 private:
  void dropLastPending() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pending_.empty()) pending_.pop_back();
  }

  std::unique_ptr<gloo::transport::UnboundBuffer> inner_;
  std::shared_ptr<TrafficCounter> counter_;
  std::mutex mutex_;            // guards pending_ and lastReceived_
  std::deque<size_t> pending_;  // posted receives not yet completed, in posting order
  size_t lastReceived_ = 0;     // what the last completed receive counted
};

// A pair buffer of Gloo's legacy algorithms: a send counts its length, a
// completed receive the buffer's size, since a pair buffer's completion does
// not say how much arrived (see traffic.h).
class CountingBuffer final : public gloo::transport::Buffer {
 public:
  CountingBuffer(int slot, void* ptr, size_t size, std::unique_ptr<gloo::transport::Buffer> inner,
                 std::shared_ptr<TrafficCounter> counter)
      : Buffer(slot, ptr, size), inner_(std::move(inner)), counter_(std::move(counter)) {}

  void setDebug(bool debug) override { inner_->setDebug(debug); }
  void send(size_t offset, size_t length, size_t roffset) override {
    inner_->send(offset, length, roffset);
    counter_->sent(length);
  }
  void waitRecv() override {
    inner_->waitRecv();
    counter_->received(size_);
  }
  void waitSend() override { inner_->waitSend(); }

 private:
  std::unique_ptr<gloo::transport::Buffer> inner_;
  std::shared_ptr<TrafficCounter> counter_;
};

class CountingPair final : public gloo::transport::Pair {
 public:
  CountingPair(int peer, gloo::transport::Pair* inner, std::shared_ptr<TrafficCounter> counter)
      : peer_(peer), inner_(inner), counter_(std::move(counter)) {}

  const gloo::transport::Address& address() const override { return inner_->address(); }
  void connect(const std::vector<char>& bytes) override { inner_->connect(bytes); }
  void close() override { inner_->close(); }
  void setSync(bool enable, bool busyPoll) override { inner_->setSync(enable, busyPoll); }
  std::unique_ptr<gloo::transport::Buffer> createSendBuffer(int slot, void* ptr, size_t size) override {
    return std::make_unique<CountingBuffer>(slot, ptr, size, inner_->createSendBuffer(slot, ptr, size), counter_);
  }
  std::unique_ptr<gloo::transport::Buffer> createRecvBuffer(int slot, void* ptr, size_t size) override {
    return std::make_unique<CountingBuffer>(slot, ptr, size, inner_->createRecvBuffer(slot, ptr, size), counter_);
  }
  // Gloo's unbound buffers post through their own context's pairs; these
  // forward the TCP buffer under a counting (and watched) one.
  void send(gloo::transport::UnboundBuffer* buf, uint64_t tag, size_t offset, size_t nbytes) override {
    gloo::transport::UnboundBuffer* target = innerOf(buf);
    inner_->send(target, tag, offset, nbytes);
    counter_->sent(bytesOf(offset, nbytes, buf->size));
  }
  void recv(gloo::transport::UnboundBuffer* buf, uint64_t tag, size_t offset, size_t nbytes) override {
    inner_->recv(innerOf(buf), tag, offset, nbytes);
  }

 private:
  // The TCP buffer the inner pair takes, its watch told of the post first.
  gloo::transport::UnboundBuffer* innerOf(gloo::transport::UnboundBuffer* buf) {
    auto* counting = dynamic_cast<CountingUnboundBuffer*>(buf);
    gloo::transport::UnboundBuffer* inner = counting != nullptr ? counting->inner() : buf;
    auto* watched = dynamic_cast<WatchedBuffer*>(inner);
    if (watched == nullptr) return inner;
    watched->posting({peer_});
    return watched->inner();
  }

  const int peer_;
  gloo::transport::Pair* inner_;  // owned by the inner context
  std::shared_ptr<TrafficCounter> counter_;
};

}  // namespace

CountingContext::CountingContext(std::shared_ptr<gloo::transport::Context> inner,
                                 std::shared_ptr<TrafficCounter> counter)
    : Context(inner->rank, inner->size),
      inner_(inner),
      counter_(std::move(counter)),
      watch_(std::make_shared<ConnectionWatch>(std::move(inner))) {
  setTimeout(inner_->getTimeout());
  pairs_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::unique_ptr<gloo::transport::Pair>& pair = inner_->getPair(r);
    if (pair) pairs_[static_cast<size_t>(r)] = std::make_unique<CountingPair>(r, pair.get(), counter_);
  }
  watch_->start();
}

// The wrappers in pairs_ only point at the inner pairs: drop them first.
CountingContext::~CountingContext() {
  watch_->stop();
  pairs_.clear();
}

std::unique_ptr<gloo::transport::Pair>& CountingContext::getPair(int rank) {
  return pairs_.at(static_cast<size_t>(rank));
}

std::unique_ptr<gloo::transport::Pair>& CountingContext::createPair(int rank) {
  WEFT_CHECK(false) << "CountingContext wraps a connected context; createPair(" << rank << ") is not supported";
  return pairs_.at(static_cast<size_t>(rank));
}

std::unique_ptr<gloo::transport::UnboundBuffer> CountingContext::createUnboundBuffer(void* ptr, size_t size) {
  return createUnboundBuffer(ptr, size, ConnectionWatch::Scope::Group);
}

std::unique_ptr<gloo::transport::UnboundBuffer> CountingContext::createUnboundBuffer(void* ptr, size_t size,
                                                                                     ConnectionWatch::Scope scope) {
  return std::make_unique<CountingUnboundBuffer>(watch_->createBuffer(ptr, size, scope), counter_);
}

void CountingContext::stopWatching() { watch_->stop(); }

void countReceivedAs(gloo::transport::UnboundBuffer& buffer, size_t bytes) {
  if (auto* counting = dynamic_cast<CountingUnboundBuffer*>(&buffer)) counting->restate(bytes);
}

}  // namespace weft::collectives::detail
