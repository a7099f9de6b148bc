// The gpt example's pipelined layout (--pp P [--tp T] [--sp S] [--dp D], run under weftrun -n
// D·P·T·S): a process mesh {dp: D, pp: P, sp: S, tp: T} (collectives/mesh.h; tensor parallelism
// innermost, sequence parallelism outside it, world rank ((d·P + s)·S + q)·T + t is tp rank t of sp
// rank q of stage s of replica d; --sp-mode 2d splits sp into {ring, ulysses} as mesh_layout.h
// does; without --tp and --sp the mesh is {dp: D, pp: P}). Stage s of the model
// (pipeline::gptLayers cut by parameter count; with --schedule interleaved cut into 2P pieces, s
// and P + s being its two chunks) is trained by pipeline::PipelineExecutor with --schedule
// gpipe|1f1b|interleaved and --microbatches M. With --tp or --sp each stage is a range of
// collectives::TensorParallelGPT layers over the stage's tp group (of one process without --tp),
// given the sp groups' SpOptions with --sp: stage 0 holds the vocabulary-parallel embedding, the
// last stage the final LayerNorm, the vocabulary-parallel head and loss
// (TensorParallelGPT::lossOfLogits). Each (sp, tp) rank of every stage runs one executor over the
// pp group of that rank, on its sp rank's tokens, so activations pass between the same rank of
// adjacent stages, and wte's tie joins the same vocabulary rows on the first and the last stage;
// after the pipelined step a stage's gradients are summed over its sp group. With D > 1 each
// replica draws its own share of the job's windows (dataRank, dataWorld: --batch-size is a
// replica's) and every stage's gradients are averaged over its dp group after the pipelined
// backward. AdamW on each stage's parameters, the gradient norm clipped over the whole model (with
// --tp, the squares of the split parameters summed over the tp group, the replicated ones counted
// once), and every stage's parameters broadcast along the pp group before an evaluation or a
// sample, so that every process holds the whole model (its tp rank's shards with --tp); with --tp
// or --sp the evaluation runs the TensorParallelGPT on the stage's tp and sp groups and the sample
// the whole model gathered from the tp group. World rank 0 reports. --checkpoint other than none
// checkpoints each stage whole; --precision bf16 is a usage error (flags.h).
//
// Errors: InvalidArgumentError when the job's size is not D·P·T·S (naming the flags and both
// sizes, before joining the job) and for fewer layers than stages (times 2 interleaved); the
// executor's and the groups' errors (pipeline/executor.h).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/sequence_parallel.h"
#include "collectives/tensor_parallel.h"
#include "collectives/tensor_parallel_gpt.h"
#include "layout.h"
#include "nn/transformer.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"

namespace weft::examples::gpt {

std::unique_ptr<Layout> makePipelineLayout(const Flags& flags);

// ---- what this layout and the fully sharded pipeline (fsdp_pipeline_layout.cpp) build alike ----

// The mesh dimensions above: {dp, pp}, then --sp's (sequenceParallelDims), then {tp} with --tp or
// --sp.
std::vector<collectives::MeshDim> pipelineMeshDims(const Flags& flags);

// The pieces of the model a stage runs: 2 under --schedule interleaved, else 1.
int pipelineChunks(const Flags& flags);

// With --tp or --sp: this rank's TensorParallelGPT over the mesh's tp group (given the sp groups'
// SpOptions with --sp; ulysses and ring as makeSpGroups made them), loaded with `whole`'s weights;
// the default generator's state, the run's dropout stream, is kept across the parallel layers'
// own initialisation.
struct TensorParallelStages {
  std::shared_ptr<collectives::TpGroup> tp;
  std::optional<collectives::SpOptions> sp;
  std::shared_ptr<collectives::TensorParallelGPT> model;
};
TensorParallelStages tensorParallelStages(const Flags& flags, collectives::Mesh& mesh, const nn::GPT& whole,
                                          const nn::GPTConfig& config, collectives::SpGroup* ulysses,
                                          collectives::SpGroup* ring);

// InvalidArgumentError unless `layers` has at least stages·chunks layers to cut into pieces.
void checkPipelineCut(const nn::Sequential& layers, int stages, int chunks, const Flags& flags);

// --schedule's schedule of `stages` stages, `chunks` pieces each, and --microbatches.
pipeline::Schedule pipelineSchedule(const Flags& flags, int stages, int chunks);

// The last stage's loss: the mean cross-entropy of its logits, or with `tpModel` (--tp or --sp)
// TensorParallelGPT::lossOfLogits over this tp rank's vocabulary slice of its sp rank's tokens.
pipeline::LossFn pipelineLoss(std::shared_ptr<collectives::TensorParallelGPT> tpModel);

}  // namespace weft::examples::gpt
