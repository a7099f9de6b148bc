#include "collectives/gloo/detail/connection_watch.h"

#include <algorithm>

#include <gloo/common/error.h>

#include "collectives/gloo/detail/call_check.h"
#include "collectives/gloo/detail/device.h"
#include "common/error.h"

namespace weft::collectives::detail {

namespace {

// The watching receive's wait. Nothing completes it, and a wait of Gloo's
// that times out closes every connection of its context: it must not end.
constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365 * 10);

}  // namespace

// ---- WatchedBuffer ----------------------------------------------------------------------------

WatchedBuffer::WatchedBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> inner,
                             std::shared_ptr<ConnectionWatch> watch)
    : UnboundBuffer(inner->ptr, inner->size), inner_(std::move(inner)), watch_(std::move(watch)) {}

WatchedBuffer::~WatchedBuffer() { watch_->removed(this); }

bool WatchedBuffer::waitRecv(int* rank, std::chrono::milliseconds timeout) {
  return watch_->wait(this, true, rank, timeout);
}

bool WatchedBuffer::waitSend(int* rank, std::chrono::milliseconds timeout) {
  return watch_->wait(this, false, rank, timeout);
}

void WatchedBuffer::abortWaitRecv() { watch_->userAbort(this, true); }

void WatchedBuffer::abortWaitSend() { watch_->userAbort(this, false); }

void WatchedBuffer::send(int dstRank, uint64_t slot, size_t offset, size_t nbytes) {
  posting({dstRank});
  inner_->send(dstRank, slot, offset, nbytes);
}

void WatchedBuffer::recv(int srcRank, uint64_t slot, size_t offset, size_t nbytes) {
  posting({srcRank});
  inner_->recv(srcRank, slot, offset, nbytes);
}

void WatchedBuffer::recv(std::vector<int> srcRanks, uint64_t slot, size_t offset, size_t nbytes) {
  posting(srcRanks);
  inner_->recv(std::move(srcRanks), slot, offset, nbytes);
}

void WatchedBuffer::posting(std::vector<int> peers) { watch_->posting(this, std::move(peers)); }

// ---- ConnectionWatch --------------------------------------------------------------------------

ConnectionWatch::ConnectionWatch(std::shared_ptr<gloo::transport::Context> context)
    : context_(std::move(context)),
      lost_(static_cast<size_t>(context_->size), false),
      reasons_(static_cast<size_t>(context_->size)) {}

ConnectionWatch::~ConnectionWatch() { stop(); }

void ConnectionWatch::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (watcher_.joinable() || stopping_) return;
  watcher_ = std::thread([this] { watch(); });
}

void ConnectionWatch::stop() {
  std::thread watcher;
  std::thread retrier;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // An abort that comes before the wait begins makes it return at once.
    if (probe_ != nullptr) probe_->abortWaitRecv();
    watcher.swap(watcher_);
    retrier.swap(retrier_);
  }
  stopped_.notify_all();
  if (watcher.joinable()) watcher.join();
  if (retrier.joinable()) retrier.join();
}

std::unique_ptr<WatchedBuffer> ConnectionWatch::createBuffer(void* ptr, size_t size, Scope scope) {
  auto buffer = std::make_unique<WatchedBuffer>(context_->createUnboundBuffer(ptr, size), shared_from_this());
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& entry = buffers_[buffer.get()];
  entry.scope = scope;
  if (scope == Scope::Group && !lostOrder_.empty()) entry.failed = true;
  return buffer;
}

void ConnectionWatch::removed(WatchedBuffer* buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.erase(buffer);
}

void ConnectionWatch::posting(WatchedBuffer* buffer, std::vector<int> peers) {
  std::sort(peers.begin(), peers.end());
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& entry = buffers_.at(buffer);
  // A post on a lost connection throws in Gloo; a receive from any of
  // several lost ranks would wait in the context for good.
  if (!peers.empty() && allLost(peers)) fail(buffer, entry);
  if (std::find(entry.posted.begin(), entry.posted.end(), peers) == entry.posted.end()) {
    entry.posted.push_back(std::move(peers));
  }
}

void ConnectionWatch::userAbort(WatchedBuffer* buffer, bool isRecv) {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.at(buffer).waits[isRecv ? 0 : 1].abortedByUser = true;
  if (isRecv) {
    buffer->inner()->abortWaitRecv();
  } else {
    buffer->inner()->abortWaitSend();
  }
}

bool ConnectionWatch::wait(WatchedBuffer* buffer, bool isRecv, int* rank, std::chrono::milliseconds timeout) {
  gloo::transport::UnboundBuffer& inner = *buffer->inner();
  if (timeout == gloo::transport::kUnsetTimeout) timeout = context_->getTimeout();
  const Clock::time_point deadline = Clock::now() + timeout;
  const size_t d = isRecv ? 0 : 1;
  int ended = 0;  // waits the watch ended without a completion
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Waiting& w = buffers_.at(buffer).waits[d];
      w.active = true;
      w.since = Clock::now();
      w.ended = false;
    }
    // What is left of the caller's timeout (Gloo reads 0 as none).
    const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                               std::chrono::milliseconds(1));
    bool done = false;
    std::exception_ptr error;
    try {
      done = isRecv ? inner.waitRecv(rank, left) : inner.waitSend(rank, left);
    } catch (...) {
      error = std::current_exception();
    }
    bool byUser = false;
    bool failed = false;
    std::string message;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Entry& entry = buffers_.at(buffer);
      byUser = entry.waits[d].abortedByUser;
      entry.waits[d] = Waiting{};
      failed = entry.failed;
      if (failed) message = lossMessage();
    }
    if (error) std::rethrow_exception(error);
    // An end of the watch's that came after the completion stays in Gloo's
    // flag: the next wait on this buffer (failed, so retried) takes it.
    if (done) return true;
    if (byUser || !failed) return false;
    if (++ended >= kTries) throw gloo::IoException(message);
  }
}

void ConnectionWatch::fail(WatchedBuffer* buffer, Entry& entry) {
  entry.failed = true;
  for (size_t d = 0; d < 2; ++d) {
    Waiting& w = entry.waits[d];
    if (!w.active || w.ended) continue;
    w.ended = true;
    if (d == 0) {
      buffer->inner()->abortWaitRecv();
    } else {
      buffer->inner()->abortWaitSend();
    }
  }
}

bool ConnectionWatch::allLost(const std::vector<int>& peers) const {
  return std::all_of(peers.begin(), peers.end(), [&](int r) {
    return r >= 0 && static_cast<size_t>(r) < lost_.size() && lost_[static_cast<size_t>(r)];
  });
}

std::string ConnectionWatch::lossMessage() const {
  if (lostOrder_.empty()) return "the connection to a peer was lost";
  std::string msg;
  if (lostOrder_.size() == 1) {
    msg = "the connection to rank " + std::to_string(lostOrder_[0]) + " was lost";
  } else {
    msg = "the connections to ranks [";
    for (size_t i = 0; i < lostOrder_.size(); ++i) msg += (i == 0 ? "" : ", ") + std::to_string(lostOrder_[i]);
    msg += "] were lost";
  }
  return msg + ": " + reasons_[static_cast<size_t>(lostOrder_[0])];
}

void ConnectionWatch::watch() {
  blockSigpipeOnThisThread();  // posting a receive writes to the peer
  uint8_t byte = 0;
  for (;;) {
    std::vector<int> watching;  // the peers not known to be lost
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      for (int r = 0; r < context_->size; ++r) {
        if (r != context_->rank && !lost_[static_cast<size_t>(r)]) watching.push_back(r);
      }
    }
    if (watching.empty()) return;
    // Buffers of the TCP context itself: nothing watches these.
    std::unique_ptr<gloo::transport::UnboundBuffer> probe = context_->createUnboundBuffer(&byte, 1);
    std::vector<std::pair<int, std::string>> found;
    for (int r : watching) {
      try {
        probe->recv(r, kWatchSlot);
      } catch (const std::exception& e) {
        found.emplace_back(r, e.what());
      }
    }
    if (found.empty()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return;
        probe_ = probe.get();
      }
      bool aborted = false;
      try {
        aborted = !probe->waitRecv(nullptr, kForever);
      } catch (const std::exception&) {
        // A connection was lost: which, below.
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        probe_ = nullptr;
        if (stopping_ || aborted) return;
      }
      // A receive posted on a lost connection throws at once; on a live one
      // it stays posted, harmlessly, since nothing is sent to kProbeSlot.
      std::unique_ptr<gloo::transport::UnboundBuffer> tester = context_->createUnboundBuffer(&byte, 1);
      for (int r : watching) {
        try {
          tester->recv(r, kProbeSlot);
        } catch (const std::exception& e) {
          found.emplace_back(r, e.what());
        }
      }
    }
    if (!found.empty()) lost(found);
  }
}

void ConnectionWatch::lost(const std::vector<std::pair<int, std::string>>& peers) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return;
  std::vector<int> ranks;
  for (const auto& [r, why] : peers) {
    lost_[static_cast<size_t>(r)] = true;
    reasons_[static_cast<size_t>(r)] = why;
    lostOrder_.push_back(r);
    ranks.push_back(r);
  }
  for (auto& [buffer, entry] : buffers_) {
    bool depends = entry.scope == Scope::Group;
    for (size_t i = 0; i < entry.posted.size() && !depends; ++i) {
      const std::vector<int>& named = entry.posted[i];
      depends = allLost(named) && std::any_of(named.begin(), named.end(), [&](int r) {
                  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
                });
    }
    if (depends) fail(buffer, entry);
  }
  if (!retrier_.joinable()) retrier_ = std::thread([this] { endRetries(); });
}

void ConnectionWatch::endRetries() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    stopped_.wait_for(lock, kRetryAfter / 2);
    if (stopping_) return;
    const Clock::time_point now = Clock::now();
    for (auto& [buffer, entry] : buffers_) {
      if (!entry.failed) continue;
      for (size_t d = 0; d < 2; ++d) {
        Waiting& w = entry.waits[d];
        if (!w.active || w.ended || now - w.since < kRetryAfter) continue;
        w.ended = true;
        if (d == 0) {
          buffer->inner()->abortWaitRecv();
        } else {
          buffer->inner()->abortWaitSend();
        }
      }
    }
  }
}

}  // namespace weft::collectives::detail
