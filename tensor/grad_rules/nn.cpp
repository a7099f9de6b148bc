// Gradient rules of the neural-network ops (see grad_rules.h). g is the
// gradient of the output (g[0], g[1], ... for an op with several). Each rule
// runs the kernel's own backward over what the forward kept; an input is
// kept only for the gradients that read it.
#include "kernels/cpu/conv.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/lstm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/conv.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/lstm.h"
#include "kernels/cuda/pool.h"
#endif
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/ops.h"

namespace weft::grad_rules {

using Grads = std::vector<Tensor>;
using kernels::cpu::BagReduce;

// d/dweight[i] = the sum of g over every position that looked up row i
void embeddingBackward(const Tensor& weight, const Tensor& out, const Tensor& idx) {
  if (!anyRequiresGrad({&weight})) return;
  SavedTensor si(idx);
  Shape wShape = weight.shape();
  DType dt = weight.dtype();
  Device dev = weight.device();
  recordOp("EmbeddingBackward", {weight}, {out}, [si, wShape, dt, dev](const Grads& g) {
    Tensor ix = si.unpack("EmbeddingBackward");
    Tensor go = g[0].contiguous();
    Tensor gw = zeros(wShape, {.dtype = dt, .device = dev});
    if (dev.isCuda()) {
      WEFT_CUDA_CALL(dev.index, embeddingBackward(dt, go.rawData(), ix.data<int64_t>(), ix.numel(), wShape[0],
                                                  wShape[1], gw.rawData()));
    } else {
      kernels::cpu::embeddingBackward(dt, go.rawData(), ix.data<int64_t>(), ix.numel(), wShape[0], wShape[1],
                                      gw.rawData());
    }
    return Grads{gw};
  });
}

// d/dweight[i] = g of each bag that holds row i, as the bag reduced it (times
// its sample weight in Sum, over the bag size in Mean, only at the argmax in
// Max); d/dperSampleWeights[j] = g of j's bag · weight[index j]
void embeddingBagBackward(const Tensor& weight, const Tensor& perSampleWeights, const Tensor& out, const Tensor& w,
                          const Tensor& idx, const Tensor& psw, const Tensor& argmax, const Tensor& starts,
                          BagReduce reduce) {
  if (!anyRequiresGrad({&weight, &perSampleWeights})) return;
  bool needW = weight.requiresGrad(), needPsw = perSampleWeights.defined() && perSampleWeights.requiresGrad();
  SavedTensor si(idx), sp(needW ? psw : Tensor()), sw(needPsw ? w : Tensor());
  Shape wShape = weight.shape(), pShape = idx.shape();
  DType dt = weight.dtype();
  Device dev = weight.device();
  recordOp("EmbeddingBagBackward", {weight, perSampleWeights}, {out},
           [needW, needPsw, si, sp, sw, argmax, starts, reduce, wShape, pShape, dt, dev](const Grads& g) {
             const char* name = "EmbeddingBagBackward";
             Tensor ix = si.unpack(name), go = g[0].contiguous();
             const int64_t nb = starts.numel() - 1;
             const int64_t* sp0 = starts.data<int64_t>();
             Grads grads(2);
             if (needW) {
               Tensor p = sp.unpack(name);
               Tensor gw = zeros(wShape, {.dtype = dt, .device = dev});
               const void* pp = p.defined() ? p.rawData() : nullptr;
               const int64_t* ap = argmax.defined() ? argmax.data<int64_t>() : nullptr;
               if (dev.isCuda()) {
                 WEFT_CUDA_CALL(dev.index, embeddingBagBackward(dt, go.rawData(), ix.data<int64_t>(), sp0, nb, reduce,
                                                                pp, ap, wShape[0], wShape[1], gw.rawData()));
               } else {
                 kernels::cpu::embeddingBagBackward(dt, go.rawData(), ix.data<int64_t>(), sp0, nb, reduce, pp, ap,
                                                    wShape[0], wShape[1], gw.rawData());
               }
               grads[0] = gw;
             }
             if (needPsw) {
               Tensor gp = empty(pShape, {.dtype = dt, .device = dev});
               const void* wv = sw.unpack(name).rawData();
               if (dev.isCuda()) {
                 WEFT_CUDA_CALL(dev.index, embeddingBagSampleWeightsBackward(dt, go.rawData(), wv, wShape[1],
                                                                             ix.data<int64_t>(), sp0, nb,
                                                                             gp.rawData()));
               } else {
                 kernels::cpu::embeddingBagSampleWeightsBackward(dt, go.rawData(), wv, wShape[1], ix.data<int64_t>(),
                                                                 sp0, nb, gp.rawData());
               }
               grads[1] = gp;
             }
             return grads;
           });
}

// d/dx = the transposed convolution of g with the weight, d/dweight = g
// correlated with x, d/dbias = g summed over batch and positions
void conv2dBackward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& xc,
                    const Tensor& wc, const kernels::cpu::Conv2dGeometry& geo) {
  if (!anyRequiresGrad({&x, &weight, &bias})) return;
  bool needX = x.requiresGrad(), needW = weight.requiresGrad(), hasBias = bias.defined();
  bool needB = hasBias && bias.requiresGrad();
  SavedTensor sx(needW ? xc : Tensor()), sw2(needX ? wc : Tensor());
  Shape xShape = x.shape(), wShape = weight.shape();
  DType dt = x.dtype();
  Device dev = x.device();
  std::vector<Tensor> inputs{x, weight};
  if (hasBias) inputs.push_back(bias);
  recordOp("Conv2dBackward", inputs, {out},
           [needX, needW, needB, hasBias, sx, sw2, geo, xShape, wShape, dt, dev](const Grads& g) {
             Tensor go = g[0].contiguous();
             Tensor xv = sx.unpack("Conv2dBackward"), wv = sw2.unpack("Conv2dBackward");
             Tensor gx = needX ? empty(xShape, {.dtype = dt, .device = dev}) : Tensor();
             Tensor gw = needW ? empty(wShape, {.dtype = dt, .device = dev}) : Tensor();
             Tensor gb = needB ? empty({wShape[0]}, {.dtype = dt, .device = dev}) : Tensor();
             auto raw = [](const Tensor& t) -> void* { return t.defined() ? t.rawData() : nullptr; };
             if (dev.isCuda()) {
               WEFT_CUDA_CALL(dev.index, conv2dBackward(dt, geo, raw(xv), raw(wv), go.rawData(), raw(gx), raw(gw),
                                                        raw(gb)));
             } else {
               kernels::cpu::conv2dBackward(dt, geo, raw(xv), raw(wv), go.rawData(), raw(gx), raw(gw), raw(gb));
             }
             Grads grads{gx, gw};
             if (hasBias) grads.push_back(gb);
             return grads;
           });
}

// d/dx = g at each window's argmax (summed where windows overlap), 0 elsewhere
void maxPool2dBackward(const Tensor& x, const Tensor& out, const Tensor& argmax,
                       const kernels::cpu::Pool2dGeometry& geo) {
  if (!anyRequiresGrad({&x})) return;
  Shape xShape = x.shape();
  DType dt = x.dtype();
  Device dev = x.device();
  recordOp("MaxPool2dBackward", {x}, {out}, [argmax, geo, xShape, dt, dev](const Grads& g) {
    Tensor go = g[0].contiguous();
    if (dev.isCuda()) {  // the kernel writes every element (an empty output means an empty input)
      Tensor gx = empty(xShape, {.dtype = dt, .device = dev});
      if (go.numel() > 0) {
        WEFT_CUDA_CALL(dev.index, maxPool2dBackward(dt, geo, go.rawData(), argmax.data<int64_t>(), gx.rawData()));
      }
      return Grads{gx};
    }
    Tensor gx = zeros(xShape, {.dtype = dt});
    if (go.numel() > 0) kernels::cpu::maxPool2dBackward(dt, geo, go.rawData(), argmax.data<int64_t>(), gx.rawData());
    return Grads{gx};
  });
}

// d/dx = g·mask
void dropoutBackward(const Tensor& x, const Tensor& out, const Tensor& mask) {
  if (!anyRequiresGrad({&x})) return;
  recordOp("DropoutBackward", {x}, {out}, [mask](const Grads& g) { return Grads{mul(g[0], mask)}; });
}

// d/dx = rstd·(ĝ - mean_n(ĝ) - x̂·mean_n(ĝ·x̂)) with ĝ = g·weight, d/dweight =
// sum_rows(g·x̂), d/dbias = sum_rows(g), where x̂ = (x - mean)·rstd
void layerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& xc,
                       const Tensor& wc, const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t n) {
  if (!anyRequiresGrad({&x, &weight, &bias})) return;
  const bool needX = x.requiresGrad(), needW = weight.defined() && weight.requiresGrad();
  const bool needB = bias.defined() && bias.requiresGrad();
  // x and the statistics feed dx and dweight; dbias reads g alone.
  const bool needStats = needX || needW;
  SavedTensor sx(needStats ? xc : Tensor()), sm(needStats ? mean : Tensor()), sr(needStats ? rstd : Tensor());
  SavedTensor sw(needX ? wc : Tensor());
  const Shape xShape = x.shape(), pShape = weight.defined() ? weight.shape() : bias.defined() ? bias.shape() : Shape{};
  const DType dt = x.dtype();
  const Device dev = x.device();
  recordOp("LayerNormBackward", {x, weight, bias}, {out},
           [sx, sm, sr, sw, needX, needW, needB, needStats, xShape, pShape, dt, dev, rows, n](const Grads& g) {
             const char* name = "LayerNormBackward";
             Tensor go = g[0].contiguous();
             Tensor xv = sx.unpack(name), mv = sm.unpack(name), rv = sr.unpack(name), wv = sw.unpack(name);
             Grads grads(3);
             if (needX) grads[0] = empty(xShape, {.dtype = dt, .device = dev});
             if (needW) grads[1] = empty(pShape, {.dtype = dt, .device = dev});
             if (needB) grads[2] = empty(pShape, {.dtype = dt, .device = dev});
             if (!needStats) {
               // Only dbias: g summed over the rows.
               NoGradGuard ng;
               grads[2] = sum(go.view({rows, n}), {0}).view(pShape);
               return grads;
             }
             auto raw = [](const Tensor& t) { return t.defined() ? t.rawData() : nullptr; };
             if (dev.isCuda()) {
               WEFT_CUDA_CALL(dev.index, layerNormBackward(dt, go.rawData(), xv.rawData(), mv.rawData(), rv.rawData(),
                                                           raw(wv), rows, n, raw(grads[0]), raw(grads[1]),
                                                           raw(grads[2])));
             } else {
               kernels::cpu::layerNormBackward(dt, go.rawData(), xv.rawData(), mv.rawData(), rv.rawData(), raw(wv),
                                               rows, n, raw(grads[0]), raw(grads[1]), raw(grads[2]));
             }
             return grads;
           });
}

// The cell's rule on a CUDA device: the backward of a one-step layer
// (kernels/cuda/lstm.h), which runs the same products; h's gradient is
// computed only where it is wanted (wHh is saved only then).
Grads cellBackwardOnDevice(const std::vector<bool>& need, const SavedTensor& sx, const SavedTensor& sh,
                           const SavedTensor& sc, const SavedTensor& scn, const SavedTensor& swi,
                           const SavedTensor& swh, const Tensor& gates, const Tensor& gh, const Tensor& gc, int64_t N,
                           int64_t in, int64_t H) {
  const char* name = "LstmCellBackward";
  const TensorOptions o{.dtype = gates.dtype(), .device = gates.device()};
  Grads grads(7);
  if (need[0]) grads[0] = empty({N, in}, o);
  if (need[1]) grads[1] = empty({N, H}, o);
  if (need[3]) grads[3] = empty({4 * H, in}, o);
  if (need[4]) grads[4] = empty({4 * H, H}, o);
  Tensor gcPrev = empty({N, H}, o), dGates = empty({N, 4 * H}, o);
  Tensor gb = need[5] || need[6] ? empty({4 * H}, o) : Tensor();
  Tensor xv = sx.unpack(name), hv = sh.unpack(name), wiv = swi.unpack(name), whv = swh.unpack(name);
  [[maybe_unused]] auto raw = [](const Tensor& t) -> void* { return t.defined() ? t.rawData() : nullptr; };
  [[maybe_unused]] const kernels::cpu::LstmLayerGeometry step{.steps = 1, .batch = N, .input = in, .hidden = H};
  WEFT_CUDA_CALL(gates.device().index,
                 lstmLayerBackward(gates.dtype(), step,
                                   {.x = raw(xv), .h0 = raw(hv), .c0 = sc.unpack(name).rawData(), .wIh = raw(wiv),
                                    .wHh = raw(whv), .gates = gates.rawData(), .hs = nullptr,
                                    .cs = scn.unpack(name).rawData()},
                                   {.output = gh.rawData(), .hLast = nullptr, .cLast = gc.rawData()},
                                   dGates.rawData(),
                                   {.x = raw(grads[0]), .h0 = raw(grads[1]), .c0 = gcPrev.rawData(),
                                    .wIh = raw(grads[3]), .wHh = raw(grads[4]), .bias = raw(gb)}));
  if (need[2]) grads[2] = gcPrev;
  if (need[5]) grads[5] = gb;
  if (need[6]) grads[6] = need[5] ? gb.clone() : gb;
  return grads;
}

// Gradients {dx, dh, dc, dwIh, dwHh, dbIh, dbHh} from g = {dhNew, dcNew}
// through the gates: dx = dGates·wIh, dh = dGates·wHh, dwIh = dGatesᵀ·x,
// dwHh = dGatesᵀ·h, and each bias the column sums of dGates
void lstmCellBackward(const std::vector<Tensor>& inputs, const Tensor& hNew, const Tensor& cNew, const Tensor& xc,
                      const Tensor& hc, const Tensor& cc, const Tensor& wi, const Tensor& wh, const Tensor& gates) {
  if (!anyRequiresGrad(inputs)) return;
  const int64_t N = xc.size(0), in = xc.size(1), H = hc.size(1);
  const DType dt = xc.dtype();
  std::vector<bool> need(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) need[i] = inputs[i].defined() && inputs[i].requiresGrad();
  SavedTensor sx(need[3] ? xc : Tensor()), sh(need[4] ? hc : Tensor()), sc(cc), scn(cNew);
  SavedTensor swi(need[0] ? wi : Tensor()), swh(need[1] ? wh : Tensor());
  const Device dev = xc.device();
  recordOp("LstmCellBackward", inputs, {hNew, cNew},
           [need, sx, sh, sc, scn, swi, swh, gates, N, in, H, dt, dev](const Grads& g) {
             const char* name = "LstmCellBackward";
             Tensor gh = g[0].contiguous(), gc = g[1].contiguous();
             if (dev.isCuda()) return cellBackwardOnDevice(need, sx, sh, sc, scn, swi, swh, gates, gh, gc, N, in, H);
             Tensor dGates = empty({N, 4 * H}, {.dtype = dt}), gcPrev = empty({N, H}, {.dtype = dt});
             kernels::cpu::lstmCellBackward(dt, N, H, gates.rawData(), sc.unpack(name).rawData(),
                                            scn.unpack(name).rawData(), gh.rawData(), gc.rawData(), dGates.rawData(),
                                            gcPrev.rawData());
             kernels::cpu::MatrixOperand dg{dGates.rawData(), false, 4 * H}, dgT{dGates.rawData(), true, 4 * H};
             Grads grads(7);
             if (need[0]) {
               grads[0] = empty({N, in}, {.dtype = dt});
               kernels::cpu::gemm(dt, dg, {swi.unpack(name).rawData(), false, in}, N, in, 4 * H, 1.0, 0.0,
                                  grads[0].rawData(), in);
             }
             if (need[1]) {
               grads[1] = empty({N, H}, {.dtype = dt});
               kernels::cpu::gemm(dt, dg, {swh.unpack(name).rawData(), false, H}, N, H, 4 * H, 1.0, 0.0,
                                  grads[1].rawData(), H);
             }
             if (need[2]) grads[2] = gcPrev;
             if (need[3]) {
               grads[3] = empty({4 * H, in}, {.dtype = dt});
               kernels::cpu::gemm(dt, dgT, {sx.unpack(name).rawData(), false, in}, 4 * H, in, N, 1.0, 0.0,
                                  grads[3].rawData(), in);
             }
             if (need[4]) {
               grads[4] = empty({4 * H, H}, {.dtype = dt});
               kernels::cpu::gemm(dt, dgT, {sh.unpack(name).rawData(), false, H}, 4 * H, H, N, 1.0, 0.0,
                                  grads[4].rawData(), H);
             }
             if (need[5] || need[6]) {
               Tensor gb = empty({4 * H}, {.dtype = dt});
               kernels::cpu::sumCols(dt, dGates.rawData(), N, 4 * H, gb.rawData());
               if (need[5]) grads[5] = gb;
               if (need[6]) grads[6] = need[5] ? gb.clone() : gb;
             }
             return grads;
           });
}

// The cell's rule run backwards through every step in one kernel, from
// g = {doutput, dhLast, dcLast}; the biases get the column sums of every
// step's dGates
void lstmLayerBackward(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, const Tensor& xc,
                       const Tensor& hc, const Tensor& cc, const Tensor& wi, const Tensor& wh, const Tensor& gates,
                       const Tensor& hs, const Tensor& cs, const kernels::cpu::LstmLayerGeometry& geo) {
  if (!anyRequiresGrad(inputs)) return;
  const DType dt = xc.dtype();
  std::vector<bool> need(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) need[i] = inputs[i].defined() && inputs[i].requiresGrad();
  // hs and cs are this node's own buffers; the layer's output is hs itself,
  // so an in-place write to it is caught by the saved version.
  SavedTensor sx(need[3] ? xc : Tensor()), sh0(hc), sc0(cc), swi(need[0] ? wi : Tensor()), swh(wh), shs(hs);
  const Device dev = xc.device();
  recordOp("LstmLayerBackward", inputs, outputs,
           [need, sx, sh0, sc0, swi, swh, shs, gates, cs, geo, dt, dev](const Grads& g) {
             const char* name = "LstmLayerBackward";
             Tensor gOut = g[0].contiguous(), ghT = g[1].contiguous(), gcT = g[2].contiguous();
             Tensor xs = sx.unpack(name), h0s = sh0.unpack(name), c0s = sc0.unpack(name);
             Tensor wIhs = swi.unpack(name), wHhs = swh.unpack(name), hss = shs.unpack(name);
             const Shape state{geo.batch, geo.hidden}, gateShape{4 * geo.hidden};
             const TensorOptions o{.dtype = dt, .device = dev};
             Grads grads(7);
             grads[1] = empty(state, o);
             grads[2] = empty(state, o);
             if (need[0]) grads[0] = empty({geo.steps, geo.batch, geo.input}, o);
             if (need[3]) grads[3] = empty({4 * geo.hidden, geo.input}, o);
             if (need[4]) grads[4] = empty({4 * geo.hidden, geo.hidden}, o);
             Tensor gb = need[5] || need[6] ? empty(gateShape, o) : Tensor();
             Tensor dGates = empty({geo.steps, geo.batch, 4 * geo.hidden}, o);
             auto raw = [](const Tensor& t) -> void* { return t.defined() ? t.rawData() : nullptr; };
             const kernels::cpu::LstmLayerSaved saved{
                 .x = raw(xs), .h0 = h0s.rawData(), .c0 = c0s.rawData(), .wIh = raw(wIhs), .wHh = wHhs.rawData(),
                 .gates = gates.rawData(), .hs = hss.rawData(), .cs = cs.rawData()};
             const kernels::cpu::LstmLayerGrads in{
                 .output = gOut.rawData(), .hLast = ghT.rawData(), .cLast = gcT.rawData()};
             const kernels::cpu::LstmLayerGradOut out{.x = raw(grads[0]), .h0 = grads[1].rawData(),
                                                      .c0 = grads[2].rawData(), .wIh = raw(grads[3]),
                                                      .wHh = raw(grads[4]), .bias = raw(gb)};
             if (dev.isCuda()) {
               WEFT_CUDA_CALL(dev.index, lstmLayerBackward(dt, geo, saved, in, dGates.rawData(), out));
             } else {
               kernels::cpu::lstmLayerBackward(dt, geo, saved, in, dGates.rawData(), out);
             }
             if (!need[1]) grads[1] = Tensor();
             if (!need[2]) grads[2] = Tensor();
             if (need[5]) grads[5] = gb;
             if (need[6]) grads[6] = need[5] ? gb.clone() : gb;
             return grads;
           });
}

}  // namespace weft::grad_rules
