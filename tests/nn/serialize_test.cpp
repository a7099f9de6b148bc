#include <cstdio>
#include <cstring>
#include <fstream>

#include "nn/serialize.h"
#include "weft_test.h"

using namespace weft;

namespace {

nn::StateDict sample() {
  Generator g(3);
  return {{"a.weight", randn({3, 4}, {}, &g)},
          {"a.bias", randn({4}, {.dtype = DType::Float64}, &g)},
          {"count", full({}, 7, {.dtype = DType::Int64})},
          {"empty", zeros({0, 5})}};
}

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::string le32(uint32_t v) { return le64(v).substr(0, 4); }

// A file image with one record whose fields are given raw.
std::string oneRecord(const std::string& name, uint8_t dtype, const std::vector<uint64_t>& dims, uint64_t nbytes,
                      const std::string& data) {
  std::string s("WEFTSTAT", 8);
  s += le32(1) + le64(1) + le32(static_cast<uint32_t>(name.size())) + name;
  s.push_back(static_cast<char>(dtype));
  s.push_back(static_cast<char>(dims.size()));
  for (uint64_t d : dims) s += le64(d);
  s += le64(nbytes) + data;
  return s;
}

}  // namespace

TEST_CASE("a state dict survives serialization with names, dtypes, shapes and values") {
  nn::StateDict d = sample();
  nn::StateDict back = nn::deserializeStateDict(nn::serializeStateDict(d));
  REQUIRE(back.size() == d.size());
  for (const auto& [name, t] : d) {
    INFO(name);
    const Tensor& u = back.at(name);
    CHECK(u.dtype() == t.dtype());
    CHECK(u.shape() == t.shape());
    CHECK(u.toVector<double>() == t.toVector<double>());
    CHECK(u.storage() != t.storage());
  }
}

TEST_CASE("the file format is the documented little-endian layout") {
  nn::StateDict d{{"w", fromVector<float>({1.0f, 2.0f}, {1, 2})}};
  std::string bytes = nn::serializeStateDict(d);
  float vals[2] = {1.0f, 2.0f};
  std::string expect = oneRecord("w", 0, {1, 2}, 8, std::string(reinterpret_cast<const char*>(vals), 8));
  CHECK(bytes == expect);
}

TEST_CASE("non-contiguous tensors are saved by value") {
  Tensor base = arange(6, {.dtype = DType::Float32}).view({2, 3});
  nn::StateDict back = nn::deserializeStateDict(nn::serializeStateDict({{"t", base.t()}}));
  CHECK(back.at("t").toVector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("saving and loading a file, and a missing file is NotFoundError") {
  std::string path = "serialize_test_file.weft";
  nn::saveStateDict(sample(), path);
  nn::StateDict back = nn::loadStateDictFile(path);
  CHECK(back.size() == 4);
  CHECK(back.at("count").item<int64_t>() == 7);
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(nn::loadStateDictFile(path), doctest::Contains("cannot open 'serialize_test_file.weft'"),
                       NotFoundError);
  CHECK_THROWS_AS(nn::saveStateDict(sample(), "no_such_directory/x.weft"), NotFoundError);
}

TEST_CASE("every truncation of a file is a clear error, never a crash") {
  std::string bytes = nn::serializeStateDict(sample());
  std::string path = "serialize_truncated.weft";
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " of " << bytes.size() << " bytes");
    CHECK_THROWS_AS(nn::deserializeStateDict(std::string_view(bytes).substr(0, n)), InvalidArgumentError);
    if (n % 17 == 0) {
      writeFile(path, bytes.substr(0, n));
      CHECK_THROWS_WITH_AS(nn::loadStateDictFile(path), doctest::Contains("serialize_truncated.weft"),
                           InvalidArgumentError);
    }
  }
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(bytes.substr(0, bytes.size() - 1)), doctest::Contains("is truncated"),
                       InvalidArgumentError);
}

TEST_CASE("corrupt headers and fields are rejected with the field named") {
  std::string good = oneRecord("w", 0, {2}, 8, std::string(8, '\0'));
  CHECK(nn::deserializeStateDict(good).at("w").shape() == Shape{2});

  std::string badMagic = good;
  badMagic[0] = 'X';
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(badMagic), doctest::Contains("not a weft state file"),
                       InvalidArgumentError);
  std::string badVersion = good;
  badVersion[8] = 9;
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(badVersion), doctest::Contains("format version 9"),
                       InvalidArgumentError);
  std::string hugeCount = std::string("WEFTSTAT", 8) + le32(1) + le64(~0ull);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(hugeCount), doctest::Contains("claims 18446744073709551615 records"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(oneRecord("w", 9, {2}, 8, std::string(8, '\0'))),
                       doctest::Contains("unknown dtype code 9"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(oneRecord("w", 0, std::vector<uint64_t>(17, 1), 4, std::string(4, 0))),
                       doctest::Contains("17 dimensions"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(oneRecord("w", 0, {2}, 12, std::string(12, '\0'))),
                       doctest::Contains("declares 12 data bytes but shape [2] of float32 needs 8"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(oneRecord("w", 0, {1ull << 62, 1ull << 62}, 0, "")),
                       doctest::Contains("overflows"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(oneRecord("w", 0, {~0ull}, 0, "")),
                       doctest::Contains("negative size"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(oneRecord("w", 0, {1ull << 40}, 4ull << 40, "")),
                       doctest::Contains("is truncated"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(good + "x"), doctest::Contains("1 unexpected bytes after"),
                       InvalidArgumentError);
  std::string zeroName = std::string("WEFTSTAT", 8) + le32(1) + le64(1) + le32(0) + std::string(20, '\0');
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(zeroName), doctest::Contains("name length of 0"),
                       InvalidArgumentError);
  std::string hugeName = std::string("WEFTSTAT", 8) + le32(1) + le64(1) + le32(0xffffffffu) + std::string(20, '\0');
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(hugeName), doctest::Contains("name length of 4294967295"),
                       InvalidArgumentError);
  // Two records with the same key.
  std::string rec = good.substr(20);
  std::string dup = std::string("WEFTSTAT", 8) + le32(1) + le64(2) + rec + rec;
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(dup), doctest::Contains("record 1 ('w') repeats a key"),
                       InvalidArgumentError);
}

TEST_CASE("random corruption of a file never crashes the reader") {
  std::string bytes = nn::serializeStateDict(sample());
  Generator g(11);
  int rejected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string c = bytes;
    int flips = 1 + static_cast<int>(g.nextBelow(4));
    for (int f = 0; f < flips; ++f) c[g.nextBelow(c.size())] = static_cast<char>(g.nextBelow(256));
    try {
      nn::StateDict d = nn::deserializeStateDict(c);
      CHECK(d.size() <= 4);  // a flip inside tensor data still parses
    } catch (const InvalidArgumentError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("undefined tensors and bad keys cannot be saved") {
  CHECK_THROWS_WITH_AS(nn::serializeStateDict({{"x", Tensor()}}), doctest::Contains("key 'x' is undefined"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(nn::serializeStateDict({{"", zeros({1})}}), InvalidArgumentError);
  CHECK_THROWS_AS(nn::saveStateDict({{"x", Tensor()}}, "never_written.weft"), InvalidArgumentError);
  CHECK_FALSE(std::ifstream("never_written.weft").good());
}

TEST_CASE("int32, uint8 and bool tensors survive a state file, and a bool byte other than 0 or 1 is refused") {
  nn::StateDict d = {{"ids", fromVector<int32_t>({-2147483647 - 1, 5, 2147483647}, {3, 1})},
                     {"pixels", fromVector<uint8_t>({0, 17, 255, 128})},
                     {"mask", fromVector(std::vector<bool>{true, false, true}, {1, 3})}};
  nn::StateDict back = nn::deserializeStateDict(nn::serializeStateDict(d));
  REQUIRE(back.size() == 3);
  CHECK(back.at("ids").dtype() == DType::Int32);
  CHECK(back.at("ids").shape() == Shape{3, 1});
  CHECK(back.at("ids").toVector<int32_t>() == d.at("ids").toVector<int32_t>());
  CHECK(back.at("pixels").dtype() == DType::UInt8);
  CHECK(back.at("pixels").toVector<uint8_t>() == std::vector<uint8_t>{0, 17, 255, 128});
  CHECK(back.at("mask").dtype() == DType::Bool);
  CHECK(back.at("mask").toVector<bool>() == std::vector<bool>{true, false, true});
  // The codes are the documented ones: int32 5, uint8 6, bool 7.
  std::string one32("\x01\x00\x00\x00", 4);
  CHECK(nn::deserializeStateDict(oneRecord("w", 5, {1}, 4, one32)).at("w").item<int32_t>() == 1);
  CHECK(nn::deserializeStateDict(oneRecord("w", 6, {1}, 1, "\xff")).at("w").item<uint8_t>() == 255);
  CHECK(nn::deserializeStateDict(oneRecord("w", 7, {2}, 2, std::string("\x00\x01", 2))).at("w").toVector<bool>() ==
        std::vector<bool>{false, true});
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(oneRecord("w", 7, {3}, 3, std::string("\x00\x01\x02", 3))),
                       doctest::Contains("record 0 ('w') is a bool tensor with byte 2 at element 2 (a bool is 0 or 1)"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(nn::deserializeStateDict(oneRecord("w", 8, {1}, 1, std::string(1, '\0'))),
                       doctest::Contains("unknown dtype code 8"), InvalidArgumentError);
}
