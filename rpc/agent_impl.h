// Agent::Impl: the agent's state and the functions that run it, shared by the
// files that implement rpc/agent.h. Internal (installed with rpc/'s headers, but
// no part of the API), included only by
//   rpc/agent.cpp            construction, frames and calls after the handshake,
//                            failures, the housekeeping tick, the Agent methods
//   rpc/agent_handshake.cpp  start(): the rendezvous steps, connect/accept, Hello/Welcome
//   rpc/agent_shutdown.cpp   shutdown(): the barrier's join/proceed rounds, the drain, closing
//
// Threads. One loop thread (rpc/uv_loop.h) owns the sockets, the timers, the
// handshakes and the shutdown barrier's state; a function whose name ends in
// OnLoop runs only there and checks so at its top (WEFT_DCHECK_ON_LOOP, on in
// debug and sanitizer builds). start() and shutdown() run on the caller's
// thread and hand their loop work over with loop_.call/loop_.post. The per-peer
// call tables (Peer::pending, Peer::incoming) are under Peer::mutex: calls are
// sent from any thread and handlers reply from the pool, and the loop fails or
// expires them. Names and addresses are under infoMutex_ until start() returns.
#pragma once

#include <uv.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "rpc/agent.h"
#include "rpc/store.h"
#include "rpc/thread_pool.h"
#include "rpc/transport/connection.h"
#include "rpc/transport/listener.h"
#include "rpc/uv_loop.h"

namespace weft::rpc {

class Agent::Impl {
 public:
  using Clock = std::chrono::steady_clock;
  using Connection = transport::Connection;

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
    // The latest Connection::lastHeardOnLoop() the tick has seen, and Impl::stalled_ then.
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

  // The shutdown barrier's stage (agent_shutdown.cpp).
  enum class Phase { None, Joining, Ending, Waiting, Closing, Done };

  static constexpr const char* kAbortKey = "weft/abort";
  // How long start() waits at a time before it checks whether it should stop.
  static constexpr auto kStartSlice = std::chrono::milliseconds(100);

  explicit Impl(Options options);
  // shutdown() (called by ~Agent) has stopped the pool, the timers and the loop.
  ~Impl() = default;

  // ---- start (agent_handshake.cpp) ------------------------------------------------------

  void start();
  // The steps of start(), in order.
  void startSteps();
  void applyOptions();
  void listen();
  void openStore();
  void claimIdentity();
  void learnPeers(Clock::time_point deadline);
  void connectPeers(Clock::time_point deadline);
  void awaitEveryoneConnected(Clock::time_point deadline);

  void checkStartAborted();
  static std::chrono::milliseconds remaining(Clock::time_point deadline);
  std::string peerLabel(int r) const;
  void connectTo(int r, Clock::time_point deadline);
  template <class Builder>
  void fillIdentity(Builder out) const;

  // ---- the handshake (agent_handshake.cpp) ----------------------------------------------

  void onAcceptedOnLoop(int fd, std::string who);
  // Returns the peer the connection now belongs to, once the handshake completes.
  Peer* onHandshakeFrameOnLoop(const std::shared_ptr<Handshake>& record, Connection& c, IncomingFrame frame);
  Peer* attachOnLoop(const std::shared_ptr<Handshake>& record, Peer& p, const std::string& name);
  void expireHandshakesOnLoop(Clock::time_point now);

  // ---- connections and frames after the handshake (agent.cpp) ---------------------------

  Connection::Handlers handlersFor(Peer* peer, std::shared_ptr<Handshake> hs);
  Peer* attachedPeerOnLoop(Connection& c);
  void onFrameOnLoop(Peer& peer, Connection& c, IncomingFrame frame);
  void sendError(Connection& c, uint64_t callId, const Status& s);
  void onCallOnLoop(Peer& peer, Connection& c, IncomingFrame frame);
  // Runs a call's body (body(ctx) returns its result) and replies when the result is ready.
  template <class Body>
  void runCall(Peer& peer, const std::shared_ptr<IncomingCall>& ic, Body&& body);
  // A frame flagged as carrying remote references: the layers take them over first.
  void announceIncomingOnLoop(Peer& peer, IncomingFrame& frame);
  // Ends an incoming call's bookkeeping; true when it was still in the table (not
  // cancelled, peer alive), i.e. a response should be sent.
  bool finishIncoming(Peer& peer, IncomingCall& ic);
  void reply(Peer& peer, const std::shared_ptr<IncomingCall>& ic, const Future<HeldValue>& f);
  void onCancelOnLoop(Peer& peer, uint64_t callId);
  void onResponseOnLoop(Peer& peer, Connection& c, IncomingFrame& frame);

  // ---- calls (agent.cpp) ----------------------------------------------------------------

  Peer* resolve(const WorkerRef& to) const;
  Peer& resolveOrThrow(const WorkerRef& to) const;
  bool sendCall(int rank, const std::string& function, uint64_t functionId, const CallOptions& opts,
                FrameWriter& writer, std::unique_ptr<detail::ResponseSink> sink, const std::string& label);

  // ---- failures and the housekeeping tick (agent.cpp) -----------------------------------

  void onPeerClosedOnLoop(Peer& peer, Connection& c, const Status& why);
  void startTickingOnLoop();
  void stopTickingOnLoop();
  void onTickOnLoop();
  void expireCallsOnLoop(Clock::time_point now);
  void trackStallsOnLoop(Clock::time_point now);
  // How long `peer` has been silent while this loop was running.
  Clock::duration silenceOnLoop(const Peer& peer, Clock::time_point now) const;
  void checkHeartbeatsOnLoop(Clock::time_point now);

  // ---- shutdown (agent_shutdown.cpp) ----------------------------------------------------

  ShutdownReport shutdown(ShutdownOptions opts);
  bool isIdle() const;
  // The connection to `peer` failed, or it left a failed barrier.
  bool goneOnLoop(const Peer& peer) const;
  bool anyGoneOnLoop() const;
  // The workers this one knows to be gone, each a worker that left a failed barrier
  // replaced by the workers it named.
  std::vector<std::string> goneWorkersOnLoop() const;
  // Round 1 of the barrier: the job is still running.
  bool jobRunningOnLoop() const;
  void beginShutdownOnLoop(Clock::duration timeout, Promise<bool> jobEnded, Promise<ShutdownReport> done);
  void joinOnLoop();
  void onShutdownJoinOnLoop(Peer& peer, uint32_t round, bool idle);
  void decideJobEndOnLoop();
  void endJobOnLoop();
  void startDrainOnLoop();
  void maybeDecideOnLoop();
  void onShutdownProceedOnLoop(Peer& peer, uint32_t round, bool done, std::vector<std::string> missing);
  // `peer` is gone (its connection failed, or it left a failed barrier).
  void onPeerGoneOnLoop(const Peer& peer);
  void failBarrierOnLoop();
  void shutdownTickOnLoop(Clock::time_point now);
  void finishShutdownOnLoop(std::vector<std::string> missing);
  // The non-graceful path.
  void closeAllOnLoop();

  AgentStats stats() const;

  // ---- helpers shared by the files ------------------------------------------------------

  // "1.250 s"
  static std::string seconds(Clock::duration d);
  // A Status from a received ErrorStatus; nullopt for a code this build does not know.
  static std::optional<Status> readError(wire::ErrorStatus::Reader in);

  // ---- state ----------------------------------------------------------------------------

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

}  // namespace weft::rpc
