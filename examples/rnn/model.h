// The parameter server's half of examples/rnn: the embedding table and the decoder of the
// distributed RNN model, as remote classes that the trainer builds on "ps" (after PyTorch's
// examples/distributed/rpc/rnn, rnn.py). Both programs of the job include this header.
//
//   RRef<EmbeddingTable> emb = agent.remote<EmbeddingTable>("ps", ntoken, ninp, 0.5, seed, "float32");
//   RRef<Decoder> dec = agent.remote<Decoder>("ps", ntoken, nhid, 0.5, seed, "float32");
//   RRef<Tensor> w = emb.remote(&EmbeddingTable::parameter, 0);   // the weight itself, owned by "ps"
//   Tensor e = emb.rpcSync(&EmbeddingTable::forward, tokens, dropoutSeed);   // [T, N] -> [T, N, ninp]
//   Tensor logits = dec.rpcSync(&Decoder::forward, lstmOutput, dropoutSeed); // [T, N, nhid] -> [T, N, ntoken]
//
// Dropout masks come from Generator(dropoutSeed), so a run is reproducible and a local replay of a
// batch (the gradient check, gradient_check.h) draws the same masks. The classes hold no other state
// that forward changes; calls may run on several handler threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/dtype.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "rref/remote_class.h"
#include "tensor/tensor.h"
#include "examples/common/seed.h"

namespace weft::examples::rnn {

// The dropout seed of one (iteration, site) pair, from the run's seed; the sites are 1 (the
// embedding), 2 (the LSTM) and 3 (the decoder).
inline int64_t dropoutSeed(uint64_t seed, int64_t iteration, uint64_t site) {
  return app::nonNegative(app::splitmix64(seed ^ (site << 48) ^ static_cast<uint64_t>(iteration)));
}

// "float32" / "float64"; InvalidArgumentError naming the value otherwise.
DType parseDType(const std::string& name);

// Embedding [ntoken, ninp], weight U(±0.1) from Generator(seed), then dropout `dropout`.
class EmbeddingTable {
 public:
  // Sizes positive, dropout in [0, 1), dtype "float32" or "float64" (InvalidArgumentError).
  EmbeddingTable(int64_t ntoken, int64_t ninp, double dropout, int64_t seed, std::string dtype);

  // Int64 tokens of any shape -> dropout(embedding) [*shape, ninp]; dropout is on when the
  // table's probability is positive, with masks from Generator(dropoutSeed).
  Tensor forward(Tensor tokens, int64_t dropoutSeed);
  // Parameter 0: the weight itself (so that remote(&EmbeddingTable::parameter, 0) is an RRef to
  // the tensor the optimizer updates). IndexError otherwise.
  Tensor parameter(int64_t index);
  int64_t parameterTensorCount();

 private:
  double dropout_;
  std::shared_ptr<nn::Embedding> encoder_;
};
WEFT_REMOTE_CLASS(EmbeddingTable, WEFT_CONSTRUCTORS((int64_t, int64_t, double, int64_t, std::string)), forward,
                  parameter, parameterTensorCount);

// dropout `dropout`, then Linear nhid -> ntoken with weight U(±0.1) from Generator(seed + 1) and
// bias zero.
class Decoder {
 public:
  // Sizes positive, dropout in [0, 1), dtype "float32" or "float64" (InvalidArgumentError).
  Decoder(int64_t ntoken, int64_t nhid, double dropout, int64_t seed, std::string dtype);

  // [*, nhid] -> logits [*, ntoken]; dropout masks from Generator(dropoutSeed).
  Tensor forward(Tensor hidden, int64_t dropoutSeed);
  // 0: weight [ntoken, nhid], 1: bias [ntoken] (the tensors themselves). IndexError otherwise.
  Tensor parameter(int64_t index);
  int64_t parameterTensorCount();

 private:
  double dropout_;
  std::shared_ptr<nn::Linear> decoder_;
};
WEFT_REMOTE_CLASS(Decoder, WEFT_CONSTRUCTORS((int64_t, int64_t, double, int64_t, std::string)), forward, parameter,
                  parameterTensorCount);

// The two halves' computations as functions of their parameters, for the local replay:
// embedTokens(weight, tokens, p, gen) and decode(weight, bias, hidden, p, gen) are exactly what
// EmbeddingTable::forward and Decoder::forward compute (dropout on when p > 0, masks from gen).
Tensor embedTokens(const Tensor& weight, const Tensor& tokens, double p, Generator* gen);
Tensor decode(const Tensor& weight, const Tensor& bias, const Tensor& hidden, double p, Generator* gen);

}  // namespace weft::examples::rnn
