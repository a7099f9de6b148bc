// Byte tokens and TextDataset: splits, windows drawn from the generator, the ranks' disjoint
// shares of a job's draws, corpus folders (fixed order, index files and links skipped), the
// real fortunes corpus, and the errors.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/text.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::data;
namespace fs = std::filesystem;

namespace {

doctest::Contains has(const std::string& s) { return doctest::Contains(doctest::String(s.c_str())); }

// `n` pseudo-random printable bytes: every window of 12 or more bytes occurs once (checked).
std::string randomText(size_t n, uint64_t seed) {
  Generator g(seed);
  std::string s(n, ' ');
  for (char& c : s) c = static_cast<char>(32 + g.nextBelow(95));
  return s;
}

std::string row(const Tensor& t, int64_t b) { return ByteTokenizer::decode(t.select(0, b).toVector<int64_t>()); }

// A temporary folder removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("weft_text_test_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream(path / name, std::ios::binary) << content;
  }
};

}  // namespace

TEST_SUITE_BEGIN("text");

TEST_CASE("ByteTokenizer maps every byte to its value and back, multi-byte UTF-8 as several tokens") {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::vector<int64_t> ids = ByteTokenizer::encode(all);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(ids[static_cast<size_t>(b)] == b);
  CHECK(ByteTokenizer::decode(ids) == all);
  CHECK(ByteTokenizer::encode("\xc3\xa9t\xc3\xa9") == std::vector<int64_t>{195, 169, 116, 195, 169});
  CHECK(ByteTokenizer::kVocab == 256);
  CHECK_THROWS_WITH_AS(ByteTokenizer::decode({65, 256}), doctest::Contains("token 256 at position 1"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(ByteTokenizer::decode({-1}), InvalidArgumentError);
}

TEST_CASE("fromString splits the first trainFraction of the bytes for training, the rest for validation") {
  std::string s = randomText(1000, 1);
  TextDataset ds = TextDataset::fromString(s);
  CHECK(ds.size(TextSplit::Train) == 900);
  CHECK(ds.size(TextSplit::Validation) == 100);
  CHECK(ds.text(TextSplit::Train) == std::string_view(s).substr(0, 900));
  CHECK(ds.text(TextSplit::Validation) == std::string_view(s).substr(900));
  TextDataset half = TextDataset::fromString(s, 0.55);
  CHECK(half.size(TextSplit::Train) == 550);
  CHECK(TextDataset::fromString(s, 1.0).size(TextSplit::Validation) == 0);
  CHECK_THROWS_WITH_AS(TextDataset::fromString(s, 0.0), doctest::Contains("trainFraction 0 is not in (0, 1]"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(TextDataset::fromString(s, 1.5), InvalidArgumentError);
}

TEST_CASE("a batch is windows at the generator's uniform draws, y shifted by one byte") {
  std::string s = randomText(5000, 2);
  TextDataset ds = TextDataset::fromString(s);
  const int64_t B = 8, T = 16;
  Generator gen(7);
  Generator twin(7);
  auto [x, y] = ds.batch(TextSplit::Train, B, T, gen);
  CHECK(x.shape() == Shape{B, T});
  CHECK(y.shape() == Shape{B, T});
  CHECK(x.dtype() == DType::Int64);
  CHECK(y.dtype() == DType::Int64);
  std::string_view train = ds.text(TextSplit::Train);
  for (int64_t b = 0; b < B; ++b) {
    // The reference: the b-th uniform draw in [0, 4500 - 16).
    const auto start = static_cast<size_t>(twin.nextBelow(4500 - 16));
    CAPTURE(b);
    CHECK(row(x, b) == train.substr(start, T));
    CHECK(row(y, b) == train.substr(start + 1, T));
  }
  CHECK(gen.state() == twin.state());
  // Validation windows come from the validation bytes only.
  auto [vx, vy] = ds.batch(TextSplit::Validation, 4, 32, gen);
  std::string_view val = ds.text(TextSplit::Validation);
  for (int64_t b = 0; b < 4; ++b) {
    const size_t at = val.find(row(vx, b));
    REQUIRE(at != std::string_view::npos);
    CHECK(row(vy, b) == val.substr(at + 1, 32));
  }
}

TEST_CASE("every window start is drawn, the last one included") {
  // 7 training bytes and windows of 5: starts 0 and 1 only.
  TextDataset ds = TextDataset::fromString("abcdefg", 1.0);
  Generator gen(3);
  std::set<std::string> seen;
  for (int i = 0; i < 20; ++i) {
    auto [x, y] = ds.batch(TextSplit::Train, 1, 5, gen);
    seen.insert(row(x, 0) + "|" + row(y, 0));
  }
  CHECK(seen == std::set<std::string>{"abcde|bcdef", "bcdef|cdefg"});
}

TEST_CASE("ranks draw disjoint shares of the job's draws: in rank order they are one process's batch") {
  std::string s = randomText(20000, 4);
  TextDataset ds = TextDataset::fromString(s);
  const int world = 3;
  const int64_t B = 4, T = 24;
  Generator single(11);
  auto [allX, allY] = ds.batch(TextSplit::Train, B * world, T, single);
  std::set<std::string> windows;
  for (int r = 0; r < world; ++r) {
    Generator gen(11);
    auto [x, y] = ds.batch(TextSplit::Train, B, T, gen, r, world);
    for (int64_t b = 0; b < B; ++b) {
      CAPTURE(r);
      CAPTURE(b);
      CHECK(row(x, b) == row(allX, r * B + b));
      CHECK(row(y, b) == row(allY, r * B + b));
      windows.insert(row(x, b));
    }
    // Every rank's generator advanced by the whole job's draws, as the single process's did.
    CHECK(gen.state() == single.state());
  }
  // 12 distinct windows: no draw went to two ranks.
  CHECK(windows.size() == static_cast<size_t>(B * world));
}

TEST_CASE("batch arguments are checked") {
  TextDataset ds = TextDataset::fromString(randomText(100, 5));
  Generator gen(1);
  CHECK_THROWS_WITH_AS(ds.batch(TextSplit::Train, 0, 8, gen), doctest::Contains("batchSize 0 and blockSize 8"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(ds.batch(TextSplit::Train, 2, 8, gen, 3, 3), doctest::Contains("rank 3 is not in [0, world 3)"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(ds.batch(TextSplit::Validation, 2, 10, gen),
                       doctest::Contains("the validation split has 10 bytes, a window of blockSize 10 needs 11"),
                       InvalidArgumentError);
}

TEST_CASE("fromDirectory reads the regular files in name order, skipping .dat indexes, links and folders") {
  TempDir dir;
  dir.write("zeta", "Z1\n%\nZ2\n");
  dir.write("alpha", "A1\n%\n");
  dir.write("alpha.dat", std::string("\x00\x00\x00\x02", 4));
  fs::create_symlink(dir.path / "alpha", dir.path / "alpha.u8");
  fs::create_symlink(dir.path / "zeta", dir.path / "mid");
  fs::create_directories(dir.path / "off");
  std::ofstream(dir.path / "off" / "rude", std::ios::binary) << "no\n";
  TextDataset ds = TextDataset::fromDirectory(dir.path.string(), 1.0);
  CHECK(ds.text(TextSplit::Train) == "A1\n%\nZ1\n%\nZ2\n");
  REQUIRE(ds.files().size() == 2);
  CHECK(fs::path(ds.files()[0]).filename() == "alpha");
  CHECK(fs::path(ds.files()[1]).filename() == "zeta");
}

TEST_CASE("a missing or empty corpus folder is a NotFoundError naming apt-get install fortunes") {
  TempDir dir;
  const std::string missing = (dir.path / "nothing-here").string();
  CHECK_THROWS_WITH_AS(TextDataset::fromDirectory(missing), has("no folder " + missing), NotFoundError);
  CHECK_THROWS_WITH_AS(TextDataset::fromDirectory(missing), doctest::Contains("apt-get install fortunes"),
                       NotFoundError);
  dir.write("only.dat", "x");
  CHECK_THROWS_WITH_AS(TextDataset::fromDirectory(dir.path.string()), doctest::Contains("no corpus files in"),
                       NotFoundError);
}

TEST_CASE("the fortunes corpus (scripts/setup.sh installs it) loads in a fixed order and batches") {
  INFO("the corpus comes from Debian's fortunes package: apt-get install fortunes fortunes-min");
  REQUIRE(fs::is_directory(kFortunesDir));
  TextDataset ds = TextDataset::fromDirectory();
  const auto& files = ds.files();
  REQUIRE(files.size() >= 2);
  bool sorted = true, anyIndex = false, hasFortunes = false;
  int64_t total = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    fs::path p(files[i]);
    if (i > 0) sorted = sorted && fs::path(files[i - 1]).filename().string() < p.filename().string();
    anyIndex = anyIndex || p.extension() == ".dat" || p.extension() == ".u8" || fs::is_symlink(p);
    hasFortunes = hasFortunes || p.filename() == "fortunes";
    total += static_cast<int64_t>(fs::file_size(p));
  }
  CHECK(sorted);
  CHECK_FALSE(anyIndex);
  CHECK(hasFortunes);  // fortunes-min's file
  CHECK(ds.size(TextSplit::Train) + ds.size(TextSplit::Validation) == total);
  CHECK(ds.size(TextSplit::Train) == static_cast<int64_t>(std::floor(0.9 * double(total))));
  CHECK(total > 1000000);
  // The same bytes as the files themselves, in order: the first file opens the training text.
  std::ifstream first(files[0], std::ios::binary);
  std::string head(64, '\0');
  first.read(head.data(), 64);
  CHECK(ds.text(TextSplit::Train).substr(0, 64) == head);
  Generator gen(1337);
  auto [x, y] = ds.batch(TextSplit::Train, 4, 64, gen);
  for (int64_t b = 0; b < 4; ++b) {
    const std::string w = row(x, b);
    CHECK(ds.text(TextSplit::Train).find(w) != std::string_view::npos);
  }
}
