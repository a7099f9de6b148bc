// FullyShardedDataParallel: ZeRO stage 3, data parallelism with parameters,
// gradients and optimizer state all sharded over the ranks of a process
// group. The module's parameters are cut into units; each unit's parameters
// live, between uses, only as one flat float32 shard per rank. A unit's
// parameters are all-gathered into the module's own tensors just before its
// forward and again before its backward, and freed after each; its gradients
// are reduce-scattered into the shard's gradient when its backward is done.
// The optimizer, any weft optimizer, steps the shards.
//
//   #include "collectives/fsdp.h"
//   auto gpt = std::make_shared<nn::GPT>(cfg);
//   collectives::FullyShardedDataParallel fsdp(gpt, *pg);   // units: each TransformerBlock, the root the rest
//   nn::optim::AdamW opt(fsdp.parameters(), {.lr = 6e-4, .weightDecay = 0.1});   // the shards
//   for (...) {
//     opt.zeroGrad();
//     Tensor logits = fsdp.forward(idx);                    // gathers and frees unit by unit
//     nn::functional::crossEntropy(logits.view({-1, V}), targets.view({-1})).backward();
//     opt.step();                                           // this rank's shards only
//   }
//   nn::StateDict full = fsdp.fullStateDict();               // rank 0: loadable into a plain GPT
//
// Units (Options::units). The given submodules of the module, each a unit;
// when none are given, every nn::TransformerBlock of an nn::GPT, and a single
// unit (the whole module) for any other module. The root unit holds the
// parameters no given unit holds (GPT: wte, wpe, ln_f). Units must not share
// parameters (InvalidArgumentError naming the parameter). Unit 0 is the root,
// then the given units in order; a unit without parameters is dropped.
//
// Flat shards and padding. A unit of n parameter elements is padded to
// n' = N·⌈n/N⌉ elements (N ranks); the unit's parameters, in
// namedParameters() order, are views of one flat storage of n' elements
// (the module's Parameter tensors keep their identity: their data is swapped
// to point there, as Module::to does), and rank r's shard is elements
// [r·n'/N, (r+1)·n'/N), a leaf float32 tensor of its own that requires grad
// (parameters()). The padding, at most N−1 elements per unit, is zero and
// stays zero (its gradient is zero).
//
// Forward. The parameters of the module must be float32 CPU tensors that
// require grad. Each unit's module gets a forward pre-hook and a forward hook
// (nn::Module's, run by operator(); GPT, TensorParallelGPT and
// SequenceParallelGPT call their blocks through it, and forward() here calls
// the root through it). The pre-hook all-gathers the
// unit's shards into its flat storage (Storage::reallocate, then
// allGatherInto straight into it, no copy). The hook, when the output needs
// a gradient, registers a pre-hook on the output's grad_fn that gathers the
// unit again when backward reaches it, and, with reshardAfterForward (ZeRO-3),
// frees the unit's storage (Storage::release: the bytes really go, while the
// tensors autograd saved keep the Storage object, whose buffer the backward
// gather refills; neither step bumps the storage version, so the saved-tensor
// checks hold). Without reshardAfterForward (ZeRO-2-like) the parameters stay
// gathered from forward through the unit's backward. The root unit is never
// freed between its forward and its backward (it wraps the whole forward, and
// its tied head runs last). A forward whose output needs no gradient (eval,
// NoGradGuard) frees each unit at the end of its forward.
//
// Prefetching. Gathers are collectives issued from hooks, so every rank
// issues them in the same order. Just after a unit's gather before its
// forward, the gather of the unit that followed it in the previous forward
// is launched (asynchronously) and completes while this unit computes;
// just after a unit's gather before its backward, that of the unit before it
// in this forward's order. So up to two units besides the root are gathered
// at once.
//
// Backward. A pre-hook on each parameter's AccumulateGrad node adds the
// gradient into its unit's flat gradient buffer and takes it from the engine:
// the module's .grad stay empty. Once every parameter of a unit has its
// gradient, the unit's parameters are freed and its buffer is
// reduce-scattered (sum, asynchronously), the units launched in reverse order
// of their forward pre-hooks (the order backward completes them: the same
// collectives on every rank). A unit's reduce-scatter, once complete
// (looked at with each gradient that arrives, and waited for when the next
// unit launches), is divided by N and added to its shard's .grad and its
// buffer freed, so at most two units' full gradients are held; the last is
// settled when the pass is over (autograd::queueCallback). Every parameter must receive a gradient in every
// pass (StateError naming them). Passes without zeroing add up in .grad.
// The averaged gradient is DDP's (the same sum over the ranks, then the same
// scaling): to the bit where the backend's reduce-scatter adds the ranks in
// its allreduce's order (two ranks always).
//
// Activation checkpointing (nn::GPTConfig::checkpoint) works: a unit's
// forward inside a checkpointed segment runs without grad, so the unit is
// freed at once; the recomputation in backward (autograd::inBackward())
// gathers it again and keeps it until its gradients are in.
//
// noSync() (gradient accumulation without communication). While a
// NoSyncGuard lives, each unit's gradients are added into a full-size flat
// buffer of its own (4·n' bytes per unit, held until the next synced pass),
// with no collective; the next synced pass reduce-scatters its gradients plus
// what was accumulated. Parameters are still gathered and freed as above.
//
// Mixed precision (Options::mixedPrecision). The shards, their gradients and
// the optimizer stay float32 (master weights). With param BFloat16 or
// Float16, each unit's shard is converted to that dtype before the gather
// (half the traffic and half the gathered bytes), the module's parameters
// are tensors of that dtype, and forward() runs the module inside an
// autocast::Scope of it (tensor/autocast.h: the products in low precision,
// LayerNorm, softmax and the losses in float32), so the output is in the
// dtype the module's last op gives. Gradients arrive in the param dtype,
// are added up in the reduce dtype, reduce-scattered in it, and divided by
// N and added to the shards' float32 gradients. fullStateDict() gives the
// float32 masters. InvalidArgumentError for another dtype.
//
// The optimizer: build any weft optimizer over parameters() (one group: the
// shards flatten parameters with different roles, so per-parameter options
// such as decay groups do not apply). Each rank steps its shards only and
// holds its shards' state only; the next forward gathers the updated values.
//
// Memory per rank, float32 with Adam (Ψ elements): shards 4Ψ/N, gradients
// 4Ψ/N, Adam state 8Ψ/N (16Ψ/N), plus the padding (at most N−1 elements per
// unit, in each of the three) and the buffers, which are not sharded.
// Transient: the gathered units (with reshardAfterForward, the current one,
// the one being prefetched and the root) and the gradient buffers of at most
// two units. Construction briefly holds the whole model twice (rank 0's
// values are broadcast into copies). With a 16-bit param policy the held
// bytes are the same 16Ψ/N: the float32 shard is the master and its
// gradient stays float32 (the ZeRO paper's 2 + 2 + 12 per parameter, split
// 4 + 4 + 8); only the transient gathered units and gradient buffers shrink
// to 2 bytes per element (the reduce buffers are in the reduce dtype).
//
// State dicts: fullStateDict() gathers the whole module's state dict on one
// rank, under the module's names, loadable into the plain module;
// loadFullStateDict() takes each rank's shards from such a dict.
// shardedStateDict() is this rank's shards with metadata, reloaded into a
// wrapper over the same model and world size with loadShardedStateDict().
// The optimizer's state over the shards is the optimizer's own (its
// stateDict() per rank).
//
// Errors: InvalidArgumentError for a null module, units that are not
// submodules or share parameters, parameters that are not float32 CPU tensors
// requiring grad, and for ranks that wrap different units (checked at
// construction on every rank: unit sizes and parameter shapes, naming the
// first difference); StateError for a parameter read while its unit is
// freed (Tensor::rawData) and a pass in which parameters received no
// gradient; the group's errors (process_group.h) prefixed with what was being
// done (a rank that dies: DisconnectedError from the next gather or
// reduce-scatter). Threads: one thread constructs, runs forward, backward and
// the optimizer, and destroys. The wrapper must outlive every graph built
// through its forward.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/no_sync.h"
#include "collectives/process_group.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace weft::collectives {

class FullyShardedDataParallel {
 public:
  struct Options {
    // See "Units": empty for the default policy.
    std::vector<std::shared_ptr<nn::Module>> units = {};
    // true: ZeRO-3 (free each unit after its forward); false: keep it until
    // its backward is done.
    bool reshardAfterForward = true;
    // See "Mixed precision".
    struct MixedPrecision {
      DType param = DType::Float32;   // Float32, BFloat16 or Float16
      DType reduce = DType::Float32;  // Float32 or Float16 (Gloo reduces no bfloat16)
    };
    MixedPrecision mixedPrecision = {};
  };

  // Collective: checks that the ranks wrap the same units, broadcasts rank
  // 0's parameters and buffers, and shards the parameters (see above).
  // `module` and `group` must outlive this object.
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group, Options options);
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group)
      : FullyShardedDataParallel(std::move(module), group, Options{}) {}
  // Removes the hooks and waits for reductions still running (errors
  // dropped); the parameters are left released.
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // The module's forward through its hooks (collective: gathers units).
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // The flat shards, one per unit: the tensors to optimise.
  const std::vector<Tensor>& parameters() const { return shards_; }

  // Turns gradient synchronisation off for its lifetime (restores the
  // previous setting at the end; nests). See "noSync()".
  using NoSyncGuard = NoSyncScope<FullyShardedDataParallel>;
  [[nodiscard]] NoSyncGuard noSync();

  // Zeroes (or drops, when setToNone) the shards' gradients and drops what
  // noSync passes accumulated.
  void zeroGrad(bool setToNone = false);
  // nn::clipGradNorm_ over the sharded gradients (collective): the
  // normType-norm of all the averaged gradients, from each rank's part of the
  // sum of |g|^normType (or of the largest |g|) allreduced in float64; every
  // rank scales its shards' gradients by min(1, maxNorm / (total + 1e-6)) and
  // gets the same total. InvalidArgumentError as nn::clipGradNorm_'s (on
  // every rank alike when the total is not finite and errorIfNonfinite).
  double clipGradNorm_(double maxNorm, double normType = 2.0, bool errorIfNonfinite = false);

  // Collective. On rank `to`, module->stateDict()'s keys with the gathered
  // parameters (and the buffers), as clones: loadable into the plain module.
  // An empty dict elsewhere. Each unit is gathered into a buffer of its own,
  // one at a time; the module's tensors are not touched.
  nn::StateDict fullStateDict(int to = 0);
  // Not collective: this rank's shards of every parameter in `full` (a
  // module state dict, as fullStateDict() gives), and the buffers.
  // InvalidArgumentError naming a missing key or a shape that differs;
  // nothing changes then.
  void loadFullStateDict(const nn::StateDict& full);
  // Not collective: "shard.<u>" (this rank's shard of unit u, a clone),
  // "buffer.<name>" per persistent buffer, "shard.rank", "shard.world"
  // (Int64 scalars) and "shard.units" (Int64 [units, 2]: each unit's
  // elements without padding and its shard's length).
  nn::StateDict shardedStateDict() const;
  // Not collective: loads a shardedStateDict() saved by the same rank of a
  // group of the same size over the same units. InvalidArgumentError naming
  // the difference (rank, world, units, an unknown or missing key, a
  // length); nothing changes then.
  void loadShardedStateDict(const nn::StateDict& shard);

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  struct UnitInfo {
    std::string name;                 // the unit module's dotted name ("" for the root)
    std::vector<std::string> params;  // its parameters' dotted names, in flat order
    int64_t numel = 0;                // elements without padding
    int64_t shardNumel = 0;           // ⌈numel / N⌉
    bool gathered = false;            // whether its parameters are materialised now
  };
  std::vector<UnitInfo> units() const;
  // Bytes of the shards, of their gradients, and of the unit buffers that
  // hold full parameters or noSync gradients now.
  int64_t shardBytes() const;
  int64_t gradientShardBytes() const;
  int64_t gatheredBytes() const;

 private:
  struct Param {
    Tensor tensor;
    std::string name;
    size_t unit = 0;
    int64_t offset = 0;  // in the unit's flat storage, elements
    int hookId = -1;
    bool ready = false;
  };
  struct Unit {
    std::string name;
    std::shared_ptr<nn::Module> module;
    std::vector<size_t> params;
    int64_t numel = 0;
    int64_t chunk = 0;
    std::shared_ptr<Storage> storage;  // chunk·N float32; released when not gathered
    Tensor flat;                       // [chunk·N] over storage
    bool gathered = false;
    bool gathering = false;            // a prefetch in flight
    Work gatherWork;
    Tensor gatherInput;                // the shard it sends, kept until it completes
    int preHookId = -1;
    int postHookId = -1;
    // backward
    size_t waiting = 0;
    bool complete = false;
    bool launched = false;
    Tensor gradFlat;  // [chunk·N] while the pass runs
    Tensor pending;   // noSync accumulation
    Tensor reduced;   // [chunk], the reduce-scatter's output
    Work work;
  };

  void startGather(size_t u, const char* why);
  void gather(size_t u, const char* why);
  void prefetch(size_t u, const char* why);
  void reshard(size_t u);
  void onPreForward(size_t u);
  void onPostForward(size_t u, Tensor& output);
  void onGradient(size_t index, std::vector<Tensor>& grads);
  void beginPassLocked();
  void launchReadyLocked();
  void settleLocked(size_t u);
  void finishPass();
  void abandonPassLocked();
  friend class NoSyncScope<FullyShardedDataParallel>;
  void setSync(bool on);
  Tensor gatherCopy(size_t u);

  std::shared_ptr<nn::Module> module_;
  ProcessGroup& group_;
  Options options_;
  std::vector<Param> params_;
  std::vector<Unit> units_;
  std::vector<Tensor> shards_;

  mutable std::recursive_mutex mutex_;
  bool sync_ = true;
  bool passActive_ = false;
  std::weak_ptr<int> passToken_;
  int64_t passes_ = 0;
  std::vector<size_t> forwardOrder_;  // units in the order of this forward's pre-hooks
  std::vector<size_t> previousForwardOrder_;  // the previous forward's: what to prefetch
  std::vector<size_t> launchOrder_;   // this pass's
  size_t nextLaunch_ = 0;
  std::vector<size_t> launched_;      // launched, not yet settled
};

}  // namespace weft::collectives
