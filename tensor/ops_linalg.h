// Matrix products, on OpenBLAS (sgemm/dgemm) on the CPU and cuBLAS on CUDA.
// Transposed operands are passed to GEMM as transposes, never copied, when
// their strides allow.
#pragma once

#include "tensor/tensor.h"

namespace weft {

Tensor mm(const Tensor& a, const Tensor& b);    // [n,k] x [k,m]
Tensor bmm(const Tensor& a, const Tensor& b);   // [B,n,k] x [B,k,m]
// torch.matmul semantics: 1-D/2-D/batched with broadcast batch dimensions.
Tensor matmul(const Tensor& a, const Tensor& b);
// x [*, in] · weight[out, in]^T + bias[out] (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace weft
