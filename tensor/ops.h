// The op facade: every tensor operation weft provides, as free functions in
// namespace weft. Each op checks its arguments (a clear InvalidArgumentError
// naming the op, shapes, dtypes and devices on mismatch), dispatches to the
// kernel for the tensor's device (kernels/cpu, kernels/cuda), and records its
// backward rule when an input requires grad.
//
//   #include "tensor/ops.h"
//   using namespace weft;
//   Tensor y = logSoftmax(linear(x, w, b), 1);
//   Tensor loss = nllLoss(y, target);
//
// Families: ops_elementwise.h (arithmetic, activations, comparisons, where,
// maskedFill, triu/tril), ops_reduce.h (sum/mean/max/min/argmax, softmax,
// cumsum), ops_linalg.h (mm, bmm, matmul, linear), ops_shape.h
// (cat/stack/split/chunk, indexSelect, gather/scatterAdd),
// ops_nn.h (embedding, conv, pooling, dropout, layer norm, losses, LSTM cell),
// ops_attention.h (scaled dot-product attention, merging partial attentions).
#pragma once

#include "tensor/autocast.h"
#include "tensor/autograd.h"
#include "tensor/checkpoint.h"
#include "tensor/generator.h"
#include "tensor/ops_attention.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_linalg.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_reduce.h"
#include "tensor/ops_shape.h"
#include "tensor/tensor.h"
