// Distributed autograd: backward passes whose graph spans several workers.
//
//   #include "dist_autograd/dist_autograd.h"
//   {
//     weft::dist_autograd::Context ctx(agent);                  // current on this thread until it ends
//     Tensor h = ps.rpcSync(&ParameterServer::forward, x);       // recorded: a send/recv pair each way
//     Tensor loss = weft::nn::functional::nllLoss(h, y);
//     ctx.backward({loss});                                      // returns when every worker is done
//     weft::dist_autograd::GradientMap grads = ctx.gradients();  // this worker's leaves -> gradients
//     opt.step(ctx);                                             // dist_optim/distributed_optimizer.h
//   }                                                            // released on every worker it reached
//
// Recording. While a Context is current on a thread, every call that thread makes through its
// agent (Agent::callAsync/call, remote(), toHere(), RRef method calls) carries the context's id. If
// the call's arguments hold tensors that require grad, the caller records a *send node* whose
// inputs are those tensors, and the callee gives the tensors it decodes a *recv node* as their
// grad function: they are not leaves, and their gradients flow back to the caller's tensors,
// whatever they are (a parameter passed as an argument keeps its autograd identity: its
// gradient lands in its owner's context, keyed by the parameter itself). The callee runs the
// function with the context current, so the calls it makes are recorded too; a result holding
// tensors that require grad is recorded the same way in the other direction. Calls made outside
// a context send tensors that require grad as leaves that require grad, with no link.
//
// Backward (PyTorch's FAST mode). backward(roots) seeds every root with ones (roots hold one
// element each) and runs the local graph; on every worker, the dependencies are counted from the
// roots (on this worker) and from every send node the context recorded there. A recv node sends
// the gradients it receives to its sender as a backward request; the sender runs its send node
// and whatever becomes ready, and answers once that work and the requests it sent in turn are
// done. backward() therefore returns only when the whole distributed graph reached by this pass
// has run on every worker. Gradients of leaves accumulate in the context of the worker that owns
// them (gradients(), and dist_autograd::gradients(agent, id) on the owner), never in .grad; a
// second backward in the same context adds to them. FAST mode assumes that every send node of
// the context takes part in the pass. On the worker that called backward() this is repaired: once
// every request has been answered, nodes still waiting for a send node the pass never reached
// run anyway (a tensor sent in a call whose result the loss does not use). On other workers such
// a node does not run, and gradients that flow only through it are missing.
//
// Graph lifetime. Without retainGraph, a pass frees what every node it ran saved for backward,
// on every worker; a second backward over the same graph then fails with StateError (naming the
// node). Pass retainGraph = true to every backward but the last.
//
// Errors. A failure anywhere (a node's backward throwing on a remote worker, a worker dying, a
// timeout) fails backward() with the typed error of where it arose (RemoteError names that
// worker), after every request already sent has been answered or has failed: no worker is left
// waiting. A worker the context reached that dies while the pass runs fails it with
// DisconnectedError naming that worker, whether its requests were still pending or already
// answered (the context is released meanwhile, see "Release").
//
// Release. The destructor (or releaseAsync()) drops the context here and on every worker it reached
// (transitively: a worker forwards the release to the workers it exchanged messages with in the
// context). Releases to other workers are sent in batches, at the latest about 50 ms later;
// releaseAsync() sends them at once and returns a future that completes when every worker reached has
// dropped the context. When a worker the context involves dies, the context is released at once
// on its peers and using it (backward, gradients) raises DisconnectedError naming that worker.
//
// Threads. A context is current only on the thread that created it (and, on callees, on the
// handler thread running a recorded call, for the duration of the body; continuations of a
// returned Future are not inside it). Creating a context while another is current on the thread
// is a StateError. backward() blocks its thread until the pass is done on every worker. While it
// waits, that thread itself runs the backward requests that reach this worker (for its own pass
// or any other), so backward() may be called on a handler thread, even when the agent has one
// handler thread and the pass needs this worker again. Otherwise backward requests are served by
// the handler threads like any call, so handlers blocked in call() delay them.
// backward() raises StateError, before starting anything, when called
//   - on the agent's loop thread (where a continuation attached to a pending call's future runs):
//     the loop delivers the answers the pass waits for, so it would wait for itself forever;
//   - inside a backward pass on the same thread (a node's rule, a hook or a queued callback):
//     that pass holds its context until it returns;
//   - on a context whose backward is already running (on another thread): passes of one context
//     run one at a time.
// Backward passes of different contexts may run at the same time, on one worker or several. A
// tensor received in a context takes part only in that context's backward(): reaching its recv
// node from a local backward() or another context's pass raises StateError.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/future.h"
#include "rpc/agent.h"
#include "tensor/tensor.h"

namespace weft::dist_autograd {

class ContextState;

// The gradients one worker holds in a context: leaf tensor -> accumulated gradient. Keys are
// compared by identity (the tensor object, not its values).
class GradientMap {
 public:
  // The gradient of leaf `t`; NotFoundError when the context holds none for it.
  const Tensor& at(const Tensor& t) const;
  // The gradient of leaf `t`, or an undefined tensor.
  Tensor get(const Tensor& t) const;
  bool contains(const Tensor& t) const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // (leaf, gradient) pairs, in no particular order.
  std::vector<std::pair<Tensor, Tensor>> items() const;

  // Adds g to t's gradient (used by the engine).
  void accumulate(const Tensor& t, const Tensor& g);

 private:
  std::unordered_map<const void*, std::pair<Tensor, Tensor>> entries_;
};

struct BackwardOptions {
  bool retainGraph = false;
  // Timeout of each backward request this worker sends; unset: the agent's rpcTimeout.
  std::optional<std::chrono::milliseconds> timeout = std::nullopt;
};

class Context {
 public:
  // A new context on `agent`, current on this thread. StateError when one is current already or
  // the agent is not started.
  explicit Context(rpc::Agent& agent);
  // Makes the context no longer current and releases it (see "Release" above).
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Worker id (rank) in the high 16 bits, this worker's counter below.
  int64_t id() const { return id_; }

  // Runs the distributed backward pass from `roots` (each one element, requiring grad).
  void backward(const std::vector<Tensor>& roots, const BackwardOptions& options = {});
  void backward(const std::vector<Tensor>& roots, bool retainGraph) {
    backward(roots, BackwardOptions{.retainGraph = retainGraph});
  }
  // This worker's accumulated gradients (copies of the handles; the tensors are shared).
  GradientMap gradients() const;
  // Releases the context everywhere now (idempotent); the future completes when every worker
  // it reached has dropped it (errors from dead workers are ignored).
  Future<void> releaseAsync();

 private:
  rpc::Agent& agent_;
  int64_t id_;
  std::shared_ptr<ContextState> state_;
  Future<void> released_;
  bool releaseStarted_ = false;
};

// The id of the context current on this thread for `agent`, or 0.
int64_t currentContextId(rpc::Agent& agent);

// The gradients this worker holds in context `contextId` (the DistributedOptimizer reads them on
// each owner). NotFoundError when this worker knows no such context; DisconnectedError when it
// was released because a worker it involved died.
GradientMap gradients(rpc::Agent& agent, int64_t contextId);

// How much distributed autograd state one agent holds (tests assert it drains).
struct DebugCounts {
  size_t contexts = 0;      // contexts known on this worker
  size_t sendNodes = 0;     // send nodes recorded in them
  size_t pendingReleases = 0;  // releases queued for other workers and not yet sent
  bool empty() const { return contexts == 0 && sendNodes == 0 && pendingReleases == 0; }
  std::string toString() const;
};
DebugCounts debugCounts(rpc::Agent& agent);

// Messages this worker's distributed autograd layer sent since its agent was built (each is one
// call and one response on the wire): backward requests (one per recv node a pass ran) and
// release batches.
struct MessageCounts {
  uint64_t backwardRequests = 0;
  uint64_t releaseMessages = 0;
};
MessageCounts messageCounts(rpc::Agent& agent);

// Sends queued releases now (normally batched, see "Release").
Future<void> flushReleasesAsync(rpc::Agent& agent);

namespace detail {
// Installs the layer on every Agent a program that includes this header builds.
bool installed();
inline const bool kLayerInstalled = installed();
// For tests: called on the thread running Context::backward each time every request the pass
// sent so far has been answered, before that thread looks at the context again (the moment a
// worker's death can be noticed between two steps of the pass). An empty function removes it.
void setBackwardSettledHook(std::function<void(int64_t contextId)> hook);
}  // namespace detail

}  // namespace weft::dist_autograd
