// Neural-network ops: lookups, convolution, pooling, dropout, layer
// normalisation, losses and the LSTM cell. Semantics and defaults follow
// PyTorch's functional API.
#pragma once

#include <utility>

#include "tensor/tensor.h"

namespace weft {

class Generator;

enum class Reduction { None, Mean, Sum };

// weight [num, dim]; indices Int64 of any shape, on weight's device ->
// [*indices.shape, dim]. An index outside [0, num) is an IndexError naming it
// and its position (on a CUDA device the smallest and largest index are read
// back; all of them only when one is out of range).
Tensor embedding(const Tensor& weight, const Tensor& indices);

enum class EmbeddingBagMode { Sum, Mean, Max };
// PyTorch's embedding_bag: 1-D indices with bag starts in `offsets` (1-D, first
// element 0, non-decreasing), or 2-D indices [bags, n] with offsets undefined.
// Empty bags give zeros. perSampleWeights (optional, Sum only) scales rows.
// Indices and offsets on weight's device; offsets are validated on the host.
Tensor embeddingBag(const Tensor& weight, const Tensor& indices, const Tensor& offsets,
                    EmbeddingBagMode mode = EmbeddingBagMode::Mean, const Tensor& perSampleWeights = Tensor());

// x [N, C, H, W], weight [O, C, kh, kw], bias [O] or undefined. im2col + GEMM.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
              int64_t padding = 0);
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::pair<int64_t, int64_t> stride,
              std::pair<int64_t, int64_t> padding);
// x [N, C, H, W]; stride defaults to the kernel size.
Tensor maxPool2d(const Tensor& x, int64_t kernel, int64_t stride = 0, int64_t padding = 0);

// Zeroes each element with probability p and scales the rest by 1/(1-p) when
// `training`; identity otherwise. p must lie in [0, 1]; p = 1 gives zeros.
// The CPU draws the mask from gen's xoshiro stream; a CUDA device from
// Philox counters gen reserves (Generator::reservePhilox), so both are
// reproducible for a seed and replayed by restoring gen's state.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

// Layer normalisation as torch.nn.functional.layer_norm: x [..., *normalizedShape]
// is normalised over its trailing normalizedShape.size() dimensions (each such
// row to mean 0 and variance 1: the biased variance, rstd = 1 / sqrt(var + eps)),
// then scaled by weight and shifted by bias, each of normalizedShape or
// undefined. Float32 or float64; weight and bias of x's dtype and device.
// One fused kernel (kernels/cpu/layer_norm.h, kernels/cuda/layer_norm.h on a
// CUDA device): the forward reads each row
// once for its mean and variance and keeps mean and rstd per row for the
// backward, which gives dx, dweight and dbias together. No double backward:
// the backward is a kernel, not recorded ops.
// Errors (InvalidArgumentError naming layerNorm and the shapes): an empty
// normalizedShape, x's trailing dimensions not equal to it, weight or bias of
// another shape, dtype or device, a non-floating x, a negative or NaN eps.
Tensor layerNorm(const Tensor& x, const Shape& normalizedShape, const Tensor& weight = {}, const Tensor& bias = {},
                 double eps = 1e-5);

// input [N, C] log-probabilities (or [N, C, d...]), target Int64 [N] (or
// [N, d...]); entries equal to ignoreIndex contribute nothing. A target out of
// [0, C) is an IndexError. Input and target share a device; on a CUDA device
// the targets are checked there and the verdict read back, as is the total
// of a reduced loss (the call waits for the device's stream).
Tensor nllLoss(const Tensor& input, const Tensor& target, Reduction r = Reduction::Mean, int64_t ignoreIndex = -100);
Tensor crossEntropy(const Tensor& logits, const Tensor& target, Reduction r = Reduction::Mean,
                    int64_t ignoreIndex = -100);
// input and target must have equal shapes (PyTorch broadcasts with a warning;
// here [N, 1] against [N] is an InvalidArgumentError, as it is almost always a
// bug). Both receive gradients.
Tensor mseLoss(const Tensor& input, const Tensor& target, Reduction r = Reduction::Mean);

// One LSTM step as torch.nn.LSTMCell: x [N, in], h/c [N, hidden],
// wIh [4*hidden, in], wHh [4*hidden, hidden], biases [4*hidden] (either may be
// undefined). Gate order i, f, g, o. Returns (h', c').
std::pair<Tensor, Tensor> lstmCell(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& wIh,
                                   const Tensor& wHh, const Tensor& bIh, const Tensor& bHh);

// One LSTM layer over a whole sequence, as one layer of torch.nn.LSTM: the
// same values as lstmCell applied step by step, as one autograd node (far
// fewer, larger GEMMs; see kernels/cpu/lstm.h). x [T, N, in], h0 and c0
// [N, hidden], weights and biases as lstmCell's. Returns the output
// [T, N, hidden] (h at every step) and the last h and c [N, hidden].
struct LstmLayerOutput {
  Tensor output, h, c;
};
LstmLayerOutput lstmLayer(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& wIh, const Tensor& wHh,
                          const Tensor& bIh, const Tensor& bHh);

}  // namespace weft
