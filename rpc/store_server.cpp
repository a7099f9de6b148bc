// StoreServer: the loop-thread state machine behind rpc/store.h.
//
// Tables, all touched only on the loop thread:
//   data_         key -> value
//   connections_  id -> Connection (socket, receive buffer, its waiters); an
//                 entry lives until both of its handles have closed
//   waiters_      id -> Waiter (a Get or Wait not answered yet)
//   watchers_     key -> ids of the waiters that wait for that key, in arrival order
//   deadlines_    (deadline, waiter id), earliest first; one timer serves them all
//   clients_      client id -> its current connection (if any) and the replies
//                 kept to its updates, so that a retried update is answered
//                 from here instead of being applied twice
// A waiter is in watchers_ under exactly the keys in its `watching` list, in
// deadlines_ iff it has a deadline, and in its connection's `waiters` set;
// removeWaiterOnLoop() takes it out of all four at once.
#include <uv.h>

#include <algorithm>
#include <climits>
#include <map>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "common/logging.h"
#include "rpc/socket_address.h"
#include "rpc/store.h"

namespace weft::rpc {

using store::BodyReader;
using store::FrameWriter;
using store::Op;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kListenBacklog = 1024;
// How long close() lets connections finish writing the replies already made.
constexpr std::chrono::milliseconds kCloseFlushTimeout{1000};
// Requested timeouts beyond this count as "no timeout" (and cannot overflow
// the deadline arithmetic).
constexpr uint64_t kMaxTimeoutMs = 365ull * 24 * 3600 * 1000;

bool tokensEqual(std::string_view a, std::string_view b) {
  // Constant time in the token's content, so timing tells nothing about it.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

std::optional<int64_t> parseCounter(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return std::nullopt;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    int digit = s[i] - '0';
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s[0] == '-' ? -digit : digit, &v)) {
      return std::nullopt;
    }
  }
  return v;
}

}  // namespace

class StoreServer::Impl {
 public:
  Impl(UvLoop& loop, const Config& config)
      : loop_(loop), config_(config), limits_(config.limits), serverId_(randomId()) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // ---- lifecycle (loop thread) --------------------------------------------------

  // Binds and listens; returns the bound port. Throws weft::Error.
  uint16_t listenOnLoop(const SocketAddress& address) {
    WEFT_DCHECK_ON_LOOP(loop_);
    uv_loop_t* loop = loop_.raw();
    uv_tcp_init(loop, &listener_);
    listener_.data = this;
    listening_ = true;
    ++openHandles_;
    uv_timer_init(loop, &deadlineTimer_);
    deadlineTimer_.data = this;
    timerOpen_ = true;
    ++openHandles_;
    uv_timer_init(loop, &logTimer_);
    logTimer_.data = this;
    logTimerOpen_ = true;
    ++openHandles_;
    int rc = uv_tcp_bind(&listener_, address.sockaddr(), 0);
    if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), kListenBacklog, &Impl::onConnection);
    WEFT_ENFORCE(rc == 0, Error, "store: cannot listen on ", address.toString(), " (host '", config_.host,
                 "'): ", uv_strerror(rc));
    sockaddr_storage bound{};
    int len = sizeof bound;
    uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &len);
    SocketAddress local = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&bound), len);
    WEFT_LOG(Info) << "store: serving on " << local.toString();
    return local.port();
  }

  // Stops listening and closes every connection: at once when it has no reply
  // in flight, else once its replies are written (or kCloseFlushTimeout has
  // passed); requests still waiting are dropped unanswered. `done` completes
  // once every handle is closed.
  void beginCloseOnLoop(Promise<void> done) {
    WEFT_DCHECK_ON_LOOP(loop_);
    closeWaiters_.push_back(std::move(done));
    if (!closing_) {
      closing_ = true;
      if (listening_) uv_close(reinterpret_cast<uv_handle_t*>(&listener_), &Impl::onServerHandleClosed);
      if (logTimerOpen_) {
        logTimerOpen_ = false;
        uv_close(reinterpret_cast<uv_handle_t*>(&logTimer_), &Impl::onServerHandleClosed);
      }
      for (auto& [id, conn] : connections_) {
        Connection& c = *conn;
        if (c.closing) continue;
        if (c.pendingWrites == 0) {
          closeConnectionOnLoop(c);
          continue;
        }
        std::vector<uint64_t> ids(c.waiters.begin(), c.waiters.end());
        for (uint64_t w : ids) removeWaiterOnLoop(w);
        uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
        c.closeAfterWrites = true;
      }
      if (timerOpen_) {
        uv_timer_start(&deadlineTimer_, &Impl::onCloseFlushTimeout, static_cast<uint64_t>(kCloseFlushTimeout.count()),
                       0);
      }
    }
    maybeFinishCloseOnLoop();
  }

  Stats statsOnLoop() const {
    WEFT_DCHECK_ON_LOOP(loop_);
    Stats s;
    s.connections = connections_.size();
    s.keys = data_.size();
    s.waiters = waiters_.size();
    s.storedBytes = storedBytes_;
    s.droppedConnections = droppedConnections_;
    s.knownClients = clients_.size();
    s.keptReplies = keptReplies_;
    return s;
  }

 private:
  struct Connection {
    Impl* server = nullptr;
    uint64_t id = 0;
    uv_tcp_t tcp{};
    uv_timer_t timer{};  // the Hello deadline, then the deadline of a partly received frame
    std::string peer = "?";
    store::FrameBuffer in{0};
    bool authenticated = false;
    uint64_t clientId = 0;  // valid once authenticated
    bool closing = false;
    bool closeAfterWrites = false;
    int pendingWrites = 0;
    int openHandles = 2;
    std::unordered_set<uint64_t> waiters;
  };

  struct Waiter {
    Connection* conn = nullptr;
    uint64_t requestId = 0;
    Op op = Op::Get;
    std::vector<std::string> keys;      // distinct; for Get the one key
    std::vector<std::string> watching;  // the keys it is registered under in watchers_
    std::chrono::milliseconds timeout{0};
    std::optional<Clock::time_point> deadline;
  };

  struct WriteRequest {
    uv_write_t req{};
    Connection* conn = nullptr;
    std::string bytes;
  };

  // What the server remembers of a client between its connections.
  struct Client {
    Connection* conn = nullptr;                // the current one, if any
    std::map<uint64_t, std::string> replies;  // request id -> reply frame, of updates
    uint64_t replyBytes = 0;
    Clock::time_point disconnectedAt{};
    bool warnedForgetting = false;
  };

  static uint64_t randomId() {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  }

  static Impl* self(uv_handle_t* h) { return static_cast<Impl*>(h->data); }
  static Connection* connection(uv_handle_t* h) { return static_cast<Connection*>(h->data); }

  static void onServerHandleClosed(uv_handle_t* h) {
    Impl* s = self(h);
    --s->openHandles_;
    s->maybeFinishCloseOnLoop();
  }

  static void onCloseFlushTimeout(uv_timer_t* t) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(t));
    for (auto& [id, conn] : s->connections_) s->closeConnectionOnLoop(*conn);
  }

  void maybeFinishCloseOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (!closing_) return;
    if (connections_.empty() && timerOpen_) {
      timerOpen_ = false;
      uv_close(reinterpret_cast<uv_handle_t*>(&deadlineTimer_), &Impl::onServerHandleClosed);
    }
    if (openHandles_ > 0 || !connections_.empty()) return;
    std::vector<Promise<void>> waiters;
    waiters.swap(closeWaiters_);
    for (Promise<void>& p : waiters) p.setValue();
  }

  // ---- connections ------------------------------------------------------------------

  static void onConnection(uv_stream_t* listener, int status) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(listener));
    if (status < 0) {
      // Under a flood (out of file descriptors) this repeats.
      WEFT_LOG_LIMITED(s->log_, Warn, "the listener") << "store: accepting a connection failed: "
                                                      << uv_strerror(status);
      s->armLogFlushOnLoop();
      return;
    }
    s->acceptOnLoop();
  }

  void acceptOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (closing_) return;
    auto owned = std::make_unique<Connection>();
    Connection& c = *owned;
    c.server = this;
    c.id = nextConnectionId_++;
    c.in.setMaxBody(limits_.maxRequestBody());
    uv_tcp_init(loop_.raw(), &c.tcp);
    c.tcp.data = &c;
    uv_timer_init(loop_.raw(), &c.timer);
    c.timer.data = &c;
    connections_.emplace(c.id, std::move(owned));
    int rc = uv_accept(reinterpret_cast<uv_stream_t*>(&listener_), reinterpret_cast<uv_stream_t*>(&c.tcp));
    if (rc < 0) {
      WEFT_LOG(Debug) << "store: accept failed: " << uv_strerror(rc);
      closeConnectionOnLoop(c);
      return;
    }
    sockaddr_storage peer{};
    int len = sizeof peer;
    if (uv_tcp_getpeername(&c.tcp, reinterpret_cast<sockaddr*>(&peer), &len) == 0) {
      c.peer = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&peer), len).toString();
    }
    if (connections_.size() > limits_.maxConnections) {
      ++droppedConnections_;
      ++refusedSinceLimit_;
      if (!overConnectionLimit_) {
        overConnectionLimit_ = true;
        WEFT_LOG(Warn) << "store: " << limits_.maxConnections
                       << " connections are open, the limit; closing new ones at once (first: " << c.peer << ")";
      }
      closeConnectionOnLoop(c);
      return;
    }
    uv_tcp_nodelay(&c.tcp, 1);
    uv_os_fd_t fd;
    if (uv_fileno(reinterpret_cast<uv_handle_t*>(&c.tcp), &fd) == 0) detectDeadPeers(fd);
    uv_timer_start(&c.timer, &Impl::onConnectionTimer, static_cast<uint64_t>(limits_.helloTimeout.count()), 0);
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c.tcp), &Impl::onAlloc, &Impl::onRead);
  }

  // Logs why (one line, a few per address and window: see log_) and closes.
  void dropOnLoop(Connection& c, const std::string& reason) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (c.closing) return;
    ++droppedConnections_;
    WEFT_LOG_LIMITED(log_, Warn, logging::RateLimiter::hostOf(c.peer))
        << "store: closing the connection from " << c.peer << ": " << reason;
    armLogFlushOnLoop();
    closeConnectionOnLoop(c);
  }

  // Makes sure the summary of the lines log_ holds back is written when its window ends.
  void armLogFlushOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (!logTimerOpen_ || uv_is_active(reinterpret_cast<uv_handle_t*>(&logTimer_))) return;
    Clock::time_point due = log_.nextDue();
    if (due == Clock::time_point::max()) return;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(due - Clock::now()).count();
    uv_timer_start(&logTimer_, &Impl::onLogTimer, static_cast<uint64_t>(std::max<int64_t>(ms, 0)) + 1, 0);
  }

  static void onLogTimer(uv_timer_t* t) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(t));
    s->log_.flush();
    s->armLogFlushOnLoop();
  }

  void closeConnectionOnLoop(Connection& c) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (c.closing) return;
    c.closing = true;
    if (c.authenticated) {
      auto it = clients_.find(c.clientId);
      if (it != clients_.end() && it->second.conn == &c) {
        it->second.conn = nullptr;
        it->second.disconnectedAt = Clock::now();
      }
    }
    std::vector<uint64_t> ids(c.waiters.begin(), c.waiters.end());
    for (uint64_t id : ids) removeWaiterOnLoop(id);
    uv_close(reinterpret_cast<uv_handle_t*>(&c.tcp), &Impl::onConnectionHandleClosed);
    uv_close(reinterpret_cast<uv_handle_t*>(&c.timer), &Impl::onConnectionHandleClosed);
  }

  static void onConnectionHandleClosed(uv_handle_t* h) {
    Connection* c = connection(h);
    if (--c->openHandles > 0) return;
    Impl* s = c->server;
    s->connections_.erase(c->id);  // frees c
    if (s->overConnectionLimit_ && s->connections_.size() < s->limits_.maxConnections) {
      s->overConnectionLimit_ = false;
      WEFT_LOG(Warn) << "store: below the connection limit again; " << s->refusedSinceLimit_
                     << " connection(s) were refused meanwhile";
      s->refusedSinceLimit_ = 0;
    }
    s->maybeFinishCloseOnLoop();
  }

  static void onConnectionTimer(uv_timer_t* t) {
    Connection* c = connection(reinterpret_cast<uv_handle_t*>(t));
    const store::Limits& limits = c->server->limits_;
    c->server->dropOnLoop(*c, c->authenticated
                            ? "a request stayed incomplete for " + store::describeDuration(limits.frameTimeout)
                            : "no hello within " + store::describeDuration(limits.helloTimeout));
  }

  static void onAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
    size_t size = 0;
    char* space = connection(h)->in.readSpace(&size);
    *buf = uv_buf_init(space, static_cast<unsigned>(std::min<size_t>(size, UINT_MAX)));
  }

  static void onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t*) {
    Connection* c = connection(reinterpret_cast<uv_handle_t*>(stream));
    Impl* s = c->server;
    if (nread < 0) {
      if (nread != UV_EOF) {
        WEFT_LOG_LIMITED(s->log_, Debug, logging::RateLimiter::hostOf(c->peer))
            << "store: connection from " << c->peer << " failed: " << uv_strerror(static_cast<int>(nread));
        s->armLogFlushOnLoop();
      }
      s->closeConnectionOnLoop(*c);
      return;
    }
    if (nread == 0 || c->closing) return;
    c->in.commit(static_cast<size_t>(nread));
    s->processInputOnLoop(*c);
  }

  void processInputOnLoop(Connection& c) {
    WEFT_DCHECK_ON_LOOP(loop_);
    bool progressed = false;
    try {
      std::string_view body;
      while (!c.closing && !c.closeAfterWrites && c.in.next(&body)) {
        handleRequestOnLoop(c, body);
        progressed = true;
      }
    } catch (const ProtocolError& e) {
      dropOnLoop(c, e.what());
      return;
    }
    if (c.closing || c.closeAfterWrites) return;
    c.in.compact();
    if (!c.authenticated) return;  // the Hello deadline keeps running
    if (!c.in.hasPartialFrame()) {
      uv_timer_stop(&c.timer);
    } else if (progressed || !uv_is_active(reinterpret_cast<uv_handle_t*>(&c.timer))) {
      uv_timer_start(&c.timer, &Impl::onConnectionTimer, static_cast<uint64_t>(limits_.frameTimeout.count()), 0);
    }
  }

  // ---- replies ----------------------------------------------------------------------

  void sendOnLoop(Connection& c, std::string bytes) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (c.closing) return;
    auto* w = new WriteRequest;
    w->conn = &c;
    w->bytes = std::move(bytes);
    w->req.data = w;
    uv_buf_t buf = uv_buf_init(w->bytes.data(), static_cast<unsigned>(w->bytes.size()));
    int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c.tcp), &buf, 1, &Impl::onWritten);
    if (rc < 0) {
      delete w;
      WEFT_LOG_LIMITED(log_, Debug, logging::RateLimiter::hostOf(c.peer))
          << "store: writing to " << c.peer << " failed: " << uv_strerror(rc);
      armLogFlushOnLoop();
      closeConnectionOnLoop(c);
      return;
    }
    ++c.pendingWrites;
    size_t backlog = uv_stream_get_write_queue_size(reinterpret_cast<uv_stream_t*>(&c.tcp));
    if (backlog > limits_.maxWriteBacklogBytes) {
      dropOnLoop(c, "it does not read its replies (" + std::to_string(backlog) + " bytes queued)");
    }
  }

  static void onWritten(uv_write_t* req, int status) {
    std::unique_ptr<WriteRequest> w(static_cast<WriteRequest*>(req->data));
    Connection& c = *w->conn;
    --c.pendingWrites;
    if (c.closing) return;
    if (status < 0) {
      WEFT_LOG_LIMITED(c.server->log_, Debug, logging::RateLimiter::hostOf(c.peer))
          << "store: writing to " << c.peer << " failed: " << uv_strerror(status);
      c.server->armLogFlushOnLoop();
      c.server->closeConnectionOnLoop(c);
    } else if (c.closeAfterWrites && c.pendingWrites == 0) {
      c.server->closeConnectionOnLoop(c);
    }
  }

  void replyOkOnLoop(Connection& c, uint64_t id) {
    WEFT_DCHECK_ON_LOOP(loop_);
    sendOnLoop(c, FrameWriter(id, 0).finish());
  }

  static std::string errorFrame(uint64_t id, const Status& s) {
    std::string_view message = s.message();
    if (message.size() > store::kMaxMessageBytes) message = message.substr(0, store::kMaxMessageBytes);
    return FrameWriter(id, static_cast<uint8_t>(s.code())).str(message).finish();
  }

  void replyErrorOnLoop(Connection& c, uint64_t id, const Status& s) {
    WEFT_DCHECK_ON_LOOP(loop_);
    sendOnLoop(c, errorFrame(id, s));
  }

  // ---- requests ---------------------------------------------------------------------

  void handleRequestOnLoop(Connection& c, std::string_view body) {
    WEFT_DCHECK_ON_LOOP(loop_);
    BodyReader r(body.data(), body.size());
    uint64_t id = r.u64("request id");
    uint8_t rawOp = r.u8("op");
    WEFT_ENFORCE(c.authenticated || rawOp == static_cast<uint8_t>(Op::Hello), ProtocolError, "store: a ",
                 store::opName(rawOp), " request before the hello");
    switch (static_cast<Op>(rawOp)) {
      case Op::Hello: return handleHelloOnLoop(c, id, r);
      case Op::Set: return handleUpdateOnLoop(c, id, Op::Set, r);
      case Op::Get: return handleGetOnLoop(c, id, r);
      case Op::Wait: return handleWaitOnLoop(c, id, r);
      case Op::Check: return handleCheckOnLoop(c, id, r);
      case Op::Add: return handleUpdateOnLoop(c, id, Op::Add, r);
      case Op::CompareSet: return handleUpdateOnLoop(c, id, Op::CompareSet, r);
      case Op::Delete: return handleUpdateOnLoop(c, id, Op::Delete, r);
      case Op::NumKeys: return handleNumKeysOnLoop(c, id, r);
    }
    throw ProtocolError("store: unknown op " + std::to_string(rawOp));
  }

  std::string_view readKey(BodyReader& r) { return r.str("key", limits_.maxKeyBytes); }
  std::string_view readValue(BodyReader& r, const char* field) { return r.str(field, limits_.maxValueBytes); }
  std::chrono::milliseconds readTimeout(BodyReader& r) {
    uint64_t ms = r.u64("timeout");
    return std::chrono::milliseconds(ms > kMaxTimeoutMs ? 0 : static_cast<int64_t>(ms));
  }
  // An empty key is refused with an error reply (a client mistake, not hostile).
  static Status emptyKey(Op op) {
    return Status::invalidArgument("store: " + store::opName(static_cast<uint8_t>(op)) + " with an empty key");
  }
  bool refuseEmptyKeyOnLoop(Connection& c, uint64_t id, std::string_view key, Op op) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (!key.empty()) return false;
    replyErrorOnLoop(c, id, emptyKey(op));
    return true;
  }

  void handleHelloOnLoop(Connection& c, uint64_t id, BodyReader& r) {
    WEFT_DCHECK_ON_LOOP(loop_);
    WEFT_ENFORCE(!c.authenticated, ProtocolError, "store: a second hello on one connection");
    uint32_t magic = r.u32("magic");
    WEFT_ENFORCE(magic == store::kMagic, ProtocolError, "store: not a weft store client (hello magic ", magic, ")");
    uint16_t version = r.u16("version");
    std::string refusal;
    uint64_t clientId = 0;
    if (version != store::kVersion) {
      // The rest of another version's hello may be laid out differently.
      refusal = "the client speaks store protocol version " + std::to_string(version) + ", this server version " +
                std::to_string(store::kVersion);
    } else {
      std::string_view token = r.str("token", limits_.maxTokenBytes);
      clientId = r.u64("client id");
      r.expectEnd("hello");
      if (!config_.token.empty() && !tokensEqual(token, config_.token)) {
        refusal = token.empty() ? "authentication failed: the client sent no token and the server requires one "
                                  "(WEFT_RPC_TOKEN)"
                                : "authentication failed: the client's token differs from the server's (WEFT_RPC_TOKEN)";
      }
    }
    if (!refusal.empty()) {
      ++droppedConnections_;
      WEFT_LOG_LIMITED(log_, Warn, logging::RateLimiter::hostOf(c.peer))
          << "store: refusing the connection from " << c.peer << ": " << refusal;
      armLogFlushOnLoop();
      uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.tcp));
      replyErrorOnLoop(c, id, Status::protocol(refusal));
      c.closeAfterWrites = true;
      if (c.pendingWrites == 0) closeConnectionOnLoop(c);
      return;
    }
    c.authenticated = true;
    c.clientId = clientId;
    uv_timer_stop(&c.timer);
    auto known = clients_.find(clientId);
    if (known == clients_.end()) {
      forgetClientsBeyondLimitOnLoop();
      known = clients_.emplace(clientId, Client{}).first;
    } else if (known->second.conn != nullptr) {
      // The client reconnected while its old connection still looks open
      // here (a partition hides a lost connection for a while): that one is
      // dead to the client, which sends its waiting requests again.
      Connection& old = *known->second.conn;
      WEFT_LOG(Info) << "store: a client reconnected from " << c.peer << "; closing its previous connection from "
                     << old.peer;
      closeConnectionOnLoop(old);
    }
    known->second.conn = &c;
    sendOnLoop(c, FrameWriter(id, 0)
                .u32(limits_.maxKeyBytes)
                .u32(limits_.maxValueBytes)
                .u32(limits_.maxKeysPerRequest)
                .u64(serverId_)
                .finish());
  }

  // Makes room for one more client record by forgetting the clients
  // disconnected longest (connected ones are bounded by maxConnections).
  void forgetClientsBeyondLimitOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    while (clients_.size() >= limits_.maxKnownClients) {
      auto oldest = clients_.end();
      for (auto it = clients_.begin(); it != clients_.end(); ++it) {
        if (it->second.conn != nullptr) continue;
        if (oldest == clients_.end() || it->second.disconnectedAt < oldest->second.disconnectedAt) oldest = it;
      }
      if (oldest == clients_.end()) return;
      keptReplies_ -= oldest->second.replies.size();
      clients_.erase(oldest);
    }
  }

  // ---- updates: applied at most once per (client, request id) ----------------------------

  void handleUpdateOnLoop(Connection& c, uint64_t id, Op op, BodyReader& r) {
    WEFT_DCHECK_ON_LOOP(loop_);
    // The whole request is read (and checked) before anything is applied.
    std::string key(readKey(r));
    std::string value;     // Set: the value; CompareSet: the desired value
    std::string expected;  // CompareSet
    int64_t delta = 0;     // Add
    if (op == Op::Set) {
      value = readValue(r, "value");
    } else if (op == Op::Add) {
      delta = r.i64("delta");
    } else if (op == Op::CompareSet) {
      expected = readValue(r, "expected value");
      value = readValue(r, "desired value");
    }
    uint64_t settled = r.u64("settled");
    r.expectEnd(store::opName(static_cast<uint8_t>(op)).c_str());

    // The record of a connected client is never forgotten; emplace only
    // guards the invariant.
    Client& client = clients_.try_emplace(c.clientId).first->second;
    forgetSettledOnLoop(client, settled);
    auto kept = client.replies.find(id);
    if (kept != client.replies.end()) {
      WEFT_LOG(Debug) << "store: answering a repeated " << store::opName(static_cast<uint8_t>(op)) << " (request "
                      << id << ") from " << c.peer << " with the reply already made";
      return sendOnLoop(c, kept->second);
    }
    std::string reply;
    switch (op) {
      case Op::Set: reply = applySetOnLoop(id, key, value); break;
      case Op::Add: reply = applyAddOnLoop(id, key, delta); break;
      case Op::CompareSet: reply = applyCompareSetOnLoop(id, key, expected, value); break;
      default: reply = applyDeleteOnLoop(id, key); break;
    }
    keepReplyOnLoop(client, id, reply, c.peer);
    sendOnLoop(c, std::move(reply));
  }

  void forgetSettledOnLoop(Client& client, uint64_t settled) {
    WEFT_DCHECK_ON_LOOP(loop_);
    auto end = client.replies.lower_bound(settled);
    for (auto it = client.replies.begin(); it != end; ++it) {
      client.replyBytes -= it->second.size();
      --keptReplies_;
    }
    client.replies.erase(client.replies.begin(), end);
  }

  void keepReplyOnLoop(Client& client, uint64_t id, const std::string& reply, const std::string& peer) {
    WEFT_DCHECK_ON_LOOP(loop_);
    client.replies.emplace(id, reply);
    client.replyBytes += reply.size();
    ++keptReplies_;
    while (client.replies.size() > 1 && (client.replies.size() > limits_.maxKeptRepliesPerClient ||
                                          client.replyBytes > limits_.maxKeptReplyBytesPerClient)) {
      if (!client.warnedForgetting) {
        client.warnedForgetting = true;
        WEFT_LOG(Warn) << "store: the client at " << peer << " has more unsettled updates than the server keeps ("
                       << limits_.maxKeptRepliesPerClient << " replies or " << limits_.maxKeptReplyBytesPerClient
                       << " bytes); the oldest would be applied again if retried";
      }
      auto oldest = client.replies.begin();
      client.replyBytes -= oldest->second.size();
      --keptReplies_;
      client.replies.erase(oldest);
    }
  }

  void handleGetOnLoop(Connection& c, uint64_t id, BodyReader& r) {
    WEFT_DCHECK_ON_LOOP(loop_);
    std::string_view key = readKey(r);
    std::chrono::milliseconds timeout = readTimeout(r);
    r.expectEnd("get");
    if (refuseEmptyKeyOnLoop(c, id, key, Op::Get)) return;
    auto it = data_.find(std::string(key));
    if (it != data_.end()) return sendOnLoop(c, FrameWriter(id, 0).str(it->second).finish());
    addWaiterOnLoop(c, id, Op::Get, {std::string(key)}, timeout);
  }

  void handleWaitOnLoop(Connection& c, uint64_t id, BodyReader& r) {
    WEFT_DCHECK_ON_LOOP(loop_);
    std::vector<std::string> keys = r.keys(limits_.maxKeysPerRequest, limits_.maxKeyBytes);
    std::chrono::milliseconds timeout = readTimeout(r);
    r.expectEnd("wait");
    for (const std::string& k : keys) {
      if (refuseEmptyKeyOnLoop(c, id, k, Op::Wait)) return;
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    bool all = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
    if (all) return replyOkOnLoop(c, id);
    addWaiterOnLoop(c, id, Op::Wait, std::move(keys), timeout);
  }

  void handleCheckOnLoop(Connection& c, uint64_t id, BodyReader& r) {
    WEFT_DCHECK_ON_LOOP(loop_);
    std::vector<std::string> keys = r.keys(limits_.maxKeysPerRequest, limits_.maxKeyBytes);
    r.expectEnd("check");
    bool all = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
    sendOnLoop(c, FrameWriter(id, 0).u8(all ? 1 : 0).finish());
  }

  // The apply* functions change the store and return the reply frame.
  std::string applySetOnLoop(uint64_t id, const std::string& key, std::string_view value) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (key.empty()) return errorFrame(id, emptyKey(Op::Set));
    Status s = storeValueOnLoop(key, value);
    if (!s.ok()) return errorFrame(id, s);
    return FrameWriter(id, 0).finish();
  }

  std::string applyAddOnLoop(uint64_t id, const std::string& key, int64_t delta) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (key.empty()) return errorFrame(id, emptyKey(Op::Add));
    int64_t current = 0;
    auto it = data_.find(key);
    if (it != data_.end()) {
      std::optional<int64_t> parsed = parseCounter(it->second);
      if (!parsed) {
        return errorFrame(id, Status::invalidArgument("store: add(" + store::describeKey(key) +
                                                      "): the stored value is not a decimal integer"));
      }
      current = *parsed;
    }
    int64_t sum = 0;
    if (__builtin_add_overflow(current, delta, &sum)) {
      return errorFrame(id, Status::invalidArgument("store: add(" + store::describeKey(key) + ", " +
                                                    std::to_string(delta) + ") overflows " +
                                                    std::to_string(current)));
    }
    Status s = storeValueOnLoop(key, std::to_string(sum));
    if (!s.ok()) return errorFrame(id, s);
    return FrameWriter(id, 0).i64(sum).finish();
  }

  std::string applyCompareSetOnLoop(uint64_t id, const std::string& key, std::string_view expected,
                              std::string_view desired) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (key.empty()) return errorFrame(id, emptyKey(Op::CompareSet));
    auto it = data_.find(key);
    bool swap = it == data_.end() ? expected.empty() : it->second == expected;
    if (!swap) {
      std::string_view current = it == data_.end() ? expected : std::string_view(it->second);
      return FrameWriter(id, 0).str(current).finish();
    }
    Status s = storeValueOnLoop(key, desired);
    if (!s.ok()) return errorFrame(id, s);
    return FrameWriter(id, 0).str(desired).finish();
  }

  std::string applyDeleteOnLoop(uint64_t id, const std::string& key) {
    WEFT_DCHECK_ON_LOOP(loop_);
    auto it = data_.find(key);
    bool existed = it != data_.end();
    if (existed) {
      storedBytes_ -= it->first.size() + it->second.size();
      data_.erase(it);
    }
    return FrameWriter(id, 0).u8(existed ? 1 : 0).finish();
  }

  void handleNumKeysOnLoop(Connection& c, uint64_t id, BodyReader& r) {
    WEFT_DCHECK_ON_LOOP(loop_);
    r.expectEnd("numKeys");
    sendOnLoop(c, FrameWriter(id, 0).i64(static_cast<int64_t>(data_.size())).finish());
  }

  // Stores value under key within maxStoredBytes, then wakes the key's waiters.
  Status storeValueOnLoop(const std::string& key, std::string_view value) {
    WEFT_DCHECK_ON_LOOP(loop_);
    auto it = data_.find(key);
    uint64_t before = it == data_.end() ? 0 : key.size() + it->second.size();
    uint64_t after = key.size() + value.size();
    if (storedBytes_ - before + after > limits_.maxStoredBytes) {
      return Status::invalidArgument("store: no room for " + std::to_string(value.size()) + " bytes under " +
                                     store::describeKey(key) + ": " + std::to_string(storedBytes_) + " of " +
                                     std::to_string(limits_.maxStoredBytes) + " bytes are in use");
    }
    storedBytes_ = storedBytes_ - before + after;
    if (it == data_.end()) {
      data_.emplace(key, std::string(value));
    } else {
      it->second.assign(value.data(), value.size());
    }
    notifyOnLoop(key);
    return Status();
  }

  // ---- waiters ----------------------------------------------------------------------

  void addWaiterOnLoop(Connection& c, uint64_t requestId, Op op, std::vector<std::string> keys,
                 std::chrono::milliseconds timeout) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (c.waiters.size() >= limits_.maxWaitersPerConnection) {
      return replyErrorOnLoop(c, requestId,
                        Status::invalidArgument("store: " + std::to_string(c.waiters.size()) +
                                                " requests of this connection are waiting already, the limit"));
    }
    uint64_t id = nextWaiterId_++;
    Waiter& w = waiters_[id];
    w.conn = &c;
    w.requestId = requestId;
    w.op = op;
    w.keys = std::move(keys);
    w.timeout = timeout;
    c.waiters.insert(id);
    watchMissingOnLoop(id, w);
    if (timeout.count() > 0) {
      w.deadline = Clock::now() + timeout;
      deadlines_.emplace(*w.deadline, id);
      armDeadlineTimerOnLoop();
    }
  }

  // Registers w under each of its keys that does not exist; returns how many.
  size_t watchMissingOnLoop(uint64_t id, Waiter& w) {
    WEFT_DCHECK_ON_LOOP(loop_);
    for (const std::string& k : w.keys) {
      if (data_.count(k)) continue;
      watchers_[k].push_back(id);
      w.watching.push_back(k);
    }
    return w.watching.size();
  }

  // key now exists: waiters that have seen all their keys set are answered if
  // all of them still exist (a wait needs them at the same time), re-registered
  // under the missing ones otherwise.
  void notifyOnLoop(const std::string& key) {
    WEFT_DCHECK_ON_LOOP(loop_);
    auto it = watchers_.find(key);
    if (it == watchers_.end()) return;
    std::vector<uint64_t> ids = std::move(it->second);
    watchers_.erase(it);
    for (uint64_t id : ids) {
      auto wit = waiters_.find(id);
      if (wit == waiters_.end()) continue;
      Waiter& w = wit->second;
      w.watching.erase(std::find(w.watching.begin(), w.watching.end(), key));
      if (!w.watching.empty() || watchMissingOnLoop(id, w) > 0) continue;
      Connection& c = *w.conn;
      if (w.op == Op::Get) {
        sendOnLoop(c, FrameWriter(w.requestId, 0).str(data_.at(w.keys[0])).finish());
      } else {
        replyOkOnLoop(c, w.requestId);
      }
      removeWaiterOnLoop(id);
    }
  }

  void removeWaiterOnLoop(uint64_t id) {
    WEFT_DCHECK_ON_LOOP(loop_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    Waiter& w = it->second;
    for (const std::string& k : w.watching) {
      auto wit = watchers_.find(k);
      if (wit == watchers_.end()) continue;
      std::vector<uint64_t>& ids = wit->second;
      ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
      if (ids.empty()) watchers_.erase(wit);
    }
    if (w.deadline) deadlines_.erase({*w.deadline, id});
    w.conn->waiters.erase(id);
    waiters_.erase(it);
  }

  void armDeadlineTimerOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (closing_) return;
    if (deadlines_.empty()) {
      uv_timer_stop(&deadlineTimer_);
      return;
    }
    auto wait = std::chrono::ceil<std::chrono::milliseconds>(deadlines_.begin()->first - Clock::now());
    uint64_t ms = static_cast<uint64_t>(std::max<int64_t>(1, wait.count()));
    uv_timer_start(&deadlineTimer_, &Impl::onDeadline, ms, 0);
  }

  static void onDeadline(uv_timer_t* t) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(t));
    Clock::time_point now = Clock::now();
    while (!s->deadlines_.empty() && s->deadlines_.begin()->first <= now) {
      uint64_t id = s->deadlines_.begin()->second;
      s->expireOnLoop(id);
    }
    s->armDeadlineTimerOnLoop();
  }

  void expireOnLoop(uint64_t id) {
    WEFT_DCHECK_ON_LOOP(loop_);
    Waiter& w = waiters_.at(id);
    std::string message =
        w.op == Op::Get
            ? "store: get(" + store::describeKey(w.keys[0]) + ") timed out after " +
                  store::describeDuration(w.timeout) + ": the key was not set"
            : "store: wait timed out after " + store::describeDuration(w.timeout) +
                  "; missing keys: " + store::describeKeys(w.watching);
    replyErrorOnLoop(*w.conn, w.requestId, Status::timeout(message));
    removeWaiterOnLoop(id);
  }

  UvLoop& loop_;
  const Config& config_;
  const store::Limits limits_;
  const uint64_t serverId_;  // tells a client that reconnects whether this server is the one it knew

  // Loop thread.
  // The lines a client can repeat at will (connections dropped, refused or failed), per
  // address; logTimer_ writes their summary when it is due.
  logging::RateLimiter log_{"store"};
  uv_tcp_t listener_{};
  uv_timer_t deadlineTimer_{};  // waiter deadlines; while closing, the flush timeout
  uv_timer_t logTimer_{};
  bool listening_ = false;
  bool timerOpen_ = false;       // until uv_close
  bool logTimerOpen_ = false;    // likewise
  int openHandles_ = 0;          // listener and timers, until their close callbacks
  bool closing_ = false;
  std::vector<Promise<void>> closeWaiters_;

  std::unordered_map<std::string, std::string> data_;
  uint64_t storedBytes_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t nextConnectionId_ = 1;
  uint64_t droppedConnections_ = 0;
  bool overConnectionLimit_ = false;
  uint64_t refusedSinceLimit_ = 0;

  std::unordered_map<uint64_t, Client> clients_;
  uint64_t keptReplies_ = 0;

  std::unordered_map<uint64_t, Waiter> waiters_;
  std::unordered_map<std::string, std::vector<uint64_t>> watchers_;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines_;
  uint64_t nextWaiterId_ = 1;
};

// ---- StoreServer --------------------------------------------------------------------

StoreServer::Config StoreServer::configFor(const Options& opt) {
  Config c;
  c.host = opt.masterAddr;
  c.port = opt.masterPort;
  c.token = opt.authToken;
  return c;
}

StoreServer::StoreServer(Config config, UvLoop* loop) : config_(std::move(config)) {
  const store::Limits& l = config_.limits;
  WEFT_ENFORCE(l.maxKeyBytes > 0 && l.maxValueBytes > 0 && l.maxKeysPerRequest > 0 && l.maxConnections > 0 &&
                   l.maxWaitersPerConnection > 0 && l.maxKeptRepliesPerClient > 0 &&
                   l.maxKeptReplyBytesPerClient > 0 && l.maxKnownClients > 0,
               InvalidArgumentError, "StoreServer: every store limit must be positive");
  WEFT_ENFORCE(l.maxRequestBody() <= UINT32_MAX && l.maxReplyBody() <= UINT32_MAX, InvalidArgumentError,
               "StoreServer: the limits allow requests of ", l.maxRequestBody(),
               " bytes, more than a frame's 32-bit length can say");
  WEFT_ENFORCE(config_.token.size() <= l.maxTokenBytes, InvalidArgumentError, "StoreServer: a token of ",
               config_.token.size(), " bytes is longer than maxTokenBytes ", l.maxTokenBytes);
  WEFT_ENFORCE(l.helloTimeout.count() > 0 && l.frameTimeout.count() > 0, InvalidArgumentError,
               "StoreServer: helloTimeout and frameTimeout must be positive");
  SocketAddress address = *SocketAddress::resolve(config_.host, config_.port);
  if (!loop) {
    ownedLoop_ = std::make_unique<UvLoop>("weft-store-srv");
    loop = ownedLoop_.get();
  }
  loop_ = loop;
  impl_ = std::make_unique<Impl>(*loop_, config_);
  try {
    port_ = loop_->call([&] { return impl_->listenOnLoop(address); });
  } catch (...) {
    close();
    throw;
  }
}

StoreServer::~StoreServer() { close(); }

StoreServer::Stats StoreServer::stats() const {
  return loop_->call([&] { return impl_->statsOnLoop(); });
}

void StoreServer::close() {
  Promise<void> done;
  Future<void> closed = done.getFuture();
  WEFT_CHECK(!loop_->inLoopThread()) << "StoreServer::close() would block its own event loop";
  // A loop that has stopped already closed our handles (see UvLoop::stop).
  if (loop_->post([this, done]() mutable { impl_->beginCloseOnLoop(std::move(done)); })) closed.get();
}

}  // namespace weft::rpc
