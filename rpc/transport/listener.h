// Listener: the agent's listening TCP socket, and the one blocking connect the
// agent makes to each peer it initiates to.
//
//   transport::Listener l(loop, "127.0.0.1", 0, [](int fd, std::string peer) { ... });   // loop thread
//   l.port();                       // the port bound
//   int fd = transport::connectTcp(address, deadline);   // any thread but the loop's
//
// Accepted sockets are handed over as plain fds (non-blocking, close-on-exec);
// the callback owns them. accept() failing for lack of descriptors (EMFILE,
// ENFILE) leaves the pending connection in the backlog, not spun on: the
// listener pauses for 100 ms. An error on the listening socket itself pauses
// it likewise, then it tries again. Each such failure is logged through a
// rate limiter (common/logging.h): the owner's, else the listener's own.
//
// Thread-safety: construct and closeOnLoop on the loop thread (or through
// UvLoop::call); port() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/logging.h"

#include "rpc/socket_address.h"
#include "rpc/uv_loop.h"

struct uv_poll_s;
struct uv_timer_s;

namespace weft::rpc::transport {

class Listener {
 public:
  using AcceptFn = std::function<void(int fd, std::string peer)>;

  // Binds and listens; throws weft::Error naming the address when it cannot.
  Listener(UvLoop& loop, const std::string& host, uint16_t port, AcceptFn onAccept,
           logging::RateLimiter* log = nullptr);
  ~Listener();  // closeOnLoop()
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  uint16_t port() const { return port_; }
  // Stops listening and closes the socket. Idempotent.
  void closeOnLoop();

 private:
  static void onPoll(uv_poll_s* handle, int status, int events);
  void acceptAllOnLoop();
  // Stops watching the socket for 100 ms.
  void pauseOnLoop();

  UvLoop& loop_;
  int fd_ = -1;
  uint16_t port_ = 0;
  AcceptFn onAccept_;
  uv_poll_s* poll_ = nullptr;
  uv_timer_s* pause_ = nullptr;
  std::unique_ptr<logging::RateLimiter> ownLog_;
  logging::RateLimiter* log_;
};

// Connects to address, blocking the calling thread until connected or deadline
// (retrying unanswered attempts every 50 ms). Returns the connected fd; throws
// TimeoutError naming the address and the last error, and DisconnectedError at
// once when the connection is refused or the address is unreachable (no route,
// no host): the agent connects only to peers already listening, so a refusal
// means the address cannot be reached from here.
int connectTcp(const SocketAddress& address, std::chrono::steady_clock::time_point deadline);

}  // namespace weft::rpc::transport
