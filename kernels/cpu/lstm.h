// The pointwise part of an LSTM cell (torch.nn.LSTMCell), fused: the gate
// pre-activations come from the caller's GEMMs, these kernels apply the gate
// nonlinearities and the state update, and their exact derivative.
//
//   // gates [N, 4H] = x · wIh^T + h · wHh^T + bIh + bHh, chunks i, f, g, o
//   lstmCellForward(DType::Float32, N, H, gates, c, cNew, hNew);
//
//   i = σ(gates_i)  f = σ(gates_f)  g = tanh(gates_g)  o = σ(gates_o)
//   c' = f * c + i * g             h' = o * tanh(c')
//
// All buffers are contiguous and row-major. Threading: rows split across
// OpenMP threads above kParallelGrain elements.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cpu {

// Replaces the pre-activations in gates [N, 4H] by the activations (i, f, g,
// o), and writes cNew [N, H] and hNew [N, H] from c [N, H].
void lstmCellForward(DType type, int64_t n, int64_t hidden, void* gates, const void* c, void* cNew, void* hNew);

// From the activations (as left by lstmCellForward), c, cNew and the incoming
// gradients gradH / gradC [N, H], writes gradGates [N, 4H] (with respect to the
// pre-activations) and gradCPrev [N, H] (with respect to c).
void lstmCellBackward(DType type, int64_t n, int64_t hidden, const void* gates, const void* c, const void* cNew,
                      const void* gradH, const void* gradC, void* gradGates, void* gradCPrev);

}  // namespace weft::kernels::cpu
