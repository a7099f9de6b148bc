// SocketAddress: a resolved TCP endpoint (IPv4 or IPv6), and the one place
// where weft turns "host" + port into one, so that every socket of a job —
// the store's, later the agents' — resolves names the same way. Also the
// liveness settings every weft TCP connection gets (detectDeadPeers).
//
//   weft::rpc::SocketAddress a = weft::rpc::SocketAddress::resolve("node0", 29500);
//   uv_tcp_connect(&req, &tcp, a.sockaddr(), onConnect);
//   WEFT_LOG(Info) << "connecting to " << a.toString();     // "10.0.0.1:29500", "[::1]:29500"
//
// Names resolve through getaddrinfo. When a name has both IPv4 and IPv6
// addresses the first IPv4 one is taken, on every process alike, so that a
// server bound to "localhost" and its clients agree (getaddrinfo may list
// ::1 first on some hosts and 127.0.0.1 first on others).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>

namespace weft::rpc {

class SocketAddress {
 public:
  // Resolves host (a name or a numeric literal). Throws InvalidArgumentError
  // naming the host when it does not resolve. temporaryFailure, when given, is
  // set instead of throwing for a failure worth retrying (EAI_AGAIN: the name
  // server did not answer), and nullopt is returned.
  static std::optional<SocketAddress> resolve(const std::string& host, uint16_t port,
                                              std::string* temporaryFailure = nullptr);
  // The address a bound or connected socket has (getsockname / getpeername
  // results).
  static SocketAddress fromSockaddr(const struct sockaddr* addr, socklen_t len);

  const struct sockaddr* sockaddr() const { return reinterpret_cast<const struct sockaddr*>(&storage_); }
  socklen_t length() const { return length_; }
  uint16_t port() const;
  // "1.2.3.4:80" or "[::1]:80".
  std::string toString() const;

 private:
  sockaddr_storage storage_{};
  socklen_t length_ = 0;
};

// The address this machine's weft sockets (the agent's listener, every Gloo
// process group's connections) bind and give their peers. `setting` is
// WEFT_SOCKET_IFNAME's value (weftrun --socket-ifname, Options::socketIfname):
//   - an interface name ("eth0", "ib0"): its first IPv4 address, else its
//     first IPv6 address that is not link-local;
//   - an IP address of this machine ("10.0.0.5", "fd00::5"): that address;
//   - empty, the default: 127.0.0.1 when `masterHost` is a loopback address or
//     a name that resolves to one (the whole job is on this machine), else the
//     local address of this machine's route to masterHost: the address the
//     kernel sends from towards it, found by connect() on a UDP socket and
//     getsockname() (no packet is sent). The machine's host name is never
//     used: it often resolves to a loopback address.
// Returns a numeric address. Throws InvalidArgumentError naming the setting
// and listing this machine's interfaces and addresses when the setting names
// neither an interface with an address nor an address of this machine, and
// naming masterHost when it does not resolve or no route leads to it.
std::string localAddressFor(const std::string& setting, const std::string& masterHost);

// True for numeric loopback addresses (127.0.0.0/8, ::1).
bool isLoopbackAddress(const SocketAddress& address);

// Makes the kernel notice a peer that vanished without closing (its machine
// died, the network split): keepalive probes after 15 s idle, every 5 s, 3
// unanswered probes end the connection; data unacknowledged for 30 s ends it
// too (TCP_USER_TIMEOUT). Either way the socket then reports an error, and
// pending calls fail with DisconnectedError instead of waiting for their
// timeouts. fd is a connected TCP socket (uv_fileno of an uv_tcp_t).
void detectDeadPeers(int fd);

}  // namespace weft::rpc
