// ZeroRedundancyOptimizer: ZeRO stage 1, the optimizer state sharded over the
// ranks of a process group (after torch.distributed.optim.ZeroRedundancyOptimizer).
// Under plain data parallelism every rank keeps the whole optimizer state
// (Adam: two moments per parameter) and takes the same step; here each rank
// keeps the state of its own shard of the parameters only, steps that shard,
// and then hands the updated values to the other ranks.
//
//   #include "collectives/ddp.h"
//   #include "collectives/zero.h"
//   collectives::DistributedDataParallel ddp(net, *pg);           // averaged gradients in .grad
//   collectives::ZeroRedundancyOptimizer opt(
//       nn::optim::decayGroups(net->namedParameters(), nn::optim::AdamWOptions{.lr = 6e-4, .weightDecay = 0.1}),
//       *pg);
//   for (...) {
//     opt.zeroGrad();
//     ddp.forward(x) ... .backward();
//     opt.step();                      // this rank's shard, then every parameter from its owner
//   }
//   nn::StateDict full = opt.consolidatedStateDict(0);   // collective; the whole state on rank 0
//
// It wraps any weft optimizer (nn/optim.h): it takes the parameter groups and
// options an nn::optim::Optimizer takes, and builds on each rank a local
// Optimizer of the same kind over the same groups restricted to that rank's
// parameters (a group may end up empty on a rank; a rank may own nothing).
//
// Partition (deterministic, the same on every rank): the parameters of all
// groups, ordered by size in bytes, largest first (ties: lower index first),
// each go to the rank that owns the fewest bytes so far (ties: the lowest
// rank). A parameter is never split, so a rank's share is within one
// parameter's size of the even split Ψ/N; ownerOf() and shard() say who owns
// what.
//
// step(): the local optimizer's step over this rank's shard, reading .grad
// (the gradients every rank holds after DDP's allreduce; a parameter without
// .grad is skipped, as by the plain optimizer), then, for each rank r in turn,
// r's parameters coalesced into flat buffers (per dtype, at most
// Options::broadcastBucketBytes each) and broadcast from r. Since a shard's
// update is the plain optimizer's per-parameter arithmetic on the same
// gradients, the parameters after each step equal, to the bit, those of the
// plain optimizer stepping every parameter on every rank.
//
// Memory: the optimizer state of rank r is the state of its shard only. For
// Adam or AdamW in float32 that is 8 bytes (exp_avg, exp_avg_sq) per element
// of the shard, 8Ψ/N per rank against 8Ψ for the plain optimizer (the ZeRO
// paper's 12Ψ/N counts a float32 master copy that float32 training does not
// have); stateBytes() sums what this rank holds. The broadcast buffers live
// during step() only.
//
// Mixed precision (Options::masterWeights). With 16-bit parameters
// (BFloat16, Float16: a module converted with Module::to, its gradients
// averaged by DDP with Options::reduceDtype), each rank keeps a float32 copy
// of the 16-bit parameters it owns (the master, cloned from the parameter's
// value at construction), its local optimizer steps the masters with the
// .grad cast to float32, each owned parameter is set to its master rounded
// to nearest-even, and the broadcast carries the 16-bit values (half the
// bytes). This is nn::optim::MasterWeightOptimizer (nn/master_weights.h)
// restricted to the shard: the parameters after each step equal its, to the
// bit. Memory per rank with Adam: the parameters 2Ψ and their .grad 2Ψ
// (every rank's), the masters and their state 12Ψ/N (the ZeRO paper's
// 2Ψ + 2Ψ + 12Ψ/N); masterBytes() says what the masters take. The state
// dicts hold the masters' optimizer state and the masters ("master.<i>",
// float32, global index i), in nn::optim::MasterWeightOptimizer::stateDict()'s
// format, so a checkpoint resumes to the bit.
//
// Collective: construction, step(), consolidatedStateDict() and
// loadStateDict() are called by every rank of the group, in the same order
// relative to the group's other collectives. The constructor compares the
// ranks' parameter layouts (group sizes, each parameter's element count and
// dtype) and fails on every rank with InvalidArgumentError naming the first
// difference when they disagree.
//
// Errors: InvalidArgumentError for bad groups or options (as
// nn::optim::Optimizer's), a non-positive bucket size, a bad rank or a state
// dict that does not fit; the group's errors (TimeoutError, DisconnectedError,
// StateError: process_group.h) prefixed with what the optimizer was doing.
// A failed broadcast leaves the parameters of the ranks it did not reach at
// their old values: the replicas then differ, and the group is unusable anyway
// after a timeout or a lost peer.
//
// Checkpoints: consolidatedStateDict() writes one dict for the whole job;
// shardedStateDict() lets each rank save its own, reloaded by the same rank
// of a job of the same size with loadShardedStateDict().
//
// Threads: one thread at a time; a step must not run concurrently with
// anything that reads or writes the parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/process_group.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "tensor/tensor.h"

namespace weft::collectives {

class ZeroRedundancyOptimizer {
 public:
  struct Options {
    // Most bytes per coalesced broadcast in step(); > 0 (InvalidArgumentError).
    int64_t broadcastBucketBytes = int64_t{25} << 20;
    // Step 16-bit parameters through float32 masters (see "Mixed precision").
    bool masterWeights = false;
  };

  // `group` must outlive the optimizer. See "Partition" and "Collective".
  ZeroRedundancyOptimizer(std::vector<nn::optim::ParamGroup> groups, ProcessGroup& group, Options options);
  ZeroRedundancyOptimizer(std::vector<nn::optim::ParamGroup> groups, ProcessGroup& group)
      : ZeroRedundancyOptimizer(std::move(groups), group, Options{}) {}
  ZeroRedundancyOptimizer(std::vector<Tensor> params, nn::optim::OptimizerOptions options, ProcessGroup& group)
      : ZeroRedundancyOptimizer({nn::optim::ParamGroup{std::move(params), std::move(options)}}, group, Options{}) {}
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // See "step()". Collective.
  void step();
  // Zeroes (or drops) the .grad of every parameter, not only the shard's.
  void zeroGrad(bool setToNone = false);

  // Every group's parameters in order (the global indices used below).
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<nn::optim::ParamGroup>& groups() const { return groups_; }
  // The rank that owns parameter `index`; IndexError when out of range.
  int ownerOf(size_t index) const;
  // The global indices of the parameters rank `rank` owns, ascending;
  // InvalidArgumentError for a bad rank.
  std::vector<size_t> shard(int rank) const;
  // This rank's optimizer over its shard (null when it owns nothing).
  const nn::optim::Optimizer* localOptimizer() const { return local_.get(); }
  // Bytes of the optimizer state buffers this rank holds, and of its
  // float32 masters (Options::masterWeights).
  int64_t stateBytes() const;
  int64_t masterBytes() const;

  // Learning rates of every group or of group `group` (InvalidArgumentError
  // when out of range), on this rank's optimizer and in groups().
  double lr(size_t group = 0) const;
  void setLr(double lr);
  void setLr(size_t group, double lr);

  // Collective. On rank `to`, the whole optimizer state in the format of
  // nn::optim::Optimizer::stateDict() over params() (global indices, every
  // group's params count and lr), loadable into the plain optimizer or into
  // loadStateDict() here; an empty dict on the other ranks. Moves through
  // allGatherObject (collectives/object_collectives.h): each rank briefly
  // holds every shard's state during the call.
  nn::StateDict consolidatedStateDict(int to = 0);
  // Not collective: each rank takes its shard's entries of a full state dict
  // (consolidatedStateDict's or a plain optimizer's over the same groups)
  // and the groups' lrs. Checks (group sizes, indices, names, shapes) come
  // before anything changes: InvalidArgumentError naming the key.
  void loadStateDict(const nn::StateDict& full);
  // Not collective: this rank's state only, for a checkpoint per rank: the
  // entries of consolidatedStateDict() for the parameters it owns, every
  // group's entries, and "shard.rank", "shard.world" (Int64 scalars) and
  // "shard.params" (Int64, the owned global indices, ascending).
  nn::StateDict shardedStateDict() const;
  // Not collective: loads a shardedStateDict() saved by the same rank of a
  // group of the same size over the same parameters. InvalidArgumentError
  // naming the difference when the rank, the size or the owned parameters
  // differ, or as loadStateDict() for the rest; nothing changes then.
  void loadShardedStateDict(const nn::StateDict& shard);

 private:
  void partition();
  void checkLayoutsAgree();
  void broadcastParameters();
  size_t checkGroup(const char* what, size_t group) const;

  ProcessGroup& group_;
  Options options_;
  std::vector<nn::optim::ParamGroup> groups_;
  std::vector<Tensor> params_;
  std::vector<size_t> groupOf_;      // global index -> group
  std::vector<int> owner_;           // global index -> rank
  std::vector<size_t> localIndex_;   // global index -> index in local_ (owned ones)
  std::vector<size_t> mine_;         // global indices this rank owns, ascending
  std::unique_ptr<nn::optim::Optimizer> local_;
};

}  // namespace weft::collectives
