// Definitions of kernels/cuda/optim.h. This file is compiled with
// --fmad=false: each rule's products and sums round separately, as in
// nn/optim.cpp's loops.
#include "kernels/cuda/optim.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tensor_table.h"

namespace weft::kernels::cuda {

namespace {

// ---- multi-tensor apply (the tables: kernels/cuda/tensor_table.h) -------------------

constexpr int kDepth = TensorTable::kDepth;
constexpr int64_t kChunk = TensorTable::kChunk;
constexpr int kIlp = 4;               // elements in flight per thread
constexpr int kApplyThreads = 512;

template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Updates one tensor's chunk: `op` gets one element of every operand (zero
// for an absent, null one) and updates them in registers; every operand but
// the gradient (slot 1) is stored back. When every operand is 16-byte
// aligned (chunks start at multiples of kChunk elements, so they stay
// aligned), each thread moves 16-byte packs; otherwise kIlp scalar elements
// at a time, strided by the block so that loads coalesce.
template <class T, class Op>
__device__ __forceinline__ void applyChunk(const TensorTable& table, const Op& op) {
  const int t = table.blockTensor[blockIdx.x];
  const int64_t n = table.numel[t];
  const int64_t begin = static_cast<int64_t>(table.blockChunk[blockIdx.x]) * kChunk;
  const int64_t end = n < begin + kChunk ? n : begin + kChunk;
  T* ptr[kDepth];
  bool aligned = true;
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    ptr[d] = static_cast<T*>(table.ptr[d][t]);
    aligned = aligned && reinterpret_cast<uintptr_t>(ptr[d]) % 16 == 0;
  }
  const double s0 = table.scalar[t][0], s1 = table.scalar[t][1];
  int64_t scalarFrom = begin;
  if (aligned) {
    constexpr int kPack = 16 / sizeof(T);
    using P = Pack<T, kPack>;
    const int64_t packs = (end - begin) / kPack;
    for (int64_t j = threadIdx.x; j < packs; j += blockDim.x) {
      const int64_t i = begin + j * kPack;
      P r[kDepth];
#pragma unroll
      for (int d = 0; d < kDepth; ++d) r[d] = ptr[d] != nullptr ? *reinterpret_cast<const P*>(ptr[d] + i) : P{};
#pragma unroll
      for (int e = 0; e < kPack; ++e) op(r[0].v[e], r[1].v[e], r[2].v[e], r[3].v[e], r[4].v[e], s0, s1);
      *reinterpret_cast<P*>(ptr[0] + i) = r[0];
#pragma unroll
      for (int d = 2; d < kDepth; ++d) {
        if (ptr[d] != nullptr) *reinterpret_cast<P*>(ptr[d] + i) = r[d];
      }
    }
    scalarFrom = begin + packs * kPack;  // the last few elements of the tensor
  }
  for (int64_t base = scalarFrom + threadIdx.x; base < end; base += static_cast<int64_t>(blockDim.x) * kIlp) {
    T r[kDepth][kIlp];
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
#pragma unroll
      for (int d = 0; d < kDepth; ++d) r[d][k] = ptr[d] != nullptr && i < end ? ptr[d][i] : T(0);
    }
#pragma unroll
    for (int k = 0; k < kIlp; ++k) op(r[0][k], r[1][k], r[2][k], r[3][k], r[4][k], s0, s1);
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
      if (i >= end) continue;
      ptr[0][i] = r[0][k];
#pragma unroll
      for (int d = 2; d < kDepth; ++d) {
        if (ptr[d] != nullptr) ptr[d][i] = r[d][k];
      }
    }
  }
}

template <class T, class Op>
__global__ void __launch_bounds__(kApplyThreads) applyKernel(const __grid_constant__ TensorTable table, Op op) {
  applyChunk<T>(table, op);
}

template <class T, class Op>
void launchApply(std::span<const OptimTensor> tensors, const Op& op, const char* name) {
  cudaStream_t s = stream();
  multiTensorApply(tensors, [&](const TensorTable& table, int blocks) {
    applyKernel<T><<<blocks, kApplyThreads, 0, s>>>(table, op);
    checkLaunch(name);
  });
}

void checkDType(DType dtype, const char* op) {
  WEFT_ENFORCE(dtype == DType::Float32 || dtype == DType::Float64, InvalidArgumentError, op,
               ": fused CUDA steps take float32 or float64 parameters, got ", dtypeName(dtype));
}

template <class T>
__device__ __forceinline__ T sqrtOf(T x) {
  if constexpr (std::is_same_v<T, float>) return sqrtf(x);
  else return sqrt(x);
}

// ---- the rules (nn/optim.cpp's loops, operation for operation) --------------------

template <class T>
struct SgdOp {
  T weightDecay, momentum, keep, negLr;
  bool maximize, decay, hasMomentum, nesterov;
  __device__ void operator()(T& p, T& g, T& buf, T&, T&, double fresh, double) const {
    T d = maximize ? -g : g;
    if (decay) d = d + weightDecay * p;
    if (hasMomentum) {
      T bi = fresh != 0 ? d : buf * momentum + keep * d;
      buf = bi;
      d = nesterov ? d + momentum * bi : bi;
    }
    p = p + negLr * d;
  }
};

template <class T>
struct AdamOp {
  T beta1, beta2, oneMinusBeta1, oneMinusBeta2, weightDecay, decay, eps;
  bool maximize, decoupled, hasDecay, amsgrad;
  __device__ void operator()(T& p, T& g, T& m, T& v, T& vmax, double negStepSize, double bc2Sqrt) const {
    T d = maximize ? -g : g;
    T pi = p;
    if (decoupled) {
      pi = pi * decay;
    } else if (hasDecay) {
      d = d + weightDecay * pi;
    }
    T mi = m * beta1 + oneMinusBeta1 * d;
    T vi = v * beta2 + (oneMinusBeta2 * d) * d;
    m = mi;
    v = vi;
    if (amsgrad) {
      vi = vmax < vi ? vi : vmax;  // std::max(vmax, vi)
      vmax = vi;
    }
    T denom = sqrtOf(vi) / static_cast<T>(bc2Sqrt) + eps;
    p = pi + (static_cast<T>(negStepSize) * mi) / denom;
  }
};

template <class T>
struct AdagradOp {
  T weightDecay, eps;
  bool maximize, decay;
  __device__ void operator()(T& p, T& g, T& sum, T&, T&, double negClr, double) const {
    T d = maximize ? -g : g;
    if (decay) d = d + weightDecay * p;
    T s = sum + d * d;
    sum = s;
    p = p + (static_cast<T>(negClr) * d) / (sqrtOf(s) + eps);
  }
};

template <class T>
struct RmspropOp {
  T weightDecay, alpha, oneMinusAlpha, eps, momentum, negLr;
  bool maximize, decay, centered, hasMomentum;
  __device__ void operator()(T& p, T& g, T& sq, T& buf, T& gavg, double, double) const {
    T d = maximize ? -g : g;
    if (decay) d = d + weightDecay * p;
    T s = sq * alpha + (oneMinusAlpha * d) * d;
    sq = s;
    T avg;
    if (centered) {
      T ga = gavg * alpha + oneMinusAlpha * d;
      gavg = ga;
      avg = sqrtOf(s + (-ga) * ga);
    } else {
      avg = sqrtOf(s);
    }
    avg = avg + eps;
    if (hasMomentum) {
      T bi = buf * momentum + d / avg;
      buf = bi;
      p = p + negLr * bi;
    } else {
      p = p + (negLr * d) / avg;
    }
  }
};

}  // namespace

void sgdStep(DType dtype, std::span<const OptimTensor> tensors, const SgdStepOptions& o) {
  checkDType(dtype, "SGD");
  WEFT_DISPATCH_FLOATING(dtype, "SGD", [&]<class T>() {
    SgdOp<T> op{static_cast<T>(o.weightDecay), static_cast<T>(o.momentum), static_cast<T>(1.0 - o.dampening),
                static_cast<T>(-o.lr), o.maximize, o.weightDecay != 0, o.momentum != 0, o.nesterov};
    launchApply<T>(tensors, op, "SGD");
  });
}

void adamStep(DType dtype, std::span<const OptimTensor> tensors, const AdamStepOptions& o) {
  const char* name = o.decoupled ? "AdamW" : "Adam";
  checkDType(dtype, name);
  WEFT_DISPATCH_FLOATING(dtype, name, [&]<class T>() {
    AdamOp<T> op{static_cast<T>(o.beta1),       static_cast<T>(o.beta2),
                 static_cast<T>(1.0 - o.beta1), static_cast<T>(1.0 - o.beta2),
                 static_cast<T>(o.weightDecay), static_cast<T>(1.0 - o.lr * o.weightDecay),
                 static_cast<T>(o.eps),         o.maximize,
                 o.decoupled,                   o.weightDecay != 0,
                 o.amsgrad};
    launchApply<T>(tensors, op, name);
  });
}

void adagradStep(DType dtype, std::span<const OptimTensor> tensors, const AdagradStepOptions& o) {
  checkDType(dtype, "Adagrad");
  WEFT_DISPATCH_FLOATING(dtype, "Adagrad", [&]<class T>() {
    AdagradOp<T> op{static_cast<T>(o.weightDecay), static_cast<T>(o.eps), o.maximize, o.weightDecay != 0};
    launchApply<T>(tensors, op, "Adagrad");
  });
}

void rmspropStep(DType dtype, std::span<const OptimTensor> tensors, const RmspropStepOptions& o) {
  checkDType(dtype, "RMSprop");
  WEFT_DISPATCH_FLOATING(dtype, "RMSprop", [&]<class T>() {
    RmspropOp<T> op{static_cast<T>(o.weightDecay), static_cast<T>(o.alpha), static_cast<T>(1.0 - o.alpha),
                    static_cast<T>(o.eps),         static_cast<T>(o.momentum), static_cast<T>(-o.lr),
                    o.maximize,                    o.weightDecay != 0,       o.centered,
                    o.momentum > 0};
    launchApply<T>(tensors, op, "RMSprop");
  });
}

// ---- gradient scaling and norms -------------------------------------------------------

namespace {

// The arrays of one dtype as OptimTensors (param = the array), so that they
// go through multiTensorApply's chunking.
std::vector<OptimTensor> arraysOf(std::span<const DeviceArray> arrays, DType dtype) {
  std::vector<OptimTensor> out;
  for (const DeviceArray& a : arrays) {
    if (a.dtype == dtype && a.numel > 0) {
      OptimTensor t;
      t.param = a.data;
      t.numel = a.numel;
      out.push_back(t);
    }
  }
  return out;
}

constexpr DType kFloatingTypes[] = {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16};

void checkArrays(std::span<const DeviceArray> arrays, const char* op) {
  for (const DeviceArray& a : arrays) {
    WEFT_ENFORCE(isFloating(a.dtype), InvalidArgumentError, op, ": expected floating arrays, got ",
                 dtypeName(a.dtype));
  }
}

// x *= scale; *flag = 1 when an element was inf or NaN before (|x| <= max is
// false for both).
template <class T>
__global__ void __launch_bounds__(kThreads) scaleCheckKernel(const __grid_constant__ TensorTable table, Acc<T> scale,
                                                             int* flag) {
  const int t = table.blockTensor[blockIdx.x];
  const int64_t n = table.numel[t];
  const int64_t begin = static_cast<int64_t>(table.blockChunk[blockIdx.x]) * kChunk;
  const int64_t end = n < begin + kChunk ? n : begin + kChunk;
  T* x = static_cast<T*>(table.ptr[0][t]);
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const Acc<T> v = toAcc(x[i]);
    bad |= !(fabs(v) <= std::numeric_limits<Acc<T>>::max());
    x[i] = fromAcc<T>(v * scale);
  }
  if (flag != nullptr && __syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

template <class T>
void launchScale(std::span<const OptimTensor> list, double scale, int* flag, const char* name) {
  using A = Acc<T>;
  const A s = static_cast<A>(std::is_same_v<A, double> ? scale : static_cast<double>(static_cast<float>(scale)));
  cudaStream_t st = stream();
  multiTensorApply(list, [&](const TensorTable& table, int blocks) {
    scaleCheckKernel<T><<<blocks, kThreads, 0, st>>>(table, s, flag);
    checkLaunch(name);
  });
}

void scaleAll(std::span<const DeviceArray> arrays, double scale, int* flag, const char* name) {
  for (DType dtype : kFloatingTypes) {
    std::vector<OptimTensor> list = arraysOf(arrays, dtype);
    if (list.empty()) continue;
    WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(dtype, name, [&]<class T>() { launchScale<T>(list, scale, flag, name); });
  }
}

// Per-block partial norms: the sum of |x|^p (p == 2 squares, p == inf takes
// the maximum of |x|) over one chunk, in float64, into partial[blockBase + b].
template <class T>
__global__ void __launch_bounds__(kThreads) normPartialKernel(const __grid_constant__ TensorTable table, double p,
                                                              int mode, double* partial, int64_t blockBase) {
  const int t = table.blockTensor[blockIdx.x];
  const int64_t n = table.numel[t];
  const int64_t begin = static_cast<int64_t>(table.blockChunk[blockIdx.x]) * kChunk;
  const int64_t end = n < begin + kChunk ? n : begin + kChunk;
  const T* x = static_cast<const T*>(table.ptr[0][t]);
  double acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double a = fabs(static_cast<double>(toAcc(x[i])));
    if (mode == 0) acc += a * a;
    else if (mode == 1) acc = (a > acc || a != a) ? a : acc;  // NaN propagates
    else acc += pow(a, p);
  }
  // Warp shuffle, then the warps' results through shared memory.
  __shared__ double warpAcc[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) {
    const double o = __shfl_down_sync(0xffffffffu, acc, off);
    if (mode == 1) acc = (o > acc || o != o) ? o : acc;
    else acc += o;
  }
  if ((threadIdx.x & 31) == 0) warpAcc[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = warpAcc[0];
    for (int w = 1; w < kThreads / 32; ++w) {
      if (mode == 1) total = (warpAcc[w] > total || warpAcc[w] != warpAcc[w]) ? warpAcc[w] : total;
      else total += warpAcc[w];
    }
    partial[blockBase + blockIdx.x] = total;
  }
}

// partial[0] = the sum (or maximum) of partial[0..n), by one block.
__global__ void __launch_bounds__(kThreads) normFinalKernel(double* partial, int64_t n, int mode) {
  __shared__ double acc[kThreads];
  double a = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = partial[i];
    if (mode == 1) a = (v > a || v != v) ? v : a;
    else a += v;
  }
  acc[threadIdx.x] = a;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      const double o = acc[threadIdx.x + half];
      if (mode == 1) acc[threadIdx.x] = (o > acc[threadIdx.x] || o != o) ? o : acc[threadIdx.x];
      else acc[threadIdx.x] += o;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[0] = acc[0];
}

}  // namespace

void gradScaleAndCheckFinite(std::span<const DeviceArray> arrays, double scale, bool* found) {
  checkArrays(arrays, "gradScaleAndCheckFinite");
  const int device = currentDevice();
  DeviceFlag flag;
  scaleAll(arrays, scale, flag.get(), "gradScaleAndCheckFinite");
  *found = flag.read() != 0;
}

void gradScale(std::span<const DeviceArray> arrays, double scale) {
  checkArrays(arrays, "gradScale");
  scaleAll(arrays, scale, nullptr, "gradScale");
}

void gradPowerSum(std::span<const DeviceArray> arrays, double normType, double* total) {
  checkArrays(arrays, "gradPowerSum");
  WEFT_ENFORCE(normType > 0, InvalidArgumentError, "gradPowerSum: normType must be positive, got ", normType);
  const int mode = std::isinf(normType) ? 1 : normType == 2.0 ? 0 : 2;
  int64_t blocks = 0;
  for (const DeviceArray& a : arrays) {
    if (a.numel > 0) blocks += (a.numel + kChunk - 1) / kChunk;
  }
  *total = 0.0;
  if (blocks == 0) return;
  const int device = currentDevice();
  Scratch partial(static_cast<size_t>(blocks) * sizeof(double), device);
  double* part = partial.as<double>();
  cudaStream_t st = stream();
  int64_t base = 0;
  for (DType dtype : kFloatingTypes) {
    std::vector<OptimTensor> list = arraysOf(arrays, dtype);
    if (list.empty()) continue;
    WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(dtype, "gradPowerSum", [&]<class T>() {
      multiTensorApply(list, [&](const TensorTable& table, int n) {
        normPartialKernel<T><<<n, kThreads, 0, st>>>(table, normType, mode, part, base);
        checkLaunch("gradPowerSum");
        base += n;
      });
    });
  }
  normFinalKernel<<<1, kThreads, 0, st>>>(part, blocks, mode);
  checkLaunch("gradPowerSum");
  copyDeviceToHost(total, part, sizeof(double), device);
}

}  // namespace weft::kernels::cuda
