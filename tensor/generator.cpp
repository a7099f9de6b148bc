#include "tensor/generator.h"

#include <cmath>

#include "common/error.h"

namespace weft {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Generator::Generator(uint64_t s) { seed(s); }

void Generator::seed(uint64_t s) {
  uint64_t x = s;
  for (auto& w : s_) w = splitmix64(x);
  haveSpare_ = false;
  philoxSeed_ = s;
  philoxOffset_ = 0;
}

PhiloxKey Generator::reservePhilox(uint64_t count) {
  PhiloxKey k{philoxSeed_, philoxOffset_};
  philoxOffset_ += count;
  return k;
}

uint64_t Generator::nextU64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

void Generator::fillU64(uint64_t* out, int64_t n) {
  uint64_t s0 = s_[0], s1 = s_[1], s2 = s_[2], s3 = s_[3];
  for (int64_t i = 0; i < n; ++i) {
    out[i] = rotl(s1 * 5, 7) * 9;
    const uint64_t t = s1 << 17;
    s2 ^= s0;
    s3 ^= s1;
    s1 ^= s2;
    s0 ^= s3;
    s2 ^= t;
    s3 = rotl(s3, 45);
  }
  s_[0] = s0;
  s_[1] = s1;
  s_[2] = s2;
  s_[3] = s3;
}

double Generator::nextDouble() { return static_cast<double>(nextU64() >> 11) * 0x1.0p-53; }
float Generator::nextFloat() { return static_cast<float>(nextU64() >> 40) * 0x1.0p-24f; }

double Generator::nextNormal() {
  if (haveSpare_) {
    haveSpare_ = false;
    return spare_;
  }
  double u1 = nextDouble();
  while (u1 <= 0) u1 = nextDouble();
  double u2 = nextDouble();
  double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2 * M_PI * u2);
  haveSpare_ = true;
  return r * std::cos(2 * M_PI * u2);
}

uint64_t Generator::nextBelow(uint64_t n) {
  if (n <= 1) return 0;
  // Lemire's nearly divisionless method, with rejection for exactness.
  __uint128_t m = static_cast<__uint128_t>(nextU64()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    uint64_t threshold = -n % n;
    while (low < threshold) {
      m = static_cast<__uint128_t>(nextU64()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

GeneratorState Generator::state() const {
  GeneratorState st;
  for (int i = 0; i < 4; ++i) st.words[i] = s_[i];
  st.haveSpare = haveSpare_;
  st.spare = spare_;
  st.philoxSeed = philoxSeed_;
  st.philoxOffset = philoxOffset_;
  return st;
}

void Generator::setState(const GeneratorState& st) {
  WEFT_ENFORCE(st.words[0] != 0 || st.words[1] != 0 || st.words[2] != 0 || st.words[3] != 0, InvalidArgumentError,
               "Generator::setState: a state whose four words are all zero (xoshiro would produce only zeros)");
  for (int i = 0; i < 4; ++i) s_[i] = st.words[i];
  haveSpare_ = st.haveSpare;
  spare_ = st.spare;
  philoxSeed_ = st.philoxSeed;
  philoxOffset_ = st.philoxOffset;
}

Generator& defaultGenerator() {
  static Generator g(0x5eed);
  return g;
}

std::mutex& defaultGeneratorMutex() {
  static std::mutex m;
  return m;
}

void manualSeed(uint64_t s) {
  std::lock_guard<std::mutex> lock(defaultGeneratorMutex());
  defaultGenerator().seed(s);
}

PhiloxKey reservePhilox(Generator* gen, uint64_t count) {
  if (gen) return gen->reservePhilox(count);
  std::lock_guard<std::mutex> lock(defaultGeneratorMutex());
  return defaultGenerator().reservePhilox(count);
}

GeneratorState defaultGeneratorState() {
  std::lock_guard<std::mutex> lock(defaultGeneratorMutex());
  return defaultGenerator().state();
}

void setDefaultGeneratorState(const GeneratorState& s) {
  std::lock_guard<std::mutex> lock(defaultGeneratorMutex());
  defaultGenerator().setState(s);
}

}  // namespace weft
