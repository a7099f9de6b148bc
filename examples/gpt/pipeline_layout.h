// The gpt example's pipelined layout (--pp P, run under weftrun -n P): stage s of the model
// (pipeline::gptLayers cut by parameter count) on rank s, trained by pipeline::PipelineExecutor
// with --schedule gpipe|1f1b and --microbatches M; AdamW on each stage's parameters, the gradient
// norm clipped over the whole model, and every stage's parameters broadcast to every process
// before an evaluation or a sample. Rank 0 reports. --checkpoint other than none checkpoints each
// stage whole; --precision bf16 is refused.
#pragma once

#include <memory>

#include "layout.h"

namespace weft::examples::gpt {

std::unique_ptr<Layout> makePipelineLayout(const Flags& flags);

}  // namespace weft::examples::gpt
