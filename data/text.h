// Text for language models: bytes as tokens, and a corpus cut into a
// training and a validation split from which batches of random windows are
// drawn (nanoGPT's character-level data, one token per byte).
//
//   using namespace weft::data;
//   TextDataset text = TextDataset::fromDirectory();     // the fortunes corpus
//   Generator gen(1337);
//   auto [x, y] = text.batch(TextSplit::Train, 16, 128, gen);  // [16, 128] Int64 each
//   std::string s = ByteTokenizer::decode(x.select(0, 0).toVector<int64_t>());
//
// The default corpus is Debian's `fortunes` package (with `fortunes-min`): the
// plain-text fortune files in /usr/share/games/fortunes, concatenated as they
// are (the "%" lines between fortunes included) in the order of their names.
// Only regular files count: the strfile indexes (*.dat), the *.u8 links and
// subfolders (the offensive set in off/) are skipped.
//
// Data parallelism: every rank of a job passes a generator seeded alike and
// its rank and the world size. Each call draws batchSize · world window
// starts from the generator, on every rank; rank r takes draws [r · batchSize,
// (r + 1) · batchSize). The ranks' batches are thus disjoint shares of the
// job's draws, and in rank order they form exactly the batch one process
// would draw with batchSize · world; the generators stay in step.
//
// Errors: a missing folder or one without corpus files is a NotFoundError
// naming it and `apt-get install fortunes`; an unreadable file one naming the
// file. Bad arguments (trainFraction outside (0, 1], non-positive sizes, a
// rank outside [0, world), a split shorter than blockSize + 1 bytes, a token
// outside [0, 256) to decode) are InvalidArgumentErrors naming the value.
// A TextDataset is immutable: batch() may run on several threads at once,
// each with its own generator.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace weft::data {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// One token per byte: ids 0..255.
class ByteTokenizer {
 public:
  static constexpr int64_t kVocab = 256;
  static std::vector<int64_t> encode(std::string_view text);
  static std::string decode(const std::vector<int64_t>& ids);
};

enum class TextSplit { Train, Validation };

class TextDataset {
 public:
  // The corpus files of `dir` (see above), the first trainFraction of the
  // bytes for training, the rest for validation.
  static TextDataset fromDirectory(const std::string& dir = kFortunesDir, double trainFraction = 0.9);
  static TextDataset fromString(std::string text, double trainFraction = 0.9);

  // x [batchSize, blockSize] Int64: windows of the split starting at
  // uniformly drawn positions; y the same windows shifted by one byte.
  std::pair<Tensor, Tensor> batch(TextSplit split, int64_t batchSize, int64_t blockSize, Generator& gen,
                                  int rank = 0, int world = 1) const;
  // Bytes (tokens) in the split.
  int64_t size(TextSplit split) const;
  // The split's bytes.
  std::string_view text(TextSplit split) const;
  // The files read, in order (empty for fromString).
  const std::vector<std::string>& files() const { return files_; }

 private:
  TextDataset(std::string text, double trainFraction, std::vector<std::string> files);

  std::string text_;
  int64_t trainBytes_ = 0;
  std::vector<std::string> files_;
};

}  // namespace weft::data
