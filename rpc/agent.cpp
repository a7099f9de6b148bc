#include "rpc/agent.h"

#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>

#include "common/logging.h"
#include "rpc/socket_address.h"
#include "rpc/store.h"
#include "rpc/thread_pool.h"
#include "rpc/transport/connection.h"
#include "rpc/transport/listener.h"
#include "rpc/uv_loop.h"

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
// The loop's housekeeping tick: deadlines, heartbeats, shutdown rounds.
constexpr auto kTick = std::chrono::milliseconds(10);
// A gap between ticks longer than this is a stall of this process (not
// scheduled, stopped) or of its loop thread (AgentStats::longestStall).
constexpr auto kStallThreshold = std::chrono::milliseconds(50);
// How long a worker waits to become idle between shutdown rounds.
constexpr auto kRoundPause = std::chrono::milliseconds(20);
// How long closing connections may take to exchange their ends of stream.
constexpr auto kCloseLinger = std::chrono::seconds(2);

std::string seconds(Clock::duration d) {
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << std::chrono::duration<double>(d).count() << " s";
  return os.str();
}

bool constantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void fillError(wire::ErrorStatus::Builder out, const Status& s) {
  out.setCode(static_cast<wire::StatusCode>(static_cast<uint16_t>(s.code())));
  out.setMessage(s.message());
  out.setWorker(s.worker());
  out.setFunction(s.function());
}

// A Status from a received ErrorStatus; nullopt for a code this build does not know.
std::optional<Status> readError(wire::ErrorStatus::Reader in) {
  auto code = statusCodeFromWire(static_cast<uint32_t>(in.getCode()));
  if (!code || *code == StatusCode::Ok) return std::nullopt;
  return Status(*code, std::string(in.getMessage().cStr()), std::string(in.getWorker().cStr()),
                std::string(in.getFunction().cStr()));
}

}  // namespace

// ---- the agent's state ---------------------------------------------------------------

class Agent::Impl {
 public:
  struct Pending {
    std::unique_ptr<detail::ResponseSink> sink;
    std::string function;
    Clock::time_point started;
    std::multimap<Clock::time_point, uint64_t>::iterator deadline;
    bool hasDeadline = false;
  };

  struct IncomingCall {
    uint64_t callId = 0;
    bool noReply = false;
    const detail::Handler* handler = nullptr;
    int64_t autogradContext = 0;  // the call's distributed autograd context, 0 for none
    std::atomic<bool> cancelled{false};
    std::atomic<bool> finished{false};
  };

  // Everything about one other worker (or this one, through a loopback).
  struct Peer {
    int rank = -1;
    std::string name;      // under Impl::infoMutex_ until start() returns
    std::string address;   // likewise

    std::shared_ptr<Connection> conn;  // set once on the loop thread; read under mutex
    std::atomic<bool> alive{false};
    std::atomic<uint64_t> nextCallId{1};

    std::mutex mutex;
    Status death;  // why the connection ended (under mutex)
    std::unordered_map<uint64_t, Pending> pending;
    std::multimap<Clock::time_point, uint64_t> deadlines;
    std::unordered_map<uint64_t, std::shared_ptr<IncomingCall>> incoming;

    // Loop thread.
    uint64_t pingSequence = 0;
    Clock::time_point lastPing{};
    // The latest Connection::lastHeard() the tick has seen, and Impl::stalled_ then.
    Clock::time_point heardAt{};
    Clock::duration stalledAtHeard{};
    Promise<void> connected;  // completed by the handshake
  };

  // A connection whose handshake has not completed. Loop thread.
  struct Handshake {
    std::shared_ptr<Connection> conn;
    Clock::time_point deadline;
    bool initiator = false;
    int expectedRank = -1;  // initiator: the rank it dialled
  };

  explicit Impl(Options options)
      : options_(std::move(options)), loop_("weft-rpc"),
        pool_("weft-handler", options_.numWorkerThreads) {
    std::random_device rd;
    incarnation_ = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    if (incarnation_ == 0) incarnation_ = 1;
    name_ = options_.workerName();
    for (int r = 0; r < options_.worldSize; ++r) {
      peers_.push_back(std::make_unique<Peer>());
      peers_.back()->rank = r;
    }
    peers_[options_.rank]->name = name_;
  }

  // shutdown() (called by ~Agent) has stopped the pool, the timers and the loop.
  ~Impl() = default;

  // ---- start --------------------------------------------------------------------------

  void start() {
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

  static constexpr const char* kAbortKey = "weft/abort";

  // Between slices of a wait in start(): stops it when the job cannot form (another
  // worker failed to start) or this agent is being shut down.
  void checkStartAborted() {
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

  static constexpr auto kStartSlice = std::chrono::milliseconds(100);

  void startSteps() {
    registry_.freeze();
    logging::setLevel(options_.logLevel);
    logging::setWorkerName(name_);
    const int rank = options_.rank;
    const int world = options_.worldSize;
    auto deadline = options_.storeTimeout.count() == 0 ? Clock::time_point::max() : Clock::now() + options_.storeTimeout;

    const std::string listenHost = options_.listenHost();
    advertisedHost_ = options_.advertisedHost();
    loop_.call([this, &listenHost] {
      listener_ = std::make_unique<transport::Listener>(
          loop_, listenHost, options_.listenPort,
          [this](int fd, std::string who) { onAccepted(fd, std::move(who)); }, &log_);
      startTicking();
      // The loopback connection to this worker itself.
      Peer& self = *peers_[options_.rank];
      self.conn = Connection::loopback(loop_, FrameLimits{}, handlersFor(&self, nullptr), "self");
      self.conn->start();
      self.alive = true;
    });
    auto endpoint = [](const std::string& host, uint16_t port) {
      return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
    };
    listenAddress_ = endpoint(listenHost, listener_->port());
    advertised_ = endpoint(advertisedHost_, listener_->port());

    if (rank == 0) {
      StoreServer::Config sc = StoreServer::configFor(options_);
      storeServer_ = std::make_unique<StoreServer>(sc, &loop_);
    }
    StoreClient::Config cc = StoreClient::configFor(options_);
    if (rank == 0 && options_.masterPort == 0) cc.port = storeServer_->port();
    store_ = std::make_unique<StoreClient>(cc, &loop_);

    // Identity checks: each is a compare-and-set that only the first claimant wins.
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
      std::string missing;
      for (int r = 0; r < world; ++r) {
        if (!store_->check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw TimeoutError("Agent::start: worker '" + name_ + "' waited " + seconds(options_.storeTimeout) +
                         " for ranks " + missing + " to join");
    }
    for (int r = 0; r < world; ++r) {
      std::string v = store_->get(keys[r]);
      auto nl = v.find('\n');
      WEFT_ENFORCE(nl != std::string::npos, ProtocolError, "Agent::start: malformed registration of rank ", r);
      std::lock_guard<std::mutex> lock(infoMutex_);
      peers_[r]->name = v.substr(0, nl);
      peers_[r]->address = v.substr(nl + 1);
    }

    // Connect to every lower rank; the higher ranks connect to us.
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
    // Calls may go out from here on, including from handlers serving a peer that already
    // returned from start(). No worker returns before every worker has reached this point, so
    // none can be called before it is able to call out itself.
    started_ = true;
    try {
      auto left = deadline == Clock::time_point::max() ? std::chrono::hours(24) : remaining(deadline);
      Future<void> all = store_->barrierAsync("weft/started", world, std::max(left, std::chrono::milliseconds(1)));
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
    WEFT_LOG(Info) << "rpc: agent '" << name_ << "' (rank " << rank << " of " << world << ") started on "
                   << listenAddress_;
  }

  static std::chrono::milliseconds remaining(Clock::time_point deadline) {
    if (deadline == Clock::time_point::max()) return std::chrono::milliseconds(0);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  std::string peerLabel(int r) const {
    std::lock_guard<std::mutex> lock(infoMutex_);
    return "'" + peers_[r]->name + "' (rank " + std::to_string(r) + ")";
  }

  void connectTo(int r, Clock::time_point deadline) {
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
      hs->conn->start();
      FrameWriter w(64);
      auto hello = w.message().initHello();
      fillIdentity(hello);
      hello.setAuthToken(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(options_.authToken.data()),
                                             options_.authToken.size()));
      hs->conn->send(std::move(w).finish());
    });
  }

  // This worker's identity, as Hello and Welcome both carry it.
  template <class Builder>
  void fillIdentity(Builder out) const {
    out.setProtocolVersion(kProtocolVersion);
    out.setWorkerName(name_);
    out.setRank(static_cast<uint32_t>(options_.rank));
    out.setWorldSize(static_cast<uint32_t>(options_.worldSize));
    out.setIncarnation(incarnation_);
  }

  // ---- connections ----------------------------------------------------------------------

  Connection::Handlers handlersFor(Peer* peer, std::shared_ptr<Handshake> hs) {
    // The handshake (when any) is held weakly by the handlers: handshakes_ owns it.
    std::weak_ptr<Handshake> weakHs = hs;
    return Connection::Handlers{
        .onFrame = [this, peer, weakHs](Connection& c, IncomingFrame f) mutable {
          if (peer == nullptr) {
            auto h = weakHs.lock();
            if (!h) return;
            Peer* attached = onHandshakeFrame(h, c, std::move(f));
            if (attached != nullptr) peer = attached;
            return;
          }
          onFrame(*peer, c, std::move(f));
        },
        .onClosed = [this, peer, weakHs](Connection& c, const Status& why) mutable {
          if (why.code() == StatusCode::Protocol || why.code() == StatusCode::InvalidArgument) {
            // Hostile or broken input, a failed handshake: one count, one line (a few per
            // address and window, then a summary: a flood of such connections costs no more).
            ++connectionsRejected_;
            WEFT_LOG_LIMITED(log_, Warn, logging::RateLimiter::hostOf(c.remoteAddress()))
                << "rpc: " << c.description() << ": " << why.message() << "; closed it";
          }
          if (auto h = weakHs.lock()) {
            handshakes_.erase(h);
            if (h->initiator && !why.ok()) {
              Peer& p = *peers_[h->expectedRank];
              if (!p.connected.isReady()) {
                p.connected.trySetError(Status(why.code(), "handshake with " + peerLabel(h->expectedRank) +
                                                                " failed: " + why.message()));
              }
            }
          }
          Peer* p = peer != nullptr ? peer : attachedPeer(c);
          if (p != nullptr) onPeerClosed(*p, c, why);
        }};
  }

  Peer* attachedPeer(Connection& c) {
    for (auto& p : peers_) {
      if (p->conn.get() == &c) return p.get();
    }
    return nullptr;
  }

  void onAccepted(int fd, std::string who) {
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
    hs->conn->start();
  }

  // Returns the peer the connection now belongs to, once the handshake completes.
  Peer* onHandshakeFrame(const std::shared_ptr<Handshake>& record, Connection& c, IncomingFrame frame) {
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
        attached = attach(record, p, name);
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
      attached = attach(record, p, expectedName);
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

  Peer* attach(const std::shared_ptr<Handshake>& record, Peer& p, const std::string& name) {
    auto conn = record->conn;
    conn->setLimits(FrameLimits{});
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

  // ---- frames after the handshake -----------------------------------------------------

  void onFrame(Peer& peer, Connection& c, IncomingFrame frame) {
    Status bad = guardRead([&] {
      auto msg = frame.message();
      switch (msg.which()) {
        case wire::Message::CALL:
          onCall(peer, c, std::move(frame));
          return;
        case wire::Message::RESPONSE:
          onResponse(peer, c, frame);
          return;
        case wire::Message::CANCEL:
          onCancel(peer, msg.getCancel().getCallId());
          return;
        case wire::Message::PING: {
          FrameWriter w(16);
          w.message().initPong().setSequence(msg.getPing().getSequence());
          c.send(std::move(w).finish());
          return;
        }
        case wire::Message::PONG:
          return;
        case wire::Message::SHUTDOWN_JOIN: {
          auto j = msg.getShutdownJoin();
          onShutdownJoin(peer, j.getRound(), j.getIdle());
          return;
        }
        case wire::Message::SHUTDOWN_PROCEED: {
          auto p = msg.getShutdownProceed();
          std::vector<std::string> missing;
          for (auto m : p.getMissing()) missing.emplace_back(m.cStr());
          onShutdownProceed(peer, p.getRound(), p.getDone(), std::move(missing));
          return;
        }
        case wire::Message::ABORT: {
          auto s = readError(msg.getAbort());
          Status why = s ? Status::disconnected("'" + peer.name + "' closed the connection: " + s->message())
                         : Status::protocol("'" + peer.name + "' sent an abort with an unknown code");
          c.close(why);
          return;
        }
        case wire::Message::HELLO:
        case wire::Message::WELCOME:
          throw ProtocolError("a second handshake message on an established connection");
      }
      throw ProtocolError("unknown message kind");
    });
    if (!bad.ok()) c.fail(bad);  // counted and logged when it closes
  }

  void sendError(Connection& c, uint64_t callId, const Status& s) {
    FrameWriter w(128);
    auto resp = w.message().initResponse();
    resp.setCallId(callId);
    fillError(resp.initError(), s);
    c.send(std::move(w).finish());
  }

  void onCall(Peer& peer, Connection& c, IncomingFrame frame) {
    auto call = frame.message().getCall();
    uint64_t callId = call.getCallId();
    uint32_t flags = call.getFlags();
    if (callId == 0) throw ProtocolError("a call with id 0");
    if (flags & ~(wire::CALL_FLAG_NO_REPLY | wire::CALL_FLAG_HAS_RREFS)) {
      throw ProtocolError("a call with unknown flags " + std::to_string(flags));
    }
    if (flags & wire::CALL_FLAG_HAS_RREFS) announceIncoming(peer, frame);
    int64_t autogradContext = 0;
    if (call.hasAutograd()) {
      autogradContext = call.getAutograd().getContextId();
      for (auto& [tag, ext] : extensions_) ext->onIncomingAutograd(peer.rank, frame, call.getAutograd(), true);
    }
    bool noReply = (flags & wire::CALL_FLAG_NO_REPLY) != 0;
    std::string name = call.getFunctionName().cStr();
    const detail::Handler* handler = registry_.find(call.getFunctionId());
    if (handler == nullptr || handler->name != name) {
      if (!noReply) {
        sendError(c, callId, Status::notFound("worker '" + name_ + "' has no function '" + name + "'")
                                 .withOrigin(name_, name));
      }
      return;
    }
    auto ic = std::make_shared<IncomingCall>();
    ic->callId = callId;
    ic->noReply = noReply;
    ic->handler = handler;
    ic->autogradContext = autogradContext;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      if (!peer.incoming.emplace(callId, ic).second) {
        throw ProtocolError("call id " + std::to_string(callId) + " is already in use");
      }
    }
    activeIncoming_.fetch_add(1, std::memory_order_relaxed);
    if (handler->runOnLoop) {
      auto shared = std::make_shared<IncomingFrame>(std::move(frame));
      runCall(peer, ic, [&](const CallContext& ctx) { return handler->runOnLoop(ctx, shared); });
      return;
    }
    bool posted = pool_.post([this, &peer, ic, frame = std::move(frame)]() mutable {
      if (ic->cancelled) {
        finishIncoming(peer, *ic);
        return;
      }
      runCall(peer, ic, [&](const CallContext& ctx) {
        auto scope = enterFrameScope(frame);
        DecodeContext dec(frame);
        return ic->handler->run(ctx, frame.message().getCall().getArgs(), dec);
      });
    });
    if (!posted) finishIncoming(peer, *ic);
  }

  // Runs a call's body (body(ctx) returns its result) and replies when the result is ready.
  template <class Body>
  void runCall(Peer& peer, const std::shared_ptr<IncomingCall>& ic, Body&& body) {
    CallContext ctx;
    ctx.callerName = peer.name;
    ctx.callerRank = peer.rank;
    ctx.callId = ic->callId;
    ctx.function = &ic->handler->name;
    Future<HeldValue> result;
    try {
      result = body(ctx);
    } catch (const ProtocolError& e) {
      result = makeErrorFuture<HeldValue>(Status::protocol(e.what()));
    } catch (const kj::Exception& e) {
      result = makeErrorFuture<HeldValue>(
          Status::protocol(ic->handler->name + ": malformed arguments: " + e.getDescription().cStr()));
    } catch (...) {
      result = makeErrorFuture<HeldValue>(std::current_exception());
    }
    result.onComplete([this, &peer, ic](const Future<HeldValue>& f) noexcept { reply(peer, ic, f); });
  }

  // A frame flagged as carrying remote references: the layers take them over first.
  void announceIncoming(Peer& peer, IncomingFrame& frame) {
    for (auto& [tag, ext] : extensions_) ext->onIncomingFrame(peer.rank, frame);
  }

  // Ends an incoming call's bookkeeping; true when it was still in the table (not
  // cancelled, peer alive), i.e. a response should be sent.
  bool finishIncoming(Peer& peer, IncomingCall& ic) {
    bool inTable = false;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      auto it = peer.incoming.find(ic.callId);
      if (it != peer.incoming.end() && it->second.get() == &ic) {
        peer.incoming.erase(it);
        inTable = true;
      }
    }
    if (!ic.finished.exchange(true)) activeIncoming_.fetch_sub(1, std::memory_order_relaxed);
    return inTable;
  }

  void reply(Peer& peer, const std::shared_ptr<IncomingCall>& ic, const Future<HeldValue>& f) {
    bool answer = finishIncoming(peer, *ic) && !ic->noReply && !ic->cancelled;
    if (!answer) return;
    std::shared_ptr<Connection> conn = peer.conn;
    const std::string& function = ic->handler->name;
    std::optional<OutgoingFrame> out;
    std::optional<EncodeContext> enc;  // commits the references the value carries once sent
    std::optional<FrameWriter> w;
    Status error;
    if (!f.hasError()) {
      try {
        w.emplace();
        auto resp = w->message().initResponse();
        resp.setCallId(ic->callId);
        enc.emplace(*w, owner_, peer.rank);
        f.get().encodeInto(*enc, resp.initValue());
        for (auto& [tag, ext] : extensions_) ext->onOutgoingResponse(peer.rank, ic->autogradContext, *enc, resp);
        if (enc->hasRRefs()) resp.setHasRrefs(true);
        out = std::move(*w).finish();
      } catch (...) {
        enc.reset();
        error = statusFromException(std::current_exception());
        error = Status(error.code(), function + ": cannot send the result: " + error.message());
      }
    } else {
      error = f.status();
    }
    if (!out) {
      if (!error.hasOrigin()) error = error.withOrigin(name_, function);
      FrameWriter ew(256);
      auto resp = ew.message().initResponse();
      resp.setCallId(ic->callId);
      fillError(resp.initError(), error);
      out = std::move(ew).finish();
    }
    if (conn->send(std::move(*out))) {
      callsServed_.fetch_add(1, std::memory_order_relaxed);
      if (enc) enc->commit();
    }
  }

  void onCancel(Peer& peer, uint64_t callId) {
    cancelsReceived_.fetch_add(1, std::memory_order_relaxed);
    std::shared_ptr<IncomingCall> ic;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      auto it = peer.incoming.find(callId);
      if (it == peer.incoming.end()) return;  // crossed the response on the wire
      ic = it->second;
      peer.incoming.erase(it);
    }
    ic->cancelled = true;
  }

  void onResponse(Peer& peer, Connection& c, IncomingFrame& frame) {
    auto resp = frame.message().getResponse();
    uint64_t callId = resp.getCallId();
    if (resp.getHasRrefs()) announceIncoming(peer, frame);
    if (resp.hasAutograd()) {
      for (auto& [tag, ext] : extensions_) ext->onIncomingAutograd(peer.rank, frame, resp.getAutograd(), false);
    }
    Pending pending;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      auto it = peer.pending.find(callId);
      if (it == peer.pending.end()) {
        lateResponses_.fetch_add(1, std::memory_order_relaxed);
        WEFT_LOG_LIMITED(log_, Debug, logging::RateLimiter::hostOf(c.remoteAddress()))
            << "rpc: dropped a response from '" << peer.name << "' for call " << callId
            << ", which is no longer pending";
        return;
      }
      pending = std::move(it->second);
      if (pending.hasDeadline) peer.deadlines.erase(pending.deadline);
      peer.pending.erase(it);
    }
    pendingOutgoing_.fetch_sub(1, std::memory_order_relaxed);
    if (resp.which() == wire::Response::VALUE) {
      pending.sink->complete(frame, resp.getValue());
      return;
    }
    if (resp.which() == wire::Response::ERROR) {
      auto s = readError(resp.getError());
      if (s) {
        pending.sink->fail(*s);
        return;
      }
      Status bad = Status::protocol("'" + peer.name + "' answered '" + pending.function +
                                    "' with an error of unknown code");
      pending.sink->fail(bad);
      throw ProtocolError(bad.message());
    }
    Status bad = Status::protocol("'" + peer.name + "' answered '" + pending.function + "' with an unknown kind of response");
    pending.sink->fail(bad);
    throw ProtocolError(bad.message());
  }

  // ---- calls --------------------------------------------------------------------------

  Peer* resolve(const WorkerRef& to) const {
    if (to.byRank()) {
      if (to.rank() < 0 || to.rank() >= options_.worldSize) return nullptr;
      return peers_[to.rank()].get();
    }
    std::lock_guard<std::mutex> lock(infoMutex_);
    for (auto& p : peers_) {
      if (p->name == to.name()) return p.get();
    }
    return nullptr;
  }

  Peer& resolveOrThrow(const WorkerRef& to) const {
    Peer* p = resolve(to);
    if (p == nullptr) {
      throw NotFoundError("rpc: no worker " + to.toString() + " in this job of " +
                          std::to_string(options_.worldSize) + (options_.worldSize == 1 ? " worker" : " workers"));
    }
    return *p;
  }

  bool sendCall(int rank, const std::string& function, uint64_t functionId, const CallOptions& opts,
                FrameWriter& writer, std::unique_ptr<detail::ResponseSink> sink, const std::string& label) {
    try {
      WEFT_ENFORCE(started_.load(), StateError, "rpc: call to '", label, "' before Agent::start()");
      WEFT_ENFORCE(!barrierOver_.load() && (!callsClosed_.load() || opts.duringShutdown), StateError,
                   "rpc: call to '", label, "' after the job ended (every worker called Agent::shutdown()) on worker '",
                   name_, "'");
      Peer& peer = resolveOrThrow(WorkerRef(rank));
      auto timeout = opts.timeout.value_or(options_.rpcTimeout);
      WEFT_ENFORCE(timeout.count() >= 0, InvalidArgumentError, "rpc: negative timeout for a call to '", label, "'");
      uint64_t callId = peer.nextCallId.fetch_add(1, std::memory_order_relaxed);
      auto call = writer.message().getCall();
      call.setCallId(callId);
      call.setFunctionId(functionId);
      call.setFunctionName(function);
      call.setTimeoutMs(static_cast<uint64_t>(timeout.count()));
      OutgoingFrame frame = std::move(writer).finish();
      auto now = Clock::now();
      std::shared_ptr<Connection> conn;
      {
        std::lock_guard<std::mutex> lock(peer.mutex);
        if (!peer.alive.load()) {
          Status d = peer.death.ok() ? Status::disconnected("rpc: worker '" + peer.name + "' is not connected")
                                     : peer.death;
          sink->fail(Status::disconnected("rpc: call to '" + label + "' on worker '" + peer.name +
                                          "' failed: " + d.message()));
          return false;
        }
        Pending& p = peer.pending[callId];
        p.sink = std::move(sink);
        p.function = label;
        p.started = now;
        if (timeout.count() > 0) {
          p.deadline = peer.deadlines.emplace(now + timeout, callId);
          p.hasDeadline = true;
        }
        conn = peer.conn;
      }
      pendingOutgoing_.fetch_add(1, std::memory_order_relaxed);
      callsSent_.fetch_add(1, std::memory_order_relaxed);
      // A closed connection drops the frame; the peer's death (reported on the
      // loop) then fails the pending call.
      return conn->send(std::move(frame));
    } catch (...) {
      if (sink) sink->failWith(std::current_exception());
      return false;
    }
  }

  // ---- failures -------------------------------------------------------------------------

  void onPeerClosed(Peer& peer, Connection& c, const Status& why) {
    if (peer.conn.get() != &c) return;
    std::unordered_map<uint64_t, Pending> pending;
    std::unordered_map<uint64_t, std::shared_ptr<IncomingCall>> incoming;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      if (!peer.alive) return;
      peer.alive = false;
      peer.death = why;
      pending.swap(peer.pending);
      peer.deadlines.clear();
      incoming.swap(peer.incoming);
    }
    for (auto& [id, ic] : incoming) ic->cancelled = true;
    pendingOutgoing_.fetch_sub(pending.size(), std::memory_order_relaxed);
    bool expected = callsClosed_ || closingAll_;
    bool logged = why.code() == StatusCode::Protocol || why.code() == StatusCode::InvalidArgument;  // by onClosed
    if (!expected && (!logged || !pending.empty())) {
      WEFT_LOG(Warn) << "rpc: lost worker '" << peer.name << "' (rank " << peer.rank << "): " << why.message()
                     << (pending.empty() ? "" : "; failing " + std::to_string(pending.size()) + " pending calls");
    }
    Status status = closingAll_ ? Status::cancelled("rpc: agent '" + name_ + "' shut down")
                                : Status::disconnected("rpc: worker '" + peer.name + "' (rank " +
                                                       std::to_string(peer.rank) + ") disconnected: " + why.message());
    for (auto& [id, p] : pending) {
      p.sink->fail(Status(status.code(), status.message() + " (call to '" + p.function + "')"));
    }
    if (!peer.connected.isReady()) peer.connected.trySetError(status);
    if (peer.rank != options_.rank) {
      for (auto& [tag, ext] : extensions_) ext->onPeerFailed(peer.rank, status);
    }
    if (peer.rank != options_.rank) onPeerGone(peer);
  }

  // ---- housekeeping tick ---------------------------------------------------------------

  void startTicking() {
    tick_ = std::make_unique<uv_timer_t>();
    uv_timer_init(loop_.raw(), tick_.get());
    tick_->data = this;
    lastTickAt_ = Clock::now();  // a stall before the first tick is a stall too
    uv_timer_start(tick_.get(), [](uv_timer_t* t) { static_cast<Impl*>(t->data)->onTick(); },
                   kTick.count(), kTick.count());
  }

  void stopTicking() {
    if (!tick_) return;
    uv_timer_stop(tick_.get());
    uv_close(reinterpret_cast<uv_handle_t*>(tick_.release()),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
  }

  void onTick() {
    transport::WriteBatch batch;
    auto now = Clock::now();
    trackStalls(now);
    expireCalls(now);
    if (now - lastHeartbeatCheck_ >= options_.heartbeatInterval / 4) {
      lastHeartbeatCheck_ = now;
      checkHeartbeats(now);
      expireHandshakes(now);
    }
    shutdownTick(now);
    log_.flush();
    for (auto& [tag, ext] : extensions_) ext->onTick();
  }

  void expireCalls(Clock::time_point now) {
    for (auto& pp : peers_) {
      Peer& peer = *pp;
      std::vector<std::pair<uint64_t, Pending>> expired;
      std::shared_ptr<Connection> conn;
      {
        std::lock_guard<std::mutex> lock(peer.mutex);
        while (!peer.deadlines.empty() && peer.deadlines.begin()->first <= now) {
          uint64_t id = peer.deadlines.begin()->second;
          peer.deadlines.erase(peer.deadlines.begin());
          auto it = peer.pending.find(id);
          if (it == peer.pending.end()) continue;
          it->second.hasDeadline = false;
          expired.emplace_back(id, std::move(it->second));
          peer.pending.erase(it);
        }
        conn = peer.conn;
      }
      if (expired.empty()) continue;
      pendingOutgoing_.fetch_sub(expired.size(), std::memory_order_relaxed);
      timeouts_.fetch_add(expired.size(), std::memory_order_relaxed);
      for (auto& [id, p] : expired) {
        if (conn) {
          FrameWriter w(16);
          w.message().initCancel().setCallId(id);
          conn->send(std::move(w).finish());
        }
        p.sink->fail(Status::timeout("rpc: call to '" + p.function + "' on worker '" + peer.name + "' (rank " +
                                     std::to_string(peer.rank) + ") timed out after " + seconds(now - p.started)));
      }
    }
  }

  // Silence is counted only while this loop runs. After a stall (this process
  // was not scheduled or was stopped, or its loop thread was held up) the
  // peers' bytes may be waiting unread, and libuv runs timers before it reads
  // sockets: judged on the time it could not watch, every peer would look
  // silent. So each peer's silence leaves out the stalls since it was last
  // heard: the part of each gap between ticks beyond half a heartbeat interval
  // (a loop that merely runs late on a loaded machine still reads its sockets
  // often enough to judge, and must not slow detection down). Marks are taken
  // before this tick's gap is added, so a stall right after a peer was heard
  // is left out too.
  void trackStalls(Clock::time_point now) {
    for (auto& pp : peers_) {
      Peer& peer = *pp;
      if (!peer.conn || peer.conn->isLoopback()) continue;
      auto heard = peer.conn->lastHeard();
      if (heard > peer.heardAt) {
        peer.heardAt = heard;
        peer.stalledAtHeard = stalled_;
      }
    }
    auto gap = now - lastTickAt_;
    auto tolerated = std::max<Clock::duration>(kStallThreshold, options_.heartbeatInterval / 2);
    if (gap > tolerated) stalled_ += gap - tolerated;
    if (gap > kStallThreshold) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(gap).count();
      if (ms > longestStallMs_.load(std::memory_order_relaxed)) longestStallMs_.store(ms, std::memory_order_relaxed);
    }
    lastTickAt_ = now;
  }

  // How long `peer` has been silent while this loop was running.
  Clock::duration silence(const Peer& peer, Clock::time_point now) const {
    return (now - peer.heardAt) - (stalled_ - peer.stalledAtHeard);
  }

  void checkHeartbeats(Clock::time_point now) {
    for (auto& pp : peers_) {
      Peer& peer = *pp;
      if (!peer.alive || !peer.conn || peer.conn->isLoopback()) continue;
      auto silent = silence(peer, now);
      auto window = options_.heartbeatInterval * options_.heartbeatMisses;
      // Bytes waiting in the socket are word from the peer, read later in this turn of the loop
      // (unless they stay unread: then the window's second round decides).
      if (silent > window && (silent > 2 * window || !peer.conn->hasUnreadBytes())) {
        peer.conn->fail(Status::disconnected("no message from '" + peer.name + "' for " + seconds(silent) +
                                             " (heartbeat)"));
        continue;
      }
      if (silent >= options_.heartbeatInterval && now - peer.lastPing >= options_.heartbeatInterval) {
        peer.lastPing = now;
        FrameWriter w(16);
        w.message().initPing().setSequence(++peer.pingSequence);
        peer.conn->send(std::move(w).finish());
      }
    }
  }

  void expireHandshakes(Clock::time_point now) {
    std::vector<std::shared_ptr<Handshake>> late;
    for (auto& h : handshakes_) {
      if (h->deadline <= now) late.push_back(h);
    }
    for (auto& h : late) {
      h->conn->fail(Status::protocol("no handshake within " + seconds(kHandshakeTimeout)));
    }
  }

  // ---- shutdown -------------------------------------------------------------------------
  //
  // Two stages (rpc/protocol.capnp, "Graceful shutdown"). Round 1, while the job runs: a worker
  // that called shutdown() stays a full member of the job (it serves, its handlers call out, its
  // layers keep their state) and the leader waits, with no deadline, until every worker has
  // joined; a worker gone (its connection failed, or it left a failed barrier) fails the barrier
  // at once on every worker that learns of it. Once all have joined, the job has ended: each
  // shutdown thread tells its layers (onShutdownBegin), and rounds 2, 3, ... drain the calls still
  // in flight, within the shutdown timeout.

  enum class Phase { None, Joining, Ending, Waiting, Closing, Done };

  bool isIdle() const {
    if (pendingOutgoing_.load() != 0 || activeIncoming_.load() != 0) return false;
    for (auto& [tag, ext] : extensions_) {
      if (ext->busy()) return false;
    }
    return true;
  }

  // Loop thread: the connection to `peer` failed, or it left a failed barrier.
  bool gone(const Peer& peer) const { return !peer.alive.load() || departed_.count(peer.rank) != 0; }

  bool anyGone() const {
    for (auto& pp : peers_) {
      if (pp->rank != options_.rank && gone(*pp)) return true;
    }
    return false;
  }

  // Loop thread: the workers this one knows to be gone, each a worker that left a failed barrier
  // replaced by the workers it named.
  std::vector<std::string> goneWorkers() const {
    std::vector<std::string> out;
    for (auto& pp : peers_) {
      if (pp->rank == options_.rank) continue;
      auto it = departed_.find(pp->rank);
      if (it != departed_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
      } else if (!pp->alive) {
        out.push_back(pp->name);
      }
    }
    return out;
  }

  // Round 1 of the barrier: the job is still running.
  bool jobRunning() const { return shutdownPhase_ == Phase::Joining && round_ == 1; }

  // Loop thread.
  void beginShutdown(Clock::duration timeout, Promise<bool> jobEnded, Promise<ShutdownReport> done) {
    shutdownDone_ = std::move(done);
    jobEnded_ = std::move(jobEnded);
    shutdownTimeout_ = timeout;
    round_ = 1;
    if (options_.worldSize == 1) {
      finishShutdown({});
      return;
    }
    if (anyGone()) {
      failBarrier();
      return;
    }
    join();
  }

  void join() {
    shutdownPhase_ = Phase::Joining;
    bool idle = isIdle();
    if (options_.rank == 0) {
      joins_[round_][0] = idle;
      maybeDecide();
      return;
    }
    Peer& leader = *peers_[0];
    if (gone(leader)) {
      finishShutdown(goneWorkers());
      return;
    }
    FrameWriter w(32);
    auto j = w.message().initShutdownJoin();
    j.setRound(round_);
    j.setIdle(idle);
    leader.conn->send(std::move(w).finish());
  }

  void onShutdownJoin(Peer& peer, uint32_t round, bool idle) {
    if (options_.rank != 0) throw ProtocolError("a shutdown join sent to a worker that does not lead shutdown");
    if (round == 0 || round > round_ + 1000) throw ProtocolError("a shutdown join for round " + std::to_string(round));
    joins_[round][peer.rank] = idle;
    maybeDecide();
  }

  // Leader: ends round 1 when every worker has joined (the job has ended), or fails it when one
  // is gone.
  void decideJobEnd() {
    if (anyGone()) {
      failBarrier();
      return;
    }
    auto& joined = joins_[1];
    for (auto& pp : peers_) {
      if (!joined.count(pp->rank)) return;
    }
    for (auto& pp : peers_) {
      if (pp->rank == 0) continue;
      FrameWriter w(64);
      auto p = w.message().initShutdownProceed();
      p.setRound(1);
      p.setDone(false);
      pp->conn->send(std::move(w).finish());
    }
    joins_.erase(1);
    endJob();
  }

  // Every worker has joined: the drain's deadline starts, and the shutdown thread tells the
  // layers before this worker joins round 2 (startDrain).
  void endJob() {
    shutdownPhase_ = Phase::Ending;
    shutdownDeadline_ = Clock::now() + shutdownTimeout_;
    jobEnded_.trySetValue(true);
  }

  void startDrain() {
    if (shutdownPhase_ != Phase::Ending) return;  // the barrier ended meanwhile
    round_ = 2;
    shutdownPhase_ = Phase::Waiting;
    nextJoinAt_ = Clock::now() + kRoundPause;
  }

  void maybeDecide() {
    if (options_.rank != 0 || (shutdownPhase_ != Phase::Joining)) return;
    if (round_ == 1) {
      decideJobEnd();
      return;
    }
    auto& joined = joins_[round_];
    bool timedOut = Clock::now() >= shutdownDeadline_;
    bool all = true;
    bool allIdle = true;
    std::vector<std::string> missing = goneWorkers();
    for (auto& pp : peers_) {
      if (gone(*pp)) continue;
      auto it = joined.find(pp->rank);
      if (it == joined.end()) {
        all = false;
        if (timedOut) missing.push_back(pp->name);
        continue;
      }
      allIdle = allIdle && it->second;
    }
    if (!all && !timedOut) return;
    bool done = timedOut || allIdle;
    for (auto& pp : peers_) {
      if (pp->rank == 0 || gone(*pp) || !joined.count(pp->rank)) continue;
      FrameWriter w(128);
      auto p = w.message().initShutdownProceed();
      p.setRound(round_);
      p.setDone(done);
      auto list = p.initMissing(static_cast<unsigned>(missing.size()));
      for (size_t i = 0; i < missing.size(); ++i) list.set(static_cast<unsigned>(i), missing[i]);
      pp->conn->send(std::move(w).finish());
    }
    if (done) {
      if (timedOut && !allIdle) {
        WEFT_LOG(Warn) << "rpc: the job's calls still in flight did not finish within " << seconds(shutdownTimeout_)
                       << " of the job's end; closing anyway";
      }
      finishShutdown(std::move(missing));
      return;
    }
    joins_.erase(round_);
    ++round_;
    shutdownPhase_ = Phase::Waiting;
    nextJoinAt_ = Clock::now() + kRoundPause;
  }

  void onShutdownProceed(Peer& peer, uint32_t round, bool done, std::vector<std::string> missing) {
    // This worker left already (its own barrier failed while the message was on its way).
    if (round != 0 && (shutdownPhase_ == Phase::Closing || shutdownPhase_ == Phase::Done)) return;
    if (round == 0) {
      // A worker that left a failed barrier, and the workers it found gone.
      if (!done) throw ProtocolError("a shutdown notice of round 0 that is not done");
      missing.erase(std::remove(missing.begin(), missing.end(), name_), missing.end());
      departed_[peer.rank] = std::move(missing);
      onPeerGone(peer);
      return;
    }
    if (peer.rank != 0) throw ProtocolError("a shutdown proceed from a worker that does not lead shutdown");
    if (shutdownPhase_ != Phase::Joining || round != round_) {
      throw ProtocolError("a shutdown proceed for round " + std::to_string(round) + " outside that round");
    }
    if (done) {
      finishShutdown(std::move(missing));
      return;
    }
    if (round == 1) {
      endJob();
      return;
    }
    ++round_;
    shutdownPhase_ = Phase::Waiting;
    nextJoinAt_ = Clock::now() + kRoundPause;
  }

  // Loop thread: `peer` is gone (its connection failed, or it left a failed barrier).
  void onPeerGone(const Peer& peer) {
    if (jobRunning()) {
      if (options_.rank == 0) {
        maybeDecide();
      } else {
        failBarrier();
      }
      return;
    }
    if (shutdownPhase_ == Phase::Joining || shutdownPhase_ == Phase::Ending || shutdownPhase_ == Phase::Waiting) {
      if (options_.rank == 0) {
        maybeDecide();
      } else if (peer.rank == 0) {
        finishShutdown(goneWorkers());
      }
    }
  }

  // Round 1 failed: a worker is gone. Tells every other live worker why this one leaves (they
  // fail their own barrier with it, now or when they join), then closes.
  void failBarrier() {
    std::vector<std::string> missing = goneWorkers();
    for (auto& pp : peers_) {
      if (pp->rank == options_.rank || gone(*pp) || !pp->conn) continue;
      FrameWriter w(128);
      auto p = w.message().initShutdownProceed();
      p.setRound(0);
      p.setDone(true);
      auto list = p.initMissing(static_cast<unsigned>(missing.size()));
      for (size_t i = 0; i < missing.size(); ++i) list.set(static_cast<unsigned>(i), missing[i]);
      pp->conn->send(std::move(w).finish());
    }
    finishShutdown(std::move(missing));
  }

  void shutdownTick(Clock::time_point now) {
    switch (shutdownPhase_) {
      case Phase::Waiting:
        if (isIdle() || now >= nextJoinAt_) join();
        return;
      case Phase::Joining:
        if (round_ == 1) return;  // the job runs: no deadline
        if (options_.rank == 0) {
          if (now >= shutdownDeadline_) maybeDecide();
        } else if (now >= shutdownDeadline_ + std::chrono::seconds(1)) {
          WEFT_LOG(Warn) << "rpc: no word from the shutdown leader '" << peers_[0]->name << "' within "
                         << seconds(shutdownTimeout_) << " of the job's end; closing";
          auto missing = goneWorkers();
          missing.push_back(peers_[0]->name);
          finishShutdown(std::move(missing));
        }
        return;
      case Phase::Closing: {
        bool open = false;
        for (auto& pp : peers_) {
          if (pp->conn && !pp->conn->isLoopback() && !pp->conn->closed()) open = true;
        }
        if (open && now < closeDeadline_) return;
        for (auto& pp : peers_) {
          if (pp->conn && !pp->conn->closed()) pp->conn->close(Status::disconnected("shut down"));
        }
        shutdownPhase_ = Phase::Done;
        shutdownDone_.trySetValue(report_);
        return;
      }
      default:
        return;
    }
  }

  void finishShutdown(std::vector<std::string> missing) {
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    report_.graceful = true;
    report_.missing = std::move(missing);
    if (!report_.missing.empty()) {
      std::string list;
      for (auto& m : report_.missing) list += (list.empty() ? "" : ", ") + m;
      WEFT_LOG(Warn) << "rpc: shut down without hearing from: " << list;
    }
    shutdownPhase_ = Phase::Closing;
    callsClosed_ = true;
    barrierOver_ = true;
    jobEnded_.trySetValue(false);
    closeDeadline_ = Clock::now() + kCloseLinger;
    for (auto& pp : peers_) {
      if (pp->conn) pp->conn->closeGracefully();
    }
  }

  // Loop thread: the non-graceful path.
  void closeAll() {
    closingAll_ = true;
    callsClosed_ = true;
    barrierOver_ = true;
    shutdownPhase_ = Phase::Done;
    for (auto& pp : peers_) {
      if (pp->conn) pp->conn->fail(Status::disconnected("worker '" + name_ + "' shut down"));
    }
    std::vector<std::shared_ptr<Handshake>> hs(handshakes_.begin(), handshakes_.end());
    for (auto& h : hs) h->conn->close(Status::cancelled("shut down"));
  }

  ShutdownReport shutdown(ShutdownOptions opts) {
    std::lock_guard<std::mutex> lock(shutdownMutex_);
    if (finalReport_) return *finalReport_;
    bool begun = false;
    {
      // A start() still running on another thread notices within a slice; a
      // later one fails.
      std::unique_lock<std::mutex> state(stateMutex_);
      shuttingDown_ = true;
      begun = startBegun_;
      startEnded_.wait(state, [&] { return !startActive_; });
    }
    if (!begun) {
      for (auto& [tag, ext] : extensions_) ext->onClosed();
      finalReport_ = ShutdownReport{opts.graceful, {}};
      return *finalReport_;
    }
    ShutdownReport report;
    report.graceful = opts.graceful;
    if (opts.graceful && started_) {
      auto timeout = opts.timeout.value_or(options_.shutdownTimeout);
      Promise<bool> ended;
      Future<bool> jobEnded = ended.getFuture();
      Promise<ShutdownReport> done;
      Future<ShutdownReport> f = done.getFuture();
      loop_.post([this, timeout, ended, done]() mutable { beginShutdown(timeout, std::move(ended), std::move(done)); });
      // No deadline: the loop ends round 1 once every worker has joined, or at once when one is
      // gone (failure detection bounds that).
      if (jobEnded.get()) {
        callsClosed_ = true;
        for (auto& [tag, ext] : extensions_) ext->onShutdownBegin();
        loop_.post([this] { startDrain(); });
      }
      if (f.waitFor(timeout + kCloseLinger + std::chrono::seconds(2))) {
        report = f.get();
      } else {
        WEFT_LOG(Error) << "rpc: graceful shutdown did not complete; closing at once";
        report.missing.push_back("(shutdown barrier incomplete)");
      }
    }
    loop_.call([this] { closeAll(); });
    pool_.stop();
    loop_.call([this] {
      if (listener_) listener_->close();
      stopTicking();
    });
    store_.reset();
    storeServer_.reset();
    loop_.stop();
    for (auto& [tag, ext] : extensions_) ext->onClosed();
    finalReport_ = report;
    return report;
  }

  AgentStats stats() const {
    AgentStats s;
    s.pendingOutgoing = pendingOutgoing_.load();
    s.activeIncoming = activeIncoming_.load();
    s.callsSent = callsSent_.load();
    s.callsServed = callsServed_.load();
    s.timeouts = timeouts_.load();
    s.lateResponses = lateResponses_.load();
    s.cancelsReceived = cancelsReceived_.load();
    s.connectionsRejected = connectionsRejected_.load();
    s.writeSyscalls = counters_.writeSyscalls.load();
    s.framesWritten = counters_.framesWritten.load();
    s.longestStall = std::chrono::milliseconds(longestStallMs_.load());
    for (auto& p : peers_) {
      if (p->rank != options_.rank && p->alive) ++s.liveConnections;
    }
    return s;
  }

  // The lines a peer can repeat at will (connections rejected or refused, late responses), per
  // address: flushed on the tick, declared first so that it outlives every user.
  logging::RateLimiter log_{"rpc"};
  Agent* owner_ = nullptr;
  std::vector<std::pair<const void*, std::shared_ptr<AgentExtension>>> extensions_;  // fixed after construction
  Options options_;
  std::string name_;
  uint64_t incarnation_ = 0;
  Registry registry_;
  UvLoop loop_;
  ThreadPool pool_;
  transport::TransportCounters counters_;

  mutable std::mutex infoMutex_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::map<int, std::string> helloNames_;  // under infoMutex_
  std::string listenAddress_;
  std::string advertisedHost_;
  std::string advertised_;

  std::unique_ptr<transport::Listener> listener_;
  std::unique_ptr<StoreServer> storeServer_;
  std::unique_ptr<StoreClient> store_;
  std::set<std::shared_ptr<Handshake>> handshakes_;  // loop thread
  std::unique_ptr<uv_timer_t> tick_;
  Clock::time_point lastHeartbeatCheck_{};
  Clock::time_point lastTickAt_{};               // loop thread
  Clock::duration stalled_{};                    // loop thread: the stalls so far, summed
  std::atomic<int64_t> longestStallMs_{0};

  std::mutex stateMutex_;
  std::condition_variable startEnded_;
  bool startActive_ = false;  // under stateMutex_
  bool startBegun_ = false;
  std::atomic<bool> started_{false};
  std::atomic<bool> shuttingDown_{false};
  std::atomic<bool> callsClosed_{false};  // the job ended (every worker joined the barrier), or closing
  std::atomic<bool> barrierOver_{false};  // the graceful barrier ended, or closing at once

  // Shutdown (loop thread unless noted).
  std::mutex shutdownMutex_;
  std::optional<ShutdownReport> finalReport_;  // under shutdownMutex_
  Phase shutdownPhase_ = Phase::None;
  bool closingAll_ = false;
  uint32_t round_ = 0;
  std::map<uint32_t, std::map<int, bool>> joins_;
  Clock::time_point shutdownDeadline_{};
  Clock::duration shutdownTimeout_{};
  Clock::time_point nextJoinAt_{};
  Clock::time_point closeDeadline_{};
  ShutdownReport report_;
  Promise<bool> jobEnded_;  // true: every worker joined; false: the barrier ended without that
  Promise<ShutdownReport> shutdownDone_;
  std::map<int, std::vector<std::string>> departed_;  // rank -> the workers it found gone

  std::atomic<size_t> pendingOutgoing_{0};
  std::atomic<size_t> activeIncoming_{0};
  std::atomic<uint64_t> callsSent_{0};
  std::atomic<uint64_t> callsServed_{0};
  std::atomic<uint64_t> timeouts_{0};
  std::atomic<uint64_t> lateResponses_{0};
  std::atomic<uint64_t> cancelsReceived_{0};
  std::atomic<uint64_t> connectionsRejected_{0};
};

// ---- Agent ----------------------------------------------------------------------------

namespace {

struct ExtensionFactories {
  std::mutex mutex;
  std::vector<std::pair<const void*, Agent::ExtensionFactory>> list;
};

ExtensionFactories& extensionFactories() {
  static ExtensionFactories f;
  return f;
}

}  // namespace

bool Agent::installExtension(const void* tag, ExtensionFactory factory) {
  auto& f = extensionFactories();
  std::lock_guard<std::mutex> lock(f.mutex);
  for (auto& [t, fn] : f.list) {
    if (t == tag) return false;
  }
  f.list.emplace_back(tag, factory);
  return true;
}

Agent::Agent(Options options) {
  options.validate();
  impl_ = std::make_unique<Impl>(std::move(options));
  impl_->owner_ = this;
  std::vector<std::pair<const void*, ExtensionFactory>> factories;
  {
    auto& f = extensionFactories();
    std::lock_guard<std::mutex> lock(f.mutex);
    factories = f.list;
  }
  for (auto& [tag, make] : factories) impl_->extensions_.emplace_back(tag, make(*this));
}

AgentExtension* Agent::findExtension(const void* tag) const {
  for (auto& [t, ext] : impl_->extensions_) {
    if (t == tag) return ext.get();
  }
  return nullptr;
}

void Agent::notifyOutgoingCall(int rank, uint64_t functionId, EncodeContext& enc, wire::Call::Builder call) {
  for (auto& [tag, ext] : impl_->extensions_) ext->onOutgoingCall(rank, functionId, enc, call);
}

bool Agent::post(std::function<void()> task) { return impl_->pool_.post(std::move(task)); }

int Agent::rankOf(const WorkerRef& to) const { return impl_->resolveOrThrow(to).rank; }

Agent::~Agent() {
  if (impl_->started_ && !impl_->finalReport_) {
    WEFT_LOG(Warn) << "rpc: agent '" << impl_->name_ << "' destroyed without shutdown(); closing at once";
  }
  impl_->shutdown(ShutdownOptions{.graceful = false, .timeout = std::nullopt});
}

Registry& Agent::registry() { return impl_->registry_; }
const Options& Agent::options() const { return impl_->options_; }
void Agent::start() { impl_->start(); }
bool Agent::started() const { return impl_->started_; }
const std::string& Agent::name() const { return impl_->name_; }
int Agent::rank() const { return impl_->options_.rank; }
int Agent::worldSize() const { return impl_->options_.worldSize; }

std::vector<WorkerInfo> Agent::workers() const {
  WEFT_ENFORCE(impl_->started_.load(), StateError, "Agent::workers: the agent has not started");
  std::vector<WorkerInfo> out;
  std::lock_guard<std::mutex> lock(impl_->infoMutex_);
  for (auto& p : impl_->peers_) out.push_back({p->name, p->rank});
  return out;
}

WorkerInfo Agent::worker(const WorkerRef& to) const {
  auto& p = impl_->resolveOrThrow(to);
  std::lock_guard<std::mutex> lock(impl_->infoMutex_);
  return {p.name, p.rank};
}

bool Agent::isAlive(const WorkerRef& to) const { return impl_->resolveOrThrow(to).alive.load(); }

std::string Agent::listenAddress() const {
  WEFT_ENFORCE(impl_->listener_ != nullptr, StateError, "Agent::listenAddress: the agent has not started");
  return impl_->listenAddress_;
}

uint16_t Agent::listenPort() const {
  WEFT_ENFORCE(impl_->listener_ != nullptr, StateError, "Agent::listenPort: the agent has not started");
  return impl_->listener_->port();
}

ShutdownReport Agent::shutdown(ShutdownOptions opts) { return impl_->shutdown(opts); }
AgentStats Agent::stats() const { return impl_->stats(); }

StoreClient& Agent::store() {
  WEFT_ENFORCE(impl_->store_ != nullptr, StateError, "Agent::store: the agent has not started (or has shut down)");
  return *impl_->store_;
}

UvLoop& Agent::loop() { return impl_->loop_; }

bool Agent::sendCall(int rank, const std::string& function, uint64_t functionId, const CallOptions& opts,
                     FrameWriter& writer, std::unique_ptr<detail::ResponseSink> sink, const std::string& label) {
  return impl_->sendCall(rank, function, functionId, opts, writer, std::move(sink), label);
}

}  // namespace weft::rpc
