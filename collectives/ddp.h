// DistributedDataParallel: data-parallel training of one module replicated on
// every rank of a process group. Each rank runs forward and backward on its own
// share of the data; DDP averages the parameters' gradients over the ranks
// during backward, so that every replica takes the same optimizer step and the
// replicas stay identical (after torch.nn.parallel.DistributedDataParallel).
//
//   #include "collectives/ddp.h"
//   #include "collectives/init.h"
//   auto pg = collectives::init();                       // the job's group, from the launcher's variables
//   auto net = std::make_shared<Net>();
//   collectives::DistributedDataParallel ddp(net, *pg);   // rank 0's parameters and buffers everywhere
//   nn::optim::SGD opt(net->parameters(), {.lr = 0.1});
//   for (...) {
//     opt.zeroGrad();
//     Tensor loss = nn::functional::crossEntropy(ddp.forward(x), y);
//     loss.backward();                                   // .grad = the average over the ranks
//     opt.step();
//   }
//   {                                                    // gradient accumulation:
//     auto scope = ddp.noSync();                         // no communication for these passes
//     lossA.backward(); lossB.backward();
//   }
//   lossC.backward();                                    // reduces A + B + C, averaged
//
// Construction (collective: every rank builds its DDP over the same group, in
// the same order relative to the group's other collectives): broadcasts every
// parameter and buffer from rank 0, then registers a pre-hook on the
// AccumulateGrad node of every parameter that requires grad, and lays those
// parameters out in buckets: in reverse order of Module::parameters() (the
// order backward usually produces their gradients), a new bucket whenever the
// next parameter would take the bucket past Options::bucketCapBytes or has
// another dtype or device. A parameter larger than the cap has a bucket of its
// own.
//
// Bucket rebuild (Options::rebuildBuckets, on by default; PyTorch's
// Reducer::rebuild_buckets). Reverse registration order is only a guess: a
// module that registers its layers in another order than it uses them would
// fill its first bucket last and launch nothing until backward is over. So
// once, at the end of the first synced pass, rank 0 broadcasts the order in
// which that pass's gradients arrived there (parameters that got none there
// last, in reverse order), and every rank lays its buckets out again in that
// order, by the same rule (cap, dtype, device). Every later pass uses that
// layout, the same on every rank. The broadcast is one more collective at the
// end of that pass's backward; stats().bucketRebuilds says it happened.
//
// Buffers (Options::broadcastBuffers, on by default; PyTorch's
// broadcast_buffers). Each forward() while sync is on and grad mode is enabled
// (a training forward) first broadcasts rank 0's buffers to every rank
// (coalesced like the construction broadcast; nothing when the module has no
// buffers), so that running statistics and the like follow rank 0. Forwards
// under noSync() or with grad mode off (evaluation) do not, so ranks may run
// different numbers of them. A module called through another forward than
// DDP's gets no broadcast.
//
// A synced backward pass (local `loss.backward()`, or
// dist_autograd::Context::backward). Each parameter's hook copies its incoming
// gradient into its slot of its bucket's flat buffer and takes it from the
// engine (nothing reaches .grad yet). When the last gradient of a bucket has
// arrived, the bucket's allreduce (sum) is launched asynchronously, so that
// communication overlaps with the rest of backward. Buckets are launched in
// bucket order (a bucket that is ready early waits for its predecessors), so
// that every rank issues the same allreduces in the same order. When the pass
// is over on this worker (autograd::queueCallback), DDP waits for every
// bucket, divides by the group size and hands each parameter its averaged
// gradient through autograd::accumulateLeafGradient: added to .grad for a
// local backward, to the context's gradients for a distributed one (where
// dist_optim::DistributedOptimizer finds them; .grad stays untouched).
// backward() returns after that. Gradients add to what .grad (or the context)
// already holds, as without DDP: zero them between steps.
//
// noSync() (gradient accumulation). While a NoSyncGuard lives, the hooks add
// each incoming gradient to a buffer per parameter that DDP keeps, with no
// communication; nothing reaches .grad or a context. The next synced pass
// reduces, for each parameter, its new gradient plus what was accumulated, and
// hands over the average of those totals. This works alike for local and
// distributed passes, and the noSync passes may run in other contexts than the
// synced one (only the synced pass's context receives the gradients).
// pendingGradient() shows what is held. The noSync passes are each rank's
// own business, but every rank must run the same number of synced passes.
//
// Mixed precision (Options::reduceDtype). The module's parameters may be
// 16-bit (Module::to(DType::BFloat16)); the group may not reduce their dtype
// (Gloo reduces no bfloat16: process_group.h; a bfloat16 parameter on a gloo
// group without reduceDtype is an InvalidArgumentError at construction,
// naming it). With reduceDtype set, the buckets hold the gradients in that
// dtype (Float32 or Float16): each incoming gradient is converted into its
// slot, the bucket is allreduced and divided by the group size in
// reduceDtype, and each parameter is handed its averaged gradient converted
// back to its own dtype (rounded to nearest-even), so .grad has the
// parameter's dtype. A bucket's buffer then exists only
// during a synced pass (allocated at its first gradient, freed once the
// gradients are handed over): between passes DDP holds no gradient bytes of
// its own, and a float32 reduction costs, while backward runs, 4 bytes per
// element of the buckets (2 for Float16), not 4 more held per parameter.
// Without reduceDtype the buckets are allocated once and kept (the
// parameters' bytes again, held). The forward's autocast (tensor/autocast.h)
// is the caller's; the float32 master weights are the optimizer's
// (nn/master_weights.h, or ZeroRedundancyOptimizer's Options::masterWeights).
//
// Parameters that get no gradient. Every rank must launch the same allreduces,
// so every bucket must fill. By default a parameter that got no gradient by
// the end of a synced pass is an error (StateError naming the parameters,
// raised from backward(); nothing is handed over). With
// Options::findUnusedParameters, forward() walks the output's local graph and
// marks the parameters it does not reach as ready (their slot holds zeros, or
// their noSync accumulation) as soon as the next synced pass starts, and any
// parameter still missing at the end of the pass is reduced the same way, so
// its bucket is launched then. A parameter marked unused whose gradient
// arrives after all (it was reached in a way the local walk cannot see, e.g.
// through an RPC) is added to its slot if the bucket has not been launched
// yet, and is an error otherwise.
//
// Ranks that disagree. A rank that runs one more synced pass than the others
// (or reduces a different set of parameters) launches a collective the others
// never call: its forward() (the buffer broadcast) or backward() (a bucket's
// allreduce) fails after the group's timeout with the group's TimeoutError (it
// names the collective and the ranks that never started it), prefixed with
// what DDP was doing. The group is unusable afterwards (see
// process_group.h). A dead peer fails the pass with DisconnectedError.
//
// Limits. A synced pass must run on this worker within one autograd pass: the
// local backward, or the part of a distributed pass that runs here in one
// piece (the worker calling ctx.backward, or one backward request). Passes of
// one DDP must not overlap. autograd::grad over the parameters is not
// supported (the hooks take the gradients).
//
// Threads: construct, forward and destroy from one thread; noSync() and the
// accessors from any; backward passes on one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/no_sync.h"
#include "collectives/process_group.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace weft::collectives {

class DistributedDataParallel {
 public:
  struct Options {
    // Most bytes of gradient per bucket; > 0 (InvalidArgumentError). PyTorch's default.
    int64_t bucketCapBytes = int64_t{25} << 20;
    // Reduce parameters that got no gradient as zeros (see "Parameters that get no gradient").
    bool findUnusedParameters = false;
    // Re-lay the buckets in the order gradients arrived on rank 0 after the
    // first synced pass (see "Bucket rebuild").
    bool rebuildBuckets = true;
    // Broadcast rank 0's buffers at each synced forward (see "Buffers").
    bool broadcastBuffers = true;
    // The dtype the buckets hold and reduce the gradients in; unset: each
    // bucket's parameters' own (see "Mixed precision").
    std::optional<DType> reduceDtype = std::nullopt;
  };

  // What the last synced pass did, for tests and tuning.
  struct Stats {
    struct Launch {
      size_t bucket = 0;       // bucket index
      size_t hooksBefore = 0;  // gradients that had arrived when it was launched
      int64_t ns = 0;          // steady clock, nanoseconds
    };
    int64_t syncedPasses = 0;          // synced passes completed since construction
    std::vector<size_t> hookOrder;     // parameter indices, in the order their gradients arrived
    std::vector<int64_t> hookNs;       // steady clock time of each, nanoseconds
    std::vector<Launch> launches;      // allreduces, in launch order
    size_t unusedParameters = 0;       // parameters reduced with no gradient of this pass
    size_t completedAtEnd = 0;         // allreduces already finished when the pass ended here
    int64_t bucketRebuilds = 0;        // 1 once the buckets follow rank 0's gradient order
  };

  // See "Construction". `module` and `group` must outlive the DDP.
  // InvalidArgumentError when the module has no parameter that requires grad,
  // for a bad option (a reduceDtype that is not Float32, Float16 or Float64),
  // or a parameter that is not a CPU tensor the group can reduce (in
  // reduceDtype when set); the group's error (prefixed) when the broadcast
  // fails, e.g. because the ranks' modules differ.
  DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group, Options options);
  DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group)
      : DistributedDataParallel(std::move(module), group, Options{}) {}
  // Removes the hooks and waits for allreduces still running (their errors
  // are dropped).
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The module's forward, after rank 0's buffers were broadcast (see
  // "Buffers"); with findUnusedParameters, also prepareForBackward. The
  // broadcast's error, prefixed, when it fails.
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  // The module's own forward with several inputs (PyTorch's ddp(a, b)): for a
  // module M whose forward takes more than one tensor, or other arguments,
  // calls M::forward(inputs...) on the module, with the same buffer broadcast
  // as forward(input) and, with findUnusedParameters, prepareForBackward over
  // the tensors of the result (a Tensor, a vector of them, or a pair or tuple
  // of those). M is the module's own type, named because Module's one virtual
  // forward takes one tensor (see nn/module.h); InvalidArgumentError naming
  // the module's typeName() when module() is not an M.
  //   DistributedDataParallel ddp(std::make_shared<TwoTower>(), pg);
  //   Tensor score = ddp.forward<TwoTower>(query, document);
  template <class M, class... Inputs>
  auto forward(const Inputs&... inputs) {
    M* typed = dynamic_cast<M*>(module_.get());
    WEFT_ENFORCE(typed != nullptr, InvalidArgumentError, "DistributedDataParallel::forward<M>: the module (",
                 module_->typeName(), ") is not of the type named by M");
    broadcastBuffersForForward();
    auto out = typed->forward(inputs...);
    if (options_.findUnusedParameters) {
      std::vector<Tensor> tensors;
      collectTensors(out, tensors);
      prepareForBackward(tensors);
    }
    return out;
  }
  // For modules called through another forward: marks, for the next synced
  // pass, the parameters that `outputs`' local graph does not reach as unused.
  // Only with findUnusedParameters (otherwise a no-op).
  void prepareForBackward(const std::vector<Tensor>& outputs);

  // Turns gradient synchronisation off for its lifetime (restores the
  // previous setting at the end; nests).
  using NoSyncGuard = NoSyncScope<DistributedDataParallel>;
  [[nodiscard]] NoSyncGuard noSync();
  bool syncEnabled() const;

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  ProcessGroup& group() const { return group_; }
  const Options& options() const { return options_; }
  // The parameters DDP reduces (those of module->parameters() that require
  // grad, in that order) and their dotted names.
  std::vector<Tensor> parameters() const;
  std::vector<std::string> parameterNames() const;
  // Parameter indices (into parameters()) of each bucket, in bucket order
  // (after the first synced pass: the rebuilt layout).
  std::vector<std::vector<size_t>> buckets() const;
  // What noSync passes accumulated for parameter `index` and the next synced
  // pass will add; undefined when nothing. IndexError for a bad index.
  Tensor pendingGradient(size_t index) const;
  Stats stats() const;

 private:
  // forward's first step (see "Buffers").
  void broadcastBuffersForForward();
  static void collectTensors(const Tensor& t, std::vector<Tensor>& out) { out.push_back(t); }
  static void collectTensors(const std::vector<Tensor>& ts, std::vector<Tensor>& out) {
    out.insert(out.end(), ts.begin(), ts.end());
  }
  template <class A, class B>
  static void collectTensors(const std::pair<A, B>& p, std::vector<Tensor>& out) {
    collectTensors(p.first, out);
    collectTensors(p.second, out);
  }
  template <class... Ts>
  static void collectTensors(const std::tuple<Ts...>& t, std::vector<Tensor>& out) {
    std::apply([&out](const Ts&... e) { (collectTensors(e, out), ...); }, t);
  }
  // Anything else in a result (a count, a name) holds no tensor.
  template <class T>
  static void collectTensors(const T&, std::vector<Tensor>&) {}

  struct Param {
    Tensor tensor;
    std::string name;
    size_t bucket = 0;
    int64_t offset = 0;  // in the bucket's flat buffer, elements
    int hookId = -1;
    Tensor pending;      // noSync accumulation
    bool ready = false;  // this pass
    bool markedUnused = false;
  };
  struct Bucket {
    std::vector<size_t> params;
    int64_t numel = 0;
    DType dtype = DType::Float32;
    Tensor flat;         // with reduceDtype: during a pass only
    size_t waiting = 0;  // parameters of this pass not yet ready
    bool launched = false;
    Work work;
  };

  void broadcastState();
  // Copies rank 0's values of `tensors` into every rank's (coalesced
  // broadcasts); a failure is rethrown with `prefix` in front.
  void broadcastFromRank0(const std::vector<Tensor>& tensors, const std::string& prefix);
  // Buckets filled with parameters in `order`: a new one whenever the next
  // would pass bucketCapBytes or has another dtype or device.
  void layOutBuckets(const std::vector<size_t>& order);
  // Lays the buckets out in rank 0's order of `arrived` (see "Bucket rebuild").
  void rebuildBuckets(const std::vector<size_t>& arrived, int64_t passNumber);
  void onGradient(size_t index, std::vector<Tensor>& grads);
  void startPassLocked();
  // Parameter p's slot in its bucket's buffer (allocated first when absent).
  Tensor slotOf(const Param& p);
  // Frees the buckets' buffers when they live during a pass only (reduceDtype).
  void releaseBucketsLocked();
  void markReadyLocked(size_t index, const Tensor& grad);
  void launchReadyLocked();
  void finishPass();
  void abandonPassLocked();
  friend class NoSyncScope<DistributedDataParallel>;
  void setSync(bool on);

  std::shared_ptr<nn::Module> module_;
  ProcessGroup& group_;
  Options options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;

  mutable std::mutex mutex_;
  bool sync_ = true;
  bool passActive_ = false;
  // Held by the callback queued for the current pass: expires when the pass
  // was abandoned (its graph task destroyed without running its callbacks).
  std::weak_ptr<int> passToken_;
  size_t nextBucket_ = 0;
  size_t hooksThisPass_ = 0;
  std::vector<bool> unusedNext_;  // from prepareForBackward; empty when none
  Stats stats_;
};

}  // namespace weft::collectives
