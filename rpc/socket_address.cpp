#include "rpc/socket_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

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

namespace {

constexpr const char* kSettingName = "WEFT_SOCKET_IFNAME";

std::string numericHost(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

bool isLinkLocal6(const sockaddr* sa) {
  return sa->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
}

struct InterfaceAddress {
  std::string interface;
  std::string address;  // numeric
  int family;
  bool linkLocal;
};

std::vector<InterfaceAddress> interfaceAddresses() {
  ifaddrs* list = nullptr;
  WEFT_ENFORCE(::getifaddrs(&list) == 0, Error, "cannot list this machine's network interfaces: ",
               std::strerror(errno));
  std::vector<InterfaceAddress> out;
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    out.push_back({i->ifa_name, numericHost(i->ifa_addr), i->ifa_addr->sa_family, isLinkLocal6(i->ifa_addr)});
  }
  ::freeifaddrs(list);
  return out;
}

// "lo 127.0.0.1 ::1, eth0 10.0.0.5"
std::string describe(const std::vector<InterfaceAddress>& addrs) {
  std::vector<std::pair<std::string, std::string>> byInterface;  // in the order first seen
  for (const InterfaceAddress& a : addrs) {
    auto it = std::find_if(byInterface.begin(), byInterface.end(), [&](const auto& e) { return e.first == a.interface; });
    if (it == byInterface.end()) it = byInterface.insert(byInterface.end(), {a.interface, a.interface});
    it->second += " " + a.address;
  }
  std::string out;
  for (const auto& e : byInterface) out += (out.empty() ? "" : ", ") + e.second;
  return out.empty() ? "none" : out;
}

std::string addressNamedBy(const std::string& setting) {
  const std::string quoted = std::string(kSettingName) + "='" + setting + "'";
  std::vector<InterfaceAddress> addrs = interfaceAddresses();
  in6_addr probe6{};
  in_addr probe4{};
  const bool literal = ::inet_pton(AF_INET, setting.c_str(), &probe4) == 1 ||
                       ::inet_pton(AF_INET6, setting.c_str(), &probe6) == 1;
  if (literal) {
    SocketAddress given = *SocketAddress::resolve(setting, 0);
    const std::string canonical = numericHost(given.sockaddr());
    for (const InterfaceAddress& a : addrs) {
      if (a.address == canonical) return canonical;
    }
    throw InvalidArgumentError(quoted + " is not an address of this machine (its interfaces: " + describe(addrs) +
                               "); name one of them, or an interface");
  }
  const InterfaceAddress* v4 = nullptr;
  const InterfaceAddress* v6 = nullptr;
  for (const InterfaceAddress& a : addrs) {
    if (a.interface != setting) continue;
    if (a.family == AF_INET && !v4) v4 = &a;
    if (a.family == AF_INET6 && !a.linkLocal && !v6) v6 = &a;
  }
  if (v4) return v4->address;
  if (v6) return v6->address;
  WEFT_ENFORCE(::if_nametoindex(setting.c_str()) == 0, InvalidArgumentError, quoted,
               " names an interface with no IPv4 or routable IPv6 address (this machine's interfaces: ",
               describe(addrs), ")");
  throw InvalidArgumentError(quoted + " is neither an interface nor an IP address of this machine (its interfaces: " +
                             describe(addrs) + ")");
}

}  // namespace

bool isLoopbackAddress(const SocketAddress& address) {
  const sockaddr* sa = address.sockaddr();
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  return false;
}

std::string localAddressFor(const std::string& setting, const std::string& masterHost) {
  if (!setting.empty()) return addressNamedBy(setting);
  std::optional<SocketAddress> resolved;
  try {
    resolved = SocketAddress::resolve(masterHost, 1);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(std::string("cannot pick this machine's address from the route to the master ") +
                               "address: " + e.what() + "; set " + kSettingName +
                               " to the interface or address the other machines reach this one at");
  }
  const SocketAddress& master = *resolved;
  if (isLoopbackAddress(master)) return "127.0.0.1";
  int fd = ::socket(master.sockaddr()->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  WEFT_ENFORCE(fd >= 0, Error, "cannot create a socket to find this machine's address: ", std::strerror(errno));
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  int err = 0;
  if (::connect(fd, master.sockaddr(), master.length()) != 0) {
    err = errno;
  } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    err = errno;
  }
  ::close(fd);
  WEFT_ENFORCE(err == 0, InvalidArgumentError, "cannot pick this machine's address: no route to the master address '",
               masterHost, "' (", std::strerror(err), "); set ", kSettingName,
               " to the interface or address the other machines reach this one at");
  return numericHost(reinterpret_cast<const sockaddr*>(&local));
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
