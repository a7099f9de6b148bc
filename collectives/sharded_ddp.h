// ShardedDataParallel: ZeRO stage 2, data parallelism with gradients and
// optimizer state sharded over the ranks of a process group. Like
// DistributedDataParallel it replicates the module and reduces gradients in
// buckets during backward, but each bucket is reduce-scattered instead of
// allreduced: each rank keeps only its slice of every bucket's averaged
// gradient, steps the optimizer on that slice only (so it holds that slice's
// optimizer state only), and all-gathers the updated parameters.
//
//   #include "collectives/sharded_ddp.h"
//   auto net = std::make_shared<Net>();
//   collectives::ShardedDataParallel sdp(
//       net, nn::optim::decayGroups(net->namedParameters(), nn::optim::AdamWOptions{.lr = 6e-4, .weightDecay = 0.1}),
//       *pg);                                     // rank 0's parameters and buffers everywhere
//   for (...) {
//     sdp.zeroGrad();
//     sdp.forward(x) ... .backward();             // reduce-scatters bucket by bucket; .grad stays empty
//     sdp.step();                                 // this rank's slices, then all-gathers the parameters
//   }
//
// Construction (collective): the groups hold parameters of the module that
// require grad, each once, contiguous CPU tensors; the ranks compare their
// layouts (InvalidArgumentError on every rank naming the first difference),
// then rank 0's parameters and buffers are broadcast, and the parameters are
// laid out in buckets as DDP's first layout: in reverse order of
// module->parameters() (whatever their groups), a new bucket whenever the
// next parameter would take it past Options::bucketCapBytes or has another
// dtype (a parameter larger than the cap has a bucket of its own); there is
// no rebuild in gradient order. A bucket of n elements is padded with zeros
// to n' = N·⌈n/N⌉ elements and rank r owns its elements [r·n'/N,
// (r+1)·n'/N): slices of whichever parameters fall there (a parameter may be
// split between ranks; the shard is even to within N−1 elements per bucket).
// The parameters must keep their storage while wrapped (no Module::to): the
// slices the optimizer updates are views of it.
//
// Backward. A pre-hook on each parameter's AccumulateGrad node copies the
// gradient into its bucket's flat buffer (allocated when the bucket's first
// gradient arrives) and takes it from the engine: nothing reaches .grad. A
// bucket whose gradients are all in is reduce-scattered (sum) at once,
// asynchronously, buckets launched in bucket order so that every rank issues
// the same collectives. When the pass is over on this worker
// (autograd::queueCallback), backward waits for them, divides this rank's
// slices by N and adds them to its gradient shard; the flat buffers are freed.
// So the averaged gradient of each element is the one DDP computes (the same
// sum over the ranks, then the same scaling), and step() updates the
// parameters as the plain optimizer would with DDP's gradients: to the bit
// where the backend's reduce-scatter adds the ranks' values in the order its
// allreduce does (two ranks always). Passes without zeroGrad() between them
// add up in the shard, as DDP's do in .grad (gradient accumulation, with a
// reduce-scatter per pass).
//
// noSync() (gradient accumulation without communication). While a
// NoSyncGuard lives, the hooks add each gradient to a full-size buffer per
// parameter, with no collective; the next synced pass reduces, for each
// parameter, its new gradient plus what was accumulated. Those buffers hold
// the whole gradient (4Ψ in float32) until that pass: accumulation without
// communication cannot keep only a shard. The noSync passes are each rank's
// own business; every rank must run the same number of synced passes.
//
// Every parameter must receive a gradient in every synced pass (StateError
// naming the missing ones, raised from backward()). There is no distributed
// autograd context support: a synced pass is a local backward on the thread
// that runs it. Buffers are broadcast at construction only.
//
// step() (collective): the optimizer's functional step (nn/optim.h, per group
// with its options) over this rank's slices, with their slices of the
// gradient shard; slices without a gradient (no pass since zeroGrad(true))
// are skipped, as the plain optimizer skips parameters without .grad. Then
// each bucket's parameters are all-gathered (allGatherInto) and copied into
// every rank's parameters. The optimizers are element-wise, so stepping a
// parameter slice by slice is stepping the parameter.
//
// Memory per rank, float32 with Adam: the parameters (4Ψ), the gradient shard
// (4Ψ/N) and the optimizer state of the slices (8Ψ/N), plus the padding of at
// most N−1 elements per bucket; gradientShardBytes() and stateBytes() say
// what is held. Transient: the flat buffers of the buckets of a pass while
// it runs, and the gather buffers during step().
//
// State dicts: consolidatedStateDict() gathers the slices' optimizer state
// into the plain optimizer's format on one rank; loadStateDict() takes each
// rank's slices of such a dict. shardedStateDict() lets each rank save its
// own slices, reloaded by the same rank of a job of the same size and bucket
// layout with loadShardedStateDict().
//
// Mixed precision (Options::reduceDtype, Options::masterWeights). With
// 16-bit parameters (BFloat16, Float16: a module converted with Module::to;
// the forward's autocast is the caller's), reduceDtype (Float32 or Float16:
// Gloo reduces no bfloat16, and a bfloat16 parameter on a gloo group without
// reduceDtype is an InvalidArgumentError at construction, naming it) is the
// dtype of the flat buffers: each gradient
// is converted into its slot and the bucket reduce-scattered and divided by
// N in it; this rank's slice is then rounded to the parameters' dtype and
// added to the gradient shard, which holds the parameters' dtype (2 bytes
// per element: the ZeRO paper's 16-bit gradients). With masterWeights, each
// slice of a 16-bit parameter has a float32 master (cloned from the
// parameter at construction, after rank 0's broadcast); step() runs the
// optimizer over the masters with the shard's gradients cast to float32,
// writes each master rounded to nearest-even into the parameter's elements,
// and all-gathers the 16-bit values. So the parameters after each step equal,
// to the bit, those of DistributedDataParallel with the same reduceDtype and
// nn::optim::MasterWeightOptimizer, where the backend adds as its allreduce
// does (two ranks always). Memory per rank with Adam: the parameters 2Ψ, the
// gradient shard 2Ψ/N, the masters 4Ψ/N and their state 8Ψ/N (the ZeRO
// paper's 2Ψ + 14Ψ/N), plus the padding; masterBytes() says what the
// masters take. The flat buffers in reduceDtype (4 bytes per element for
// Float32) live while the pass runs, as above. The optimizer state is the
// masters', in float32, and the state dicts hold the masters too:
// consolidatedStateDict() as "master.<param>" (float32, whole, in
// nn::optim::MasterWeightOptimizer::stateDict()'s format),
// shardedStateDict() as "slice.<param>.<start>.master"; loading either sets
// the masters and, rounded, the parameters' elements they cover, so a
// checkpoint resumes to the bit. clipGradNorm_ sums a 16-bit shard in
// float32.
//
// clipGradNorm_() clips the sharded gradients by their global norm, which
// needs one allreduce of a scalar.
//
// Errors: InvalidArgumentError for bad options or groups (as
// nn::optim::Optimizer's, and parameters not of the module, frozen or not
// contiguous); the group's errors (process_group.h) prefixed with what was
// being done. Threads: one thread constructs, runs forward, backward and
// step, and destroys.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collectives/no_sync.h"
#include "collectives/process_group.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "tensor/tensor.h"

namespace weft::collectives {

class ShardedDataParallel {
 public:
  struct Options {
    // Most bytes of gradient per bucket; > 0 (InvalidArgumentError).
    int64_t bucketCapBytes = int64_t{25} << 20;
    // The dtype the buckets are reduce-scattered in; unset: the parameters'
    // own (see "Mixed precision").
    std::optional<DType> reduceDtype = std::nullopt;
    // Step 16-bit parameters through float32 master slices.
    bool masterWeights = false;
  };

  // What the last synced pass did, for tests and tuning.
  struct Stats {
    int64_t syncedPasses = 0;
    std::vector<size_t> launchHooks;  // gradients that had arrived when each reduce-scatter was launched
    size_t hooks = 0;                 // gradients of the pass
  };

  // See "Construction". `module` and `group` must outlive this object.
  ShardedDataParallel(std::shared_ptr<nn::Module> module, std::vector<nn::optim::ParamGroup> groups,
                      ProcessGroup& group, Options options);
  ShardedDataParallel(std::shared_ptr<nn::Module> module, std::vector<nn::optim::ParamGroup> groups,
                      ProcessGroup& group)
      : ShardedDataParallel(std::move(module), std::move(groups), group, Options{}) {}
  // Every parameter of the module that requires grad, in one group.
  ShardedDataParallel(std::shared_ptr<nn::Module> module, nn::optim::OptimizerOptions options, ProcessGroup& group);
  // Removes the hooks and waits for reductions still running (errors dropped).
  ~ShardedDataParallel();
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;

  Tensor forward(const Tensor& input) { return module_->forward(input); }
  Tensor operator()(const Tensor& input) { return forward(input); }

  // Turns gradient synchronisation off for its lifetime (restores the
  // previous setting at the end; nests). See "noSync()".
  using NoSyncGuard = NoSyncScope<ShardedDataParallel>;
  [[nodiscard]] NoSyncGuard noSync();
  // What noSync passes accumulated for parameter `index` (undefined when
  // nothing); IndexError for a bad index.
  Tensor pendingGradient(size_t index) const;

  // See "step()".
  void step();
  // Zeroes this rank's gradient shard, or drops it when setToNone.
  void zeroGrad(bool setToNone = false);
  // Learning rates of every group or of group `group` (InvalidArgumentError
  // when out of range), as nn::optim::Optimizer's: the next step() uses them.
  double lr(size_t group = 0) const;
  void setLr(double lr);
  void setLr(size_t group, double lr);
  // nn::clipGradNorm_ over the sharded gradients (collective): the
  // normType-norm of all the averaged gradients, from each rank's part of the
  // sum of |g|^normType (or of the largest |g|) allreduced in float64; every
  // rank scales its shard by min(1, maxNorm / (total + 1e-6)) and gets the
  // same total. InvalidArgumentError as nn::clipGradNorm_'s (on every rank
  // alike when the total is not finite and errorIfNonfinite).
  double clipGradNorm_(double maxNorm, double normType = 2.0, bool errorIfNonfinite = false);

  // Collective. On rank `to`, the whole optimizer state in the format of
  // nn::optim::Optimizer::stateDict() over params() (each parameter's buffers
  // assembled from the ranks' slices), loadable into the plain optimizer over
  // the same groups or into loadStateDict() here; an empty dict elsewhere.
  // Moves through allGatherObject: each rank briefly holds every slice.
  nn::StateDict consolidatedStateDict(int to = 0);
  // Not collective: each rank takes its slices of a full state dict (as
  // nn::optim::Optimizer::loadStateDict checks and converts it, which first
  // builds the whole state on this rank) and the groups' lrs.
  // InvalidArgumentError as that function's.
  void loadStateDict(const nn::StateDict& full);
  // Not collective: this rank's slices of the optimizer state, for a
  // checkpoint per rank: "slice.<param>.<start>.step" and
  // "slice.<param>.<start>.<buffer>" per slice with state, every group's
  // "param_groups.<g>.params" and ".lr", and "shard.rank", "shard.world"
  // (Int64 scalars) and "shard.slices" (Int64 [slices, 3]: parameter, start,
  // length of each slice this rank owns).
  nn::StateDict shardedStateDict() const;
  // Not collective: loads a shardedStateDict() saved by the same rank of a
  // group of the same size over the same parameters and buckets.
  // InvalidArgumentError naming the difference (rank, size, slices, an
  // unknown key or buffer, a length, a group's size); nothing changes then.
  void loadShardedStateDict(const nn::StateDict& shard);

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  // Every group's parameters in order (the indices used below).
  const std::vector<Tensor>& params() const { return params_; }
  // Parameter indices of each bucket, in bucket order.
  std::vector<std::vector<size_t>> buckets() const;
  // This rank's slice of the averaged gradient of parameter `index`'s
  // elements [start, start + length) in its flattened order, as held in the
  // gradient shard; an empty vector of pieces when this rank owns none of it.
  // IndexError for a bad index.
  struct Slice {
    int64_t start = 0;
    Tensor grad;  // undefined when no synced pass since zeroGrad(true)
  };
  std::vector<Slice> gradientSlices(size_t index) const;
  int64_t gradientShardBytes() const;
  int64_t stateBytes() const;
  // Bytes of the float32 master slices (Options::masterWeights).
  int64_t masterBytes() const;
  Stats stats() const;

 private:
  struct Param {
    Tensor tensor;
    std::string name;
    size_t group = 0;
    size_t moduleIndex = 0;  // in module->namedParameters()
    size_t bucket = 0;
    int64_t offset = 0;  // in the bucket, elements
    int hookId = -1;
    bool ready = false;
    Tensor pending;  // noSync accumulation
  };
  // A slice of one parameter inside this rank's part of a bucket.
  struct Piece {
    size_t param = 0;
    int64_t start = 0;       // in the flattened parameter
    int64_t length = 0;
    int64_t shardOffset = 0; // in the bucket's shard
    Tensor values;           // a view of the parameter's elements
    Tensor master;           // float32 copy of values (Options::masterWeights, 16-bit); else undefined
    nn::optim::ParamState state;
    // What the optimizer steps: the master when there is one.
    const Tensor& stepped() const { return master.defined() ? master : values; }
  };
  struct Bucket {
    std::vector<size_t> params;
    int64_t numel = 0;
    int64_t chunk = 0;       // padded numel / N
    std::vector<size_t> pieces;
    Tensor gradShard;        // chunk elements; undefined when dropped
    Tensor flat;             // during a pass
    Tensor reduced;          // during a pass: this rank's reduce-scatter output
    size_t waiting = 0;
    bool launched = false;
    Work work;
  };

  void broadcastState();
  void layOut();
  void onGradient(size_t index, std::vector<Tensor>& grads);
  void launchReadyLocked();
  void finishPass();
  void abandonPassLocked();
  friend class NoSyncScope<ShardedDataParallel>;
  void setSync(bool on);

  std::shared_ptr<nn::Module> module_;
  ProcessGroup& group_;
  Options options_;
  std::vector<nn::optim::ParamGroup> groups_;
  std::vector<Tensor> params_;
  std::vector<Param> meta_;
  std::vector<Bucket> buckets_;
  std::vector<Piece> pieces_;

  mutable std::mutex mutex_;
  bool sync_ = true;
  bool passActive_ = false;
  std::weak_ptr<int> passToken_;  // see DistributedDataParallel
  size_t nextBucket_ = 0;
  Stats stats_;
};

}  // namespace weft::collectives
