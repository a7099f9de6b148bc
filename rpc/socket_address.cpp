#include "rpc/socket_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace weft::rpc {

std::optional<SocketAddress> SocketAddress::resolve(const std::string& host, uint16_t port,
                                                    std::string* temporaryFailure) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &results);
  if (rc == EAI_AGAIN && temporaryFailure) {
    *temporaryFailure = std::string("resolving '") + host + "': " + ::gai_strerror(rc);
    return std::nullopt;
  }
  WEFT_ENFORCE(rc == 0, InvalidArgumentError, "cannot resolve host '", host, "': ", ::gai_strerror(rc));
  const addrinfo* chosen = nullptr;
  for (const addrinfo* r = results; r; r = r->ai_next) {
    if (r->ai_family == AF_INET) {
      chosen = r;
      break;
    }
    if (r->ai_family == AF_INET6 && !chosen) chosen = r;
  }
  if (!chosen) {
    ::freeaddrinfo(results);
    throw InvalidArgumentError("host '" + host + "' has no IPv4 or IPv6 address");
  }
  SocketAddress a = fromSockaddr(chosen->ai_addr, chosen->ai_addrlen);
  ::freeaddrinfo(results);
  if (a.storage_.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&a.storage_)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(&a.storage_)->sin6_port = htons(port);
  }
  return a;
}

SocketAddress SocketAddress::fromSockaddr(const struct sockaddr* addr, socklen_t len) {
  SocketAddress a;
  a.length_ = std::min<socklen_t>(len, sizeof(a.storage_));
  std::memcpy(&a.storage_, addr, a.length_);
  return a;
}

uint16_t SocketAddress::port() const {
  if (storage_.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (storage_.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return 0;
}

std::string SocketAddress::toString() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (storage_.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(port());
  }
  if (storage_.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, buf, sizeof buf);
    std::string out(1, '[');
    out.append(buf).append("]:").append(std::to_string(port()));
    return out;
  }
  return "<unknown address family>";
}

void detectDeadPeers(int fd) {
  int on = 1;
  int idleSeconds = 15;
  int intervalSeconds = 5;
  int probes = 3;
  unsigned userTimeoutMs = 30000;
  // Best effort: a socket option the kernel lacks leaves the defaults.
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idleSeconds, sizeof idleSeconds);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intervalSeconds, sizeof intervalSeconds);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeoutMs, sizeof userTimeoutMs);
}

}  // namespace weft::rpc
