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

#include "layout.h"

namespace weft::examples::gpt {

std::unique_ptr<Layout> makePipelineLayout(const Flags& flags);

}  // namespace weft::examples::gpt
