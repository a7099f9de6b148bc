#include "rpc/transport/listener.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/logging.h"

namespace weft::rpc::transport {

Listener::Listener(UvLoop& loop, const std::string& host, uint16_t port, AcceptFn onAccept,
                   logging::RateLimiter* log)
    : loop_(loop),
      onAccept_(std::move(onAccept)),
      ownLog_(log == nullptr ? std::make_unique<logging::RateLimiter>("rpc") : nullptr),
      log_(log == nullptr ? ownLog_.get() : log) {
  WEFT_CHECK(loop_.inLoopThread()) << "Listener constructed off the loop thread";
  SocketAddress address = *SocketAddress::resolve(host, port);
  fd_ = ::socket(address.sockaddr()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  WEFT_ENFORCE(fd_ >= 0, Error, "rpc: cannot create a socket to listen on ", address.toString(), ": ",
               std::strerror(errno));
  int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd_, address.sockaddr(), address.length()) != 0 || ::listen(fd_, 1024) != 0) {
    int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error("rpc: cannot listen on " + address.toString() + ": " + std::strerror(err));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&bound), len).port();
  poll_ = new uv_poll_s;
  int rc = uv_poll_init(loop_.raw(), poll_, fd_);
  if (rc != 0) {
    delete poll_;
    poll_ = nullptr;
    ::close(fd_);
    fd_ = -1;
    throw Error("rpc: cannot watch the socket listening on " + address.toString() + ": " + uv_strerror(rc));
  }
  poll_->data = this;
  uv_poll_start(poll_, UV_READABLE, &Listener::onPoll);
  pause_ = new uv_timer_s;
  uv_timer_init(loop_.raw(), pause_);
  pause_->data = this;
}

Listener::~Listener() {
  if (fd_ < 0) return;
  if (loop_.inLoopThread()) {
    closeOnLoop();
  } else {
    try {
      loop_.call([this] { closeOnLoop(); });
    } catch (const StateError&) {
      // The loop has stopped and closed our handles itself.
      ::close(fd_);
    }
  }
}

void Listener::closeOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (fd_ < 0) return;
  uv_poll_stop(poll_);
  uv_close(reinterpret_cast<uv_handle_t*>(poll_), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_s*>(h); });
  uv_timer_stop(pause_);
  uv_close(reinterpret_cast<uv_handle_t*>(pause_), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_s*>(h); });
  poll_ = nullptr;
  pause_ = nullptr;
  ::close(fd_);
  fd_ = -1;
}

void Listener::onPoll(uv_poll_s* handle, int status, int) {
  auto* self = static_cast<Listener*>(handle->data);
  if (self->ownLog_) self->ownLog_->flush();
  if (status < 0) {
    // libuv has stopped the handle: watch again after a pause rather than never.
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(self->fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    WEFT_LOG_LIMITED(*self->log_, Warn, "the listener")
        << "rpc: error on the listening socket (" << (err != 0 ? std::strerror(err) : uv_strerror(status))
        << "); pausing the listener for 100 ms";
    self->pauseOnLoop();
    return;
  }
  self->acceptAllOnLoop();
}

void Listener::pauseOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  uv_poll_stop(poll_);
  uv_timer_start(pause_, [](uv_timer_s* t) {
    auto* l = static_cast<Listener*>(t->data);
    if (l->ownLog_) l->ownLog_->flush();
    if (l->poll_ != nullptr) uv_poll_start(l->poll_, UV_READABLE, &Listener::onPoll);
  }, 100, 0);
}

void Listener::acceptAllOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  for (int i = 0; i < 256 && fd_ >= 0; ++i) {
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        WEFT_LOG_LIMITED(*log_, Warn, "the listener")
            << "rpc: cannot accept a connection (" << std::strerror(errno) << "); pausing the listener for 100 ms";
        pauseOnLoop();
        return;
      }
      WEFT_LOG_LIMITED(*log_, Warn, "the listener") << "rpc: accept failed: " << std::strerror(errno);
      return;
    }
    std::string who = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&peer), len).toString();
    onAccept_(fd, std::move(who));
  }
}

int connectTcp(const SocketAddress& address, std::chrono::steady_clock::time_point deadline) {
  std::string lastError = "no attempt";
  int attempts = 0;
  auto refusedOrUnreachable = [&](int err) {
    if (err != ECONNREFUSED && err != ENETUNREACH && err != EHOSTUNREACH) return;
    throw DisconnectedError("rpc: cannot connect to " + address.toString() + ": " + std::strerror(err));
  };
  for (;;) {
    ++attempts;
    int fd = ::socket(address.sockaddr()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    WEFT_ENFORCE(fd >= 0, Error, "rpc: cannot create a socket: ", std::strerror(errno));
    int rc = ::connect(fd, address.sockaddr(), address.length());
    if (rc != 0 && errno == EINPROGRESS) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLOUT, 0};
      int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left.count(), 1000))));
      if (ready == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) return fd;
        ::close(fd);
        refusedOrUnreachable(err);
        fd = -1;
        lastError = std::strerror(err);
      } else {
        lastError = "no answer";
      }
    } else if (rc == 0) {
      return fd;
    } else {
      const int err = errno;
      ::close(fd);
      refusedOrUnreachable(err);
      fd = -1;
      lastError = std::strerror(err);
    }
    if (fd >= 0) ::close(fd);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError("rpc: cannot connect to " + address.toString() + " after " + std::to_string(attempts) +
                         " attempts: " + lastError);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace weft::rpc::transport
