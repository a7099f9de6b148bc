// What the ZeRO, FSDP and mixed-precision worker programs (zero_worker.cpp, fsdp_worker.cpp,
// mixed_precision_worker.cpp) share: the tiny GPT they train (vocab 64, block 16, 2 layers, 2
// heads, width 32, no dropout, the same initial weights on every rank), each rank's batch of a
// step, the AdamW settings, the loss, and the bytes held by tensors once the group has settled.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "collectives/process_group.h"
#include "nn/functional.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

namespace weft::testing::zero {

inline constexpr int64_t kTinyVocab = 64, kTinyBlock = 16, kTinyLayers = 2, kTinyWidth = 32;
// Its parameter count by the GPT's formula (the tests check the workers' count against it):
// V·C + T·C + L·(12·C² + 13·C) + 2·C.
inline constexpr int64_t kTinyGptParameters = kTinyVocab * kTinyWidth + kTinyBlock * kTinyWidth +
                                              kTinyLayers * (12 * kTinyWidth * kTinyWidth + 13 * kTinyWidth) +
                                              2 * kTinyWidth;

inline std::shared_ptr<nn::GPT> tinyGpt() {
  nn::GPTConfig c;
  c.vocabSize = kTinyVocab;
  c.blockSize = kTinyBlock;
  c.layers = kTinyLayers;
  c.heads = 2;
  c.width = kTinyWidth;
  Generator init(11);
  return std::make_shared<nn::GPT>(c, &init);
}

// Rank `rank`'s inputs and targets at `step`: [4, 16] token ids of its own.
inline std::pair<Tensor, Tensor> batch(int rank, int step) {
  Generator gen(900 + static_cast<uint64_t>(rank) * 37 + static_cast<uint64_t>(step));
  Tensor idx = randint(0, kTinyVocab, {4, kTinyBlock}, {.dtype = DType::Int64}, &gen);
  Tensor targets = randint(0, kTinyVocab, {4, kTinyBlock}, {.dtype = DType::Int64}, &gen);
  return {idx, targets};
}

inline nn::optim::AdamWOptions adamw() { return {.lr = 3e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .weightDecay = 0.1}; }

inline Tensor lossOf(const Tensor& logits, const Tensor& targets) {
  return nn::functional::crossEntropy(logits.view({-1, 64}), targets.view({-1}));
}

// The bytes held by tensors once the group's thread has let go of the tensors of finished
// collectives: it drops an op only after completing its Work, so after a barrier, the count is
// read until it stays put (three equal reads 5 ms apart, at most 2 s).
inline size_t settledLiveBytes(collectives::ProcessGroup& pg) {
  pg.barrier().wait();
  size_t last = Storage::memoryStats().liveBytes;
  int same = 0;
  for (int i = 0; i < 400 && same < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const size_t now = Storage::memoryStats().liveBytes;
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

}  // namespace weft::testing::zero
