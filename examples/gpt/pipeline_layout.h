// The gpt example's pipelined layout (--pp P [--dp D], run under weftrun -n D·P): a process mesh
// {dp: D, pp: P} (collectives/mesh.h; world rank d·P + s is stage s of replica d). Stage s of the
// model (pipeline::gptLayers cut by parameter count; with --schedule interleaved cut into 2P
// pieces, s and P + s being its two chunks) is trained by pipeline::PipelineExecutor with
// --schedule gpipe|1f1b|interleaved and --microbatches M; with D > 1 each replica draws its own
// share of the job's windows (dataRank, dataWorld: --batch-size is a replica's) and every stage's
// gradients are averaged over its dp group after the pipelined backward. AdamW on each stage's
// parameters, the gradient norm clipped over the whole model, and every stage's parameters
// broadcast to every process of its replica before an evaluation or a sample. World rank 0
// reports. --checkpoint other than none checkpoints each stage whole; --precision bf16 is refused.
#pragma once

#include <memory>

#include "layout.h"

namespace weft::examples::gpt {

std::unique_ptr<Layout> makePipelineLayout(const Flags& flags);

}  // namespace weft::examples::gpt
