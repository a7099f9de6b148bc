#include "rpc/transport/connection.h"

#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "rpc/socket_address.h"
#include "rpc/thread_pool.h"

namespace weft::rpc::transport {

namespace {

thread_local WriteBatch* tBatch = nullptr;

// Spans per writev; IOV_MAX is 1024 on Linux.
constexpr size_t kMaxIov = 1024;
// Reads per readable callback before other connections get their turn.
constexpr int kReadsPerWakeup = 64;

OutgoingFrame abortFrame(const Status& why) {
  FrameWriter writer(64);
  auto abort = writer.message().initAbort();
  abort.setCode(static_cast<wire::StatusCode>(static_cast<uint16_t>(why.code())));
  abort.setMessage(why.message());
  return std::move(writer).finish();
}

}  // namespace

// ---- WriteBatch ------------------------------------------------------------------

WriteBatch::WriteBatch() : outermost_(tBatch == nullptr) {
  if (outermost_) tBatch = this;
}

WriteBatch::~WriteBatch() {
  if (!outermost_) return;
  // Flushing may run code that sends again (nothing does today, but stay safe):
  // take the list first.
  while (!connections_.empty()) {
    auto list = std::move(connections_);
    connections_.clear();
    for (auto& c : list) c->flushOnLoop();
  }
  tBatch = nullptr;
}

WriteBatch* WriteBatch::current() { return tBatch; }

void WriteBatch::add(std::shared_ptr<Connection> connection) { tBatch->connections_.push_back(std::move(connection)); }

// ---- Connection ------------------------------------------------------------------

std::shared_ptr<Connection> Connection::create(UvLoop& loop, int fd, FrameLimits limits, Handlers handlers,
                                               std::string description, TransportCounters* counters) {
  WEFT_CHECK(fd >= 0) << "Connection::create with fd " << fd;
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  detectDeadPeers(fd);
  return std::shared_ptr<Connection>(
      new Connection(loop, fd, limits, std::move(handlers), std::move(description), counters));
}

std::shared_ptr<Connection> Connection::loopback(UvLoop& loop, FrameLimits limits, Handlers handlers,
                                                 std::string description) {
  return std::shared_ptr<Connection>(new Connection(loop, -1, limits, std::move(handlers), std::move(description),
                                                    nullptr));
}

Connection::Connection(UvLoop& loop, int fd, FrameLimits limits, Handlers handlers, std::string description,
                       TransportCounters* counters)
    : loop_(loop),
      fd_(fd),
      description_(std::move(description)),
      remote_("self"),
      counters_(counters),
      handlers_(std::move(handlers)),
      decoder_(limits),
      fdOwned_(fd >= 0),
      lastReceived_(std::chrono::steady_clock::now()),
      lastHeard_(lastReceived_) {
  if (fd_ >= 0) {
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    remote_ = ::getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &len) == 0
                  ? SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&peer), len).toString()
                  : std::string("an unknown address");
  }
}

Connection::~Connection() {
  // Normally closed through closeNowOnLoop (which closes the fd in the
  // poll handle's close callback, or here below when it never had one).
  if (fdOwned_) ::close(fd_);
}

void Connection::startOnLoop() {
  WEFT_CHECK(loop_.inLoopThread()) << "Connection::startOnLoop off the loop thread";
  WEFT_CHECK(!started_) << "Connection::startOnLoop twice";
  started_ = true;
  lastReceived_ = std::chrono::steady_clock::now();
  lastHeard_ = lastReceived_;
  if (fd_ < 0) return;
  poll_ = new uv_poll_s;
  int rc = uv_poll_init(loop_.raw(), poll_, fd_);
  if (rc != 0) {
    delete poll_;
    poll_ = nullptr;
    closeNowOnLoop(Status::disconnected(std::string("cannot watch the socket: ") + uv_strerror(rc)));
    return;
  }
  poll_->data = this;
  std::unique_lock<std::mutex> lock(writeMutex_);
  updatePollLocked();
}

void Connection::setDescription(std::string description) {
  std::lock_guard<std::mutex> lock(writeMutex_);
  description_ = std::move(description);
}

bool Connection::closed() const {
  std::lock_guard<std::mutex> lock(writeMutex_);
  return closed_;
}

bool Connection::send(OutgoingFrame frame) {
  if (fd_ < 0) {
    {
      std::lock_guard<std::mutex> lock(writeMutex_);
      if (closed_ || closing_) return false;
    }
    std::vector<std::byte> bytes;
    bytes.reserve(frame.byteSize());
    frame.appendTo(bytes);
    return loop_.post([self = shared_from_this(), bytes = std::move(bytes)]() mutable {
      self->deliverLoopbackOnLoop(std::move(bytes));
    });
  }
  std::unique_lock<std::mutex> lock(writeMutex_);
  if (closed_ || closing_) return false;
  queue_.push_back(std::move(frame));
  if (awaitingWritable_ || inBatch_ || flushPosted_) return true;  // someone will write it
  if (WriteBatch* batch = WriteBatch::current(); batch != nullptr && loop_.inLoopThread()) {
    inBatch_ = true;
    lock.unlock();
    batch->add(shared_from_this());
    return true;
  }
  if (ThreadPool::underLoad()) {
    flushPosted_ = true;
    lock.unlock();
    if (!loop_.post([self = shared_from_this()] { self->flushOnLoop(); })) {
      lock.lock();
      flushPosted_ = false;
      flushLocked(lock);
    }
    return true;
  }
  flushLocked(lock);
  return true;
}

void Connection::flushOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  std::unique_lock<std::mutex> lock(writeMutex_);
  inBatch_ = false;
  flushPosted_ = false;
  if (closed_ || awaitingWritable_) return;
  flushLocked(lock);
}

void Connection::flushLocked(std::unique_lock<std::mutex>& lock) {
  iovec iov[kMaxIov];
  while (!queue_.empty() && !closed_) {
    size_t n = 0;
    for (size_t f = 0; f < queue_.size() && n < kMaxIov; ++f) {
      auto spans = queue_[f].spans();
      for (size_t s = (f == 0 ? frontSpan_ : 0); s < spans.size() && n < kMaxIov; ++s) {
        size_t skip = (f == 0 && s == frontSpan_) ? frontOffset_ : 0;
        if (spans[s].size() <= skip) continue;
        iov[n].iov_base = const_cast<std::byte*>(spans[s].data()) + skip;
        iov[n].iov_len = spans[s].size() - skip;
        ++n;
      }
    }
    if (n == 0) {  // only empty spans left: every queued frame is complete
      if (counters_) counters_->framesWritten.fetch_add(queue_.size(), std::memory_order_relaxed);
      queue_.clear();
      frontSpan_ = frontOffset_ = 0;
      break;
    }
    // sendmsg with MSG_NOSIGNAL, not writev: the writer may be any thread of the program (a
    // caller's, a handler's), and a write to a connection the peer reset or that was shut down
    // must fail with EPIPE rather than raise SIGPIPE, whose default action ends the process.
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!awaitingWritable_) {
          awaitingWritable_ = true;
          if (loop_.inLoopThread()) {
            updatePollLocked();
          } else {
            lock.unlock();
            loop_.post([self = shared_from_this()] {
              std::unique_lock<std::mutex> l(self->writeMutex_);
              self->updatePollLocked();
            });
            lock.lock();
          }
        }
        return;
      }
      int err = errno;
      std::string why = std::string("write failed: ") + std::strerror(err);
      lock.unlock();
      if (loop_.inLoopThread()) {
        closeNowOnLoop(Status::disconnected(why));
      } else {
        loop_.post([self = shared_from_this(), why] { self->closeNowOnLoop(Status::disconnected(why)); });
      }
      lock.lock();
      return;
    }
    if (counters_) counters_->writeSyscalls.fetch_add(1, std::memory_order_relaxed);
    bytesWritten_ += static_cast<uint64_t>(w);
    if (counters_) counters_->bytesWritten.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
    // Advance through the queue by w bytes, releasing finished frames.
    size_t left = static_cast<size_t>(w);
    uint64_t done = 0;
    while (!queue_.empty()) {
      auto spans = queue_.front().spans();
      while (frontSpan_ < spans.size()) {
        size_t rest = spans[frontSpan_].size() - frontOffset_;
        if (left < rest) {
          frontOffset_ += left;
          left = 0;
          break;
        }
        left -= rest;
        ++frontSpan_;
        frontOffset_ = 0;
      }
      if (frontSpan_ < spans.size()) break;
      queue_.pop_front();
      frontSpan_ = 0;
      frontOffset_ = 0;
      ++done;
    }
    if (counters_) counters_->framesWritten.fetch_add(done, std::memory_order_relaxed);
  }
  if (queue_.empty()) afterDrainLocked();
}

void Connection::afterDrainLocked() {
  if (closing_ && !halfClosed_ && fd_ >= 0 && !closed_) {
    halfClosed_ = true;
    ::shutdown(fd_, SHUT_WR);
  }
}

void Connection::updatePollLocked() {
  if (poll_ == nullptr || closed_) return;
  bool wantWritable = awaitingWritable_;
  int events = UV_READABLE | (wantWritable ? UV_WRITABLE : 0);
  pollWritable_ = wantWritable;
  int rc = uv_poll_start(poll_, events, &Connection::onPoll);
  if (rc != 0) {
    // An unwatched socket would never be read again: close (writeMutex_ is held here).
    std::string why = std::string("cannot watch the socket: ") + uv_strerror(rc);
    loop_.post([self = shared_from_this(), why] { self->closeNowOnLoop(Status::disconnected(why)); });
  }
}

void Connection::onPoll(uv_poll_s* handle, int status, int events) {
  auto* self = static_cast<Connection*>(handle->data);
  auto keep = self->shared_from_this();
  if (status < 0) {
    // The socket failed. An error pending on it (EPOLLERR: a reset, as when the
    // peer's process dies with bytes unread, or a TCP timeout) comes as a
    // status, UV_EBADF from libuv 1.44, and libuv has stopped the handle
    // either way: nothing more can be read or written. Deliver the frames that
    // arrived before the error, then close, naming the socket's error.
    while (!self->closed() && self->onReadableOnLoop()) {
    }
    if (!self->closed()) self->closeNowOnLoop(Status::disconnected(self->socketError(status)));
    return;
  }
  if (events & UV_WRITABLE) self->onWritableOnLoop();
  if ((events & UV_READABLE) && !self->closed()) self->onReadableOnLoop();
}

std::string Connection::socketError(int pollStatus) const {
  int err = 0;
  socklen_t len = sizeof(err);
  if (fd_ >= 0 && ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
    return std::string("socket error: ") + std::strerror(err);
  }
  return std::string("socket error: ") + uv_strerror(pollStatus);
}

void Connection::onWritableOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  std::unique_lock<std::mutex> lock(writeMutex_);
  awaitingWritable_ = false;
  uint64_t before = bytesWritten_;
  flushLocked(lock);
  // The socket was full and took more: the peer's process read what was queued.
  if (bytesWritten_ != before) lastHeard_ = std::chrono::steady_clock::now();
  if (!closed_ && pollWritable_ != awaitingWritable_) updatePollLocked();
}

bool Connection::onReadableOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  WriteBatch batch;
  lastReceived_ = std::chrono::steady_clock::now();
  lastHeard_ = lastReceived_;
  for (int i = 0; i < kReadsPerWakeup; ++i) {
    if (closed()) return false;
    std::span<std::byte> dst = decoder_.prepareRead();
    ssize_t n = ::read(fd_, dst.data(), dst.size());
    if (n > 0) {
      if (counters_) counters_->bytesRead.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      Status s = decoder_.commitRead(static_cast<size_t>(n));
      deliverFramesOnLoop();
      if (!s.ok()) {
        fail(s);
        return false;
      }
      if (static_cast<size_t>(n) < dst.size()) return false;  // drained
      continue;
    }
    if (n == 0) {
      Status end = decoder_.endOfStream();
      closeNowOnLoop(end.ok() ? Status::disconnected("connection closed by the peer")
                        : end);
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    closeNowOnLoop(Status::disconnected(std::string("read failed: ") + std::strerror(errno)));
    return false;
  }
  return true;
}

bool Connection::hasUnreadBytesOnLoop() const {
  WEFT_DCHECK_ON_LOOP(loop_);
  int pending = 0;
  return fd_ >= 0 && !closed() && ::ioctl(fd_, FIONREAD, &pending) == 0 && pending > 0;
}

void Connection::deliverFramesOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  while (auto frame = decoder_.next()) {
    if (closeReported_) return;
    handlers_.onFrame(*this, std::move(*frame));
  }
}

void Connection::deliverLoopbackOnLoop(std::vector<std::byte> bytes) {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (closeReported_) return;
  WriteBatch batch;
  Status s = decoder_.feed(bytes);
  deliverFramesOnLoop();
  if (!s.ok()) closeNowOnLoop(s);
}

void Connection::close(Status why) {
  if (loop_.inLoopThread()) {
    closeNowOnLoop(std::move(why));
  } else {
    loop_.post([self = shared_from_this(), why = std::move(why)]() mutable { self->closeNowOnLoop(std::move(why)); });
  }
}

void Connection::fail(Status why) {
  auto run = [self = shared_from_this(), why = std::move(why)]() mutable {
    {
      std::unique_lock<std::mutex> lock(self->writeMutex_);
      if (self->closed_) return;
      if (self->fd_ >= 0 && !self->halfClosed_) {
        // Best effort: whatever is queued, then the abort, without waiting for the socket.
        self->queue_.push_back(abortFrame(why));
        self->awaitingWritable_ = false;
        self->flushLocked(lock);
      }
    }
    self->closeNowOnLoop(std::move(why));
  };
  if (loop_.inLoopThread()) {
    run();
  } else {
    loop_.post(std::move(run));
  }
}

void Connection::closeGracefully() {
  auto run = [self = shared_from_this()] {
    std::unique_lock<std::mutex> lock(self->writeMutex_);
    if (self->closed_ || self->closing_) return;
    self->closing_ = true;
    if (self->fd_ < 0) {
      lock.unlock();
      self->closeNowOnLoop(Status::disconnected("closed"));
      return;
    }
    if (self->queue_.empty()) self->afterDrainLocked();
  };
  if (loop_.inLoopThread()) {
    run();
  } else {
    loop_.post(std::move(run));
  }
}

void Connection::closeNowOnLoop(Status why) {
  WEFT_CHECK(loop_.inLoopThread()) << "Connection::closeNowOnLoop off the loop thread";
  {
    std::lock_guard<std::mutex> lock(writeMutex_);
    if (closed_) return;
    closed_ = true;
    queue_.clear();
  }
  if (poll_ != nullptr) {
    fdOwned_ = false;  // the close callback closes it
    uv_poll_stop(poll_);
    poll_->data = reinterpret_cast<void*>(static_cast<intptr_t>(fd_));
    uv_close(reinterpret_cast<uv_handle_t*>(poll_), [](uv_handle_t* h) {
      int fd = static_cast<int>(reinterpret_cast<intptr_t>(h->data));
      ::close(fd);
      delete reinterpret_cast<uv_poll_s*>(h);
    });
    poll_ = nullptr;
  } else if (fdOwned_) {
    fdOwned_ = false;
    ::close(fd_);
  }
  if (!closeReported_) {
    closeReported_ = true;
    auto keep = shared_from_this();
    if (handlers_.onClosed) handlers_.onClosed(*this, why);
  }
}

}  // namespace weft::rpc::transport
