// Building blocks shared by the reduction-shaped kernels (reduce, scan,
// softmax, loss): warp and block reductions over an associative, commutative
// `Op`, the shuffle of any arithmetic state, and a scratch buffer from the
// caching allocator for two-pass reductions.
//
// An Op is a struct with
//   using State = ...;                       // what is reduced
//   static __device__ State identity();      // combine(identity(), s) == s
//   static __device__ State combine(State, State);
//   static __device__ State shuffleXor(State, int laneMask);
#pragma once

#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda {

constexpr unsigned kFullWarp = 0xffffffffu;

// __shfl_xor_sync for any arithmetic type (8-bit and 16-bit integers travel as int).
template <class S>
__device__ __forceinline__ S shuffleXorValue(S v, int laneMask) {
  if constexpr (std::is_floating_point_v<S>) {
    return __shfl_xor_sync(kFullWarp, v, laneMask);
  } else if constexpr (sizeof(S) == 8) {
    return static_cast<S>(__shfl_xor_sync(kFullWarp, static_cast<long long>(v), laneMask));
  } else {
    return static_cast<S>(__shfl_xor_sync(kFullWarp, static_cast<int>(v), laneMask));
  }
}

// Every lane of the (full) warp gets the combination of the 32 lanes' states.
template <class Op>
__device__ __forceinline__ typename Op::State warpReduce(typename Op::State s) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) s = Op::combine(s, Op::shuffleXor(s, m));
  return s;
}

// Every thread of the block (blockDim.x a multiple of 32, one dimension) gets
// the combination of all threads' states. `scratch` holds 32 states in shared
// memory; the call may follow another on the same scratch.
template <class Op>
__device__ typename Op::State blockReduce(typename Op::State s, typename Op::State* scratch) {
  s = warpReduce<Op>(s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  s = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : Op::identity();
  return warpReduce<Op>(s);
}

template <class A>
struct SumOp {
  using State = A;
  static __device__ __forceinline__ State identity() { return State(0); }
  static __device__ __forceinline__ State combine(State a, State b) { return static_cast<State>(a + b); }
  static __device__ __forceinline__ State shuffleXor(State s, int m) { return shuffleXorValue(s, m); }
};

// exp at the precision of its argument (the accurate expf, not __expf).
__device__ __forceinline__ float expOf(float v) { return expf(v); }
__device__ __forceinline__ double expOf(double v) { return exp(v); }

// A value of the accumulation type rounded to the element type T.
template <class T, class A>
__device__ __forceinline__ T roundTo(A v) {
  if constexpr (kIsDeviceHalf<T>) return fromAcc<T>(static_cast<float>(v));
  else return static_cast<T>(v);
}

}  // namespace weft::kernels::cuda
