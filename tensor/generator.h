// Generator: a seeded, reproducible random source (xoshiro256** seeded through
// splitmix64). The same seed gives the same numbers on every machine.
//
//   weft::manualSeed(42);                          // the process default
//   weft::Generator g(7);
//   Tensor x = weft::randn({3, 4}, {}, &g);        // an explicit one
//
// The default generator is per process and guarded by a mutex; an explicit
// Generator is not thread-safe (one per thread).
//
// state()/setState() capture and restore everything that decides the next
// numbers (the xoshiro words and Box-Muller's cached spare normal), so that a
// restored generator repeats the same sequence (activation checkpointing
// replays dropout masks this way):
//
//   GeneratorState s = g.state();
//   Tensor a = weft::randn({4}, {}, &g);
//   g.setState(s);
//   Tensor b = weft::randn({4}, {}, &g);           // equal to a
#pragma once

#include <cstdint>
#include <mutex>

namespace weft {

// A generator's complete state: a value, copyable and comparable.
struct GeneratorState {
  uint64_t words[4] = {0, 0, 0, 0};
  bool haveSpare = false;  // nextNormal() holds the second of a pair
  double spare = 0;
  bool operator==(const GeneratorState&) const = default;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed);
  void seed(uint64_t s);
  uint64_t nextU64();
  // out[0..n) = the next n values of nextU64(), in order (a tight loop for
  // bulk users such as dropout masks).
  void fillU64(uint64_t* out, int64_t n);
  double nextDouble();   // U[0, 1) with 53 random bits
  float nextFloat();     // U[0, 1) with 24 random bits
  double nextNormal();   // N(0, 1), Box-Muller (pairs cached)
  // Uniform in [0, n) without modulo bias.
  uint64_t nextBelow(uint64_t n);

  GeneratorState state() const;
  // Afterwards the generator produces what it produced after state() returned
  // `s`. A state of all-zero words (never reached by seeding) is an
  // InvalidArgumentError: xoshiro would then produce only zeros.
  void setState(const GeneratorState& s);

 private:
  uint64_t s_[4];
  bool haveSpare_ = false;
  double spare_ = 0;
};

// The process default generator, used when an op is given none. Callers that
// use it concurrently must hold defaultGeneratorMutex().
Generator& defaultGenerator();
std::mutex& defaultGeneratorMutex();
void manualSeed(uint64_t seed);
// The default generator's state, read and restored under its mutex.
GeneratorState defaultGeneratorState();
void setDefaultGeneratorState(const GeneratorState& s);

}  // namespace weft
