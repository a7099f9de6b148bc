#include "data/text.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "common/error.h"

namespace weft::data {

namespace fs = std::filesystem;

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    WEFT_ENFORCE(ids[i] >= 0 && ids[i] < kVocab, InvalidArgumentError, "ByteTokenizer::decode: token ", ids[i],
                 " at position ", i, " is not a byte (expected 0..255)");
    out[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return out;
}

namespace {

bool isCorpusFile(const fs::directory_entry& e) {
  std::error_code ec;
  // symlink_status: the *.u8 links are not followed.
  if (!fs::is_regular_file(e.symlink_status(ec)) || ec) return false;
  const std::string ext = e.path().extension().string();
  return ext != ".dat" && ext != ".u8";
}

[[noreturn]] void corpusMissing(const std::string& dir, const std::string& why) {
  throw NotFoundError(detail::concat("TextDataset: ", why, " ", dir,
                                     " (the fortunes corpus: apt-get install fortunes, or scripts/setup.sh)"));
}

}  // namespace

TextDataset::TextDataset(std::string text, double trainFraction, std::vector<std::string> files)
    : text_(std::move(text)), files_(std::move(files)) {
  WEFT_ENFORCE(trainFraction > 0.0 && trainFraction <= 1.0, InvalidArgumentError, "TextDataset: trainFraction ",
               trainFraction, " is not in (0, 1]");
  trainBytes_ = static_cast<int64_t>(std::floor(trainFraction * static_cast<double>(text_.size())));
}

TextDataset TextDataset::fromString(std::string text, double trainFraction) {
  return TextDataset(std::move(text), trainFraction, {});
}

TextDataset TextDataset::fromDirectory(const std::string& dir, double trainFraction) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) corpusMissing(dir, "no folder");
  std::vector<fs::path> paths;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (isCorpusFile(*it)) paths.push_back(it->path());
  }
  WEFT_ENFORCE(!ec, NotFoundError, "TextDataset: cannot list ", dir, ": ", ec.message());
  if (paths.empty()) corpusMissing(dir, "no corpus files in");
  std::sort(paths.begin(), paths.end(), [](const fs::path& a, const fs::path& b) {
    return a.filename().string() < b.filename().string();
  });
  std::string text;
  std::vector<std::string> files;
  for (const fs::path& p : paths) {
    std::ifstream in(p, std::ios::binary);
    WEFT_ENFORCE(in.good(), NotFoundError, "TextDataset: cannot open ", p.string());
    std::ostringstream buf;
    buf << in.rdbuf();
    WEFT_ENFORCE(!in.bad(), NotFoundError, "TextDataset: cannot read ", p.string());
    text += buf.str();
    files.push_back(p.string());
  }
  return TextDataset(std::move(text), trainFraction, std::move(files));
}

std::string_view TextDataset::text(TextSplit split) const {
  std::string_view all(text_);
  return split == TextSplit::Train ? all.substr(0, static_cast<size_t>(trainBytes_))
                                   : all.substr(static_cast<size_t>(trainBytes_));
}

int64_t TextDataset::size(TextSplit split) const { return static_cast<int64_t>(text(split).size()); }

std::pair<Tensor, Tensor> TextDataset::batch(TextSplit split, int64_t batchSize, int64_t blockSize, Generator& gen,
                                             int rank, int world) const {
  const char* name = split == TextSplit::Train ? "train" : "validation";
  WEFT_ENFORCE(batchSize > 0 && blockSize > 0, InvalidArgumentError, "TextDataset::batch: batchSize ", batchSize,
               " and blockSize ", blockSize, " must be positive");
  WEFT_ENFORCE(world >= 1 && rank >= 0 && rank < world, InvalidArgumentError, "TextDataset::batch: rank ", rank,
               " is not in [0, world ", world, ")");
  std::string_view bytes = text(split);
  const auto n = static_cast<int64_t>(bytes.size());
  WEFT_ENFORCE(n > blockSize, InvalidArgumentError, "TextDataset::batch: the ", name, " split has ", n,
               " bytes, a window of blockSize ", blockSize, " needs ", blockSize + 1);
  const auto starts = static_cast<uint64_t>(n - blockSize);
  std::vector<int64_t> mine(static_cast<size_t>(batchSize));
  for (int64_t d = 0; d < batchSize * world; ++d) {
    const auto s = static_cast<int64_t>(gen.nextBelow(starts));
    if (d / batchSize == rank) mine[static_cast<size_t>(d % batchSize)] = s;
  }
  Tensor x = empty({batchSize, blockSize}, {.dtype = DType::Int64});
  Tensor y = empty({batchSize, blockSize}, {.dtype = DType::Int64});
  int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  for (int64_t b = 0; b < batchSize; ++b) {
    const auto* src = reinterpret_cast<const unsigned char*>(bytes.data()) + mine[static_cast<size_t>(b)];
    for (int64_t t = 0; t < blockSize; ++t) {
      px[b * blockSize + t] = src[t];
      py[b * blockSize + t] = src[t + 1];
    }
  }
  return {x, y};
}

}  // namespace weft::data
