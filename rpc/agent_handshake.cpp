// Agent::start() and the handshake (rpc/agent.h, "Start"): the
// rendezvous steps through the store, connecting to the lower ranks and
// accepting the higher ones, and the Hello/Welcome exchange that attaches a
// connection to its peer (rpc/protocol.capnp, "Handshake").
//
// Threads. start() and its steps run on the caller's thread: they wait on the
// store and on the peers' handshakes in slices of kStartSlice, checking between
// slices whether the job can still form (checkStartAborted). The sockets and
// handshake records belong to the loop thread: start() hands them over with
// loop_.call, and the functions ending in OnLoop run there (accepting a
// connection, reading its first frame, expiring a handshake that never came).
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "common/logging.h"
#include "rpc/agent_impl.h"
#include "rpc/socket_address.h"

namespace weft::rpc {

namespace {

using Clock = std::chrono::steady_clock;
using transport::Connection;

// Frames a connection accepts before its handshake completes: a Hello is tiny.
FrameLimits handshakeLimits() {
  FrameLimits l;
  l.maxFrameBytes = 64 << 10;
  l.maxSegments = 4;
  l.maxBuffers = 0;
  l.maxNesting = 4;
  return l;
}

// How long an accepted connection may take to say Hello, and how many may be
// waiting to at once (more are closed on arrival).
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
constexpr size_t kMaxPendingHandshakes = 64;

bool constantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

// ---- start --------------------------------------------------------------------------

void Agent::Impl::start() {
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    WEFT_ENFORCE(!startBegun_, StateError, "Agent::start: already started");
    WEFT_ENFORCE(!shuttingDown_, StateError, "Agent::start: the agent has been shut down");
    startBegun_ = true;
    startActive_ = true;
  }
  struct Done {
    Impl& impl;
    ~Done() {
      std::lock_guard<std::mutex> lock(impl.stateMutex_);
      impl.startActive_ = false;
      impl.startEnded_.notify_all();
    }
  } done{*this};
  try {
    startSteps();
  } catch (const std::exception& e) {
    // Tell the rest of the job, so that every worker fails now with the reason
    // instead of waiting out its store timeout (first reason wins).
    if (store_ && !shuttingDown_) {
      try {
        store_->compareSet(kAbortKey, "", std::to_string(incarnation_) + "\nworker '" + name_ + "' (rank " +
                                              std::to_string(options_.rank) + "): " + e.what());
      } catch (...) {
      }
    }
    throw;
  }
}

// Between slices of a wait in start(): stops it when the job cannot form (another
// worker failed to start) or this agent is being shut down.
void Agent::Impl::checkStartAborted() {
  WEFT_ENFORCE(!shuttingDown_, StateError, "Agent::start: worker '", name_,
               "' was shut down while starting");
  if (store_->check({kAbortKey})) {
    // "<incarnation of the worker that failed>\n<its reason>"
    std::string value = store_->get(kAbortKey);
    auto nl = value.find('\n');
    if (value.substr(0, nl) != std::to_string(incarnation_)) {
      throw Error("Agent::start: the job cannot form: " + (nl == std::string::npos ? value : value.substr(nl + 1)));
    }
  }
}

// start(), step by step. Each step either completes or throws the error start() reports.
void Agent::Impl::startSteps() {
  auto deadline = options_.storeTimeout.count() == 0 ? Clock::time_point::max() : Clock::now() + options_.storeTimeout;
  applyOptions();
  listen();
  openStore();
  claimIdentity();
  learnPeers(deadline);
  connectPeers(deadline);
  awaitEveryoneConnected(deadline);
  WEFT_LOG(Info) << "rpc: agent '" << name_ << "' (rank " << options_.rank << " of " << options_.worldSize
                 << ") started on " << listenAddress_;
}

// The registry takes no more functions; the log takes this worker's level and name.
void Agent::Impl::applyOptions() {
  registry_.freeze();
  logging::setLevel(options_.logLevel);
  logging::setWorkerName(name_);
}

// On the loop: the listener, the housekeeping tick, and the loopback connection to this
// worker itself. Then the addresses it listens on and gives its peers.
void Agent::Impl::listen() {
  const std::string listenHost = options_.listenHost();
  advertisedHost_ = options_.advertisedHost();
  loop_.call([this, &listenHost] {
    listener_ = std::make_unique<transport::Listener>(
        loop_, listenHost, options_.listenPort,
        [this](int fd, std::string who) { onAcceptedOnLoop(fd, std::move(who)); }, &log_);
    startTickingOnLoop();
    Peer& self = *peers_[options_.rank];
    self.conn = Connection::loopback(loop_, FrameLimits{}, handlersFor(&self, nullptr), "self");
    self.conn->startOnLoop();
    self.alive = true;
  });
  auto endpoint = [](const std::string& host, uint16_t port) {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  };
  listenAddress_ = endpoint(listenHost, listener_->port());
  advertised_ = endpoint(advertisedHost_, listener_->port());
}

// Rank 0 serves the store; every worker (rank 0 included) is its client.
void Agent::Impl::openStore() {
  if (options_.rank == 0) {
    StoreServer::Config sc = StoreServer::configFor(options_);
    storeServer_ = std::make_unique<StoreServer>(sc, &loop_);
  }
  StoreClient::Config cc = StoreClient::configFor(options_);
  if (options_.rank == 0 && options_.masterPort == 0) cc.port = storeServer_->port();
  store_ = std::make_unique<StoreClient>(cc, &loop_);
}

// Identity checks, each a compare-and-set that only the first claimant wins (the world size,
// the rank, the name); then this worker's registration: its name and the address it gives.
void Agent::Impl::claimIdentity() {
  const int rank = options_.rank;
  const int world = options_.worldSize;
  const std::string me = std::to_string(rank);
  std::string ws = store_->compareSet("weft/world_size", "", std::to_string(world));
  WEFT_ENFORCE(ws == std::to_string(world), InvalidArgumentError, "Agent::start: world size mismatch: worker '",
               name_, "' (rank ", rank, ") was started with world size ", world, " but another worker with ", ws);
  std::string token = std::to_string(incarnation_);
  std::string owner = store_->compareSet("weft/rank/" + me, "", token);
  WEFT_ENFORCE(owner == token, InvalidArgumentError, "Agent::start: rank ", rank,
               " was started twice (another process already registered it)");
  std::string holder = store_->compareSet("weft/name/" + name_, "", me);
  WEFT_ENFORCE(holder == me, InvalidArgumentError, "Agent::start: duplicate worker name '", name_,
               "': ranks ", holder, " and ", rank, " both use it");
  store_->set("weft/worker/" + me, name_ + "\n" + advertised_);
}

// Waits for every worker's registration and reads each one's name and address.
void Agent::Impl::learnPeers(Clock::time_point deadline) {
  const int world = options_.worldSize;
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("weft/worker/" + std::to_string(r));
  try {
    for (;;) {
      try {
        store_->wait(keys, std::min<std::chrono::milliseconds>(kStartSlice, remaining(deadline)));
        break;
      } catch (const TimeoutError&) {
        checkStartAborted();
        if (Clock::now() >= deadline) throw;
      }
    }
  } catch (const TimeoutError&) {
    // Named as the collectives name ranks: "rank 2", "ranks [2, 3]".
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      if (!store_->check({keys[r]})) missing.push_back(r);
    }
    std::string who;
    if (missing.empty()) {
      who = "every rank";  // all joined just after the deadline
    } else if (missing.size() == 1) {
      who = "rank " + std::to_string(missing[0]);
    } else {
      for (int r : missing) who += (who.empty() ? "ranks [" : ", ") + std::to_string(r);
      who += "]";
    }
    throw TimeoutError("Agent::start: worker '" + name_ + "' waited " + seconds(options_.storeTimeout) + " for " +
                       who + " to join");
  }
  for (int r = 0; r < world; ++r) {
    std::string v = store_->get(keys[r]);
    auto nl = v.find('\n');
    WEFT_ENFORCE(nl != std::string::npos, ProtocolError, "Agent::start: malformed registration of rank ", r);
    std::lock_guard<std::mutex> lock(infoMutex_);
    peers_[r]->name = v.substr(0, nl);
    peers_[r]->address = v.substr(nl + 1);
  }
}

// Connects to every lower rank (the higher ranks connect to this one), waits until every
// handshake has completed, and checks that each peer introduced itself by the name it registered.
void Agent::Impl::connectPeers(Clock::time_point deadline) {
  const int rank = options_.rank;
  const int world = options_.worldSize;
  for (int r = 0; r < rank; ++r) connectTo(r, deadline);
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    Future<void> f = peers_[r]->connected.getFuture();
    while (!f.waitFor(kStartSlice) && Clock::now() < deadline) checkStartAborted();
    if (!f.isReady()) {
      std::string missing;
      for (int q = 0; q < world; ++q) {
        if (q != rank && !peers_[q]->connected.isReady()) missing += (missing.empty() ? "" : ", ") + peerLabel(q);
      }
      throw TimeoutError("Agent::start: worker '" + name_ + "' timed out after " + seconds(options_.storeTimeout) +
                         " waiting for connections from " + missing);
    }
    f.get();
  }
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    std::lock_guard<std::mutex> lock(infoMutex_);
    WEFT_ENFORCE(helloNames_[r].empty() || helloNames_[r] == peers_[r]->name, InvalidArgumentError,
                 "Agent::start: rank ", r, " registered as '", peers_[r]->name, "' but introduced itself as '",
                 helloNames_[r], "'");
  }
}

// Calls may go out from here on, including from handlers serving a peer that already
// returned from start(). No worker returns before every worker has reached this point, so
// none can be called before it is able to call out itself.
void Agent::Impl::awaitEveryoneConnected(Clock::time_point deadline) {
  started_ = true;
  try {
    auto left = deadline == Clock::time_point::max() ? std::chrono::hours(24) : remaining(deadline);
    Future<void> all =
        store_->barrierAsync("weft/started", options_.worldSize, std::max(left, std::chrono::milliseconds(1)));
    while (!all.waitFor(kStartSlice)) checkStartAborted();
    all.get();
  } catch (const TimeoutError&) {
    started_ = false;
    throw TimeoutError("Agent::start: worker '" + name_ + "' timed out after " + seconds(options_.storeTimeout) +
                       " waiting for every worker to finish connecting");
  } catch (...) {
    started_ = false;
    throw;
  }
}

std::chrono::milliseconds Agent::Impl::remaining(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return std::chrono::milliseconds(0);
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

std::string Agent::Impl::peerLabel(int r) const {
  std::lock_guard<std::mutex> lock(infoMutex_);
  return "'" + peers_[r]->name + "' (rank " + std::to_string(r) + ")";
}

// This worker's identity, as Hello and Welcome both carry it.
template <class Builder>
void Agent::Impl::fillIdentity(Builder out) const {
  out.setProtocolVersion(kProtocolVersion);
  out.setWorkerName(name_);
  out.setRank(static_cast<uint32_t>(options_.rank));
  out.setWorldSize(static_cast<uint32_t>(options_.worldSize));
  out.setIncarnation(incarnation_);
}

void Agent::Impl::connectTo(int r, Clock::time_point deadline) {
  std::string address;
  {
    std::lock_guard<std::mutex> lock(infoMutex_);
    address = peers_[r]->address;
  }
  auto colon = address.rfind(':');
  WEFT_ENFORCE(colon != std::string::npos, ProtocolError, "Agent::start: malformed address '", address,
               "' of rank ", r);
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  int port = std::stoi(address.substr(colon + 1));
  SocketAddress sa = *SocketAddress::resolve(host, static_cast<uint16_t>(port));
  int fd = -1;
  const auto began = Clock::now();
  for (;;) {
    try {
      fd = transport::connectTcp(sa, std::min(deadline, Clock::now() + std::chrono::seconds(1)));
      break;
    } catch (const TimeoutError&) {
      checkStartAborted();
      if (Clock::now() >= deadline) throw;
    } catch (const DisconnectedError& e) {
      // Refused or unreachable: the peer listens before it registers its
      // address, so the address it gave cannot be reached from here.
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began).count();
      std::string why = std::string(e.what()) + " after " + std::to_string(ms) + " ms";
      if (isLoopbackAddress(sa) && !isLoopbackHost(options_.masterAddr)) {
        why += " (a loopback address, which only its own machine reaches)";
      }
      throw DisconnectedError("Agent::start: worker '" + name_ + "' (rank " + std::to_string(options_.rank) +
                              ", at " + advertised_ + ") cannot connect to " + peerLabel(r) + " at " + address +
                              ", the address it gave: " + why +
                              "; each worker binds and gives its peers the address WEFT_SOCKET_IFNAME names "
                              "(weftrun --socket-ifname; default: the local address of the route to the master "
                              "address " + options_.masterAddr + "): set it on rank " + std::to_string(r) +
                              "'s machine to an interface or address the other machines reach");
    }
  }
  loop_.call([&] {
    auto hs = std::make_shared<Handshake>();
    hs->initiator = true;
    hs->expectedRank = r;
    hs->deadline = Clock::now() + kHandshakeTimeout;
    hs->conn = Connection::create(loop_, fd, handshakeLimits(), handlersFor(nullptr, hs),
                                  "connection to " + peerLabel(r), &counters_);
    handshakes_.insert(hs);
    hs->conn->startOnLoop();
    FrameWriter w(64);
    auto hello = w.message().initHello();
    fillIdentity(hello);
    hello.setAuthToken(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(options_.authToken.data()),
                                           options_.authToken.size()));
    hs->conn->send(std::move(w).finish());
  });
}

void Agent::Impl::onAcceptedOnLoop(int fd, std::string who) {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (handshakes_.size() >= kMaxPendingHandshakes || shutdownPhase_ != Phase::None) {
    WEFT_LOG_LIMITED(log_, Warn, logging::RateLimiter::hostOf(who))
        << "rpc: refused a connection from " << who
        << (shutdownPhase_ != Phase::None ? ": shutting down" : ": too many connections in handshake");
    ++connectionsRejected_;
    ::close(fd);
    return;
  }
  auto hs = std::make_shared<Handshake>();
  hs->deadline = Clock::now() + kHandshakeTimeout;
  hs->conn = Connection::create(loop_, fd, handshakeLimits(), handlersFor(nullptr, hs),
                                "connection from " + who, &counters_);
  handshakes_.insert(hs);
  hs->conn->startOnLoop();
}

// Returns the peer the connection now belongs to, once the handshake completes.
Agent::Impl::Peer* Agent::Impl::onHandshakeFrameOnLoop(const std::shared_ptr<Handshake>& record, Connection& c,
                                                       IncomingFrame frame) {
  WEFT_DCHECK_ON_LOOP(loop_);
  const Handshake& hs = *record;
  Peer* attached = nullptr;
  Status bad;
  try {
  bad = guardRead([&] {
    auto msg = frame.message();
    if (!hs.initiator) {
      if (msg.which() != wire::Message::HELLO) {
        throw ProtocolError("expected a Hello as the first message, got another kind of message");
      }
      auto hello = msg.getHello();
      if (hello.getProtocolVersion() != kProtocolVersion) {
        throw ProtocolError("protocol version " + std::to_string(hello.getProtocolVersion()) + " (this worker speaks " +
                            std::to_string(kProtocolVersion) + ")");
      }
      auto token = hello.getAuthToken();
      if (!constantTimeEqual(std::string_view(reinterpret_cast<const char*>(token.begin()), token.size()),
                             options_.authToken)) {
        throw InvalidArgumentError("wrong authentication token (WEFT_RPC_TOKEN)");
      }
      if (hello.getWorldSize() != static_cast<uint32_t>(options_.worldSize)) {
        throw InvalidArgumentError("world size mismatch: the peer has " + std::to_string(hello.getWorldSize()) +
                                   ", this worker " + std::to_string(options_.worldSize));
      }
      uint32_t r = hello.getRank();
      if (r >= static_cast<uint32_t>(options_.worldSize) || static_cast<int>(r) <= options_.rank) {
        throw InvalidArgumentError("rank " + std::to_string(r) + " may not connect to rank " +
                                   std::to_string(options_.rank) + " (world size " +
                                   std::to_string(options_.worldSize) + "; higher ranks connect to lower ones)");
      }
      std::string name = hello.getWorkerName().cStr();
      if (name.empty() || name.size() > 128) throw InvalidArgumentError("invalid worker name in Hello");
      Peer& p = *peers_[r];
      if (p.conn != nullptr) {
        throw InvalidArgumentError("rank " + std::to_string(r) + " ('" + name + "') is already connected");
      }
      {
        std::lock_guard<std::mutex> lock(infoMutex_);
        if (!p.name.empty() && p.name != name) {
          throw InvalidArgumentError("rank " + std::to_string(r) + " is registered as '" + p.name +
                                     "', not '" + name + "'");
        }
        helloNames_[r] = name;
      }
      FrameWriter w(64);
      fillIdentity(w.message().initWelcome());
      c.send(std::move(w).finish());
      attached = attachOnLoop(record, p, name);
      return;
    }
    // Initiator: Welcome or Abort.
    if (msg.which() == wire::Message::ABORT) {
      auto s = readError(msg.getAbort());
      throw ProtocolError("the peer refused the handshake: " +
                          (s ? s->message() : std::string("(an abort with an unknown code)")));
    }
    if (msg.which() != wire::Message::WELCOME) throw ProtocolError("expected a Welcome, got another message");
    auto welcome = msg.getWelcome();
    Peer& p = *peers_[hs.expectedRank];
    std::string expectedName;
    {
      std::lock_guard<std::mutex> lock(infoMutex_);
      expectedName = p.name;
    }
    if (welcome.getProtocolVersion() != kProtocolVersion ||
        welcome.getWorldSize() != static_cast<uint32_t>(options_.worldSize) ||
        welcome.getRank() != static_cast<uint32_t>(hs.expectedRank) ||
        std::string(welcome.getWorkerName().cStr()) != expectedName) {
      throw InvalidArgumentError("the Welcome does not match: expected '" + expectedName + "' rank " +
                                 std::to_string(hs.expectedRank) + ", got '" + welcome.getWorkerName().cStr() +
                                 "' rank " + std::to_string(welcome.getRank()));
    }
    attached = attachOnLoop(record, p, expectedName);
  });
  } catch (const InvalidArgumentError& e) {
    bad = Status::invalidArgument(e.what());
  }
  if (!bad.ok()) {
    c.fail(bad);  // counted and logged when it closes
    return nullptr;
  }
  return attached;
}

Agent::Impl::Peer* Agent::Impl::attachOnLoop(const std::shared_ptr<Handshake>& record, Peer& p,
                                             const std::string& name) {
  WEFT_DCHECK_ON_LOOP(loop_);
  auto conn = record->conn;
  conn->setLimitsOnLoop(FrameLimits{});
  conn->setDescription("connection with '" + name + "' (rank " + std::to_string(p.rank) + ")");
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    p.conn = conn;
  }
  p.alive = true;
  p.lastPing = Clock::now();
  // The handshake record is no longer needed; the handlers now go to the peer.
  handshakes_.erase(record);
  p.connected.trySetValue();
  return &p;
}

void Agent::Impl::expireHandshakesOnLoop(Clock::time_point now) {
  WEFT_DCHECK_ON_LOOP(loop_);
  std::vector<std::shared_ptr<Handshake>> late;
  for (auto& h : handshakes_) {
    if (h->deadline <= now) late.push_back(h);
  }
  for (auto& h : late) {
    h->conn->fail(Status::protocol("no handshake within " + seconds(kHandshakeTimeout)));
  }
}

}  // namespace weft::rpc
