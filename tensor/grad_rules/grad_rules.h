// Gradient rules: the backward of every differentiable op, one function per
// op, with its siblings in one file per op family (internal to tensor/):
//
//   elementwise.cpp  add sub mul div maximum minimum pow, where maskedFill
//                    triu tril, and the unary ops as one table of what each
//                    derivative reads
//   reduce.cpp       sum, max/min (whole tensor and along a dim), softmax,
//                    cumsum
//   linalg.cpp       the matrix products (mm bmm matmul) and linear
//   views.cpp        the view ops, clone, and dtype/device conversion
//   shape.cpp        cat stack split indexSelect gather scatterAdd
//   nn.cpp           embedding embeddingBag conv2d maxPool2d dropout layerNorm
//                    lstm
//   loss.cpp         nllLoss crossEntropy mseLoss
//   attention.cpp    scaledDotProductAttention mergeAttention
//
// A forward op computes its outputs, then calls its rule with the tensors
// its node has edges to, its outputs, and whatever forward state the
// derivative reads (packed operands, indices, geometry): the parameter list
// is the rule's contract with its forward. A rule does nothing unless grad
// mode is on and some input requires grad; otherwise it saves what the
// requested gradients read and records the node with recordOp. Each rule is
// named after the node it records (mulBackward records "MulBackward"), so the
// name in an autograd error leads to its rule; a rule that several ops share
// (the unary ops, max/min, softmax/logSoftmax, the products) records each
// op's own name.
//
// Why a rule records rather than only returning a formula (as in tinygrad's
// gradient.py, where the lazy graph keeps every input alive): weft saves
// explicitly and selectively — mul keeps a only when b needs a gradient, the
// nn ops keep the contiguous copies their kernels already made — and that
// choice belongs next to the formula that reads what was saved.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/lstm.h"
#include "kernels/cpu/pool.h"
#include "tensor/op_checks.h"
#include "tensor/op_layout.h"
#include "tensor/ops_nn.h"
#include "tensor/tensor.h"

namespace weft::grad_rules {

// ---- elementwise ------------------------------------------------------------
void addBackward(const Tensor& a, const Tensor& b, const Tensor& out);
void subBackward(const Tensor& a, const Tensor& b, const Tensor& out);
void mulBackward(const Tensor& a, const Tensor& b, const Tensor& out);
void divBackward(const Tensor& a, const Tensor& b, const Tensor& out);
void maximumBackward(const Tensor& a, const Tensor& b, const Tensor& out);
void minimumBackward(const Tensor& a, const Tensor& b, const Tensor& out);
void powTensorBackward(const Tensor& a, const Tensor& e, const Tensor& out);
// where and maskedFill (`name`: WhereBackward, MaskedFillBackward); cond is
// the Bool condition (mask), a and b the values taken where it holds and
// where it does not.
void whereBackward(const char* name, const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
void triangleBackward(bool upper, int64_t diagonal, const Tensor& x, const Tensor& out);
// Every op of kernels::cpu::UnaryOp; `name` is the node's, p0/p1 the op's
// scalar parameters (exponent, clamp bounds, the scalar added or multiplied).
void unaryBackward(kernels::cpu::UnaryOp op, const char* name, const Tensor& a, const Tensor& out, double p0 = 0,
                   double p1 = 0);

// ---- reductions ---------------------------------------------------------------
// dims: the reduced dimensions, sorted and non-negative.
void sumBackward(const Tensor& a, const Tensor& out, const std::vector<int64_t>& dims);
// max(a) / min(a) over every element.
void extremumAllBackward(bool isMax, const Tensor& a, const Tensor& out);
// max(a, dim) / min(a, dim): `indices` from the forward, `v` a's layout around dim.
void extremumAlongBackward(bool isMax, const Tensor& a, const Tensor& values, const Tensor& indices,
                           detail::AxisView v);
void softmaxBackward(bool log, const Tensor& a, const Tensor& out, detail::AxisView v);
// v: a's layout around the summed dim.
void cumsumBackward(const Tensor& a, const Tensor& out, detail::AxisView v);

// ---- matrix products ------------------------------------------------------------
// out = a · b per element of `batch` (a, b broadcast over it); `name` is the
// node's (MmBackward, BmmBackward, MvBackward, DotBackward, MatmulBackward).
void productBackward(const char* name, const Tensor& a, const Tensor& b, const Tensor& out, const Shape& batch);
// out [rows, outF] = x2 · W^T + bias, where x2 [rows, in] is x seen as a
// matrix; xKeep / wKeep are the operands as the forward GEMM read them.
void linearBackward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& xKeep,
                    const Tensor& wKeep, int64_t rows, int64_t in, int64_t outF);

// ---- views and conversions --------------------------------------------------------
// view (and reshape, squeeze, unsqueeze, flatten through it).
void viewBackward(const Tensor& in, const Tensor& out);
void transposeBackward(const Tensor& in, const Tensor& out, int64_t d0, int64_t d1);
// inverse: the permutation that undoes the forward's.
void permuteBackward(const Tensor& in, const Tensor& out, const Shape& inverse);
void narrowBackward(const Tensor& in, const Tensor& out, int64_t dim, int64_t start, int64_t length);
void selectBackward(const Tensor& in, const Tensor& out, int64_t dim, int64_t index);
void expandBackward(const Tensor& in, const Tensor& out);
void cloneBackward(const Tensor& in, const Tensor& out);
// to(dtype): a gradient flows only into a floating-point result.
void toDTypeBackward(const Tensor& in, const Tensor& out);
void toDeviceBackward(const Tensor& in, const Tensor& out);

// ---- joining, splitting, gathering ------------------------------------------------
// sizes: each input's extent along dim.
void catBackward(const std::vector<Tensor>& inputs, const Tensor& out, std::vector<int64_t> sizes, int64_t dim);
void stackBackward(const std::vector<Tensor>& inputs, const Tensor& out, int64_t dim);
// One node for every piece.
void splitBackward(const Tensor& a, const std::vector<Tensor>& pieces, int64_t dim);
// index: contiguous; a seen as [outer, size, inner] around the indexed dim.
void indexSelectBackward(const Tensor& a, const Tensor& out, const Tensor& index, int64_t outer, int64_t size,
                         int64_t inner);

// index: contiguous, of rank >= 1 (a 0-D index seen as [1]); dim wrapped.
void gatherBackward(const Tensor& x, const Tensor& out, const Tensor& index, int64_t dim);
void scatterAddBackward(const Tensor& x, const Tensor& src, const Tensor& out, const Tensor& index, int64_t dim);

// ---- nn ----------------------------------------------------------------------------
// idx: the indices as the forward read them (contiguous).
void embeddingBackward(const Tensor& weight, const Tensor& out, const Tensor& idx);
// w, idx, psw: packed weight, indices, per-sample weights; argmax: the
// forward's (Max mode); starts: where each bag starts, plus the end (Int64
// [bags + 1] on the weight's device).
void embeddingBagBackward(const Tensor& weight, const Tensor& perSampleWeights, const Tensor& out, const Tensor& w,
                          const Tensor& idx, const Tensor& psw, const Tensor& argmax, const Tensor& starts,
                          kernels::cpu::BagReduce reduce);
// xc, wc: the packed input and weight the forward read.
void conv2dBackward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& xc,
                    const Tensor& wc, const kernels::cpu::Conv2dGeometry& geo);
void maxPool2dBackward(const Tensor& x, const Tensor& out, const Tensor& argmax,
                       const kernels::cpu::Pool2dGeometry& geo);
// mask: 0 or 1/(1-p) per element, as the forward applied it.
void dropoutBackward(const Tensor& x, const Tensor& out, const Tensor& mask);
// xc, wc: the packed input and weight (undefined without one) the forward
// read; mean, rstd: its per-row statistics, x seen as [rows, n].
void layerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& xc,
                       const Tensor& wc, const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t n);
// inputs: {x, h, c, wIh, wHh, bIh, bHh}; xc, hc, cc, wi, wh: their packed
// forms; gates: the forward's activated gates [N, 4H].
void lstmCellBackward(const std::vector<Tensor>& inputs, const Tensor& hNew, const Tensor& cNew, const Tensor& xc,
                      const Tensor& hc, const Tensor& cc, const Tensor& wi, const Tensor& wh, const Tensor& gates);
// inputs: {x, h0, c0, wIh, wHh, bIh, bHh}; outputs: {output (= hs), h, c};
// gates, hs, cs: the forward's per-step buffers.
void lstmLayerBackward(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, const Tensor& xc,
                       const Tensor& hc, const Tensor& cc, const Tensor& wi, const Tensor& wh, const Tensor& gates,
                       const Tensor& hs, const Tensor& cs, const kernels::cpu::LstmLayerGeometry& geo);

// ---- losses -------------------------------------------------------------------------
// The scores seen as [N, C, D]; target: contiguous Int64; count: how many
// targets were not ignored (the Mean divisor).
void nllLossBackward(const Tensor& input, const Tensor& out, const Tensor& target, int64_t N, int64_t C, int64_t D,
                     int64_t ignoreIndex, Reduction r, int64_t count);
// logProbs: logSoftmax of the logits, kept from the forward.
void crossEntropyBackward(const Tensor& logits, const Tensor& out, const Tensor& target, const Tensor& logProbs,
                          int64_t N, int64_t C, int64_t D, int64_t ignoreIndex, Reduction r, int64_t count);
// x, t: contiguous input and target.
void mseLossBackward(const Tensor& input, const Tensor& target, const Tensor& out, const Tensor& x, const Tensor& t,
                     Reduction r);

// ---- attention ----------------------------------------------------------------------
// What the CPU kernels read for a [B, H, S, D] operand: t itself (detached)
// when its rows are contiguous (stride(3) == 1), with *layout set to its
// strides, else a contiguous copy with the default layout.
Tensor attentionOperand(const Tensor& t, kernels::cpu::AttentionLayout* layout);
// True when t's memory order is [B, S, H, D] (heads inside positions, as
// views of a [B, S, C] projection are).
bool sequenceMajor(const Tensor& t);
// A new [B, H, S, D] tensor (shape), laid out as [B, S, H, D] when
// sequenceMajor, else contiguous; *layout describes it.
Tensor attentionResult(const Shape& shape, const TensorOptions& like, bool sequenceMajor,
                       kernels::cpu::AttentionLayout* layout);
// qc, kc, vc: the q, k, v the forward read (packed, or the inputs' own
// strided views on the CPU, as geo's layouts say); geo: its geometry (with
// the dropout seed); out and lse: its outputs.
void attentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const Tensor& qc, const Tensor& kc, const Tensor& vc,
                       const kernels::cpu::AttentionGeometry& geo);
// inputs: {outA, lseA, outB, lseB}; oa, la, ob, lb: their packed forms.
void mergeAttentionBackward(const std::vector<Tensor>& inputs, const Tensor& out, const Tensor& lse,
                            const Tensor& oa, const Tensor& la, const Tensor& ob, const Tensor& lb);

}  // namespace weft::grad_rules
