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
// lstmLayerForward / lstmLayerBackward run one layer of torch.nn.LSTM over a
// whole sequence (T steps of N rows): the input projection of every step is
// one GEMM, the recurrence runs step by step, and in backward the weight
// gradients are one GEMM each over all steps. Each chunk of batch rows runs
// the recurrence on its own (chunks of about 16 rows, their number fixed by N
// alone), spread over the kernel threads, and every GEMM's blocks are fixed by
// its shape (kernels/cpu/gemm.h): the results are the same bits for any thread
// count.
//
// float32 gates use vectorised sigmoid and tanh (kernels/cpu/vec_math.h, a few
// ulp); float64 uses libm.
//
// All buffers are contiguous and row-major. Threading (cell kernels): rows
// split across the kernel threads above kParallelGrain elements.
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

struct LstmLayerGeometry {
  int64_t steps = 0, batch = 0, input = 0, hidden = 0;
};

// x [T, N, in], h0 and c0 [N, H], wIh [4H, in], wHh [4H, H], bias [4H] (the sum
// of both biases) or null. Writes gates [T, N, 4H] (the activations i, f, g, o
// of every step, kept for backward), hs [T, N, H] (the output) and cs [T, N, H].
void lstmLayerForward(DType type, const LstmLayerGeometry& g, const void* x, const void* h0, const void* c0,
                      const void* wIh, const void* wHh, const void* bias, void* gates, void* hs, void* cs);

// What lstmLayerForward read and wrote (x only needed for the wIh gradient).
struct LstmLayerSaved {
  const void *x = nullptr, *h0 = nullptr, *c0 = nullptr, *wIh = nullptr, *wHh = nullptr;
  const void *gates = nullptr, *hs = nullptr, *cs = nullptr;
};
// Incoming gradients: of the output [T, N, H] and of the last h and c [N, H];
// null means zeros.
struct LstmLayerGrads {
  const void *output = nullptr, *hLast = nullptr, *cLast = nullptr;
};
// Outgoing gradients, each overwritten: h0 and c0 [N, H] always; x [T, N, in],
// wIh, wHh and bias [4H] where non-null.
struct LstmLayerGradOut {
  void *x = nullptr, *h0 = nullptr, *c0 = nullptr, *wIh = nullptr, *wHh = nullptr, *bias = nullptr;
};

// gradGates: scratch of [T, N, 4H] (the gradients of the pre-activations).
void lstmLayerBackward(DType type, const LstmLayerGeometry& g, const LstmLayerSaved& saved, const LstmLayerGrads& in,
                       void* gradGates, const LstmLayerGradOut& out);

}  // namespace weft::kernels::cpu
