#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/idx.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::data;
namespace fs = std::filesystem;

namespace {

// doctest::Contains for a std::string built at run time.
doctest::Contains has(const std::string& s) { return doctest::Contains(doctest::String(s.c_str())); }

// A fresh folder under the system temp dir, removed with its contents when
// the test case ends.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("weft_idx_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

using Bytes = std::vector<uint8_t>;

void appendBigEndian32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// An IDX header for `type` and `dims` followed by `data`.
Bytes idxBytes(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& data) {
  Bytes b{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) appendBigEndian32(b, d);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

void writePlain(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void writeGzip(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!b.empty()) REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

Bytes readAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A 3x2x2 uint8 image file's data: 0, 17, 34, ..., 187.
Bytes imagePixels() {
  Bytes px;
  for (int i = 0; i < 12; ++i) px.push_back(static_cast<uint8_t>(17 * i));
  return px;
}

}  // namespace

TEST_CASE("a plain and a gzip IDX image file read back the same pixels") {
  TempDir dir;
  const Bytes file = idxBytes(0x08, {3, 2, 2}, imagePixels());
  writePlain(dir.file("images"), file);
  writeGzip(dir.file("images.gz"), file);
  for (const std::string& name : {dir.file("images"), dir.file("images.gz")}) {
    CAPTURE(name);
    IdxArray raw = readIdx(name);
    CHECK(raw.type == IdxType::UInt8);
    CHECK(raw.dims == Shape{3, 2, 2});
    CHECK(raw.bytes == imagePixels());

    Tensor scaled = readIdxImages(name);
    CHECK(scaled.shape() == Shape{3, 2, 2});
    CHECK(scaled.dtype() == DType::Float32);
    std::vector<float> v = scaled.toVector<float>();
    for (int i = 0; i < 12; ++i) CHECK(v[i] == static_cast<float>(17 * i) / 255.0f);
    CHECK(v[0] == 0.0f);

    std::vector<float> unscaled = readIdxImages(name, false).toVector<float>();
    CHECK(unscaled[11] == 187.0f);
  }
}

TEST_CASE("labels are read as int64") {
  TempDir dir;
  writeGzip(dir.file("labels.gz"), idxBytes(0x08, {5}, {9, 0, 0, 3, 255}));
  Tensor labels = readIdxLabels(dir.file("labels.gz"));
  CHECK(labels.dtype() == DType::Int64);
  CHECK(labels.toVector<int64_t>() == std::vector<int64_t>{9, 0, 0, 3, 255});
}

TEST_CASE("multi-byte IDX element types are decoded big-endian") {
  // int16 -2 and 258; int32 -70000; float32 1.5; float64 -0.25.
  IdxArray i16 = parseIdx(idxBytes(0x0B, {2}, {0xFF, 0xFE, 0x01, 0x02}).data(), 12, "i16");
  CHECK(idxToTensor(i16, DType::Int64).toVector<int64_t>() == std::vector<int64_t>{-2, 258});
  Bytes i32 = idxBytes(0x0C, {1}, {0xFF, 0xFE, 0xEE, 0x90});
  CHECK(idxToTensor(parseIdx(i32.data(), i32.size(), "i32"), DType::Int64).toVector<int64_t>() ==
        std::vector<int64_t>{-70000});
  Bytes f32 = idxBytes(0x0D, {1, 1}, {0x3F, 0xC0, 0x00, 0x00});
  Tensor t32 = idxToTensor(parseIdx(f32.data(), f32.size(), "f32"), DType::Float32);
  CHECK(t32.shape() == Shape{1, 1});
  CHECK(t32.toVector<float>() == std::vector<float>{1.5f});
  Bytes f64 = idxBytes(0x0E, {1}, {0xBF, 0xD0, 0, 0, 0, 0, 0, 0});
  CHECK(idxToTensor(parseIdx(f64.data(), f64.size(), "f64"), DType::Float64).toVector<double>() ==
        std::vector<double>{-0.25});
  Bytes s8 = idxBytes(0x09, {2}, {0x80, 0x7F});
  CHECK(idxToTensor(parseIdx(s8.data(), s8.size(), "s8"), DType::Float32).toVector<float>() ==
        std::vector<float>{-128.0f, 127.0f});
  CHECK_THROWS_WITH_AS(idxToTensor(parseIdx(f32.data(), f32.size(), "f32"), DType::Int64),
                       has("cannot convert float32 elements to int64"), InvalidArgumentError);
}

TEST_CASE("a missing IDX file is a NotFoundError naming it") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(readIdx(dir.file("nope.gz")), has(dir.file("nope.gz") + ": no such file"),
                       NotFoundError);
  CHECK_THROWS_WITH_AS(readIdx(dir.path().string()), has("not a regular file"), InvalidArgumentError);
}

TEST_CASE("a damaged IDX header is refused with the file name and the reason") {
  TempDir dir;
  struct Case {
    const char* what;
    Bytes bytes;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"empty", {}, "shorter than the 4-byte header"},
      {"short prefix", {0, 0, 8}, "shorter than the 4-byte header"},
      {"bad magic", {1, 0, 8, 1, 0, 0, 0, 1, 7}, "bad magic"},
      {"unknown type", {0, 0, 0x0A, 1, 0, 0, 0, 1, 7}, "unknown element type code 0x0A"},
      {"no dims", {0, 0, 8, 0}, "0 dimensions declared"},
      {"too many dims", {0, 0, 8, 9}, "9 dimensions declared"},
      {"cut in the dims", {0, 0, 8, 3, 0, 0, 0, 2, 0, 0}, "truncated inside the header"},
      {"overflowing dims", idxBytes(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}), "more data than any file"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string plain = dir.file(std::string(c.what) + ".idx");
    const std::string gz = plain + ".gz";
    writePlain(plain, c.bytes);
    writeGzip(gz, c.bytes);
    CHECK_THROWS_WITH_AS(readIdx(plain), has(plain + ": "), InvalidArgumentError);
    CHECK_THROWS_WITH_AS(readIdx(plain), has(c.message), InvalidArgumentError);
    CHECK_THROWS_WITH_AS(readIdx(gz), has(c.message), InvalidArgumentError);
    CHECK_THROWS_WITH_AS(parseIdx(c.bytes.data(), c.bytes.size(), c.what), has(c.message),
                         InvalidArgumentError);
  }
}

TEST_CASE("IDX data shorter or longer than the header promises is refused") {
  TempDir dir;
  Bytes full = idxBytes(0x08, {3, 2, 2}, imagePixels());
  Bytes shortData(full.begin(), full.end() - 1);
  Bytes longData = full;
  longData.push_back(0);
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    const std::string s = dir.file(gz ? "short.gz" : "short"), l = dir.file(gz ? "long.gz" : "long");
    (gz ? writeGzip : writePlain)(s, shortData);
    (gz ? writeGzip : writePlain)(l, longData);
    CHECK_THROWS_WITH_AS(readIdx(s),
                         has(s + ": truncated: the header promises 3x2x2 uint8 = 12 data bytes, "
                                               "the file holds 11"),
                         InvalidArgumentError);
    CHECK_THROWS_WITH_AS(readIdx(l), has(l + ": unexpected bytes after the 3x2x2 uint8"),
                         InvalidArgumentError);
  }
  CHECK_THROWS_WITH_AS(parseIdx(longData.data(), longData.size(), "mem"),
                       has("1 unexpected bytes after"), InvalidArgumentError);
}

TEST_CASE("a header promising 47 MB over a few bytes fails without reading past the file") {
  TempDir dir;
  const std::string path = dir.file("liar.gz");
  writeGzip(path, idxBytes(0x08, {60000, 28, 28}, {1, 2, 3}));
  CHECK_THROWS_WITH_AS(readIdx(path), has("60000x28x28 uint8 = 47040000 data bytes, the file holds 3"),
                       InvalidArgumentError);
}

TEST_CASE("a cut or corrupted gzip stream is an error, not silent short data") {
  TempDir dir;
  // Enough incompressible-ish pixels that the compressed stream spans many bytes.
  Bytes px(5000);
  uint32_t x = 12345;
  for (auto& p : px) {
    x = x * 1103515245u + 12345u;
    p = static_cast<uint8_t>(x >> 24);
  }
  const std::string good = dir.file("good.gz");
  writeGzip(good, idxBytes(0x08, {5, 10, 100}, px));
  CHECK(readIdx(good).bytes == px);
  Bytes gz = readAll(good);
  REQUIRE(gz.size() > 200);

  const std::string cut = dir.file("cut.gz");
  writePlain(cut, Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
  CHECK_THROWS_WITH_AS(readIdx(cut), has(cut), InvalidArgumentError);

  // The stream is complete but its CRC no longer matches.
  Bytes flipped = gz;
  flipped[gz.size() / 2] ^= 0x5A;
  const std::string bad = dir.file("flipped.gz");
  writePlain(bad, flipped);
  CHECK_THROWS_WITH_AS(readIdx(bad), has(bad), InvalidArgumentError);

  // Only the trailer is cut: all the data decompresses but the CRC is missing.
  const std::string noTrailer = dir.file("notrailer.gz");
  writePlain(noTrailer, Bytes(gz.begin(), gz.end() - 4));
  CHECK_THROWS_WITH_AS(readIdx(noTrailer), has("gzip"), InvalidArgumentError);
}

TEST_CASE("image and label readers refuse files of the other kind") {
  TempDir dir;
  writePlain(dir.file("labels"), idxBytes(0x08, {4}, {1, 2, 3, 4}));
  writePlain(dir.file("images"), idxBytes(0x08, {3, 2, 2}, imagePixels()));
  writePlain(dir.file("floats"), idxBytes(0x0D, {1, 1, 1}, {0, 0, 0, 0}));
  CHECK_THROWS_WITH_AS(readIdxImages(dir.file("labels")), has("expected [N, rows, cols] uint8, found 4 uint8"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(readIdxLabels(dir.file("images")), has("expected [N] uint8, found 3x2x2 uint8"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(readIdxImages(dir.file("floats")), has("1x1x1 float32"), InvalidArgumentError);
}

TEST_CASE("an IDX file with a zero dimension is an empty tensor") {
  TempDir dir;
  writePlain(dir.file("empty"), idxBytes(0x08, {0, 28, 28}, {}));
  Tensor t = readIdxImages(dir.file("empty"));
  CHECK(t.shape() == Shape{0, 28, 28});
  CHECK(t.numel() == 0);
}
