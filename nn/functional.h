// The functional vocabulary of torch.nn.functional, for model code that
// prefers `F::relu(F::linear(x, w, b))` to modules.
//
//   namespace F = weft::nn::functional;
//   Tensor h = F::relu(F::conv2d(x, w, b, 1, 1));
//   Tensor loss = F::nllLoss(F::logSoftmax(F::linear(h.flatten(1), w2, b2), 1), target);
//
// weft's ops are already free functions in namespace weft (tensor/ops.h,
// camelCase names); this header only re-exports the neural-network ones under
// weft::nn::functional, so the two spellings are the same functions with the
// same contracts (documented in tensor/ops_*.h).
#pragma once

#include "tensor/ops.h"

namespace weft::nn::functional {

using weft::EmbeddingBagMode;
using weft::Reduction;

// linear layers and convolution (tensor/ops_linalg.h, tensor/ops_nn.h)
using weft::conv2d;
using weft::linear;
using weft::maxPool2d;
// lookups
using weft::embedding;
using weft::embeddingBag;
// activations and normalisers (tensor/ops_elementwise.h, tensor/ops_reduce.h)
using weft::gelu;
using weft::logSoftmax;
using weft::relu;
using weft::sigmoid;
using weft::softmax;
using weft::tanh;
// regularisation
using weft::dropout;
// losses
using weft::crossEntropy;
using weft::mseLoss;
using weft::nllLoss;
// recurrent
using weft::lstmCell;

}  // namespace weft::nn::functional
