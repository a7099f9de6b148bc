// The LSTM cell's pointwise part and one LSTM layer on a CUDA device: the
// functions of kernels/cpu/lstm.h with the same signatures and semantics
// (float32 and float64, contiguous row-major device buffers).
//
//   kernels::cuda::lstmLayerForward(DType::Float32, geo, x, h0, c0, wIh, wHh, bias, gates, hs, cs);
//
// lstmCellForward / lstmCellBackward are one fused kernel each (gates ->
// activations, c', h'; and their exact derivative). lstmLayerForward runs the
// input projection of every step as one cuBLAS GEMM up front, then per step
// one GEMM for the recurrent part (h_{s-1} · wHh^T added onto the step's
// gates) and the fused cell kernel. lstmLayerBackward runs per step, from the
// last, the fused cell backward (which also adds the output's gradient) and
// one GEMM for the gradient reaching h_{s-1}; then dx, dwIh and dwHh are one
// GEMM each over all steps (dwHh two: step 0 reads h0) and the bias gradient a
// column sum in float64. Sigmoid and tanh are the CUDA math library's (a few
// ulp from the CPU's in float32).
//
// Beyond the CPU contract: lstmLayerBackward accepts out.h0 == nullptr when
// steps == 1 (h0's gradient is then not computed and saved.wHh is not read),
// and reads saved.hs only when steps > 1 and out.wHh is set; the lstmCell op
// runs on CUDA as a one-step layer through these.
//
// Errors: a dtype other than float32/float64 is an InvalidArgumentError
// naming the op; a GEMM dimension (steps * batch, 4 * hidden, input) past the
// 32-bit cuBLAS range is an InvalidArgumentError; CUDA and cuBLAS failures
// are DeviceErrors. Everything is enqueued on the current stream.
#pragma once

#include "kernels/cpu/lstm.h"

namespace weft::kernels::cuda {

using cpu::LstmLayerGeometry;
using cpu::LstmLayerGradOut;
using cpu::LstmLayerGrads;
using cpu::LstmLayerSaved;

void lstmCellForward(DType type, int64_t n, int64_t hidden, void* gates, const void* c, void* cNew, void* hNew);

void lstmCellBackward(DType type, int64_t n, int64_t hidden, const void* gates, const void* c, const void* cNew,
                      const void* gradH, const void* gradC, void* gradGates, void* gradCPrev);

void lstmLayerForward(DType type, const LstmLayerGeometry& g, const void* x, const void* h0, const void* c0,
                      const void* wIh, const void* wHh, const void* bias, void* gates, void* hs, void* cs);

void lstmLayerBackward(DType type, const LstmLayerGeometry& g, const LstmLayerSaved& saved, const LstmLayerGrads& in,
                       void* gradGates, const LstmLayerGradOut& out);

}  // namespace weft::kernels::cuda
