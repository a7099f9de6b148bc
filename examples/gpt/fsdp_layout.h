// The gpt example's fully sharded layouts (--fsdp): collectives::FullyShardedDataParallel (ZeRO-3)
// over the job, or over the dp dimension of a mesh around a pipeline stage or a tensor- or
// sequence-parallel model. makeFsdpLayout picks one from the flags:
//  - --fsdp [--dp N] (weftrun -n N; --dp, when given, is the job's size): every process builds the
//    whole model from the same seed (or --load) and wraps it in FSDP over the job (each
//    TransformerBlock a unit, the embeddings and the final LayerNorm the root unit); each process
//    draws its own share of the batch windows (dataRank, dataWorld: --batch-size is a process's).
//    The gradient norm is
//    clipped over the shards (FSDP::clipGradNorm_); evaluation runs the same batch through the
//    wrapper on every process; sampling gathers the full model on each process in turn.
//  - --fsdp --dp D --pp P [--tp T] [--sp S] (weftrun -n D·P·T·S; fsdp_pipeline_layout.cpp): the
//    mesh of pipeline_layout.h, each stage's module (each chunk's, interleaved; a range of
//    TensorParallelGPT layers with --tp or --sp) wrapped in FSDP over the stage's dp group; the
//    executor does not average over dp, FSDP's reduce-scatters do.
//  - --fsdp --dp D with --tp T and/or --sp S (weftrun -n D·S·T; fsdp_mesh_layout.cpp): the mesh
//    of mesh_layout.h, collectives::TensorParallelGPT on the tp group (its tokens split over sp
//    with --sp) or with --sp alone collectives::SequenceParallelGPT, wrapped in FSDP over the dp
//    group (each tp rank's part of a block's matrices is what its dp group flattens and shards).
// In every one AdamW steps the flat shards with nanoGPT's decay groups (ShardedAdamW below:
// --weight-decay on the matrices' elements only, as nn::optim::decayGroups), so a job takes the
// one-process run's steps on the same windows up to float rounding. --checkpoint works;
// --precision bf16 is refused (InvalidArgumentError).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/fsdp.h"
#include "layout.h"
#include "nn/optim.h"

namespace weft::examples::gpt {

std::unique_ptr<Layout> makeFsdpLayout(const Flags& flags);
std::unique_ptr<Layout> makeFsdpPipelineLayout(const Flags& flags);
std::unique_ptr<Layout> makeFsdpMeshLayout(const Flags& flags);

// Where a parameter of an FSDP-wrapped module lies in this rank's shards: `length` of its elements
// are elements [shardBegin, shardBegin + length) of FullyShardedDataParallel::parameters()[unit].
// From the layout fsdp.h documents: a unit's parameters follow one another in its flat storage, in
// the order units() lists them, and rank r's shard is elements [r·shardNumel, (r+1)·shardNumel).
struct ShardSlice {
  size_t unit = 0;
  std::string name;  // the parameter's name in the wrapped module
  Tensor parameter;  // the module's parameter (its shape; its data is not to be read)
  int64_t shardBegin = 0;
  int64_t length = 0;
};
// The slices of this rank's shards (group rank `rank`), parameters without elements here left out.
std::vector<ShardSlice> shardSlices(const collectives::FullyShardedDataParallel& fsdp, int rank);
// Where parameter `p` lies in its unit's flat storage: its unit and first element; -1 offset when
// the wrapper does not hold it.
struct FlatPlace {
  size_t unit = 0;
  int64_t offset = -1;
};
FlatPlace flatPlace(const collectives::FullyShardedDataParallel& fsdp, const Tensor& p);

// AdamW over the shards of one or more FSDP wrappers with the decay groups of
// nn::optim::decayGroups: the elements of parameters of 2 or more dimensions are multiplied by
// 1 − lr·weightDecay before the step (AdamW's decoupled decay, applied to them alone), the Adam
// update of every element follows with no decay. The wrappers must outlive it; `rank` is this
// process's rank in their groups.
class ShardedAdamW {
 public:
  ShardedAdamW(const std::vector<collectives::FullyShardedDataParallel*>& wrappers, int rank, const Flags& f);
  void setLr(double lr) {
    lr_ = lr;
    opt_->setLr(lr);
  }
  void zeroGrad() { opt_->zeroGrad(true); }
  void step();

 private:
  struct Decayed {
    Tensor shard;
    int64_t begin;
    int64_t length;
  };
  std::unique_ptr<nn::optim::AdamW> opt_;
  std::vector<Decayed> decayed_;
  double lr_;
  double weightDecay_;
};

}  // namespace weft::examples::gpt
