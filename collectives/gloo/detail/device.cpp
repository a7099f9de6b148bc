#include "collectives/gloo/detail/device.h"

#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>

#include <condition_variable>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include "collectives/process_group.h"
#include "common/error.h"
#include "rpc/options.h"
#include "rpc/socket_address.h"

namespace weft::collectives::detail {

namespace {

// Puts the calling thread under SCHED_BATCH for a scope (see the header).
class BatchPolicyScope {
 public:
  BatchPolicyScope() {
    ok_ = pthread_getschedparam(pthread_self(), &policy_, &param_) == 0 && policy_ == SCHED_OTHER;
    if (!ok_) return;  // a real-time or other explicit policy: leave it (and so the loop thread's) alone
    sched_param batch{};
    batch.sched_priority = 0;
    ok_ = pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch) == 0;
  }
  ~BatchPolicyScope() {
    if (ok_) pthread_setschedparam(pthread_self(), policy_, &param_);
  }
  BatchPolicyScope(const BatchPolicyScope&) = delete;
  BatchPolicyScope& operator=(const BatchPolicyScope&) = delete;

 private:
  int policy_ = SCHED_OTHER;
  sched_param param_{};
  bool ok_ = false;
};

}  // namespace

void blockSigpipeOnThisThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

SigpipeBlock::SigpipeBlock() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &previous_);
  sigset_t pending;
  sigpending(&pending);
  wasPending_ = sigismember(&pending, SIGPIPE) == 1;
}

SigpipeBlock::~SigpipeBlock() {
  if (sigismember(&previous_, SIGPIPE) == 1) return;  // it was blocked before: leave everything as it was
  sigset_t pending;
  sigpending(&pending);
  if (!wasPending_ && sigismember(&pending, SIGPIPE) == 1) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    timespec zero{0, 0};
    sigtimedwait(&set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

std::shared_ptr<gloo::transport::Device> createTcpDevice(const std::string& hostname) {
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  SigpipeBlock block;      // Gloo's loop thread inherits the mask
  BatchPolicyScope batch;  // and the scheduling policy
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw Error("cannot create a Gloo TCP device on '" + hostname + "': " + e.what());
  }
}

namespace {

// "host" of "host:port" or "[v6]:port".
std::string storeHost(const std::string& endpoint) {
  std::string host = endpoint;
  size_t colon = host.rfind(':');
  if (colon != std::string::npos) host = host.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

}  // namespace

std::string defaultDeviceAddress(const std::string& storeEndpoint) {
  const char* setting = std::getenv("WEFT_SOCKET_IFNAME");
  return rpc::localAddressFor(setting ? setting : "", storeHost(storeEndpoint));
}

namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// Between waits, how often a rank looks for a failure another rank posted.
constexpr Millis kMeshSlice{100};

// How long a failing rank lets Gloo's loop thread take up the connections it
// dialled before it closes them (see "Closing" in the header).
constexpr Millis kDialGrace{250};

Millis since(Clock::time_point t) { return std::chrono::duration_cast<Millis>(Clock::now() - t); }

bool isLoopback(const gloo::transport::tcp::Address& a) {
  const sockaddr_storage& ss = a.getSockaddr();
  if (ss.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
  }
  return ss.ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr);
}

// "10.0.0.1:29500" or "[fd00::1]:29500" (Gloo's own str() prints the port in
// network byte order).
std::string endpointOf(const gloo::transport::tcp::Address& a) {
  return rpc::SocketAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(&a.getSockaddr()), sizeof(sockaddr_storage))
      .toString();
}

// What a Gloo connect error says happened, without Gloo's source location and
// its own (byte-swapped) rendering of the address: "Connection refused".
std::string connectFailure(const std::string& what) {
  std::string text = what;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find("] ");
    if (close != std::string::npos) text = text.substr(close + 2);
  }
  if (text.rfind("connect", 0) == 0) {
    size_t colon = text.rfind(": ");
    if (colon != std::string::npos) text = text.substr(colon + 2);
  }
  return text;
}

// Whether this side of a pair dials the peer: Gloo's rule (Pair::connect)
// compares the two listening addresses, and the greater one connects.
bool dialsOut(const gloo::transport::tcp::Address& self, const gloo::transport::tcp::Address& peer) {
  const sockaddr_storage& a = self.getSockaddr();
  const sockaddr_storage& b = peer.getSockaddr();
  if (a.ss_family != b.ss_family) return false;
  int order = 0;
  if (a.ss_family == AF_INET) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in*>(&b);
    order = std::memcmp(&sa->sin_addr, &sb->sin_addr, sizeof(in_addr));
    if (order == 0) order = sa->sin_port - sb->sin_port;
  } else if (a.ss_family == AF_INET6) {
    const auto* sa = reinterpret_cast<const sockaddr_in6*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in6*>(&b);
    order = std::memcmp(&sa->sin6_addr, &sb->sin6_addr, sizeof(in6_addr));
    if (order == 0) order = sa->sin6_port - sb->sin6_port;
  }
  return order > 0;
}

constexpr const char* kSettingHint =
    "each rank binds and gives its peers the address WEFT_SOCKET_IFNAME names (weftrun --socket-ifname; default: "
    "the local address of the route to the master address)";

}  // namespace

void MeshContext::connectMesh(rpc::StoreClient& store, const std::string& prefix,
                              const std::shared_ptr<gloo::transport::Device>& device, std::chrono::milliseconds timeout,
                              const std::string& label) {
  const auto began = Clock::now();
  const auto deadline = began + timeout;
  const std::string failedKey = prefix + "mesh/failed";
  auto elapsed = [&] { return std::to_string(since(began).count()) + " ms"; };
  // A store call; losing the store names what was going on.
  auto viaStore = [&](auto&& call) {
    try {
      return call();
    } catch (const DisconnectedError& e) {
      throw DisconnectedError("ProcessGroupGloo: " + label + ": lost the store after " + elapsed() +
                              " while connecting the group (the rank serving it may have ended): " + e.what());
    }
  };
  // Another rank's failure, posted for the group: this rank fails with it.
  auto checkFailed = [&] {
    if (!viaStore([&] { return store.check({failedKey}); })) return;
    throw DisconnectedError("ProcessGroupGloo: " + label + ": the connect failed on another rank after " + elapsed() +
                            ": " + viaStore([&] { return store.get(failedKey); }));
  };

  std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
  transport->setTimeout(timeout);
  std::string mine;
  gloo::transport::tcp::Address self;
  std::vector<gloo::transport::tcp::Address> listening(static_cast<size_t>(size));  // this rank's, per peer
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    auto& pair = transport->createPair(i);
    std::vector<char> bytes = pair->address().bytes();
    listening[static_cast<size_t>(i)] = gloo::transport::tcp::Address(bytes);
    if (mine.empty()) self = listening[static_cast<size_t>(i)];
    mine.append(bytes.begin(), bytes.end());
  }
  viaStore([&] { store.set(prefix + "mesh/" + std::to_string(rank), mine); });

  // Every peer's addresses, under the deadline.
  std::vector<std::string> keys;
  for (int i = 0; i < size; ++i) {
    if (i != rank) keys.push_back(prefix + "mesh/" + std::to_string(i));
  }
  for (;;) {
    try {
      const Millis left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
      const Millis slice = std::max(Millis(1), std::min(kMeshSlice, left));
      viaStore([&] { store.wait(keys, slice); });
      break;
    } catch (const TimeoutError&) {
      checkFailed();
      if (Clock::now() < deadline) continue;
      std::vector<int> missing;
      for (int i = 0; i < size; ++i) {
        if (i != rank && !viaStore([&] { return store.check({prefix + "mesh/" + std::to_string(i)}); })) {
          missing.push_back(i);
        }
      }
      throw TimeoutError("ProcessGroupGloo: " + label + ": rendezvous timed out after " + elapsed() + ": rank" +
                         (missing.size() == 1 ? " " : "s ") + rankList(missing) +
                         (missing.size() == 1 ? " has" : " have") + " not joined (the group's timeout is " +
                         std::to_string(timeout.count()) + " ms)");
    }
  }

  struct Link {
    gloo::transport::tcp::Address address;
    std::thread thread;
    bool done = false;
    std::exception_ptr error;
  };
  std::vector<Link> links(static_cast<size_t>(size));
  std::mutex mutex;
  std::condition_variable changed;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    std::string all = viaStore([&] { return store.get(prefix + "mesh/" + std::to_string(i)); });
    const size_t each = mine.size() / static_cast<size_t>(size - 1);
    WEFT_ENFORCE(all.size() == mine.size(), ProtocolError, "ProcessGroupGloo: ", label, ": rank ", i, " posted ",
                 all.size(), " bytes of addresses, not ", size - 1, " of ", each, " bytes");
    const size_t slot = static_cast<size_t>(rank > i ? rank - 1 : rank);
    std::vector<char> bytes(all.begin() + static_cast<std::ptrdiff_t>(slot * each),
                            all.begin() + static_cast<std::ptrdiff_t>((slot + 1) * each));
    links[static_cast<size_t>(i)].address = gloo::transport::tcp::Address(bytes);
  }
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    Link& link = links[static_cast<size_t>(i)];
    std::vector<char> bytes = link.address.bytes();
    try {
      link.thread = std::thread([&, i, bytes = std::move(bytes)] {
        std::exception_ptr error;
        try {
          transport->getPair(i)->connect(bytes);
        } catch (...) {
          error = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mutex);
        links[static_cast<size_t>(i)].done = true;
        links[static_cast<size_t>(i)].error = error;
        changed.notify_all();
      });
    } catch (const std::system_error& e) {
      for (int j = 0; j < size; ++j) {
        if (j != rank) transport->getPair(j)->close();
      }
      for (Link& started : links) {
        if (started.thread.joinable()) started.thread.join();
      }
      throw Error("ProcessGroupGloo: " + label + ": cannot start a thread to connect to rank " + std::to_string(i) +
                  ": " + e.what());
    }
  }

  // Waits until every link is up, one failed, another rank failed, or the
  // deadline; then stops the links still waiting (closing a pair wakes its
  // thread) and joins every thread.
  std::exception_ptr failure;
  int failedPeer = -1;
  {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      bool all = true;
      for (int i = 0; i < size && failedPeer < 0; ++i) {
        if (i == rank) continue;
        const Link& link = links[static_cast<size_t>(i)];
        all = all && link.done;
        if (link.done && link.error) failedPeer = i;
      }
      if (failedPeer >= 0 || all || Clock::now() >= deadline) break;
      changed.wait_for(lock, std::min(kMeshSlice, std::chrono::duration_cast<Millis>(deadline - Clock::now())));
      if (Clock::now() >= deadline) continue;
      lock.unlock();
      try {
        checkFailed();
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (failure) break;
    }
  }
  // A link still waiting means this rank fails. A connection it dialled may
  // be up in the kernel but not yet taken up by Gloo's loop thread; closing
  // its pair now would reset it before the peer's loop accepted it (see
  // "Closing" in the header), so the loop thread gets kDialGrace first.
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait_until(lock, Clock::now() + kDialGrace, [&] {
      for (int i = 0; i < size; ++i) {
        const Link& link = links[static_cast<size_t>(i)];
        if (i != rank && !link.done && dialsOut(listening[static_cast<size_t>(i)], link.address)) return false;
      }
      return true;
    });
    for (int i = 0; i < size && !failure && failedPeer < 0; ++i) {
      if (i != rank && links[static_cast<size_t>(i)].done && links[static_cast<size_t>(i)].error) failedPeer = i;
    }
  }
  std::vector<int> unreached;
  std::string unreachedAt;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (int i = 0; i < size; ++i) {
      if (i == rank || links[static_cast<size_t>(i)].done) continue;
      unreached.push_back(i);
      unreachedAt += (unreachedAt.empty() ? "" : ", ") + std::to_string(i) + " at " +
                     endpointOf(links[static_cast<size_t>(i)].address);
    }
  }
  for (int i : unreached) transport->getPair(i)->close();
  for (Link& link : links) {
    if (link.thread.joinable()) link.thread.join();
  }
  if (failure) std::rethrow_exception(failure);
  if (failedPeer >= 0) {
    const Link& link = links[static_cast<size_t>(failedPeer)];
    std::string why;
    try {
      std::rethrow_exception(link.error);
    } catch (const std::exception& e) {
      why = connectFailure(e.what());
    } catch (...) {
      why = "unknown error";
    }
    std::string msg = "rank " + std::to_string(rank) + " (at " + endpointOf(self) + ") could not connect to rank " +
                      std::to_string(failedPeer) + " at " + endpointOf(link.address) + ", the address it gave, after " +
                      elapsed() + ": " + why;
    if (isLoopback(link.address) && !rpc::isLoopbackHost(storeHost(store.endpoint()))) {
      msg += " (a loopback address, which only its own machine reaches)";
    }
    msg += "; " + std::string(kSettingHint) + ": set it on rank " + std::to_string(failedPeer) +
           "'s machine to an interface or address the other machines reach";
    try {
      store.compareSet(failedKey, "", msg);
    } catch (...) {
      // The store may be gone too; this rank's own error says what happened.
    }
    throw DisconnectedError("ProcessGroupGloo: " + label + ": " + msg);
  }
  if (!unreached.empty()) {
    // The deadline may have passed while this rank was the late one: another
    // rank's failure then says what happened (a lost store keeps the timeout).
    bool posted = false;
    try {
      posted = store.check({failedKey});
    } catch (const std::exception&) {
    }
    if (posted) checkFailed();
    std::string msg = "rank " + std::to_string(rank) + " (at " + endpointOf(self) + ") timed out after " + elapsed() +
                      " connecting to rank" + (unreached.size() == 1 ? " " : "s ") + unreachedAt +
                      " (the group's timeout is " + std::to_string(timeout.count()) + " ms); " + kSettingHint +
                      ": check that every machine reaches the addresses given";
    try {
      store.compareSet(failedKey, "", msg);
    } catch (...) {
    }
    throw TimeoutError("ProcessGroupGloo: " + label + ": " + msg);
  }

  // Every rank's connections are up before any rank goes on: a rank that
  // returned at once could close its connections (its program ending) before
  // a peer's loop thread accepted them (see "Closing" in the header).
  viaStore([&] { store.set(prefix + "mesh/up/" + std::to_string(rank), "1"); });
  std::vector<std::string> upKeys;
  for (int i = 0; i < size; ++i) {
    if (i != rank) upKeys.push_back(prefix + "mesh/up/" + std::to_string(i));
  }
  for (;;) {
    try {
      const Millis left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
      const Millis slice = std::max(Millis(1), std::min(kMeshSlice, left));
      viaStore([&] { store.wait(upKeys, slice); });
      break;
    } catch (const TimeoutError&) {
      checkFailed();
      if (Clock::now() < deadline) continue;
      std::vector<int> pending;
      for (int i = 0; i < size; ++i) {
        if (i != rank && !viaStore([&] { return store.check({prefix + "mesh/up/" + std::to_string(i)}); })) {
          pending.push_back(i);
        }
      }
      const bool one = pending.size() == 1;
      std::string msg = "rank " + std::to_string(rank) + " connected to every peer, but rank" + (one ? " " : "s ") +
                        rankList(pending) + (one ? " has" : " have") + " not finished connecting after " + elapsed() +
                        " (the group's timeout is " + std::to_string(timeout.count()) + " ms)";
      try {
        store.compareSet(failedKey, "", msg);
      } catch (...) {
      }
      throw TimeoutError("ProcessGroupGloo: " + label + ": " + msg);
    }
  }
  device_ = device;
  counting_ = std::make_shared<CountingContext>(std::move(transport), traffic_);
  transportContext_ = counting_;
}

std::unique_ptr<gloo::transport::UnboundBuffer> MeshContext::createPeerBuffer(void* ptr, size_t size) {
  WEFT_CHECK(counting_) << "createPeerBuffer before connectMesh";
  return counting_->createUnboundBuffer(ptr, size, ConnectionWatch::Scope::Peers);
}

void MeshContext::stopWatching() {
  if (counting_) counting_->stopWatching();
}

}  // namespace weft::collectives::detail
