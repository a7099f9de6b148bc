// The gpt example's fully sharded layout (--fsdp, run under weftrun -n N): every process builds the
// whole model from the same seed (or --load) and wraps it in collectives::FullyShardedDataParallel (ZeRO-3:
// each TransformerBlock a unit, the embeddings and the final LayerNorm the root unit); each
// process draws its own share of the batch windows, and AdamW steps its flat shards (one group:
// --weight-decay applies to every parameter, the flat shards mixing matrices, biases and
// LayerNorm weights). The gradient norm is clipped over the shards (FSDP::clipGradNorm_);
// evaluation runs the same batch through the wrapper on every process; sampling gathers the full
// model on each process in turn. --checkpoint works; --precision bf16 is refused.
#pragma once

#include <memory>

#include "layout.h"

namespace weft::examples::gpt {

std::unique_ptr<Layout> makeFsdpLayout(const Flags& flags);

}  // namespace weft::examples::gpt
