// Matrix products; their gradient rules are in grad_rules/linalg.cpp. Every
// product, forward and backward, is one (batched) GEMM on the operands' own
// storage (see tensor/batched_gemm.h), on the operands' device: OpenBLAS on
// the CPU, cuBLAS on CUDA.
#include "tensor/ops_linalg.h"

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda_call.h"
#include "tensor/autocast.h"
#include "tensor/batched_gemm.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/op_checks.h"
#include "tensor/op_layout.h"
#include "tensor/ops_elementwise.h"

namespace weft {
namespace {

using detail::batchedGemm;
using detail::GemmInput;
using detail::gemmInput;

void checkGemmKind(const char* op, const Tensor& a, const Tensor& b) {
  detail::checkSameKind(op, a, b);
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
  grad_rules::productBackward(name, a, b, out, batch);
  return out;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::lowFor({&a, &b})) return mm(autocast::detail::cast(a, *d), autocast::detail::cast(b, *d));
  checkGemmKind("mm", a, b);
  WEFT_ENFORCE(a.dim() == 2 && b.dim() == 2, InvalidArgumentError, "mm: expected two 2-D tensors, got shapes ",
               a.shape(), " and ", b.shape());
  checkInner("mm", a, b, a.size(1), b.size(0));
  return product("MmBackward", a, b, {});
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::lowFor({&a, &b})) return bmm(autocast::detail::cast(a, *d), autocast::detail::cast(b, *d));
  checkGemmKind("bmm", a, b);
  WEFT_ENFORCE(a.dim() == 3 && b.dim() == 3, InvalidArgumentError, "bmm: expected two 3-D tensors, got shapes ",
               a.shape(), " and ", b.shape());
  WEFT_ENFORCE(a.size(0) == b.size(0), InvalidArgumentError, "bmm: batch sizes differ: shapes ", a.shape(), " and ",
               b.shape());
  checkInner("bmm", a, b, a.size(2), b.size(1));
  return product("BmmBackward", a, b, {a.size(0)});
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto d = autocast::detail::lowFor({&a, &b})) {
    return matmul(autocast::detail::cast(a, *d), autocast::detail::cast(b, *d));
  }
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
  if (auto d = autocast::detail::lowFor({&x, &weight, &bias})) {
    return linear(autocast::detail::cast(x, *d), autocast::detail::cast(weight, *d), autocast::detail::cast(bias, *d));
  }
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
  Tensor out = empty(outShape, {.dtype = x.dtype(), .device = x.device()});
  GemmInput xIn = gemmInput(x2, {}), wIn = gemmInput(weight, {});
  double beta = 0.0;
  if (bias.defined() && rows > 0) {
    // The bias broadcast into out, then the GEMM adds onto it (beta = 1):
    // one pass over out instead of a separate broadcast add after.
    Tensor b = bias.isContiguous() ? bias : bias.detach().contiguous();
    if (x.device().isCuda()) {
      WEFT_CUDA_CALL(x.device().index, fillRows(x.dtype(), b.rawData(), rows, outF, out.rawData(), outF));
    } else {
      kernels::cpu::fillRows(x.dtype(), b.rawData(), rows, outF, out.rawData(), outF);
    }
    beta = 1.0;
  }
  // out = x2 · W^T (+ bias already in out)
  detail::gemmOn(x.device(), x.dtype(), xIn.mat, wIn.maybeTransposed(true), rows, outF, in, 1.0, beta, out.rawData(),
                 outF);

  grad_rules::linearBackward(x, weight, bias, out, xIn.keep, wIn.keep, rows, in, outF);
  return out;
}

Tensor Tensor::matmul(const Tensor& other) const { return weft::matmul(*this, other); }

}  // namespace weft
