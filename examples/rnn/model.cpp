#include "model.h"

#include "common/error.h"
#include "nn/init.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace weft::examples::rnn {

DType parseDType(const std::string& name) {
  if (name == "float32") return DType::Float32;
  if (name == "float64") return DType::Float64;
  throw InvalidArgumentError("unknown dtype '" + name + "' (expected float32 or float64)");
}

namespace {

void checkSizes(const char* what, int64_t a, int64_t b, double dropout) {
  WEFT_ENFORCE(a > 0 && b > 0, InvalidArgumentError, what, ": sizes must be positive, got ", a, " and ", b);
  WEFT_ENFORCE(dropout >= 0.0 && dropout < 1.0, InvalidArgumentError, what, ": dropout must be in [0, 1), got ",
               dropout);
}

}  // namespace

Tensor embedTokens(const Tensor& weight, const Tensor& tokens, double p, Generator* gen) {
  return dropout(embedding(weight, tokens), p, p > 0, gen);
}

Tensor decode(const Tensor& weight, const Tensor& bias, const Tensor& hidden, double p, Generator* gen) {
  return linear(dropout(hidden, p, p > 0, gen), weight, bias);
}

EmbeddingTable::EmbeddingTable(int64_t ntoken, int64_t ninp, double dropout, int64_t seed, std::string dtype)
    : dropout_(dropout) {
  checkSizes("EmbeddingTable", ntoken, ninp, dropout);
  const DType type = parseDType(dtype);
  encoder_ = std::make_shared<nn::Embedding>(ntoken, ninp);
  encoder_->to(type);
  Generator gen(static_cast<uint64_t>(seed));
  nn::init::uniform_(encoder_->weight(), -0.1, 0.1, &gen);
}

Tensor EmbeddingTable::forward(Tensor tokens, int64_t dropoutSeed) {
  Generator gen(static_cast<uint64_t>(dropoutSeed));
  return embedTokens(encoder_->weight(), tokens, dropout_, &gen);
}

Tensor EmbeddingTable::parameter(int64_t index) {
  WEFT_ENFORCE(index == 0, IndexError, "EmbeddingTable::parameter: index ", index, " outside 0..0");
  return encoder_->weight();
}

int64_t EmbeddingTable::parameterTensorCount() { return 1; }

Decoder::Decoder(int64_t ntoken, int64_t nhid, double dropout, int64_t seed, std::string dtype) : dropout_(dropout) {
  checkSizes("Decoder", nhid, ntoken, dropout);
  const DType type = parseDType(dtype);
  decoder_ = std::make_shared<nn::Linear>(nhid, ntoken);
  decoder_->to(type);
  Generator gen(static_cast<uint64_t>(seed) + 1);
  nn::init::zeros_(decoder_->bias());
  nn::init::uniform_(decoder_->weight(), -0.1, 0.1, &gen);
}

Tensor Decoder::forward(Tensor hidden, int64_t dropoutSeed) {
  Generator gen(static_cast<uint64_t>(dropoutSeed));
  return decode(decoder_->weight(), decoder_->bias(), hidden, dropout_, &gen);
}

Tensor Decoder::parameter(int64_t index) {
  WEFT_ENFORCE(index == 0 || index == 1, IndexError, "Decoder::parameter: index ", index, " outside 0..1");
  return index == 0 ? decoder_->weight() : decoder_->bias();
}

int64_t Decoder::parameterTensorCount() { return 2; }

}  // namespace weft::examples::rnn
