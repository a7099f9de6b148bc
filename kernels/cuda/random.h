// Random fills on the device from a counter-based generator, Philox-4x32-10
// (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): the value
// of element i depends only on (seed, offset, i), never on the launch shape,
// so a fill is reproducible for a seed on every device. The key comes from
// weft's Generator (Generator::reservePhilox in tensor/generator.h):
//
//   PhiloxKey k = reservePhilox(gen, n);            // n counters, at most one per element
//   kernels::cuda::normalFill(DType::Float32, p, n, 0.0, 1.0, k.seed, k.offset);
//
// Element i reads the four 32-bit words of counter offset + i / per, where
// per is the number of elements one counter serves: 4 for uniform and normal
// fills of float32 and the 16-bit types, 2 for float64, randint and the
// dropout mask. A fill of n elements uses at most n counters.
//   uniform: u = 24 random bits / 2^24 (float32 and 16-bit types) or 53 bits
//            / 2^53 (float64), in [0, 1); value = low + (high - low) * u,
//            rounded to the dtype.
//   normal:  Box-Muller on pairs of uniforms, mean + std * z.
//   randint: low + floor(r * (high - low) / 2^64) for a 64-bit r (the bias
//            is below (high - low) / 2^64), converted to the dtype.
//   dropout: element i is dropped when its 53-bit uniform is below p, as the
//            CPU's dropout decides it (the CPU's draws come from another
//            generator: masks agree in distribution, not bit for bit).
// The numbers differ from the CPU's xoshiro streams. Pointers are device
// pointers of the current device; launches go on its current stream.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace weft::kernels::cuda {

// Floating dtypes (float32, float64, bfloat16, float16).
void uniformFill(DType type, void* out, int64_t n, double low, double high, uint64_t seed, uint64_t offset);
void normalFill(DType type, void* out, int64_t n, double mean, double std, uint64_t seed, uint64_t offset);
// Any dtype of common/dtype.h: values in [low, high) (high > low), converted
// as a cast from int64 does (Bool: value != 0).
void randintFill(DType type, void* out, int64_t n, int64_t low, int64_t high, uint64_t seed, uint64_t offset);

// Dropout over contiguous x [n] of a floating dtype: mask[i] = 0 (dropped,
// probability p) or 1 / (1 - p), out[i] = x[i] * mask[i]. p == 1 drops all.
void dropoutForward(DType type, const void* x, int64_t n, double p, uint64_t seed, uint64_t offset, void* mask,
                    void* out);

}  // namespace weft::kernels::cuda
