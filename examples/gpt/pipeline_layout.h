// The gpt example's pipelined layout (--pp P [--tp T] [--dp D], run under weftrun -n D·P·T): a
// process mesh {dp: D, pp: P, tp: T} (collectives/mesh.h; tensor parallelism innermost, world rank
// (d·P + s)·T + t is tp rank t of stage s of replica d; without --tp the mesh is {dp: D, pp: P}).
// Stage s of the model (pipeline::gptLayers cut by parameter count; with --schedule interleaved cut
// into 2P pieces, s and P + s being its two chunks) is trained by pipeline::PipelineExecutor with
// --schedule gpipe|1f1b|interleaved and --microbatches M. With --tp each stage is a range of
// collectives::TensorParallelGPT layers over the stage's tp group (stage 0 holds the
// vocabulary-parallel embedding, the last stage the final LayerNorm, the vocabulary-parallel head
// and loss); tp rank t of every stage runs one executor over the pp group of tp rank t, so
// activations pass between the same tp rank of adjacent stages, and wte's tie joins the same
// vocabulary rows on the first and the last stage. With D > 1 each replica draws its own share of
// the job's windows (dataRank, dataWorld: --batch-size is a replica's) and every stage's gradients
// are averaged over its dp group after the pipelined backward. AdamW on each stage's parameters,
// the gradient norm clipped over the whole model (with --tp, the squares of the split parameters
// summed over the tp group, the replicated ones counted once), and every stage's parameters
// broadcast to every process of its replica (of its tp rank) before an evaluation or a sample;
// with --tp the evaluation runs the TensorParallelGPT and the sample the whole model gathered from
// the tp group. World rank 0 reports. --checkpoint other than none checkpoints each stage whole;
// --precision bf16 is refused; --sp does not combine with --pp (flags.h).
#pragma once

#include <memory>

#include "layout.h"

namespace weft::examples::gpt {

std::unique_ptr<Layout> makePipelineLayout(const Flags& flags);

}  // namespace weft::examples::gpt
