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
//
// Device fills (CUDA tensors, dropout masks on the device) draw from a
// counter-based generator (Philox-4x32-10, kernels/cuda/random.h) keyed by
// the seed and a counter offset that each fill reserves here
// (reservePhilox); the xoshiro stream is not touched, so a program's CPU
// numbers are the same whether or not it also fills device tensors. The
// offset is part of the state, so restoring a state repeats device numbers too.
#pragma once

#include <cstdint>
#include <mutex>

namespace weft {

// The key of one device fill: Philox counters offset .. offset + count - 1
// under `seed` belong to it alone.
struct PhiloxKey {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// A generator's complete state: a value, copyable and comparable.
struct GeneratorState {
  uint64_t words[4] = {0, 0, 0, 0};
  bool haveSpare = false;  // nextNormal() holds the second of a pair
  double spare = 0;
  uint64_t philoxSeed = 0;    // the seed the generator was given
  uint64_t philoxOffset = 0;  // the first counter not yet reserved
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

  // Reserves `count` Philox counters for one device fill: returns the seed
  // and the first of them, and moves the offset past them.
  PhiloxKey reservePhilox(uint64_t count);

  GeneratorState state() const;
  // Afterwards the generator produces what it produced after state() returned
  // `s`. A state of all-zero words (never reached by seeding) is an
  // InvalidArgumentError: xoshiro would then produce only zeros.
  void setState(const GeneratorState& s);

 private:
  uint64_t s_[4];
  bool haveSpare_ = false;
  double spare_ = 0;
  uint64_t philoxSeed_ = 0;
  uint64_t philoxOffset_ = 0;
};

// The process default generator, used when an op is given none. Callers that
// use it concurrently must hold defaultGeneratorMutex().
Generator& defaultGenerator();
std::mutex& defaultGeneratorMutex();
void manualSeed(uint64_t seed);
// gen->reservePhilox(count), or the default generator's under its mutex when
// gen is null.
PhiloxKey reservePhilox(Generator* gen, uint64_t count);
// The default generator's state, read and restored under its mutex.
GeneratorState defaultGeneratorState();
void setDefaultGeneratorState(const GeneratorState& s);

}  // namespace weft
