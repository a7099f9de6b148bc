// Matrix products and their backward rules. Every product, forward and
// backward, is one (batched) GEMM on the operands' own storage: a transposed
// view reaches BLAS as a transpose flag, and only a matrix whose strides BLAS
// cannot express (no unit-stride dimension) is copied first.
#include "tensor/ops_linalg.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/reduce.h"
#include "tensor/autograd.h"
#include "tensor/op_utils.h"
#include "tensor/ops_elementwise.h"

namespace weft {
namespace {

using kernels::cpu::MatrixOperand;

// Row-major ([rows, cols] with unit column stride) or the transpose of a
// row-major [cols, rows]; false when neither describes the strides.
bool blasLayout(int64_t rows, int64_t cols, int64_t rowStride, int64_t colStride, MatrixOperand& out) {
  if ((cols <= 1 || colStride == 1) && (rows <= 1 || rowStride >= std::max<int64_t>(cols, 1))) {
    out.trans = false;
    out.ld = rows <= 1 ? std::max<int64_t>(cols, 1) : rowStride;
    return true;
  }
  if ((rows <= 1 || rowStride == 1) && (cols <= 1 || colStride >= std::max<int64_t>(rows, 1))) {
    out.trans = true;
    out.ld = cols <= 1 ? std::max<int64_t>(rows, 1) : colStride;
    return true;
  }
  return false;
}

// t's strides over the leading (batch) dimensions, aligned to `batch` from
// the right; 0 where t has no such dimension or repeats a size-1 one.
Shape batchStrides(const Tensor& t, const Shape& batch) {
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  int64_t nb = static_cast<int64_t>(batch.size()), tb = static_cast<int64_t>(shape.size()) - 2;
  Shape st(nb, 0);
  for (int64_t i = nb - tb; i < nb; ++i) {
    int64_t d = i - (nb - tb);
    st[i] = shape[d] == 1 ? 0 : strides[d];
  }
  return st;
}

// The last two entries of a shape or strides vector (a matrix's rows, cols).
std::pair<int64_t, int64_t> lastTwo(const Shape& v) { return {v[v.size() - 2], v[v.size() - 1]}; }

// A tensor [..., rows, cols] as GEMM reads it: one matrix per batch element.
struct GemmInput {
  Tensor keep;        // owns the data: the tensor itself, or its contiguous copy
  MatrixOperand mat;  // the matrix of one batch element
  Shape strides;      // batch strides over the product's batch shape
  MatrixOperand maybeTransposed(bool t) const { return {mat.data, mat.trans != t, mat.ld}; }
};

GemmInput gemmInput(const Tensor& t, const Shape& batch) {
  GemmInput in;
  in.keep = t;
  auto [rows, cols] = lastTwo(t.shape());
  auto [rowStride, colStride] = lastTwo(t.strides());
  if (!blasLayout(rows, cols, rowStride, colStride, in.mat)) {
    in.keep = t.detach().contiguous();
    std::tie(rowStride, colStride) = lastTwo(in.keep.strides());
    blasLayout(rows, cols, rowStride, colStride, in.mat);
  }
  in.mat.data = in.keep.rawData();
  if (!batch.empty()) in.strides = batchStrides(in.keep, batch);
  return in;
}

// Returns r[resultShape] with r[i] = op(x[i]) · op(y[i]) for every i of
// `batch` (x, y broadcast over it); op transposes when xT / yT. A result
// batch dimension of size 1 (or missing) that `batch` stretches is summed
// over, which is how gradients reach broadcast operands.
Tensor batchedGemm(const Tensor& x, bool xT, const Tensor& y, bool yT, const Shape& batch, const Shape& resultShape) {
  size_t nd = resultShape.size();
  int64_t m = resultShape[nd - 2], n = resultShape[nd - 1];
  auto [xRows, xCols] = lastTwo(x.shape());
  int64_t k = xT ? xRows : xCols;
  DType dt = x.dtype();
  GemmInput gx = gemmInput(x, batch), gy = gemmInput(y, batch);
  Tensor r = empty(resultShape, {.dtype = dt});
  if (batch.empty()) {
    kernels::cpu::gemm(dt, gx.maybeTransposed(xT), gy.maybeTransposed(yT), m, n, k, 1.0, 0.0, r.rawData(), n);
    return r;
  }
  Shape rStrides = batchStrides(r, batch);
  bool accumulates = false;
  for (size_t i = 0; i < batch.size(); ++i) accumulates |= rStrides[i] == 0 && batch[i] > 1;
  if (accumulates) r.zero_();
  kernels::cpu::gemmBatched(dt, batch, gx.maybeTransposed(xT), gx.strides, gy.maybeTransposed(yT), gy.strides,
                            m, n, k, 1.0, accumulates ? 1.0 : 0.0, r.rawData(), rStrides, n);
  return r;
}

void checkGemmKind(const char* op, const Tensor& a, const Tensor& b) {
  detail::checkSameKind(op, a, b);
  detail::requireCpu(op, a);
  WEFT_ENFORCE(isFloating(a.dtype()), InvalidArgumentError, op, ": ", dtypeName(a.dtype()),
               " matrix products are not supported (GEMM is floating-point only); convert the operands of shapes ",
               a.shape(), " and ", b.shape(), " to float32 or float64");
}

void checkInner(const char* op, const Tensor& a, const Tensor& b, int64_t ka, int64_t kb) {
  WEFT_ENFORCE(ka == kb, InvalidArgumentError, op, ": shapes ", a.shape(), " and ", b.shape(),
               " cannot be multiplied (", ka, " != ", kb, ")");
}

// The product of a [batch.., n, k] and b [batch.., k, m] (batch dimensions
// broadcast to `batch`), with its backward rule recorded as `name`.
Tensor product(const char* name, const Tensor& a, const Tensor& b, const Shape& batch) {
  Shape outShape = batch;
  outShape.push_back(a.size(-2));
  outShape.push_back(b.size(-1));
  Tensor out = batchedGemm(a, false, b, false, batch, outShape);
  if (anyRequiresGrad({&a, &b})) {
    bool needA = a.requiresGrad(), needB = b.requiresGrad();
    SavedTensor sa(needB ? a : Tensor()), sb(needA ? b : Tensor());
    Shape aShape = a.shape(), bShape = b.shape();
    recordOp(name, {a, b}, {out},
             [name, needA, needB, sa, sb, aShape, bShape, batch](const std::vector<Tensor>& g) {
               Tensor ga, gb;
               // dA = dC · B^T, dB = A^T · dC, per batch element.
               if (needA) ga = batchedGemm(g[0], false, sb.unpack(name), true, batch, aShape);
               if (needB) gb = batchedGemm(sa.unpack(name), true, g[0], false, batch, bShape);
               return std::vector<Tensor>{ga, gb};
             });
  }
  return out;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  checkGemmKind("mm", a, b);
  WEFT_ENFORCE(a.dim() == 2 && b.dim() == 2, InvalidArgumentError, "mm: expected two 2-D tensors, got shapes ",
               a.shape(), " and ", b.shape());
  checkInner("mm", a, b, a.size(1), b.size(0));
  return product("MmBackward", a, b, {});
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  checkGemmKind("bmm", a, b);
  WEFT_ENFORCE(a.dim() == 3 && b.dim() == 3, InvalidArgumentError, "bmm: expected two 3-D tensors, got shapes ",
               a.shape(), " and ", b.shape());
  WEFT_ENFORCE(a.size(0) == b.size(0), InvalidArgumentError, "bmm: batch sizes differ: shapes ", a.shape(), " and ",
               b.shape());
  checkInner("bmm", a, b, a.size(2), b.size(1));
  return product("BmmBackward", a, b, {a.size(0)});
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  checkGemmKind("matmul", a, b);
  WEFT_ENFORCE(a.dim() >= 1 && b.dim() >= 1, InvalidArgumentError,
               "matmul: both arguments need at least one dimension, got shapes ", a.shape(), " and ", b.shape());
  int64_t da = a.dim(), db = b.dim();
  checkInner("matmul", a, b, a.size(-1), db == 1 ? b.size(0) : b.size(-2));
  if (da == 1 && db == 1) return product("DotBackward", a.unsqueeze(0), b.unsqueeze(1), {}).reshape({});
  if (da == 2 && db == 1) return product("MvBackward", a, b.unsqueeze(1), {}).squeeze(1);
  if (da == 1 && db == 2) return product("MmBackward", a.unsqueeze(0), b, {}).squeeze(0);
  if (da == 2 && db == 2) return product("MmBackward", a, b, {});
  if (da >= 3 && db <= 2 && a.isContiguous()) {
    // Fold the batch into the rows: one GEMM [B*n, k] x [k, m].
    Shape outShape(a.shape().begin(), a.shape().end() - 1);
    Tensor a2 = a.reshape({shapeNumel(outShape), a.size(-1)});
    if (db == 1) return product("MvBackward", a2, b.unsqueeze(1), {}).reshape(outShape);
    outShape.push_back(b.size(1));
    return product("MmBackward", a2, b, {}).reshape(outShape);
  }
  // Batched with broadcast batch dimensions; a 1-D operand becomes a matrix
  // for the product and its added dimension is removed after.
  Tensor a3 = da == 1 ? a.unsqueeze(0) : a;
  Tensor b3 = db == 1 ? b.unsqueeze(1) : b;
  Shape batch = broadcastShapes(Shape(a3.shape().begin(), a3.shape().end() - 2),
                                Shape(b3.shape().begin(), b3.shape().end() - 2), "matmul");
  Tensor out = product("MatmulBackward", a3, b3, batch);
  if (da == 1) out = out.squeeze(-2);
  if (db == 1) out = out.squeeze(-1);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  checkGemmKind("linear", x, weight);
  WEFT_ENFORCE(weight.dim() == 2, InvalidArgumentError, "linear: weight must be 2-D [out, in], got shape ",
               weight.shape());
  WEFT_ENFORCE(x.dim() >= 1 && x.size(-1) == weight.size(1), InvalidArgumentError, "linear: input of shape ",
               x.shape(), " does not match weight of shape ", weight.shape(), " (expected last dimension ",
               weight.size(1), ")");
  int64_t in = weight.size(1), outF = weight.size(0);
  if (bias.defined()) {
    checkGemmKind("linear", x, bias);
    WEFT_ENFORCE(bias.dim() == 1 && bias.size(0) == outF, InvalidArgumentError, "linear: bias of shape ",
                 bias.shape(), " does not match weight of shape ", weight.shape(), " (expected [", outF, "])");
  }
  // x as a matrix [rows, in]: a 2-D x in any BLAS layout, else a view (or,
  // when the leading dimensions cannot be merged, a copy).
  Shape outShape(x.shape().begin(), x.shape().end() - 1);
  int64_t rows = shapeNumel(outShape);
  Tensor x2 = x.dim() == 2 ? x : x.detach().reshape({rows, in});
  outShape.push_back(outF);
  Tensor out = empty(outShape, {.dtype = x.dtype()});
  GemmInput xIn = gemmInput(x2, {}), wIn = gemmInput(weight, {});
  double beta = 0.0;
  if (bias.defined() && rows > 0) {
    Tensor b = bias.isContiguous() ? bias : bias.detach().contiguous();
    kernels::cpu::fillRows(x.dtype(), b.rawData(), rows, outF, out.rawData(), outF);
    beta = 1.0;
  }
  // out = x2 · W^T (+ bias already in out)
  kernels::cpu::gemm(x.dtype(), xIn.mat, wIn.maybeTransposed(true), rows, outF, in, 1.0, beta, out.rawData(), outF);

  if (anyRequiresGrad({&x, &weight, &bias})) {
    bool needX = x.requiresGrad(), needW = weight.requiresGrad(), hasBias = bias.defined();
    bool needB = hasBias && bias.requiresGrad();
    SavedTensor sx(needW ? xIn.keep : Tensor()), sw(needX ? wIn.keep : Tensor());
    Shape xShape = x.shape(), wShape = weight.shape();
    DType dt = x.dtype();
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    recordOp("LinearBackward", inputs, {out},
             [needX, needW, needB, hasBias, sx, sw, xShape, wShape, dt, rows, in, outF](const std::vector<Tensor>& g) {
               Tensor g2 = g[0].contiguous();
               MatrixOperand gm{g2.rawData(), false, outF};
               std::vector<Tensor> grads(hasBias ? 3 : 2);
               if (needX) {  // dx = g · W
                 Tensor w = sw.unpack("LinearBackward");
                 Tensor gx = empty(xShape, {.dtype = dt});
                 kernels::cpu::gemm(dt, gm, gemmInput(w, {}).mat, rows, in, outF, 1.0, 0.0, gx.rawData(), in);
                 grads[0] = gx;
               }
               if (needW) {  // dW = g^T · x
                 GemmInput xs = gemmInput(sx.unpack("LinearBackward"), {});
                 Tensor gw = empty(wShape, {.dtype = dt});
                 kernels::cpu::gemm(dt, {g2.rawData(), true, outF}, xs.mat, outF, in, rows, 1.0, 0.0, gw.rawData(),
                                    in);
                 grads[1] = gw;
               }
               if (needB) {  // db = column sums of g
                 Tensor gb = empty({outF}, {.dtype = dt});
                 kernels::cpu::sumCols(dt, g2.rawData(), rows, outF, gb.rawData());
                 grads[2] = gb;
               }
               return grads;
             });
  }
  return out;
}

Tensor Tensor::matmul(const Tensor& other) const { return weft::matmul(*this, other); }

}  // namespace weft
