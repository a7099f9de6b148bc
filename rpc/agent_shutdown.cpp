// Agent::shutdown() and the shutdown barrier (rpc/agent.h, "Shutdown"; the
// messages: rpc/protocol.capnp, "Graceful shutdown").
//
// Two stages. Round 1, while the job runs: a worker that called shutdown()
// stays a full member of the job (it serves, its handlers call out, its layers
// keep their state) and the leader (rank 0) waits, with no deadline, until
// every worker has joined; a worker gone (its connection failed, or it left a
// failed barrier) fails the barrier at once on every worker that learns of it
// (failBarrierOnLoop). Once all have joined, the job has ended: each shutdown
// thread tells its layers (onShutdownBegin), and rounds 2, 3, ... drain the
// calls still in flight, within the shutdown timeout. Then every connection
// closes gracefully (closing: each side's end of stream, or kCloseLinger).
//
// Threads. shutdown() runs on the caller's thread: it posts the barrier to the
// loop, tells the layers when the job has ended, and waits for the report.
// The barrier's state (shutdownPhase_, round_, joins_, departed_) belongs to
// the loop thread, where every function ending in OnLoop runs: the join and
// proceed messages arrive there, and the housekeeping tick drives the rounds
// (shutdownTickOnLoop).
#include <algorithm>

#include "common/logging.h"
#include "rpc/agent_impl.h"

namespace weft::rpc {

namespace {

using Clock = std::chrono::steady_clock;

// How long a worker waits to become idle between shutdown rounds.
constexpr auto kRoundPause = std::chrono::milliseconds(20);
// How long closing connections may take to exchange their ends of stream.
constexpr auto kCloseLinger = std::chrono::seconds(2);

}  // namespace

bool Agent::Impl::isIdle() const {
  if (pendingOutgoing_.load() != 0 || activeIncoming_.load() != 0) return false;
  for (auto& [tag, ext] : extensions_) {
    if (ext->busy()) return false;
  }
  return true;
}

// The connection to `peer` failed, or it left a failed barrier.
bool Agent::Impl::goneOnLoop(const Peer& peer) const {
  WEFT_DCHECK_ON_LOOP(loop_);
  return !peer.alive.load() || departed_.count(peer.rank) != 0;
}

bool Agent::Impl::anyGoneOnLoop() const {
  WEFT_DCHECK_ON_LOOP(loop_);
  for (auto& pp : peers_) {
    if (pp->rank != options_.rank && goneOnLoop(*pp)) return true;
  }
  return false;
}

// The workers this one knows to be gone, each a worker that left a failed barrier
// replaced by the workers it named.
std::vector<std::string> Agent::Impl::goneWorkersOnLoop() const {
  WEFT_DCHECK_ON_LOOP(loop_);
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
bool Agent::Impl::jobRunningOnLoop() const {
  WEFT_DCHECK_ON_LOOP(loop_);
  return shutdownPhase_ == Phase::Joining && round_ == 1;
}

void Agent::Impl::beginShutdownOnLoop(Clock::duration timeout, Promise<bool> jobEnded, Promise<ShutdownReport> done) {
  WEFT_DCHECK_ON_LOOP(loop_);
  shutdownDone_ = std::move(done);
  jobEnded_ = std::move(jobEnded);
  shutdownTimeout_ = timeout;
  round_ = 1;
  if (options_.worldSize == 1) {
    finishShutdownOnLoop({});
    return;
  }
  if (anyGoneOnLoop()) {
    failBarrierOnLoop();
    return;
  }
  joinOnLoop();
}

void Agent::Impl::joinOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  shutdownPhase_ = Phase::Joining;
  bool idle = isIdle();
  if (options_.rank == 0) {
    joins_[round_][0] = idle;
    maybeDecideOnLoop();
    return;
  }
  Peer& leader = *peers_[0];
  if (goneOnLoop(leader)) {
    finishShutdownOnLoop(goneWorkersOnLoop());
    return;
  }
  FrameWriter w(32);
  auto j = w.message().initShutdownJoin();
  j.setRound(round_);
  j.setIdle(idle);
  leader.conn->send(std::move(w).finish());
}

void Agent::Impl::onShutdownJoinOnLoop(Peer& peer, uint32_t round, bool idle) {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (options_.rank != 0) throw ProtocolError("a shutdown join sent to a worker that does not lead shutdown");
  if (round == 0 || round > round_ + 1000) throw ProtocolError("a shutdown join for round " + std::to_string(round));
  joins_[round][peer.rank] = idle;
  maybeDecideOnLoop();
}

// Leader: ends round 1 when every worker has joined (the job has ended), or fails it when one
// is gone.
void Agent::Impl::decideJobEndOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (anyGoneOnLoop()) {
    failBarrierOnLoop();
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
  endJobOnLoop();
}

// Every worker has joined: the drain's deadline starts, and the shutdown thread tells the
// layers before this worker joins round 2 (startDrainOnLoop).
void Agent::Impl::endJobOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  shutdownPhase_ = Phase::Ending;
  shutdownDeadline_ = Clock::now() + shutdownTimeout_;
  jobEnded_.trySetValue(true);
}

void Agent::Impl::startDrainOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (shutdownPhase_ != Phase::Ending) return;  // the barrier ended meanwhile
  round_ = 2;
  shutdownPhase_ = Phase::Waiting;
  nextJoinAt_ = Clock::now() + kRoundPause;
}

void Agent::Impl::maybeDecideOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (options_.rank != 0 || (shutdownPhase_ != Phase::Joining)) return;
  if (round_ == 1) {
    decideJobEndOnLoop();
    return;
  }
  auto& joined = joins_[round_];
  bool timedOut = Clock::now() >= shutdownDeadline_;
  bool all = true;
  bool allIdle = true;
  std::vector<std::string> missing = goneWorkersOnLoop();
  for (auto& pp : peers_) {
    if (goneOnLoop(*pp)) continue;
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
    if (pp->rank == 0 || goneOnLoop(*pp) || !joined.count(pp->rank)) continue;
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
    finishShutdownOnLoop(std::move(missing));
    return;
  }
  joins_.erase(round_);
  ++round_;
  shutdownPhase_ = Phase::Waiting;
  nextJoinAt_ = Clock::now() + kRoundPause;
}

void Agent::Impl::onShutdownProceedOnLoop(Peer& peer, uint32_t round, bool done, std::vector<std::string> missing) {
  WEFT_DCHECK_ON_LOOP(loop_);
  // This worker left already (its own barrier failed while the message was on its way).
  if (round != 0 && (shutdownPhase_ == Phase::Closing || shutdownPhase_ == Phase::Done)) return;
  if (round == 0) {
    // A worker that left a failed barrier, and the workers it found gone.
    if (!done) throw ProtocolError("a shutdown notice of round 0 that is not done");
    missing.erase(std::remove(missing.begin(), missing.end(), name_), missing.end());
    departed_[peer.rank] = std::move(missing);
    onPeerGoneOnLoop(peer);
    return;
  }
  if (peer.rank != 0) throw ProtocolError("a shutdown proceed from a worker that does not lead shutdown");
  if (shutdownPhase_ != Phase::Joining || round != round_) {
    throw ProtocolError("a shutdown proceed for round " + std::to_string(round) + " outside that round");
  }
  if (done) {
    finishShutdownOnLoop(std::move(missing));
    return;
  }
  if (round == 1) {
    endJobOnLoop();
    return;
  }
  ++round_;
  shutdownPhase_ = Phase::Waiting;
  nextJoinAt_ = Clock::now() + kRoundPause;
}

// `peer` is gone (its connection failed, or it left a failed barrier).
void Agent::Impl::onPeerGoneOnLoop(const Peer& peer) {
  WEFT_DCHECK_ON_LOOP(loop_);
  if (jobRunningOnLoop()) {
    if (options_.rank == 0) {
      maybeDecideOnLoop();
    } else {
      failBarrierOnLoop();
    }
    return;
  }
  if (shutdownPhase_ == Phase::Joining || shutdownPhase_ == Phase::Ending || shutdownPhase_ == Phase::Waiting) {
    if (options_.rank == 0) {
      maybeDecideOnLoop();
    } else if (peer.rank == 0) {
      finishShutdownOnLoop(goneWorkersOnLoop());
    }
  }
}

// Round 1 failed: a worker is gone. Tells every other live worker why this one leaves (they
// fail their own barrier with it, now or when they join), then closes.
void Agent::Impl::failBarrierOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
  std::vector<std::string> missing = goneWorkersOnLoop();
  for (auto& pp : peers_) {
    if (pp->rank == options_.rank || goneOnLoop(*pp) || !pp->conn) continue;
    FrameWriter w(128);
    auto p = w.message().initShutdownProceed();
    p.setRound(0);
    p.setDone(true);
    auto list = p.initMissing(static_cast<unsigned>(missing.size()));
    for (size_t i = 0; i < missing.size(); ++i) list.set(static_cast<unsigned>(i), missing[i]);
    pp->conn->send(std::move(w).finish());
  }
  finishShutdownOnLoop(std::move(missing));
}

void Agent::Impl::shutdownTickOnLoop(Clock::time_point now) {
  WEFT_DCHECK_ON_LOOP(loop_);
  switch (shutdownPhase_) {
    case Phase::Waiting:
      if (isIdle() || now >= nextJoinAt_) joinOnLoop();
      return;
    case Phase::Joining:
      if (round_ == 1) return;  // the job runs: no deadline
      if (options_.rank == 0) {
        if (now >= shutdownDeadline_) maybeDecideOnLoop();
      } else if (now >= shutdownDeadline_ + std::chrono::seconds(1)) {
        WEFT_LOG(Warn) << "rpc: no word from the shutdown leader '" << peers_[0]->name << "' within "
                       << seconds(shutdownTimeout_) << " of the job's end; closing";
        auto missing = goneWorkersOnLoop();
        missing.push_back(peers_[0]->name);
        finishShutdownOnLoop(std::move(missing));
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

void Agent::Impl::finishShutdownOnLoop(std::vector<std::string> missing) {
  WEFT_DCHECK_ON_LOOP(loop_);
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

// The non-graceful path.
void Agent::Impl::closeAllOnLoop() {
  WEFT_DCHECK_ON_LOOP(loop_);
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

ShutdownReport Agent::Impl::shutdown(ShutdownOptions opts) {
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
    loop_.post([this, timeout, ended, done]() mutable {
      beginShutdownOnLoop(timeout, std::move(ended), std::move(done));
    });
    // No deadline: the loop ends round 1 once every worker has joined, or at once when one is
    // gone (failure detection bounds that).
    if (jobEnded.get()) {
      callsClosed_ = true;
      for (auto& [tag, ext] : extensions_) ext->onShutdownBegin();
      loop_.post([this] { startDrainOnLoop(); });
    }
    if (f.waitFor(timeout + kCloseLinger + std::chrono::seconds(2))) {
      report = f.get();
    } else {
      WEFT_LOG(Error) << "rpc: graceful shutdown did not complete; closing at once";
      report.missing.push_back("(shutdown barrier incomplete)");
    }
  }
  loop_.call([this] { closeAllOnLoop(); });
  pool_.stop();
  loop_.call([this] {
    if (listener_) listener_->closeOnLoop();
    stopTickingOnLoop();
  });
  store_.reset();
  storeServer_.reset();
  loop_.stop();
  for (auto& [tag, ext] : extensions_) ext->onClosed();
  finalReport_ = report;
  return report;
}
}  // namespace weft::rpc
