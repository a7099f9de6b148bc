// Agent (rpc/agent.h): construction, the frames and calls that follow the
// handshake, failures, the loop's housekeeping tick, and the Agent methods.
// The handshake and start() live in rpc/agent_handshake.cpp, the shutdown
// barrier in rpc/agent_shutdown.cpp; Agent::Impl is declared in
// rpc/agent_impl.h, which says which thread runs what (the OnLoop functions
// run on the loop thread; calls are sent from any thread; handlers reply from
// the pool).
#include "rpc/agent.h"

#include <uv.h>

#include <algorithm>
#include <random>
#include <sstream>

#include "common/logging.h"
#include "rpc/agent_impl.h"

namespace weft::rpc {

namespace {

using Clock = std::chrono::steady_clock;

// The loop's housekeeping tick: deadlines, heartbeats, shutdown rounds.
constexpr auto kTick = std::chrono::milliseconds(10);
// A gap between ticks longer than this is a stall of this process (not
// scheduled, stopped) or of its loop thread (AgentStats::longestStall).
constexpr auto kStallThreshold = std::chrono::milliseconds(50);

void fillError(wire::ErrorStatus::Builder out, const Status& s) {
  out.setCode(static_cast<wire::StatusCode>(static_cast<uint16_t>(s.code())));
  out.setMessage(s.message());
  out.setWorker(s.worker());
  out.setFunction(s.function());
}

}  // namespace

// ---- helpers shared by the agent's files -----------------------------------------------

std::string Agent::Impl::seconds(Clock::duration d) {
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << std::chrono::duration<double>(d).count() << " s";
  return os.str();
}

std::optional<Status> Agent::Impl::readError(wire::ErrorStatus::Reader in) {
  auto code = statusCodeFromWire(static_cast<uint32_t>(in.getCode()));
  if (!code || *code == StatusCode::Ok) return std::nullopt;
  return Status(*code, std::string(in.getMessage().cStr()), std::string(in.getWorker().cStr()),
                std::string(in.getFunction().cStr()));
}

// ---- the agent's state ---------------------------------------------------------------

Agent::Impl::Impl(Options options)
    : options_(std::move(options)), loop_("weft-rpc"), pool_("weft-handler", options_.numWorkerThreads) {
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

// ---- connections ----------------------------------------------------------------------

Agent::Impl::Connection::Handlers Agent::Impl::handlersFor(Peer* peer, std::shared_ptr<Handshake> hs) {
  // The handshake (when any) is held weakly by the handlers: handshakes_ owns it.
  std::weak_ptr<Handshake> weakHs = hs;
  return Connection::Handlers{
      .onFrame = [this, peer, weakHs](Connection& c, IncomingFrame f) mutable {
        if (peer == nullptr) {
          auto h = weakHs.lock();
          if (!h) return;
          Peer* attached = onHandshakeFrameOnLoop(h, c, std::move(f));
          if (attached != nullptr) peer = attached;
          return;
        }
        onFrameOnLoop(*peer, c, std::move(f));
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
        Peer* p = peer != nullptr ? peer : attachedPeerOnLoop(c);
        if (p != nullptr) onPeerClosedOnLoop(*p, c, why);
      }};
}

Agent::Impl::Peer* Agent::Impl::attachedPeerOnLoop(Connection& c) {
  WEFT_DCHECK_ON_LOOP(loop_);
  for (auto& p : peers_) {
    if (p->conn.get() == &c) return p.get();
  }
  return nullptr;
}

// ---- frames after the handshake -----------------------------------------------------

void Agent::Impl::onFrameOnLoop(Peer& peer, Connection& c, IncomingFrame frame) {
  WEFT_DCHECK_ON_LOOP(loop_);
  Status bad = guardRead([&] {
    auto msg = frame.message();
    switch (msg.which()) {
      case wire::Message::CALL:
        onCallOnLoop(peer, c, std::move(frame));
        return;
      case wire::Message::RESPONSE:
        onResponseOnLoop(peer, c, frame);
        return;
      case wire::Message::CANCEL:
        onCancelOnLoop(peer, msg.getCancel().getCallId());
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
        onShutdownJoinOnLoop(peer, j.getRound(), j.getIdle());
        return;
      }
      case wire::Message::SHUTDOWN_PROCEED: {
        auto p = msg.getShutdownProceed();
        std::vector<std::string> missing;
        for (auto m : p.getMissing()) missing.emplace_back(m.cStr());
        onShutdownProceedOnLoop(peer, p.getRound(), p.getDone(), std::move(missing));
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

void Agent::Impl::sendError(Connection& c, uint64_t callId, const Status& s) {
  FrameWriter w(128);
  auto resp = w.message().initResponse();
  resp.setCallId(callId);
  fillError(resp.initError(), s);
  c.send(std::move(w).finish());
}

void Agent::Impl::onCallOnLoop(Peer& peer, Connection& c, IncomingFrame frame) {
  WEFT_DCHECK_ON_LOOP(loop_);
  auto call = frame.message().getCall();
  uint64_t callId = call.getCallId();
  uint32_t flags = call.getFlags();
  if (callId == 0) throw ProtocolError("a call with id 0");
  if (flags & ~(wire::CALL_FLAG_NO_REPLY | wire::CALL_FLAG_HAS_RREFS)) {
    throw ProtocolError("a call with unknown flags " + std::to_string(flags));
  }
  if (flags & wire::CALL_FLAG_HAS_RREFS) announceIncomingOnLoop(peer, frame);
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
void Agent::Impl::runCall(Peer& peer, const std::shared_ptr<IncomingCall>& ic, Body&& body) {
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
void Agent::Impl::announceIncomingOnLoop(Peer& peer, IncomingFrame& frame) {
  WEFT_DCHECK_ON_LOOP(loop_);
  for (auto& [tag, ext] : extensions_) ext->onIncomingFrame(peer.rank, frame);
}

// Ends an incoming call's bookkeeping; true when it was still in the table (not
// cancelled, peer alive), i.e. a response should be sent.
bool Agent::Impl::finishIncoming(Peer& peer, IncomingCall& ic) {
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

void Agent::Impl::reply(Peer& peer, const std::shared_ptr<IncomingCall>& ic, const Future<HeldValue>& f) {
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

void Agent::Impl::onCancelOnLoop(Peer& peer, uint64_t callId) {
  WEFT_DCHECK_ON_LOOP(loop_);
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

void Agent::Impl::onResponseOnLoop(Peer& peer, Connection& c, IncomingFrame& frame) {
  WEFT_DCHECK_ON_LOOP(loop_);
  auto resp = frame.message().getResponse();
  uint64_t callId = resp.getCallId();
  if (resp.getHasRrefs()) announceIncomingOnLoop(peer, frame);
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

Agent::Impl::Peer* Agent::Impl::resolve(const WorkerRef& to) const {
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

Agent::Impl::Peer& Agent::Impl::resolveOrThrow(const WorkerRef& to) const {
  Peer* p = resolve(to);
  if (p == nullptr) {
    throw NotFoundError("rpc: no worker " + to.toString() + " in this job of " +
                        std::to_string(options_.worldSize) + (options_.worldSize == 1 ? " worker" : " workers"));
  }
  return *p;
}

bool Agent::Impl::sendCall(int rank, const std::string& function, uint64_t functionId, const CallOptions& opts,
                           FrameWriter& writer, std::unique_ptr<detail::ResponseSink> sink,
                           const std::string& label) {
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

void Agent::Impl::onPeerClosedOnLoop(Peer& peer, Connection& c, const Status& why) {
  WEFT_DCHECK_ON_LOOP(loop_);
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
  if (peer.rank != options_.rank) onPeerGoneOnLoop(peer);
}

// ---- housekeeping tick ---------------------------------------------------------------

void Agent::Impl::startTickingOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  tick_ = std::make_unique<uv_timer_t>();
  uv_timer_init(loop_.raw(), tick_.get());
  tick_->data = this;
  lastTickAt_ = Clock::now();  // a stall before the first tick is a stall too
  uv_timer_start(tick_.get(), [](uv_timer_t* t) { static_cast<Impl*>(t->data)->onTickOnLoop(); },
                 kTick.count(), kTick.count());
}

void Agent::Impl::stopTickingOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (!tick_) return;
  uv_timer_stop(tick_.get());
  uv_close(reinterpret_cast<uv_handle_t*>(tick_.release()),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
}

void Agent::Impl::onTickOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  transport::WriteBatch batch;
  auto now = Clock::now();
  trackStallsOnLoop(now);
  expireCallsOnLoop(now);
  if (now - lastHeartbeatCheck_ >= options_.heartbeatInterval / 4) {
    lastHeartbeatCheck_ = now;
    checkHeartbeatsOnLoop(now);
    expireHandshakesOnLoop(now);
  }
  shutdownTickOnLoop(now);
  log_.flush();
  for (auto& [tag, ext] : extensions_) ext->onTick();
}

void Agent::Impl::expireCallsOnLoop(Clock::time_point now) {
  WEFT_DCHECK_ON_LOOP(loop_);
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
void Agent::Impl::trackStallsOnLoop(Clock::time_point now) {
  WEFT_DCHECK_ON_LOOP(loop_);
  for (auto& pp : peers_) {
    Peer& peer = *pp;
    if (!peer.conn || peer.conn->isLoopback()) continue;
    auto heard = peer.conn->lastHeardOnLoop();
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
Agent::Impl::Clock::duration Agent::Impl::silenceOnLoop(const Peer& peer, Clock::time_point now) const {
  WEFT_DCHECK_ON_LOOP(loop_);
  return (now - peer.heardAt) - (stalled_ - peer.stalledAtHeard);
}

void Agent::Impl::checkHeartbeatsOnLoop(Clock::time_point now) {
  WEFT_DCHECK_ON_LOOP(loop_);
  for (auto& pp : peers_) {
    Peer& peer = *pp;
    if (!peer.alive || !peer.conn || peer.conn->isLoopback()) continue;
    auto silent = silenceOnLoop(peer, now);
    auto window = options_.heartbeatInterval * options_.heartbeatMisses;
    // Bytes waiting in the socket are word from the peer, read later in this turn of the loop
    // (unless they stay unread: then the window's second round decides).
    if (silent > window && (silent > 2 * window || !peer.conn->hasUnreadBytesOnLoop())) {
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

AgentStats Agent::Impl::stats() const {
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
  s.bytesSent = counters_.bytesWritten.load();
  s.bytesReceived = counters_.bytesRead.load();
  s.longestStall = std::chrono::milliseconds(longestStallMs_.load());
  for (auto& p : peers_) {
    if (p->rank != options_.rank && p->alive) ++s.liveConnections;
  }
  return s;
}

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
