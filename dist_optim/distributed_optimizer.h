// DistributedOptimizer: updates parameters that live on other workers from the gradients a
// distributed autograd context holds, after torch.distributed.optim.DistributedOptimizer.
//
//   #include "dist_optim/distributed_optimizer.h"
//
//   weft::RemoteModule<nn::Linear> fc(agent, "ps/cpu", 784, 10);
//   weft::dist_optim::DistributedOptimizer opt(agent, nn::optim::AdamOptions{.lr = 1e-3},
//                                              fc.remoteParameters());
//   for (auto& [x, y] : batches) {
//     weft::dist_autograd::Context ctx(agent);
//     Tensor loss = nn::functional::crossEntropy(fc.forward(x), y);
//     ctx.backward({loss});
//     opt.step(ctx);            // every owner updates its parameters from the context's gradients
//   }
//
// Kinds. The alternative the options hold is the optimizer kind, with PyTorch 1.13's update rules,
// defaults and argument checks (nn/optim.h): SGDOptions (lr, required; momentum, dampening,
// weightDecay, nesterov, maximize), AdamOptions and AdamWOptions (lr, betas, eps, weightDecay,
// amsgrad, maximize; AdamW decouples the decay), AdagradOptions (lr, lrDecay, weightDecay,
// initialAccumulatorValue, eps, maximize), RMSpropOptions (lr, alpha, eps, weightDecay, momentum,
// centered, maximize). A run is therefore comparable step for step with a local nn::optim
// optimizer of the same kind, or with PyTorch.
//
// Where things live. The parameters are RRef<Tensor>s owned by any workers (this one included):
// RemoteModule::remoteParameters(), or makeRRef(agent, param) on the owner. The constructor builds
// one OwnerOptimizer per owner, through RPC, over that owner's parameters (the tensors themselves,
// so an update is seen by the module using them), and waits until every one is built. The
// optimizer state (momentum buffers, Adam moments, step counts) lives there, with the parameter,
// and is freed when the DistributedOptimizer is destroyed (the owners drop their OwnerOptimizer
// once the last handle to it is gone). Two DistributedOptimizers over the same parameters keep
// separate state, as in PyTorch.
//
// Stepping. step(ctx) sends one call per other owner at once (RRef::rpcAsync), steps this worker's
// own parameters directly meanwhile (no message), and waits for all of them.
// Each owner reads its gradients in the context (dist_autograd::gradients(agent, id): gradients
// accumulate there, never in .grad) and applies the functional step of nn/optim.h to its
// parameters in place. A parameter without a gradient in the context is skipped, its state
// untouched (PyTorch skips parameters without .grad). Nothing is zeroed: the next iteration uses a
// new context. When step(ctx) runs on the thread where ctx is current (the usual case), its calls
// carry the context like every call made in it (dist_autograd/dist_autograd.h, Recording): an
// owner that took no part in the pass then knows the context, holds no gradient in it, and
// updates nothing. stepAsync(id) from a thread where the context is not current reaches such an
// owner without it (NotFoundError, below).
//
// Concurrency. Several trainers (or threads) may step DistributedOptimizers over the same
// parameters at the same time. On the owner, each parameter has one lock (per worker, shared by
// every OwnerOptimizer updating that tensor); an OwnerOptimizer's step reads its gradients, then
// takes the locks of all its parameters, in a fixed order (so steps over overlapping parameter
// sets never deadlock), and releases them when its update is done. Updates of one parameter are
// therefore applied one whole step at a time (in no particular order between trainers), and none
// is lost or torn.
// Forward passes are not locked: a forward running on the owner while a step updates a parameter
// reads it as it is (Hogwild, as RemoteModule documents). One DistributedOptimizer may be used
// from several threads at once.
//
// Errors.
//  - Constructor: invalid options (nn::optim::validate), an empty parameter list, an empty RRef, an
//    RRef of another agent or the same RRef twice: InvalidArgumentError, before any RPC. An owner
//    refusing its parameters (not floating, the same tensor twice) or unreachable: its typed error
//    naming that worker, after every owner has answered.
//  - step: the typed error an owner raised, naming it: NotFoundError when the owner knows no such
//    context ("worker 'ps' knows no distributed autograd context ...": released, or never reached),
//    DisconnectedError when the owner died or the context was released because a worker it
//    involved died, InvalidArgumentError for a gradient whose shape or dtype does not match its
//    parameter. step waits for every owner to
//    answer before it raises, so no update is still running when it returns; when several owners
//    fail, the error of the lowest-ranked one is raised. Owners that succeeded have applied their
//    update (a step is not atomic across owners, as in PyTorch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/future.h"
#include "dist_autograd/dist_autograd.h"
#include "nn/optim.h"
#include "rpc/agent.h"
#include "rpc/codec.h"
#include "rref/remote_class.h"
#include "rref/rref.h"
#include "tensor/tensor.h"

namespace weft::rpc {

// nn::optim::OptimizerOptions on the wire: the record of the alternative it holds ("SGDOptions",
// "AdamOptions", "AdamWOptions", "AdagradOptions", "RMSpropOptions", each WEFT_CODEC_FIELDS with
// every field of the options struct, in declaration order). The receiver decodes the
// alternative the name selects (ProtocolError for an unknown name or a field count or type that
// does not match); it does not validate the values (OwnerOptimizer does).
template <>
struct Codec<nn::optim::OptimizerOptions> {
  static std::string typeName() { return "optim.OptimizerOptions"; }
  static void encode(const nn::optim::OptimizerOptions& v, wire::Value::Builder out, EncodeContext& ctx);
  static nn::optim::OptimizerOptions decode(wire::Value::Reader in, DecodeContext& ctx);
};

}  // namespace weft::rpc

namespace weft::dist_optim {

namespace detail {
class LockTable;
}  // namespace detail

// The owner's side of a DistributedOptimizer: the parameters of one DistributedOptimizer that this
// worker owns, their optimizer state and the options. Built by DistributedOptimizer through
// Agent::remote; its methods run on the owner's handler threads.
class OwnerOptimizer {
 public:
  // `params` must be RRefs owned by the worker this runs on, to distinct floating tensors
  // (InvalidArgumentError otherwise); `options` are validated again here.
  OwnerOptimizer(nn::optim::OptimizerOptions options, std::vector<RRef<Tensor>> params);
  ~OwnerOptimizer();
  OwnerOptimizer(const OwnerOptimizer&) = delete;
  OwnerOptimizer& operator=(const OwnerOptimizer&) = delete;

  // One update of every parameter that has a gradient in context `contextId` on this worker,
  // under the parameters' locks (see "Concurrency" at the top of this file). Returns how many
  // parameters were updated. NotFoundError naming this worker and the context when it knows no
  // such context.
  int64_t step(int64_t contextId);
  int64_t parameterCount() const { return static_cast<int64_t>(params_.size()); }

 private:
  rpc::Agent& agent_;
  nn::optim::OptimizerOptions options_;
  std::vector<Tensor> params_;                       // the owner's tensors themselves
  std::vector<nn::optim::ParamState> state_;         // state_[i] belongs to params_[i]
  // The parameters' locks, sorted by the parameter's TensorImpl address (the order they are
  // taken in); shared with every other OwnerOptimizer of this worker updating the same tensor.
  std::vector<std::shared_ptr<std::mutex>> locks_;
  std::shared_ptr<detail::LockTable> table_;  // this worker's, where locks_ came from
};
WEFT_REMOTE_CLASS(OwnerOptimizer, WEFT_CONSTRUCTORS((nn::optim::OptimizerOptions, std::vector<RRef<Tensor>>)), step,
                  parameterCount);

// Copies are handles to the same owner-side optimizers and state; the owners free them when the
// last copy is gone.
class DistributedOptimizer {
 public:
  // One OwnerOptimizer per owner of `params`, built through `agent` (whose handles the RRefs must
  // be); returns once every owner has built it. Errors: see "Errors" at the top of this file.
  DistributedOptimizer(rpc::Agent& agent, nn::optim::OptimizerOptions options, std::vector<RRef<Tensor>> params);

  // One update on every owner from the gradients of `ctx`; blocks until every owner answered.
  void step(const dist_autograd::Context& ctx) { stepAsync(ctx.id()).get(); }
  // The same, from a context id (a context created on any worker of the job); the future
  // completes when every owner has answered, with the error described under "Errors".
  Future<void> stepAsync(int64_t contextId) const;

  const nn::optim::OptimizerOptions& options() const { return options_; }
  // "SGD", "Adam", "AdamW", "Adagrad", "RMSprop".
  const char* name() const { return nn::optim::optimizerName(options_); }
  // The parameters, in the order given to the constructor.
  const std::vector<RRef<Tensor>>& parameters() const { return params_; }
  // The ranks owning parameters, ascending (one OwnerOptimizer each).
  std::vector<int> ownerRanks() const;

 private:
  struct Owner {
    int rank;
    RRef<OwnerOptimizer> optimizer;
  };

  rpc::Agent& agent_;
  nn::optim::OptimizerOptions options_;
  std::vector<RRef<Tensor>> params_;
  std::vector<Owner> owners_;  // ascending rank
};

// What the distributed optimizer holds on one worker (tests assert it drains): OwnerOptimizers
// alive here, and parameter locks some live OwnerOptimizer shares.
struct DebugCounts {
  size_t ownerOptimizers = 0;
  size_t parameterLocks = 0;
  bool empty() const { return ownerOptimizers == 0 && parameterLocks == 0; }
  std::string toString() const;
};
DebugCounts debugCounts(rpc::Agent& agent);

namespace detail {
// Installs the per-agent parameter lock table on every Agent a program including this header
// builds (rpc::AgentExtension).
bool installLayer();
inline const bool kLayerInstalled = installLayer();
}  // namespace detail

}  // namespace weft::dist_optim
