// Agent: one process's endpoint in a weft job. It joins the job through the
// rendezvous store, connects to every other worker, serves the functions bound
// in its registry and makes typed calls to the others.
//
//   // api.h, shared by every program of the job
//   inline const weft::Function<Tensor(Tensor, Tensor)> add{"add"};
//
//   weft::rpc::Agent agent(weft::rpc::Options::fromEnv());
//   agent.registry().impl(add, [](Tensor a, Tensor b) { return a + b; });
//   agent.start();                                        // rendezvous + handshake with every peer
//   Tensor c = agent.call("worker1", add, a, b);          // blocks; throws the typed error
//   weft::Future<Tensor> f = agent.callAsync(1, add, {.timeout = 2s}, a, b);   // by rank, own timeout
//   agent.shutdown();                                     // graceful: serves until the whole job ends
//
// Calls. callAsync(to, fn, args...) returns at once with a Future; call(...) is
// callAsync(...).get(). `to` is a worker's name or rank. The arguments are checked
// against fn's declared parameters at compile time, converted to them, and
// encoded on the calling thread before callAsync returns: tensor bytes are then
// read from the tensor's own storage when the frame is written (no copy, see
// rpc/frame.h), so do not modify a tensor in place until its call has
// completed. CallOptions come right after fn: {.timeout = 250ms}; 0 means no
// timeout; unset means Options::rpcTimeout (60 s by default).
//
// What get() throws (common/error.h):
//   RemoteError          the remote body threw; names the worker, the function and the message
//                        (a body throwing a typed weft error raises that type instead)
//   TimeoutError         no reply within the timeout: names the worker, the function and the
//                        time waited. The callee is sent a cancel, and a reply arriving later
//                        is dropped
//   DisconnectedError    the peer's connection dropped or its process died (pending calls fail
//                        at once when its socket closes, as when the process is killed, and
//                        after heartbeatMisses x heartbeatInterval, 10 s by default, when it
//                        falls silent); later calls to that peer fail at once. Other peers are
//                        unaffected
//   NotFoundError        the callee has no such function, or `to` names no worker
//   ProtocolError        the arguments or the result did not decode as declared (names the
//                        function and the argument), or the peer broke the protocol
//   InvalidArgumentError an argument cannot be sent (a CUDA tensor, a value over the limits)
//   StateError           the agent is not started, or the job has ended (every worker called
//                        shutdown())
//
// Threads. One loop thread (rpc/uv_loop.h) owns the sockets, the timers and
// the handshake; a pool of Options::numWorkerThreads threads runs the bodies of
// registered functions. A caller's frame is written by the calling thread when
// the connection has nothing queued (no hop through the loop on the latency
// path); otherwise it joins the queue, and the loop writes queued frames
// together in one writev (coalescing: many small calls cost one system call).
// Continuations attached to a call's future before it completes run on the loop
// thread: keep them short and never block in them (call call() there and the
// loop waits for itself). Chaining a nested callAsync() in a continuation is fine.
//
// Start. start() binds its listener to Options::listenHost() (by default the
// address WEFT_SOCKET_IFNAME names, else the local address of the route to
// the master address: Options::localAddress()), registers this worker and
// that address in the store (served by rank 0 on this agent's loop), checks
// that the name and rank are unique and that every worker agrees on the world
// size (each a clear error), then connects to every peer: a worker initiates
// the connection to each lower rank and accepts one from each higher rank.
// Each connection begins with a Hello/Welcome handshake (protocol version,
// name, rank, world size, token: rpc/protocol.capnp). It returns once every
// worker is connected to every other (a last barrier in the store, so that a
// handler serving an early caller can itself call out), or throws TimeoutError
// naming the workers still missing after Options::storeTimeout. An address a
// peer gave that refuses the connection or cannot be routed to (it listens
// before it registers, so nothing else can be meant) fails start() at once
// with DisconnectedError naming the peer, the address and WEFT_SOCKET_IFNAME;
// every other worker's start() then fails at once with the same reason.
//
// Failures. A closed or reset socket is noticed at once (its pending calls
// fail as soon as the loop sees the socket's end or error). A peer silent for
// heartbeatMisses heartbeat intervals is declared dead: the loop pings a peer
// it has not heard from for an interval, from its own timer, whatever else is
// queued, and any sign of the peer counts as hearing from it (any byte
// received or waiting in the socket, or its reading what this side had
// queued). Silence is counted only while this process's loop runs: after a
// stall of this process (not scheduled, stopped, its loop held up) peers are
// not blamed for time nobody was watching, and detection is late by up to
// the stall (AgentStats::longestStall). README.md, "Failures", gives the
// bounds the tests hold.
//
// Bytes that break the protocol (garbage, a truncated or oversized frame, a
// wrong version or token, a connection that never says Hello) cost only that
// connection: it is closed, its pending calls fail, one line is logged, and
// the agent keeps serving. Those lines are rate-limited per peer address
// (common/logging.h: three per 10 s, then one summary, "rpc: ... and 2,997
// more from 127.0.0.1 in the last 10 s"), so a flood of hostile connections
// cannot flood the log.
//
// Shutdown. shutdown() is graceful by default, and is the whole end of a job: a worker that only
// serves calls (one that hosts objects for the others) calls it right after start() and returns
// when the job ends, as in PyTorch. A barrier led by rank 0 (rpc/protocol.capnp, "Graceful
// shutdown") runs in two stages:
//   1. The job runs. Until every worker has called shutdown(), a worker waiting in it stays a full
//      member of the job: incoming calls are served, its handlers (and other threads) may call
//      out, remote references and distributed autograd contexts work as before. There is no
//      deadline, however long the job takes. It fails when a worker is gone (already, or while
//      the others wait), as the failure detection judges it (a closed socket at once,
//      heartbeatMisses x heartbeatInterval of silence): every worker in the barrier leaves it as
//      soon as it knows, and tells the others; a worker still working then sees its calls to
//      those fail (DisconnectedError), and its own shutdown() returns at once. Each report names
//      the lost worker in ShutdownReport::missing (not the workers that left because of it).
//      Survivors that still need each other should meet before shutdown().
//   2. The job has ended (every worker joined). From here on calls fail with StateError (except
//      the layers' bookkeeping, CallOptions::duringShutdown); the layers drop what this worker
//      holds (AgentExtension::onShutdownBegin), and the barrier waits until no worker has a call
//      in flight, for at most the shutdown timeout (Options::shutdownTimeout, or
//      ShutdownOptions::timeout); workers not done by then are named in missing. Then every
//      worker closes.
// shutdown({.graceful = false}) closes at once, failing every pending call with CancelledError on
// this side and DisconnectedError on the peers'. The destructor of a started agent that was not
// shut down performs a non-graceful shutdown and logs a warning.
//
// Thread-safety: after start(), every method may be called from any thread,
// including from handler bodies (which should prefer callAsync() to call()).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "common/type_tag.h"
#include "rpc/codec.h"
#include "rpc/frame.h"
#include "rpc/function.h"
#include "rpc/options.h"
#include "rpc/registry.h"

namespace weft {
template <class T>
class RRef;
}  // namespace weft

namespace weft::rpc {

class StoreClient;
class UvLoop;

struct CallOptions {
  // Unset: Options::rpcTimeout. Zero: no timeout.
  std::optional<std::chrono::milliseconds> timeout = std::nullopt;
  // For the bookkeeping of layers above rpc (an RRef's delete) that must still reach the peers
  // while the graceful shutdown barrier drains; other calls fail with StateError once the job has
  // ended (every worker called shutdown()).
  bool duringShutdown = false;
};

struct WorkerInfo {
  std::string name;
  int rank = -1;
};

// A worker named by rank or by name.
class WorkerRef {
 public:
  WorkerRef(int rank) : rank_(rank) {}  // NOLINT: implicit by design
  WorkerRef(std::string name) : name_(std::move(name)) {}  // NOLINT
  WorkerRef(const char* name) : name_(name) {}  // NOLINT
  WorkerRef(std::string_view name) : name_(name) {}  // NOLINT
  WorkerRef(const WorkerInfo& w) : rank_(w.rank) {}  // NOLINT

  bool byRank() const { return rank_ >= 0 || name_.empty(); }
  int rank() const { return rank_; }
  const std::string& name() const { return name_; }
  std::string toString() const { return byRank() ? "rank " + std::to_string(rank_) : "'" + name_ + "'"; }

 private:
  int rank_ = -1;
  std::string name_;
};

struct ShutdownOptions {
  bool graceful = true;
  // How long the graceful barrier's drain may take once every worker has joined (the wait for the
  // others to join has no deadline); unset: Options::shutdownTimeout.
  std::optional<std::chrono::milliseconds> timeout = std::nullopt;
};

struct ShutdownReport {
  bool graceful = true;
  // The workers lost while the job ran (dead, as the failure detection judged it, here or on the
  // worker that told this one), and those still busy when the drain's timeout expired.
  std::vector<std::string> missing;
  bool clean() const { return missing.empty(); }
};

struct AgentStats {
  size_t pendingOutgoing = 0;   // calls sent and not yet answered, timed out or failed
  size_t activeIncoming = 0;    // calls received and not yet answered or dropped
  uint64_t callsSent = 0;
  uint64_t callsServed = 0;     // responses sent
  uint64_t timeouts = 0;        // calls that failed with TimeoutError
  uint64_t lateResponses = 0;   // responses for calls no longer pending, dropped
  uint64_t cancelsReceived = 0;
  uint64_t connectionsRejected = 0;  // closed for a protocol violation or a failed handshake
  uint64_t writeSyscalls = 0;   // writev calls (frames / writeSyscalls = coalescing)
  uint64_t framesWritten = 0;
  // Bytes this agent's connections wrote to and read from their sockets (frames, headers and
  // heartbeats included; the store's connection is not an agent connection).
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
  size_t liveConnections = 0;
  // The longest stall of this agent's loop thread (housekeeping ran late: the process was not
  // scheduled or was stopped, or the loop was held up), 0 when none passed 50 ms. Heartbeat
  // silence leaves out the part of each stall beyond half a heartbeat interval, so failure
  // detection can be late by up to as much.
  std::chrono::milliseconds longestStall{0};
};

// Per-agent state of a layer above rpc (rref/, dist_autograd/). A layer installs a factory once
// per program (Agent::installExtension, from an inline variable in its header); every Agent
// constructed afterwards builds one instance, which registers the layer's reserved functions
// (Registry::implOnLoop) and is told about the events below.
class AgentExtension {
 public:
  virtual ~AgentExtension() = default;
  // Loop thread, in arrival order: a call or response flagged as carrying remote references
  // arrived from peerRank, before it is dispatched, or dropped (an unknown function, a late
  // response). Attach what its values need to the frame (IncomingFrame::attach).
  virtual void onIncomingFrame(int peerRank, IncomingFrame& frame) {}
  // Loop thread: the connection to `rank` ended; the calls pending on it have failed.
  virtual void onPeerFailed(int rank, const Status& why) {}
  // The thread calling shutdown({.graceful = true}), once every worker has joined the barrier (the
  // job has ended) and before the calls still in flight are drained; not called when the barrier
  // fails. Calls made with CallOptions::duringShutdown still go out.
  virtual void onShutdownBegin() {}
  // The calling thread: a call to peerRank was encoded (enc.gradTensors() are the tensors that
  // require grad among its arguments). The layer may fill call.initAutograd() and keep
  // bookkeeping that enc.onDiscard undoes if the frame is never sent.
  virtual void onOutgoingCall(int peerRank, uint64_t functionId, EncodeContext& enc, wire::Call::Builder call) {}
  // The thread encoding a response to a call from peerRank that carried the distributed
  // autograd context `contextId` (0: none); as onOutgoingCall.
  virtual void onOutgoingResponse(int peerRank, int64_t contextId, EncodeContext& enc,
                                  wire::Response::Builder response) {}
  // Loop thread, in arrival order, before the frame is dispatched (or dropped): a call (isCall)
  // or response from peerRank carries an AutogradInfo. Attach what its tensors need
  // (IncomingFrame::attach<FrameAutograd>).
  virtual void onIncomingAutograd(int peerRank, IncomingFrame& frame, wire::AutogradInfo::Reader info, bool isCall) {}
  // Loop thread, on the agent's housekeeping tick (every 10 ms) while it is running.
  virtual void onTick() {}
  // Any thread: true while the layer has bookkeeping in flight; the shutdown barrier waits.
  virtual bool busy() const { return false; }
  // After shutdown closed every connection and stopped the handler pool.
  virtual void onClosed() {}
};

namespace detail {

// Receives the outcome of one outgoing call; built by Agent::callAsync for the
// declared result type. Exactly one of complete/fail is called, on the loop
// thread or the thread that failed the call.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void complete(const IncomingFrame& frame, wire::Value::Reader value) = 0;
  virtual void fail(Status status) = 0;
  virtual void failWith(std::exception_ptr error) = 0;
};

template <class R>
class TypedSink final : public ResponseSink {
 public:
  TypedSink(Promise<R> promise, const std::string& function) : promise_(std::move(promise)), function_(function) {}
  void complete(const IncomingFrame& frame, wire::Value::Reader value) override {
    try {
      if constexpr (std::is_void_v<R>) {
        if (value.which() != wire::Value::NONE) {
          throw ProtocolError(function_ + ": result: expected none, got " + describeKind(value));
        }
        promise_.trySetValue();
      } else {
        DecodeContext dec(frame);
        promise_.trySetValue(decodeResult<R>(function_, value, dec));
      }
    } catch (const kj::Exception& e) {
      promise_.trySetError(Status::protocol(function_ + ": result: malformed value: " + e.getDescription().cStr()));
    } catch (...) {
      promise_.trySetError(std::current_exception());
    }
  }
  void fail(Status status) override { promise_.trySetError(std::move(status)); }
  void failWith(std::exception_ptr error) override { promise_.trySetError(std::move(error)); }

 private:
  Promise<R> promise_;
  const std::string& function_;  // the Function's name; the Function outlives its calls
};

}  // namespace detail

class Agent {
 public:
  // Validates options (InvalidArgumentError) and starts the loop thread;
  // nothing touches the network before start().
  explicit Agent(Options options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  Registry& registry();
  const Options& options() const;

  // See "Start" above. Once only (StateError otherwise).
  void start();
  bool started() const;

  const std::string& name() const;
  int rank() const;
  int worldSize() const;
  // Every worker of the job, this one included, ordered by rank. After start().
  std::vector<WorkerInfo> workers() const;
  // The worker `to` names; NotFoundError when none does.
  WorkerInfo worker(const WorkerRef& to) const;
  // False once the connection to that worker has failed (always true for self).
  bool isAlive(const WorkerRef& to) const;
  // "host:port" this agent's RPC listener is bound to. After start().
  std::string listenAddress() const;
  uint16_t listenPort() const;

  template <class R, class... A>
  Future<R> callAsync(const WorkerRef& to, const Function<R(A...)>& fn,
                  std::type_identity_t<const std::decay_t<A>&>... args) {
    return callAsync(to, fn, CallOptions{}, args...);
  }
  template <class R, class... A>
  Future<R> callAsync(const WorkerRef& to, const Function<R(A...)>& fn, const CallOptions& opts,
                  std::type_identity_t<const std::decay_t<A>&>... args);

  template <class R, class... A>
  R call(const WorkerRef& to, const Function<R(A...)>& fn, std::type_identity_t<const std::decay_t<A>&>... args) {
    return callAsync(to, fn, CallOptions{}, args...).get();
  }
  template <class R, class... A>
  R call(const WorkerRef& to, const Function<R(A...)>& fn, const CallOptions& opts,
         std::type_identity_t<const std::decay_t<A>&>... args) {
    return callAsync(to, fn, opts, args...).get();
  }

  // Remote references (defined in rref/rref.h, which a program using them includes):
  //   RRef<PS> ps = agent.remote<PS>("ps", 0.03);       // builds a remote class on "ps"
  //   RRef<Tensor> t = agent.remote("w1", add, a, b);   // keeps a function's result on "w1"
  // Both return at once; see rref/rref.h.
  template <class T, class... Args>
  RRef<T> remote(const WorkerRef& to, const Args&... args);
  template <class R, class... A>
  RRef<R> remote(const WorkerRef& to, const Function<R(A...)>& fn,
                 std::type_identity_t<const std::decay_t<A>&>... args);

  // For layers above rpc: sends a call to `function` whose arguments fill(EncodeContext&,
  // wire::Call::Builder) writes (call.initArgs(n) and the values), and decodes the result as
  // R. Errors name `label` (default: the function), e.g. the remote method a reserved function
  // runs. `function` and `label` must outlive the call (static or declared names). Errors as
  // for callAsync().
  template <class R, class Fill>
  Future<R> callWith(const WorkerRef& to, const std::string& function, uint64_t functionId, const CallOptions& opts,
                     Fill&& fill, const std::string* label = nullptr);

  // Runs task on the handler pool; false (task dropped) once shutdown stopped the pool.
  bool post(std::function<void()> task);

  // The rank of the worker `to` names; NotFoundError when none does.
  int rankOf(const WorkerRef& to) const;

  // Layers above rpc, see AgentExtension.
  using ExtensionFactory = std::shared_ptr<AgentExtension> (*)(Agent&);
  static bool installExtension(const void* tag, ExtensionFactory factory);
  // This agent's instance of extension E (installed under typeTag<E>()); StateError if none.
  template <class E>
  E& extension() const {
    AgentExtension* e = findExtension(typeTag<E>());
    WEFT_ENFORCE(e != nullptr, StateError, "Agent: a layer this program uses was installed after the agent was built");
    return static_cast<E&>(*e);
  }

  // See "Shutdown" above. Idempotent: a second call returns the first report.
  ShutdownReport shutdown(ShutdownOptions opts = {});

  AgentStats stats() const;

  // The rendezvous store this agent joined through (for process groups and
  // other layers that rendezvous). After start().
  StoreClient& store();
  UvLoop& loop();

 private:
  class Impl;

  // Sends a call whose message in `writer` has its arguments encoded; fills in
  // the envelope and hands the outcome to sink. Never throws: every failure
  // (agent not started, peer dead) goes to the sink. True when the frame was
  // handed to the connection.
  bool sendCall(int rank, const std::string& function, uint64_t functionId, const CallOptions& opts,
                FrameWriter& writer, std::unique_ptr<detail::ResponseSink> sink, const std::string& label);
  AgentExtension* findExtension(const void* tag) const;
  void notifyOutgoingCall(int rank, uint64_t functionId, EncodeContext& enc, wire::Call::Builder call);

  std::unique_ptr<Impl> impl_;
};

// ---- implementation -------------------------------------------------------------

template <class R, class Fill>
Future<R> Agent::callWith(const WorkerRef& to, const std::string& function, uint64_t functionId,
                          const CallOptions& opts, Fill&& fill, const std::string* label) {
  Promise<R> promise;
  Future<R> result = promise.getFuture();
  const std::string& name = label != nullptr ? *label : function;
  auto sink = std::make_unique<detail::TypedSink<R>>(std::move(promise), name);
  try {
    int peer = rankOf(to);
    FrameWriter writer;
    auto call = writer.message().initCall();
    EncodeContext enc(writer, this, peer);
    fill(enc, call);
    notifyOutgoingCall(peer, functionId, enc, call);
    if (enc.hasRRefs()) call.setFlags(call.getFlags() | wire::CALL_FLAG_HAS_RREFS);
    if (sendCall(peer, function, functionId, opts, writer, std::move(sink), name)) enc.commit();
  } catch (...) {
    // Encoding failed before sendCall took the sink (which never throws after).
    if (!sink) throw;
    sink->failWith(std::current_exception());
  }
  return result;
}

template <class R, class... A>
Future<R> Agent::callAsync(const WorkerRef& to, const Function<R(A...)>& fn, const CallOptions& opts,
                       std::type_identity_t<const std::decay_t<A>&>... args) {
  return callWith<R>(to, fn.name(), fn.id(), opts, [&](EncodeContext& enc, wire::Call::Builder call) {
    encodeArguments(enc, call.initArgs(sizeof...(A)), args...);
  });
}

}  // namespace weft::rpc
