// Multi-tensor apply's launch plan (as PyTorch's multi_tensor_apply): a list
// of tensors is cut into chunks of kChunk elements, one thread block per
// chunk, and the chunks into launches of at most kMaxBlocks blocks over at
// most kMaxTensors tensors. Each launch gets a TensorTable by value in its
// parameter block, so the pointer table needs no upload and no
// synchronisation. Plain C++ (the kernels in kernels/cuda/optim.cu read
// the table; the plan is tested on the host).
//
//   multiTensorApply(tensors, [&](const TensorTable& table, int blocks) {
//     kernel<<<blocks, threads, 0, stream>>>(table, ...);
//   });
//
// Block b of a launch updates elements [blockChunk[b] * kChunk, min(numel,
// (blockChunk[b] + 1) * kChunk)) of tensor slot blockTensor[b]. A tensor
// whose chunks do not fit one launch continues in the next one, in a new
// slot. Empty tensors get no block; a list with no elements, no launch.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cuda/optim.h"

namespace weft::kernels::cuda {

struct TensorTable {
  static constexpr int kDepth = 5;           // param, grad, three state buffers
  static constexpr int kMaxTensors = 32;     // slots per launch
  static constexpr int kMaxBlocks = 320;     // blocks per launch
  static constexpr int64_t kChunk = 65536;   // elements per block

  void* ptr[kDepth][kMaxTensors];
  int64_t numel[kMaxTensors];
  double scalar[kMaxTensors][2];
  uint8_t blockTensor[kMaxBlocks];
  int32_t blockChunk[kMaxBlocks];
};
// A kernel's parameters must fit 4 KiB on every device: the table leaves
// room for the rule's constants.
static_assert(sizeof(TensorTable) <= 3800, "a TensorTable must leave room in a 4 KiB parameter block");

// Calls launch(table, blocks) for each launch of the plan over `tensors`.
template <class Launch>
void multiTensorApply(std::span<const OptimTensor> tensors, Launch&& launch) {
  constexpr int64_t kChunk = TensorTable::kChunk;
  TensorTable table;
  int nTensors = 0, nBlocks = 0;
  for (const OptimTensor& t : tensors) {
    if (t.numel <= 0) continue;
    const int64_t chunks = (t.numel + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || nTensors == 0) {
        // A slot for this tensor: at its first chunk, or again after a launch.
        table.ptr[0][nTensors] = t.param;
        table.ptr[1][nTensors] = const_cast<void*>(t.grad);
        for (int s = 0; s < 3; ++s) table.ptr[2 + s][nTensors] = t.state[s];
        table.numel[nTensors] = t.numel;
        table.scalar[nTensors][0] = t.scalar[0];
        table.scalar[nTensors][1] = t.scalar[1];
        ++nTensors;
      }
      table.blockTensor[nBlocks] = static_cast<uint8_t>(nTensors - 1);
      table.blockChunk[nBlocks] = static_cast<int32_t>(c);
      ++nBlocks;
      const bool lastChunk = c == chunks - 1;
      if (nBlocks == TensorTable::kMaxBlocks || (nTensors == TensorTable::kMaxTensors && lastChunk)) {
        launch(static_cast<const TensorTable&>(table), nBlocks);
        nBlocks = 0;
        nTensors = 0;
      }
    }
  }
  if (nBlocks > 0) launch(static_cast<const TensorTable&>(table), nBlocks);
}

}  // namespace weft::kernels::cuda
