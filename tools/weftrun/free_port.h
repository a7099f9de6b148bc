// Choosing a TCP port for a job's store that nothing else on this machine
// takes before rank 0 binds it: weftrun's master port when none is given,
// and the ports the tests give their jobs (tests/rpc/agent_group.h).
//
//   weft::weftrun::PortReservation r = weft::weftrun::reserveFreePort();
//   startRanks(r.port());  // rank 0 binds it; r holds the reservation meanwhile
//
// A port found free a moment ago can be taken before rank 0 binds it:
//   - by the local end of any outgoing TCP connection, when it lies in
//     Linux's ephemeral range (net.ipv4.ip_local_port_range), which binding
//     port 0 also draws from: so the port is drawn below that range, from
//     kLowestPort up (from anywhere else when the range leaves no room);
//   - by another weftrun or test choosing the same port: so each holds a
//     reservation while its job starts, an abstract Unix socket named
//     "weft-port-<port>" (no file; the kernel drops it with its last
//     descriptor, so a crashed holder leaves nothing), and the choices of
//     the others skip a reserved port.
// Only a program binding a fixed port in that range on its own can still
// take it. The reservation's descriptor is close-on-exec: the ranks do not
// inherit it. Header-only, so that the tests use it without linking weftrun.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace weft::weftrun {

// The lowest port drawn.
inline constexpr int kLowestPort = 20000;

// A port reserved for a job (see the file comment); move-only, released by
// the destructor.
class PortReservation {
 public:
  PortReservation() = default;
  PortReservation(uint16_t port, int fd) : port_(port), fd_(fd) {}
  PortReservation(PortReservation&& o) noexcept : port_(o.port_), fd_(std::exchange(o.fd_, -1)) {}
  PortReservation& operator=(PortReservation&& o) noexcept {
    if (this != &o) {
      release();
      port_ = o.port_;
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation() { release(); }

  uint16_t port() const { return port_; }

 private:
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  uint16_t port_ = 0;
  int fd_ = -1;
};

namespace detail {

// The first port of Linux's ephemeral range (32768 when unreadable).
inline int ephemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (in >> low && low > 0) return low;
  return 32768;
}

// The reservation of `port` among the processes of this network namespace;
// -1 when another holds it.
inline int reserve(uint16_t port) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = "weft-port-" + std::to_string(port);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] == 0: the abstract namespace
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether a TCP socket could bind `port` on every address right now.
inline bool bindable(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace detail

// A port below the ephemeral range that no socket is bound to and no other
// weftrun or test holds, reserved until the result is destroyed.
// std::runtime_error when none is found in 1000 draws.
inline PortReservation reserveFreePort() {
  int low = kLowestPort;
  int high = detail::ephemeralLow() - 1;
  if (high - low < 1000) {  // the ephemeral range leaves no room below it: draw from everywhere
    low = 1024;
    high = 65535;
  }
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(low, high);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const auto port = static_cast<uint16_t>(pick(rng));
    const int fd = detail::reserve(port);
    if (fd < 0) continue;
    if (detail::bindable(port)) return PortReservation(port, fd);
    ::close(fd);
  }
  throw std::runtime_error("no free TCP port found in " + std::to_string(low) + "-" + std::to_string(high) +
                           " after 1000 draws");
}

}  // namespace weft::weftrun
