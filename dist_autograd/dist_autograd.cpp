// Distributed autograd: contexts, recording messages, the FAST-mode backward pass across workers
// and the release protocol (rpc/protocol.capnp, "Distributed autograd"). The send and recv nodes
// that recording puts into the local graphs are in nodes.cpp, the id layout in ids.h.
//
// Threads: calls and results are recorded on the thread that encodes them. Recorded frames, the
// backward and release requests, the batched releases (onTick) and a peer's death reach the
// layer on the loop thread, which never waits for a pass: a backward request runs on a handler
// pool thread, or on a thread waiting in Context::backward, which runs its own pass. ContextState
// says which lock guards what.
#include "dist_autograd/dist_autograd.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_set>

#include "common/logging.h"
#include "dist_autograd/ids.h"
#include "dist_autograd/nodes.h"
#include "rpc/uv_loop.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::dist_autograd {

namespace {

using Clock = std::chrono::steady_clock;

const std::string kBackward = "weft.autograd.backward";
const std::string kRelease = "weft.autograd.release";
const uint64_t kBackwardId = rpc::nameId(kBackward);
const uint64_t kReleaseId = rpc::nameId(kRelease);

// Bounds on what a peer may make this worker hold.
constexpr size_t kMaxContexts = size_t{1} << 20;
constexpr uint32_t kMaxGradTensors = 1u << 16;
// Releases queued for one worker are sent when this many are waiting, or after kReleaseDelay.
constexpr size_t kReleaseBatch = 64;
constexpr auto kReleaseDelay = std::chrono::milliseconds(50);
// Ids of released contexts remembered, so that a late message does not recreate one.
constexpr size_t kTombstones = size_t{1} << 16;

const rpc::CallOptions kControl{.timeout = std::chrono::milliseconds(0), .duringShutdown = true};

}  // namespace

class DistAutogradExtension;

// ---- contexts -----------------------------------------------------------------------------------

void GradientMap::accumulate(const Tensor& t, const Tensor& g) {
  auto it = entries_.find(t.impl());
  if (it == entries_.end()) {
    entries_.emplace(t.impl(), std::make_pair(t, autograd::ownedGradient(g)));
  } else {
    it->second.second = autograd::accumulate(it->second.second, g);
  }
}

const Tensor& GradientMap::at(const Tensor& t) const {
  auto it = entries_.find(t.impl());
  WEFT_ENFORCE(it != entries_.end(), NotFoundError, "dist_autograd: the context holds no gradient for this tensor (shape ",
               shapeString(t.shape()), ")");
  return it->second.second;
}

Tensor GradientMap::get(const Tensor& t) const {
  auto it = entries_.find(t.impl());
  return it == entries_.end() ? Tensor() : it->second.second;
}

bool GradientMap::contains(const Tensor& t) const { return entries_.count(t.impl()) != 0; }

std::vector<std::pair<Tensor, Tensor>> GradientMap::items() const {
  std::vector<std::pair<Tensor, Tensor>> out;
  out.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) out.push_back(entry);
  return out;
}

// One context on one worker.
//
// Two locks. mutex_ guards what any thread may look at: the workers reached, the send nodes, the
// gradients, the current pass's task and whether (and why) the context was released. It is held
// only briefly, and the loop thread takes it (recording, releases, a peer's death), never
// runMutex_: the loop never waits for a pass. runMutex_ serialises running the context's passes
// (a GraphTask is not thread-safe) and guards the pass's parameters and the requests it sent; a
// thread takes it before mutex_, never while holding mutex_. A pass's task is shared by the
// context and the thread running it: a release takes the task out of the context under mutex_,
// and the runner, which holds its own reference, checks under mutex_ that the context is still
// usable and the task still its pass each time it resumes, and otherwise fails the pass with the
// context's failure. No thread ever uses a task through the context after it was dropped.
class ContextState : public std::enable_shared_from_this<ContextState> {
 public:
  ContextState(DistAutogradExtension& layer, int64_t id) : layer_(layer), id_(id) {}

  DistAutogradExtension& layer() { return layer_; }
  int64_t id() const { return id_; }

  std::mutex mutex_;
  std::set<int> workers_;  // the workers this context exchanged messages with
  std::unordered_map<int64_t, std::shared_ptr<SendNode>> sendNodes_;
  GradientMap grads_;
  std::shared_ptr<GraphTask> task_;  // the current pass, shared with the thread running it
  bool backwardRunning_ = false;     // Context::backward is running on this worker
  // Why the context can no longer be used (released, or a worker it reached died).
  bool released_ = false;
  Status failure_;

  std::mutex runMutex_;
  int64_t passId_ = 0;
  rpc::CallOptions passCall_;
  bool passRetain_ = false;
  std::vector<Future<void>> outstanding_;  // backward requests sent by the pass's nodes

  // mutex_ held.
  void throwIfUnusable() const {
    if (!failure_.ok()) throwStatus(failure_);
    WEFT_ENFORCE(!released_, StateError, "distributed autograd context ", idString(id_), " was released");
  }

  // mutex_ held: why the pass running `task` cannot go on (the context was released, or another
  // pass replaced it), or null.
  std::exception_ptr passGone(const std::shared_ptr<GraphTask>& task) const {
    if (std::exception_ptr e = unusable()) return e;
    if (task_ == task) return nullptr;
    return std::make_exception_ptr(StateError("distributed autograd context " + idString(id_) +
                                              ": another backward pass replaced the one running"));
  }

  // mutex_ held: what throwIfUnusable would throw, or null.
  std::exception_ptr unusable() const {
    try {
      throwIfUnusable();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  // Starts pass `passId` (runMutex_ held, not mutex_): dependencies from `roots` and every send
  // node. StateError (or the context's failure) when the context was released.
  std::shared_ptr<GraphTask> startPass(int64_t passId, bool retainGraph,
                                       std::optional<std::chrono::milliseconds> timeout,
                                       std::vector<std::shared_ptr<Node>> roots) {
    weft::BackwardOptions options;
    options.retainGraph = retainGraph;
    options.leafSink = [this](const Tensor& leaf, const Tensor& g) {
      std::lock_guard<std::mutex> lock(mutex_);
      grads_.accumulate(leaf, g);
    };
    auto task = std::make_shared<GraphTask>(std::move(options));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      throwIfUnusable();
      for (auto& [id, node] : sendNodes_) roots.push_back(node);
      task_ = task;
    }
    passId_ = passId;
    passCall_ = rpc::CallOptions{.timeout = timeout};
    passRetain_ = retainGraph;
    task->computeDependencies(roots);
    return task;
  }

  // What a released context held: the workers it reached, and its graph (freed by whoever takes
  // it, outside the locks, unless a thread running a pass still holds the task).
  struct Dropped {
    std::set<int> workers;
    std::unordered_map<int64_t, std::shared_ptr<SendNode>> sendNodes;
    std::shared_ptr<GraphTask> task;
  };
  // Marks the context released (a later use raises `why` when it is an error and no other failure
  // came first, else StateError) and takes what it held; nothing when it was released already.
  std::optional<Dropped> drop(const Status& why = Status()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (released_) return std::nullopt;
    released_ = true;
    if (failure_.ok() && !why.ok()) failure_ = why;
    Dropped d;
    d.workers.swap(workers_);
    d.sendNodes.swap(sendNodes_);
    d.task.swap(task_);
    return d;
  }

 private:
  DistAutogradExtension& layer_;
  int64_t id_;
};

namespace {

// The context current on this thread and the layer (agent) it belongs to.
struct Current {
  DistAutogradExtension* layer = nullptr;
  std::shared_ptr<ContextState> state;
};
thread_local Current tCurrent;

// The context whose pass this thread is running (its runMutex_ held), or null.
thread_local ContextState* tPass = nullptr;

class PassScope {
 public:
  explicit PassScope(ContextState* state) : previous_(tPass) { tPass = state; }
  ~PassScope() { tPass = previous_; }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;

 private:
  ContextState* previous_;
};

class ScopeToken {
 public:
  explicit ScopeToken(Current next) : previous_(std::move(tCurrent)) { tCurrent = std::move(next); }
  ~ScopeToken() { tCurrent = std::move(previous_); }
  ScopeToken(const ScopeToken&) = delete;
  ScopeToken& operator=(const ScopeToken&) = delete;

 private:
  Current previous_;
};

// Completes when every input has completed: with the first error among `local` and the inputs
// (none when ignoreErrors), else with a value. Unlike whenAll it never completes early.
Future<void> settleAll(std::vector<Future<void>> inputs, std::exception_ptr local, bool ignoreErrors = false) {
  if (inputs.empty()) return local ? makeErrorFuture<void>(local) : makeReadyFuture();
  struct Shared {
    std::mutex mutex;
    size_t left;
    std::exception_ptr first;
    Promise<void> done;
  };
  auto shared = std::make_shared<Shared>();
  shared->left = inputs.size();
  shared->first = local;
  Future<void> result = shared->done.getFuture();
  for (auto& f : inputs) {
    f.onComplete([shared, ignoreErrors](const Future<void>& g) {
      std::exception_ptr e = g.hasError() && !ignoreErrors ? g.exception() : nullptr;
      bool last = false;
      {
        std::lock_guard<std::mutex> lock(shared->mutex);
        if (e && !shared->first) shared->first = e;
        last = --shared->left == 0;
      }
      if (!last) return;
      if (shared->first) {
        shared->done.trySetError(shared->first);
      } else {
        shared->done.trySetValue();
      }
    });
  }
  return result;
}

}  // namespace

// ---- the layer ----------------------------------------------------------------------------------

class DistAutogradExtension final : public rpc::AgentExtension, public std::enable_shared_from_this<DistAutogradExtension> {
 public:
  explicit DistAutogradExtension(rpc::Agent& agent) : agent_(agent) {}

  void registerFunctions() {
    auto& reg = agent_.registry();
    reg.implOnLoop(kBackward, [this](const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
      return onBackward(ctx, std::move(frame));
    });
    reg.implOnLoop(kRelease, [this](const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
      return onRelease(ctx, std::move(frame));
    });
  }

  rpc::Agent& agent() { return agent_; }

  int64_t newId() {
    return static_cast<int64_t>((static_cast<uint64_t>(agent_.rank()) << kRankShift) |
                                (counter_.fetch_add(1, std::memory_order_relaxed) & kCounterMask));
  }

  std::shared_ptr<ContextState> create() {
    auto state = std::make_shared<ContextState>(*this, newId());
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_ENFORCE(!closed_, StateError, "dist_autograd: worker '", agent_.name(), "' has shut down its agent");
    contexts_.emplace(state->id(), state);
    return state;
  }

  std::shared_ptr<ContextState> find(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = contexts_.find(id);
    return it == contexts_.end() ? nullptr : it->second;
  }

  // The context `id`, or the error a use of it raises.
  std::shared_ptr<ContextState> require(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = contexts_.find(id);
    if (it != contexts_.end()) return it->second;
    auto f = failures_.find(id);
    if (f != failures_.end()) throwStatus(f->second);
    throw NotFoundError("worker '" + agent_.name() + "' has no distributed autograd context " + idString(id) +
                        " (released, or never reached by a call)");
  }

  // ---- recording ----

  void onOutgoingCall(int peer, uint64_t functionId, rpc::EncodeContext& enc, rpc::wire::Call::Builder call) override {
    if (tCurrent.layer != this || functionId == kBackwardId || functionId == kReleaseId) return;
    std::shared_ptr<ContextState> state = tCurrent.state;
    std::lock_guard<std::mutex> lock(state->mutex_);
    if (state->released_ || !state->failure_.ok()) return;
    auto info = call.initAutograd();
    record(*state, peer, enc, info);
  }

  void onOutgoingResponse(int peer, int64_t contextId, rpc::EncodeContext& enc,
                          rpc::wire::Response::Builder response) override {
    if (contextId == 0 || enc.gradTensors().empty()) return;
    std::shared_ptr<ContextState> state = find(contextId);
    if (!state) return;
    std::lock_guard<std::mutex> lock(state->mutex_);
    if (state->released_ || !state->failure_.ok()) return;
    auto info = response.initAutograd();
    record(*state, peer, enc, info);
  }

  // state->mutex_ held.
  void record(ContextState& state, int peer, rpc::EncodeContext& enc, rpc::wire::AutogradInfo::Builder info) {
    state.workers_.insert(peer);
    info.setContextId(state.id());
    const std::vector<Tensor>& tensors = enc.gradTensors();
    if (tensors.empty()) return;
    int64_t messageId = newId();
    state.sendNodes_.emplace(messageId, std::make_shared<SendNode>(messageId, tensors));
    info.setMessageId(messageId);
    info.setGradTensors(static_cast<uint32_t>(tensors.size()));
    enc.onDiscard([weak = std::weak_ptr<ContextState>(state.shared_from_this()), messageId] {
      if (auto s = weak.lock()) {
        std::lock_guard<std::mutex> lock(s->mutex_);
        s->sendNodes_.erase(messageId);
      }
    });
  }

  // What a recorded frame carries: its recv node, and the context its user code runs in.
  class FrameLink final : public rpc::FrameAutograd {
   public:
    FrameLink(DistAutogradExtension& layer, std::shared_ptr<ContextState> state, std::shared_ptr<RecvNode> recv)
        : layer_(layer), state_(std::move(state)), recv_(std::move(recv)) {}
    void link(Tensor& t, uint32_t slot) override {
      if (recv_) {
        recv_->link(t, slot);
      } else {
        t.requiresGrad_(true);
      }
    }
    std::shared_ptr<void> enterScope() override {
      return std::make_shared<ScopeToken>(Current{&layer_, state_});
    }

   private:
    DistAutogradExtension& layer_;
    std::shared_ptr<ContextState> state_;
    std::shared_ptr<RecvNode> recv_;
  };

  void checkId(int64_t id, const char* what) const {
    auto u = static_cast<uint64_t>(id);
    if ((u >> kRankShift) >= static_cast<uint64_t>(agent_.worldSize()) || (u & kCounterMask) == 0) {
      throw ProtocolError(std::string("a malformed distributed autograd ") + what + " id " + std::to_string(id));
    }
  }

  void onIncomingAutograd(int peer, rpc::IncomingFrame& frame, rpc::wire::AutogradInfo::Reader info,
                          bool isCall) override {
    int64_t contextId = info.getContextId();
    int64_t messageId = info.getMessageId();
    uint32_t n = info.getGradTensors();
    checkId(contextId, "context");
    if (messageId != 0) checkId(messageId, "message");
    if ((messageId == 0) != (n == 0) || n > kMaxGradTensors) {
      throw ProtocolError("a distributed autograd message with id " + std::to_string(messageId) + " and " +
                          std::to_string(n) + " tensors that require grad");
    }
    std::shared_ptr<ContextState> state;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = contexts_.find(contextId);
      if (it != contexts_.end()) {
        state = it->second;
      } else if (isCall && !closed_ && !tombstones_.count(contextId)) {
        if (contexts_.size() >= kMaxContexts) {
          throw ProtocolError("more than " + std::to_string(kMaxContexts) + " distributed autograd contexts");
        }
        state = std::make_shared<ContextState>(*this, contextId);
        contexts_.emplace(contextId, state);
      }
    }
    if (!state) return;  // released: the message runs outside any context
    {
      std::lock_guard<std::mutex> lock(state->mutex_);
      if (state->released_) return;
      state->workers_.insert(peer);
    }
    std::shared_ptr<RecvNode> recv;
    if (messageId != 0) recv = std::make_shared<RecvNode>(state, peer, messageId, n);
    frame.attach<rpc::FrameAutograd>(std::make_shared<FrameLink>(*this, std::move(state), std::move(recv)));
  }

  // ---- backward ----

  Future<void> sendBackward(int peer, int64_t contextId, int64_t passId, int64_t messageId, bool retainGraph,
                            const std::vector<Tensor>& grads, const rpc::CallOptions& opts) {
    backwardRequests_.fetch_add(1, std::memory_order_relaxed);
    return agent_.callWith<void>(peer, kBackward, kBackwardId, opts,
                                 [&](rpc::EncodeContext& enc, rpc::wire::Call::Builder call) {
                                   rpc::encodeArguments(enc, call.initArgs(1),
                                                        std::make_tuple(contextId, passId, messageId, retainGraph, grads));
                                 });
  }

  Future<rpc::HeldValue> onBackward(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
    rpc::DecodeContext dec(*frame);
    auto [request] = rpc::decodeArguments<std::tuple<int64_t, int64_t, int64_t, bool, std::vector<Tensor>>>(
        kBackward, frame->message().getCall().getArgs(), dec);
    auto [contextId, passId, messageId, retainGraph, grads] = std::move(request);
    checkId(contextId, "context");
    checkId(passId, "pass");
    Promise<rpc::HeldValue> answer;
    Future<rpc::HeldValue> result = answer.getFuture();
    std::string caller = ctx.callerName;
    auto job = std::make_shared<std::function<void()>>([self = shared_from_this(), answer, contextId, passId,
                                                             messageId, retainGraph, grads = std::move(grads),
                                                             caller]() mutable {
      ScopeToken outside(Current{});  // a waiting backward() may run it: not in that thread's context
      Future<void> done;
      try {
        done = self->runRequest(contextId, passId, messageId, retainGraph, std::move(grads), caller);
      } catch (...) {
        done = makeErrorFuture<void>(std::current_exception());
      }
      done.onComplete([answer](const Future<void>& f) mutable {
        if (f.hasError()) {
          answer.trySetError(f.exception());
        } else {
          answer.trySetValue(rpc::HeldValue::none());
        }
      });
    });
    {
      std::lock_guard<std::mutex> lock(requestMutex_);
      requests_.push_back(job);
    }
    requestReady_.notify_all();
    if (!agent_.post([self = shared_from_this()] { self->runOneRequest(); })) {
      bool mine = false;
      {
        std::lock_guard<std::mutex> lock(requestMutex_);
        auto it = std::find(requests_.begin(), requests_.end(), job);
        if (it != requests_.end()) {
          requests_.erase(it);
          mine = true;
        }
      }
      if (mine) answer.trySetError(Status::cancelled("the agent shut down"));
    }
    return result;
  }

  // Backward requests wait in requests_ for the first of a pool thread (one is posted per
  // request) and a thread waiting in Context::backward (waitHelping). The latter lets backward()
  // run on a handler thread: the requests its pass (or another pass it waits for) brings back to
  // this worker do not need a free handler thread.
  void runOneRequest() {
    std::shared_ptr<std::function<void()>> request;
    {
      std::lock_guard<std::mutex> lock(requestMutex_);
      if (requests_.empty()) return;
      request = std::move(requests_.front());
      requests_.pop_front();
    }
    (*request)();
  }

  // Waits until `done` completes, running the backward requests that reach this worker meanwhile.
  void waitHelping(const Future<void>& done) {
    done.onComplete([self = shared_from_this()](const Future<void>&) {
      std::lock_guard<std::mutex> lock(self->requestMutex_);
      self->requestReady_.notify_all();
    });
    for (;;) {
      std::shared_ptr<std::function<void()>> request;
      {
        std::unique_lock<std::mutex> lock(requestMutex_);
        requestReady_.wait(lock, [&] { return done.isReady() || !requests_.empty(); });
        if (done.isReady()) return;
        request = std::move(requests_.front());
        requests_.pop_front();
      }
      (*request)();
    }
  }

  // A pool thread: runs the send node of `messageId` with the gradients a recv node sent.
  Future<void> runRequest(int64_t contextId, int64_t passId, int64_t messageId, bool retainGraph,
                          std::vector<Tensor> grads, const std::string& caller) {
    std::shared_ptr<ContextState> state = require(contextId);
    std::exception_ptr failure;
    std::vector<Future<void>> pending;
    {
      std::lock_guard<std::mutex> run(state->runMutex_);
      PassScope scope(state.get());
      std::shared_ptr<SendNode> send;
      std::shared_ptr<GraphTask> task;
      {
        std::lock_guard<std::mutex> lock(state->mutex_);
        state->throwIfUnusable();
        auto it = state->sendNodes_.find(messageId);
        WEFT_ENFORCE(it != state->sendNodes_.end(), NotFoundError, "distributed autograd context ",
                     idString(contextId), " on worker '", agent_.name(), "' has no message ", idString(messageId));
        send = it->second;
        if (grads.size() != send->outputs().size()) {
          throw ProtocolError("'" + caller + "' sent " + std::to_string(grads.size()) + " gradients for message " +
                              idString(messageId) + ", which carried " + std::to_string(send->outputs().size()) +
                              " tensors that require grad");
        }
        if (passId == state->passId_) task = state->task_;
        if (!task) {
          WEFT_ENFORCE(state->passId_ == 0 || passId > state->passId_ || creatorOf(passId) != creatorOf(state->passId_),
                       StateError, "a backward request of an earlier pass of context ", idString(contextId));
          WEFT_ENFORCE(!state->backwardRunning_, StateError, "a backward request of another pass of context ",
                       idString(contextId), " while its backward pass runs on worker '", agent_.name(), "'");
        }
      }
      if (!task) task = state->startPass(passId, retainGraph, std::nullopt, {});
      try {
        for (size_t i = 0; i < grads.size(); ++i) {
          if (grads[i].defined()) task->deliver({send, static_cast<uint32_t>(i)}, grads[i]);
        }
        task->schedule(send.get());
        task->run();
        task->runCallbacks();
      } catch (...) {
        failure = std::current_exception();
      }
      pending.swap(state->outstanding_);
    }
    return settleAll(std::move(pending), failure);
  }

  // ---- release ----

  // Drops `state` here and queues its release for the workers it reached. With `now`, sends
  // those workers' queues at once and returns when they answered.
  Future<void> release(const std::shared_ptr<ContextState>& state, bool now) {
    std::optional<ContextState::Dropped> dropped = state->drop();
    if (!dropped) return makeReadyFuture();
    dropped->workers.erase(agent_.rank());
    Batches batches;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int w : queueRelease(state->id(), dropped->workers)) {
        if (now || pendingRelease_[w].size() >= kReleaseBatch) batches.emplace_back(w, takeQueued(w));
      }
    }
    return sendAll(batches);
  }

  // mutex_ held: forgets `id` and queues its release for each of `workers` still alive; returns
  // those workers.
  std::vector<int> queueRelease(int64_t id, const std::set<int>& workers) {
    forget(id);
    std::vector<int> queued;
    for (int w : workers) {
      if (deadPeers_.count(w)) continue;
      pendingRelease_[w].push_back(id);
      queued.push_back(w);
    }
    return queued;
  }

  // mutex_ held: removes `id` from the table and remembers it.
  void forget(int64_t id) {
    contexts_.erase(id);
    if (tombstones_.insert(id).second) {
      tombstoneOrder_.push_back(id);
      if (tombstoneOrder_.size() > kTombstones) {
        tombstones_.erase(tombstoneOrder_.front());
        failures_.erase(tombstoneOrder_.front());
        tombstoneOrder_.pop_front();
      }
    }
  }

  // mutex_ held: takes the releases queued for worker w (counted in flight until sent and
  // answered, see sendRelease).
  std::vector<int64_t> takeQueued(int w) {
    auto it = pendingRelease_.find(w);
    if (it == pendingRelease_.end()) return {};
    std::vector<int64_t> ids = std::move(it->second);
    pendingRelease_.erase(it);
    if (!ids.empty()) ++inflight_;
    return ids;
  }

  // No lock held (the answer may complete at once, on this thread): sends a batch takeQueued made.
  Future<void> sendRelease(int w, const std::vector<int64_t>& ids) {
    releaseMessages_.fetch_add(1, std::memory_order_relaxed);
    Future<void> f = agent_.callWith<void>(w, kRelease, kReleaseId, kControl,
                                           [&](rpc::EncodeContext& enc, rpc::wire::Call::Builder call) {
                                             rpc::encodeArguments(enc, call.initArgs(1), ids);
                                           });
    f.onComplete([self = shared_from_this(), w](const Future<void>& g) {
      if (g.hasError()) {
        WEFT_LOG(Debug) << "dist_autograd: releasing contexts on rank " << w << " failed: " << g.status().message();
      }
      std::lock_guard<std::mutex> lock(self->mutex_);
      --self->inflight_;
    });
    return f;
  }

  using Batches = std::vector<std::pair<int, std::vector<int64_t>>>;

  Future<void> sendAll(const Batches& batches) {
    std::vector<Future<void>> sent;
    for (const auto& [w, ids] : batches) sent.push_back(sendRelease(w, ids));
    return settleAll(std::move(sent), nullptr, true);
  }

  Future<void> flushAll() {
    Batches batches;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<int> ws;
      for (auto& [w, ids] : pendingRelease_) ws.push_back(w);
      for (int w : ws) {
        auto ids = takeQueued(w);
        if (!ids.empty()) batches.emplace_back(w, std::move(ids));
      }
      lastFlush_ = Clock::now();
    }
    return sendAll(batches);
  }

  Future<rpc::HeldValue> onRelease(const rpc::CallContext& ctx, std::shared_ptr<rpc::IncomingFrame> frame) {
    rpc::DecodeContext dec(*frame);
    auto [ids] = rpc::decodeArguments<std::vector<int64_t>>(kRelease, frame->message().getCall().getArgs(), dec);
    std::vector<std::shared_ptr<ContextState>> states;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int64_t id : ids) {
        auto it = contexts_.find(id);
        if (it != contexts_.end()) {
          states.push_back(it->second);
        } else {
          forget(id);  // a late message must not recreate it
        }
      }
    }
    std::vector<std::pair<int64_t, ContextState::Dropped>> dropped;  // freed outside the locks
    for (auto& state : states) {
      // The creator's context released by another worker: only after a failure there.
      Status why = creatorOf(state->id()) == agent_.rank()
                       ? Status::disconnected("distributed autograd context " + idString(state->id()) +
                                              " was released by worker '" + ctx.callerName +
                                              "' after a worker it reached failed")
                       : Status();
      std::optional<ContextState::Dropped> d = state->drop(why);
      if (!d) continue;
      d->workers.erase(ctx.callerRank);
      d->workers.erase(agent_.rank());
      dropped.emplace_back(state->id(), std::move(*d));
    }
    Batches batches;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::set<int> touched;
      for (auto& [id, d] : dropped) {
        for (int w : queueRelease(id, d.workers)) touched.insert(w);
      }
      for (int w : touched) batches.emplace_back(w, takeQueued(w));
    }
    dropped.clear();
    return sendAll(batches).then([] { return rpc::HeldValue::none(); });
  }

  // ---- agent events ----

  void onTick() override {
    bool due = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      due = !pendingRelease_.empty() && Clock::now() - lastFlush_ >= kReleaseDelay;
    }
    if (due) flushAll();
  }

  void onShutdownBegin() override { flushAll(); }

  bool busy() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inflight_ != 0 || !pendingRelease_.empty();
  }

  void onPeerFailed(int rank, const Status& why) override {
    std::vector<std::shared_ptr<ContextState>> hit;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      deadPeers_.insert(rank);
      pendingRelease_.erase(rank);
      for (auto& [id, state] : contexts_) hit.push_back(state);
    }
    const std::string name = agent_.worker(rank).name;
    for (auto& state : hit) {
      Status failure;
      {
        std::lock_guard<std::mutex> lock(state->mutex_);
        if (state->workers_.count(rank) == 0 && creatorOf(state->id()) != rank) continue;
        if (state->failure_.ok()) {
          state->failure_ = Status::disconnected("distributed autograd context " + idString(state->id()) +
                                                 " was released on worker '" + agent_.name() + "': worker '" + name +
                                                 "', which it reached, failed (" + why.message() + ")");
        }
        failure = state->failure_;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        failures_[state->id()] = failure;
      }
      release(state, false);
    }
  }

  void onClosed() override {
    std::unordered_map<int64_t, std::shared_ptr<ContextState>> left;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
      atClose_ = countsLocked();
      left.swap(contexts_);
      pendingRelease_.clear();
    }
    for (auto& [id, state] : left) {
      state->drop(Status::cancelled("distributed autograd context " + idString(id) + ": worker '" + agent_.name() +
                                    "' has shut down its agent"));
    }
  }

  MessageCounts messages() const {
    return {backwardRequests_.load(std::memory_order_relaxed), releaseMessages_.load(std::memory_order_relaxed)};
  }

  DebugCounts counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_ ? atClose_ : countsLocked();
  }

  DebugCounts countsLocked() {
    DebugCounts c;
    c.contexts = contexts_.size();
    for (auto& [id, state] : contexts_) {
      std::lock_guard<std::mutex> lock(state->mutex_);
      c.sendNodes += state->sendNodes_.size();
    }
    for (auto& [w, ids] : pendingRelease_) c.pendingReleases += ids.size();
    return c;
  }

 private:
  rpc::Agent& agent_;
  std::atomic<uint64_t> counter_{1};
  std::atomic<uint64_t> backwardRequests_{0};
  std::atomic<uint64_t> releaseMessages_{0};
  mutable std::mutex mutex_;
  std::unordered_map<int64_t, std::shared_ptr<ContextState>> contexts_;
  std::unordered_set<int64_t> tombstones_;
  std::deque<int64_t> tombstoneOrder_;
  std::unordered_map<int64_t, Status> failures_;  // why a context was dropped, for later uses
  std::map<int, std::vector<int64_t>> pendingRelease_;
  std::set<int> deadPeers_;
  size_t inflight_ = 0;
  Clock::time_point lastFlush_ = Clock::now();
  std::mutex requestMutex_;
  std::condition_variable requestReady_;  // a request queued, or a waited-for pass settled
  std::deque<std::shared_ptr<std::function<void()>>> requests_;
  bool closed_ = false;
  DebugCounts atClose_;
};

// ---- what a recv node needs of its context (dist_autograd/nodes.h) -----------------------------

int64_t contextIdOf(const ContextState& ctx) { return ctx.id(); }

ContextState* passOnThisThread() { return tPass; }

void sendGradients(ContextState& ctx, int peer, int64_t messageId, std::vector<Tensor> grads) {
  ctx.outstanding_.push_back(
      ctx.layer().sendBackward(peer, ctx.id(), ctx.passId_, messageId, ctx.passRetain_, grads, ctx.passCall_));
}

namespace {

DistAutogradExtension& layerOf(rpc::Agent& agent) { return agent.extension<DistAutogradExtension>(); }

bool installLayer() {
  return rpc::Agent::installExtension(typeTag<DistAutogradExtension>(), [](rpc::Agent& agent) -> std::shared_ptr<rpc::AgentExtension> {
    auto layer = std::make_shared<DistAutogradExtension>(agent);
    layer->registerFunctions();
    return layer;
  });
}

}  // namespace

namespace {
std::mutex gHookMutex;
std::function<void(int64_t)> gSettledHook;

void settledHook(int64_t contextId) {
  std::function<void(int64_t)> hook;
  {
    std::lock_guard<std::mutex> lock(gHookMutex);
    hook = gSettledHook;
  }
  if (hook) hook(contextId);
}
}  // namespace

namespace detail {
bool installed() {
  static const bool done = installLayer();
  return done;
}

void setBackwardSettledHook(std::function<void(int64_t contextId)> hook) {
  std::lock_guard<std::mutex> lock(gHookMutex);
  gSettledHook = std::move(hook);
}
}  // namespace detail

// ---- Context ------------------------------------------------------------------------------------

Context::Context(rpc::Agent& agent) : agent_(agent), id_(0) {
  WEFT_ENFORCE(agent.started(), StateError, "dist_autograd::Context: the agent is not started");
  WEFT_ENFORCE(tCurrent.state == nullptr, StateError, "dist_autograd::Context: context ",
               idString(tCurrent.state ? tCurrent.state->id() : 0),
               " is already current on this thread; contexts do not nest");
  DistAutogradExtension& layer = layerOf(agent);
  state_ = layer.create();
  id_ = state_->id();
  tCurrent = Current{&layer, state_};
}

Context::~Context() {
  if (tCurrent.state == state_) tCurrent = Current{};
  if (!releaseStarted_) {
    try {
      layerOf(agent_).release(state_, false);
    } catch (const std::exception& e) {
      WEFT_LOG(Warn) << "dist_autograd: releasing context " << idString(id_) << " failed: " << e.what();
    }
  }
}

Future<void> Context::releaseAsync() {
  if (!releaseStarted_) {
    releaseStarted_ = true;
    released_ = layerOf(agent_).release(state_, true);
  }
  return released_;
}

void Context::backward(const std::vector<Tensor>& roots, const BackwardOptions& options) {
  WEFT_ENFORCE(!roots.empty(), InvalidArgumentError, "dist_autograd::backward: no roots");
  std::vector<Edge> edges;
  std::vector<std::shared_ptr<Node>> rootNodes;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    WEFT_ENFORCE(r.defined() && r.requiresGrad(), InvalidArgumentError, "dist_autograd::backward: root ", i,
                 " does not require grad");
    WEFT_ENFORCE(r.numel() == 1, InvalidArgumentError, "dist_autograd::backward: root ", i, " has shape ",
                 shapeString(r.shape()), "; roots must hold one element");
    edges.push_back(gradientEdge(r));
    rootNodes.push_back(edges.back().fn);
  }
  WEFT_ENFORCE(!agent_.loop().inLoopThread(), StateError, "dist_autograd::backward: context ", idString(id_),
               ": called on the agent's loop thread (a continuation of a call's future, or a task posted to the "
               "loop), which must stay free to deliver the answers the pass waits for; call it from another thread");
  WEFT_ENFORCE(tPass == nullptr, StateError, "dist_autograd::backward: context ", idString(id_),
               ": called inside a backward pass on this thread (a node's rule, a hook or a queued callback of ",
               "context ", idString(tPass != nullptr ? tPass->id() : 0), "); call it after that pass returns");
  DistAutogradExtension& layer = layerOf(agent_);
  {
    std::lock_guard<std::mutex> lock(state_->mutex_);
    state_->throwIfUnusable();
    WEFT_ENFORCE(!state_->backwardRunning_, StateError, "dist_autograd::backward: a backward pass of context ",
                 idString(id_), " is already running (on another thread); passes of one context run one at a time");
    state_->backwardRunning_ = true;
  }
  struct Running {
    ContextState& state;
    ~Running() {
      std::lock_guard<std::mutex> lock(state.mutex_);
      state.backwardRunning_ = false;
    }
  } running{*state_};

  std::shared_ptr<GraphTask> task;  // this pass's, whatever happens to the context meanwhile
  std::exception_ptr failure;
  std::vector<Future<void>> pending;
  {
    std::lock_guard<std::mutex> run(state_->runMutex_);
    PassScope scope(state_.get());
    task = state_->startPass(layer.newId(), options.retainGraph, options.timeout, rootNodes);
    try {
      for (size_t i = 0; i < roots.size(); ++i) task->deliver(edges[i], onesLike(roots[i]));
      for (auto& n : rootNodes) task->schedule(n.get());
      task->run();
    } catch (...) {
      failure = std::current_exception();
    }
    pending.swap(state_->outstanding_);
  }
  Future<void> done = settleAll(std::move(pending), failure);
  layer.waitHelping(done);
  settledHook(id_);
  // Every request this pass sent has been answered, so nothing more can arrive here: a node
  // still waiting waits for a send node the pass never reached (FAST mode's assumption broken
  // here, e.g. a tensor sent in a call whose result the loss does not use). Run it anyway, so
  // that this worker's gradients are complete, and wait for what that sends in turn. Each step
  // first checks that the context was not released meanwhile (a worker it reached died).
  while (!done.hasError()) {
    failure = nullptr;
    {
      std::lock_guard<std::mutex> run(state_->runMutex_);
      PassScope scope(state_.get());
      {
        std::lock_guard<std::mutex> lock(state_->mutex_);
        failure = state_->passGone(task);
      }
      if (failure) {
        done = makeErrorFuture<void>(failure);
        break;
      }
      if (task->scheduleWaiting() == 0) break;
      try {
        task->run();
      } catch (...) {
        failure = std::current_exception();
      }
      pending.clear();
      pending.swap(state_->outstanding_);
    }
    done = settleAll(std::move(pending), failure);
    layer.waitHelping(done);
    settledHook(id_);
  }
  {
    std::lock_guard<std::mutex> run(state_->runMutex_);
    PassScope scope(state_.get());
    if (!done.hasError()) {
      std::exception_ptr gone;
      {
        std::lock_guard<std::mutex> lock(state_->mutex_);
        gone = state_->passGone(task);
      }
      if (gone) {
        done = makeErrorFuture<void>(gone);
      } else {
        try {
          task->runCallbacks();  // e.g. DDP's: its averaged gradients land in the context
        } catch (...) {
          done = makeErrorFuture<void>(std::current_exception());
        }
      }
    }
    std::lock_guard<std::mutex> lock(state_->mutex_);
    if (state_->task_ == task) state_->task_.reset();
    // A worker the pass reached died: the context is unusable from now on, even before the
    // agent reports the failed connection to the layer (onPeerFailed). One that died while the
    // callbacks ran fails the pass too.
    if (!done.hasError()) {
      std::exception_ptr gone = state_->unusable();
      if (gone) done = makeErrorFuture<void>(gone);
    }
    if (done.hasError() && done.status().code() == StatusCode::Disconnected && state_->failure_.ok()) {
      state_->failure_ = done.status();
    }
  }
  task.reset();  // outside the locks: the graph it kept alive may be large
  if (done.hasError()) std::rethrow_exception(done.exception());
}

GradientMap Context::gradients() const {
  std::lock_guard<std::mutex> lock(state_->mutex_);
  if (!state_->failure_.ok()) throwStatus(state_->failure_);
  return state_->grads_;
}

int64_t currentContextId(rpc::Agent& agent) {
  return tCurrent.layer == &layerOf(agent) && tCurrent.state ? tCurrent.state->id() : 0;
}

GradientMap gradients(rpc::Agent& agent, int64_t contextId) {
  std::shared_ptr<ContextState> state = layerOf(agent).require(contextId);
  std::lock_guard<std::mutex> lock(state->mutex_);
  if (!state->failure_.ok()) throwStatus(state->failure_);
  return state->grads_;
}

std::string DebugCounts::toString() const {
  std::ostringstream out;
  out << "contexts " << contexts << " sendNodes " << sendNodes << " pendingReleases " << pendingReleases;
  return out.str();
}

DebugCounts debugCounts(rpc::Agent& agent) { return layerOf(agent).counts(); }

MessageCounts messageCounts(rpc::Agent& agent) { return layerOf(agent).messages(); }

Future<void> flushReleasesAsync(rpc::Agent& agent) { return layerOf(agent).flushAll(); }

}  // namespace weft::dist_autograd
