// cuBLAS products in weft's row-major conventions (see gemm.h): the swapped
// operand order, batch dimensions collapsed onto strided-batched calls, and
// the two small kernels around them (scaling or accumulating into C, and the
// bias pre-broadcast).
#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda {
namespace {

// ---- kernels -------------------------------------------------------------------

// C matrices addressed by a row-major index over up to kMaxDims batch
// dimensions: the offset of matrix o is sum_d i_d(o) * strides[d].
struct MatrixLayout {
  int dims = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

// For every C matrix o of `layout` and element e = (r, col): starting from
// acc = C (not read when beta is 0), `steps` times acc = beta * acc + alpha *
// P[o, step, r, col] (P contiguous [outer, steps, m, n], nullptr for no
// product: k == 0), then C = acc. The in-order accumulation of repeated C
// matrices, and beta-scaling when k == 0. blockIdx.y walks the matrices
// (grid-stride, gridDim.y <= 65535), x the elements.
template <class T>
__global__ void accumulateKernel(const Acc<T>* p, int64_t steps, int64_t outer, int64_t m, int64_t n, Acc<T> alpha,
                                 Acc<T> beta, T* c, int64_t ldc, MatrixLayout layout) {
  using A = Acc<T>;
  const int64_t mn = m * n;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    int64_t off = 0;
    for (int64_t d = layout.dims - 1, rem = o; d >= 0; --d) {
      off += (rem % layout.sizes[d]) * layout.strides[d];
      rem /= layout.sizes[d];
    }
    T* cm = c + off;
    const A* pm = p ? p + o * steps * mn : nullptr;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < mn;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t r = e / n, col = e - r * n;
      T* dst = cm + r * ldc + col;
      A acc = beta == A(0) ? A(0) : toAcc(*dst);
      for (int64_t s = 0; s < steps; ++s) {
        acc = (beta == A(0) ? A(0) : beta * acc) + (pm ? alpha * pm[s * mn + e] : A(0));
      }
      *dst = fromAcc<T>(acc);
    }
  }
}

template <class T>
void launchAccumulate(cudaStream_t s, const Acc<T>* p, int64_t steps, int64_t outer, int64_t m, int64_t n,
                      Acc<T> alpha, Acc<T> beta, T* c, int64_t ldc, const MatrixLayout& layout) {
  const int64_t fill = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 32;
  const int64_t x = std::clamp<int64_t>((m * n + kThreads - 1) / kThreads, 1, fill);
  const int64_t y = std::clamp<int64_t>(fill / x, 1, std::min<int64_t>(outer, 65535));
  accumulateKernel<T><<<dim3(static_cast<unsigned>(x), static_cast<unsigned>(y)), kThreads, 0, s>>>(
      p, steps, outer, m, n, alpha, beta, c, ldc, layout);
  checkLaunch("gemm");
}

// C[i, j] = row[j]: a thread per column (coalesced along the row), blockIdx.y
// strides over the rows (gridDim.y <= 65535).
template <class T>
__global__ void fillRowsKernel(const T* row, int64_t rows, int64_t cols, T* c, int64_t ldc) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  const T v = row[j];
  for (int64_t i = blockIdx.y; i < rows; i += gridDim.y) c[i * ldc + j] = v;
}

template <class T>
void launchFillRows(cudaStream_t s, const T* row, int64_t rows, int64_t cols, T* c, int64_t ldc) {
  const int64_t fill = static_cast<int64_t>(properties(currentDevice()).multiprocessors) * 32;
  const int64_t x = (cols + kThreads - 1) / kThreads;
  const int64_t y = std::clamp<int64_t>(fill / x, 1, std::min<int64_t>(rows, 65535));
  fillRowsKernel<T><<<dim3(static_cast<unsigned>(x), static_cast<unsigned>(y)), kThreads, 0, s>>>(row, rows, cols,
                                                                                                   c, ldc);
  checkLaunch("fillRows");
}

// ---- cuBLAS calls --------------------------------------------------------------

struct CublasTypes {
  cudaDataType data;  // A, B and C
  cudaDataType acc;   // the workspace of repeated C matrices
  cublasComputeType_t compute;
};

CublasTypes cublasTypes(DType type) {
  switch (type) {
    case DType::Float64: return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::Float32:
      return {CUDA_R_32F, CUDA_R_32F, allowTF32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
    case DType::BFloat16: return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::Float16: return {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    default: throwUnsupportedDType("gemm", type);
  }
}

// alpha and beta as the compute type reads them (host memory).
struct Scalars {
  double d[2];
  float f[2];
  Scalars(double alpha, double beta) : d{alpha, beta}, f{static_cast<float>(alpha), static_cast<float>(beta)} {}
  const void* alpha(const CublasTypes& t) const { return t.compute == CUBLAS_COMPUTE_64F ? &d[0] : (const void*)&f[0]; }
  const void* beta(const CublasTypes& t) const { return t.compute == CUBLAS_COMPUTE_64F ? &d[1] : (const void*)&f[1]; }
};

// An operand as cuBLAS takes it in C^T = op(B)^T · op(A)^T: the stored
// row-major matrix is the column-major transpose, so an untransposed operand
// is CUBLAS_OP_N and a transposed one CUBLAS_OP_T, with the same ld.
struct BlasOperand {
  const char* data;
  cublasOperation_t op;
  int64_t ld;
};

// op(x) is [rows, cols]; a single stored row makes the leading dimension
// irrelevant, and cuBLAS still wants it >= the stored columns.
BlasOperand blasOperand(const MatrixOperand& x, int64_t rows, int64_t cols) {
  const int64_t storedRows = x.trans ? cols : rows, storedCols = x.trans ? rows : cols;
  const int64_t minLd = std::max<int64_t>(storedCols, 1);
  int64_t ld = x.ld;
  if (storedRows <= 1) ld = std::max(ld, minLd);
  WEFT_CHECK(ld >= minLd) << "gemm: leading dimension " << ld << " below " << minLd;
  return {static_cast<const char*>(x.data), x.trans ? CUBLAS_OP_T : CUBLAS_OP_N, ld};
}

int64_t outputLd(int64_t m, int64_t n, int64_t ldc) {
  const int64_t minLd = std::max<int64_t>(n, 1);
  if (m <= 1) return std::max(ldc, minLd);
  WEFT_CHECK(ldc >= minLd) << "gemm: output leading dimension " << ldc << " below " << minLd;
  return ldc;
}

// One batch dimension of a product: its size and the element strides of A,
// B and C along it.
struct BatchDim {
  int64_t size, a, b, c;
};

// `dims` (row-major order) without size-1 dimensions, and with each
// dimension that is a contiguous run of the next inner one for A, B and C
// merged into it; innermost first.
std::vector<BatchDim> mergeDims(const std::vector<BatchDim>& dims) {
  std::vector<BatchDim> merged;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    if (it->size == 1) continue;
    if (!merged.empty()) {
      BatchDim& in = merged.back();
      if (it->a == in.a * in.size && it->b == in.b * in.size && it->c == in.c * in.size) {
        in.size *= it->size;
        continue;
      }
    }
    merged.push_back(*it);
  }
  return merged;
}

// The products of `dims` (row-major order) into C of type cType, element
// size `es` for A and B, `cs` for C, none of them writing the same C. After
// merging, the largest dimension is one strided-batched call, repeated over
// the indices of the others.
void runProducts(const CublasTypes& t, size_t es, size_t cs, cudaDataType cType, const std::vector<BatchDim>& dims,
                 const BlasOperand& a, const BlasOperand& b, int64_t m, int64_t n, int64_t k, const Scalars& sc,
                 char* c, int64_t ldc) {
  std::vector<BatchDim> merged = mergeDims(dims);
  BatchDim inner{1, 0, 0, 0};
  if (!merged.empty()) {
    auto largest = std::max_element(merged.begin(), merged.end(),
                                    [](const BatchDim& x, const BatchDim& y) { return x.size < y.size; });
    inner = *largest;
    merged.erase(largest);
  }
  int64_t outer = 1;
  for (const BatchDim& d : merged) outer *= d.size;
  cublasHandle_t h = cublasHandle();
  std::vector<int64_t> index(merged.size(), 0);
  int64_t offA = 0, offB = 0, offC = 0;
  for (int64_t e = 0; e < outer; ++e) {
    const char* pa = a.data + offA * static_cast<int64_t>(es);
    const char* pb = b.data + offB * static_cast<int64_t>(es);
    char* pc = c + offC * static_cast<int64_t>(cs);
    if (inner.size == 1) {
      checkCublas(cublasGemmEx_64(h, b.op, a.op, n, m, k, sc.alpha(t), pb, t.data, b.ld, pa, t.data, a.ld, sc.beta(t),
                                  pc, cType, ldc, t.compute, CUBLAS_GEMM_DEFAULT),
                  "gemm: cublasGemmEx");
    } else {
      checkCublas(cublasGemmStridedBatchedEx_64(h, b.op, a.op, n, m, k, sc.alpha(t), pb, t.data, b.ld, inner.b, pa,
                                                t.data, a.ld, inner.a, sc.beta(t), pc, cType, ldc, inner.c,
                                                inner.size, t.compute, CUBLAS_GEMM_DEFAULT),
                  "gemm: cublasGemmStridedBatchedEx");
    }
    for (size_t d = 0; d < merged.size(); ++d) {  // odometer, merged[0] innermost
      offA += merged[d].a;
      offB += merged[d].b;
      offC += merged[d].c;
      if (++index[d] < merged[d].size) break;
      offA -= merged[d].a * merged[d].size;
      offB -= merged[d].b * merged[d].size;
      offC -= merged[d].c * merged[d].size;
      index[d] = 0;
    }
  }
}

// Device scratch memory from the caching allocator, returned when the scope
// ends (reuse on the same stream is ordered after the work enqueued on it).
class Workspace {
 public:
  Workspace(size_t nbytes, int device) : device_(device), p_(nbytes ? allocate(nbytes, device) : nullptr) {}
  ~Workspace() {
    if (p_) deallocate(p_, device_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return p_; }

 private:
  int device_;
  void* p_;
};

// C matrices of the non-repeated dimensions: their layout and count.
MatrixLayout layoutOf(const std::vector<BatchDim>& dims, int64_t& count) {
  MatrixLayout l;
  count = 1;
  for (const BatchDim& d : dims) {
    l.sizes[l.dims] = d.size;
    l.strides[l.dims] = d.c;
    ++l.dims;
    count *= d.size;
  }
  return l;
}

void accumulate(DType type, const void* p, int64_t steps, const std::vector<BatchDim>& outerDims, int64_t m,
                int64_t n, double alpha, double beta, void* c, int64_t ldc) {
  int64_t outer = 0;
  const MatrixLayout layout = layoutOf(outerDims, outer);
  WEFT_CUDA_DISPATCH_FLOATING_AND_HALF(type, "gemm", [&]<class T>() {
    using A = Acc<T>;
    launchAccumulate<T>(stream(), static_cast<const A*>(p), steps, outer, m, n, static_cast<A>(alpha),
                        static_cast<A>(beta), static_cast<T*>(c), ldc, layout);
  });
}

// Sum_j op(A_j) · op(B_j) over a repeated dimension r (A_j at A + j * r.a,
// B_j likewise) as the single product [op(A_0) .. op(A_J-1)] · [op(B_0); ..;
// op(B_J-1)] with k * J, when the strides make those a matrix each: the
// stored A_j (B_j) follow each other by k rows (columns). Sets fa and fb.
bool foldIntoK(const MatrixOperand& a, const MatrixOperand& b, int64_t m, int64_t n, int64_t k, const BatchDim& r,
               MatrixOperand& fa, MatrixOperand& fb) {
  const int64_t kk = k * r.size;
  // A stored [k, m] (transposed) stacks by rows; stored [m, k] side by side.
  const bool aFolds = a.trans ? r.a == k * a.ld && a.ld >= std::max<int64_t>(m, 1)
                              : r.a == k && (m <= 1 || a.ld >= kk);
  // B stored [k, n] stacks by rows; stored [n, k] (transposed) side by side.
  const bool bFolds = b.trans ? r.b == k && (n <= 1 || b.ld >= kk)
                              : r.b == k * b.ld && b.ld >= std::max<int64_t>(n, 1);
  if (!aFolds || !bFolds) return false;
  fa = a;
  fb = b;
  return true;
}

// The largest workspace for repeated C matrices; past it the products run
// in rounds, one per repeated index, without a workspace.
constexpr size_t kWorkspaceBytes = size_t{256} << 20;

}  // namespace

void gemm(DType type, MatrixOperand a, MatrixOperand b, int64_t m, int64_t n, int64_t k, double alpha, double beta,
          void* c, int64_t ldc) {
  const int64_t shape[1] = {1}, zero[1] = {0};
  cuda::gemmBatched(type, std::span<const int64_t>(shape, 0), a, std::span<const int64_t>(zero, 0), b,
              std::span<const int64_t>(zero, 0), m, n, k, alpha, beta, c, std::span<const int64_t>(zero, 0), ldc);
}

void gemmBatched(DType type, std::span<const int64_t> batchShape, MatrixOperand a,
                 std::span<const int64_t> aBatchStrides, MatrixOperand b, std::span<const int64_t> bBatchStrides,
                 int64_t m, int64_t n, int64_t k, double alpha, double beta, void* c,
                 std::span<const int64_t> cBatchStrides, int64_t ldc) {
  const CublasTypes t = cublasTypes(type);
  const size_t nd = batchShape.size();
  WEFT_CHECK(nd <= static_cast<size_t>(kMaxDims) && aBatchStrides.size() == nd && bBatchStrides.size() == nd &&
             cBatchStrides.size() == nd)
      << "gemmBatched: " << nd << " batch dimensions with " << aBatchStrides.size() << ", " << bBatchStrides.size()
      << " and " << cBatchStrides.size() << " strides";
  std::vector<BatchDim> outerDims, repeatedDims;  // C distinct along outerDims, repeated along repeatedDims
  int64_t steps = 1;
  for (size_t d = 0; d < nd; ++d) {
    if (batchShape[d] == 0) return;
    if (batchShape[d] == 1) continue;
    BatchDim bd{batchShape[d], aBatchStrides[d], bBatchStrides[d], cBatchStrides[d]};
    if (bd.c == 0) {
      repeatedDims.push_back(bd);
      steps *= bd.size;
    } else {
      outerDims.push_back(bd);
    }
  }
  if (m == 0 || n == 0) return;
  ldc = outputLd(m, n, ldc);
  if (k == 0) {
    if (beta != 1.0) accumulate(type, nullptr, steps, outerDims, m, n, alpha, beta, c, ldc);
    return;
  }
  const BlasOperand ba = blasOperand(a, m, k), bb = blasOperand(b, k, n);
  const size_t es = elementSize(type);
  if (repeatedDims.empty()) {
    runProducts(t, es, es, t.data, outerDims, ba, bb, m, n, k, Scalars(alpha, beta), static_cast<char*>(c), ldc);
    return;
  }
  // Repeated C matrices with beta = 1 (the gradient of a broadcast operand):
  // when the repeated A and B matrices lie side by side along k, their sum
  // of products is one product with k * steps.
  const std::vector<BatchDim> repeated = mergeDims(repeatedDims);
  if (beta == 1.0 && repeated.size() == 1) {
    MatrixOperand fa, fb;
    if (foldIntoK(a, b, m, n, k, repeated[0], fa, fb)) {
      const int64_t kk = k * repeated[0].size;
      runProducts(t, es, es, t.data, outerDims, blasOperand(fa, m, kk), blasOperand(fb, kk, n), m, n, kk,
                  Scalars(alpha, 1.0), static_cast<char*>(c), ldc);
      return;
    }
  }
  const size_t ps = t.acc == CUDA_R_64F ? sizeof(double) : sizeof(float);
  int64_t outer = 1;
  for (const BatchDim& d : outerDims) outer *= d.size;
  if (static_cast<double>(outer) * static_cast<double>(steps) * static_cast<double>(m * n) * static_cast<double>(ps) <=
      static_cast<double>(kWorkspaceBytes)) {
    // Every product into a workspace P [outer, steps, m, n] (float32,
    // float64 for Float64), then summed into C in order by one kernel.
    std::vector<BatchDim> all = outerDims;
    all.insert(all.end(), repeatedDims.begin(), repeatedDims.end());
    int64_t stride = m * n;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      it->c = stride;
      stride *= it->size;
    }
    Workspace p(static_cast<size_t>(stride) * ps, currentDevice());
    runProducts(t, es, ps, t.acc, all, ba, bb, m, n, k, Scalars(1.0, 0.0), static_cast<char*>(p.get()), n);
    accumulate(type, p.get(), steps, outerDims, m, n, alpha, beta, c, ldc);
    return;
  }
  // Too large for the workspace: one round of products per repeated index,
  // in order, each onto C with beta (the CPU's loop, rounding included).
  std::vector<int64_t> index(repeatedDims.size(), 0);
  int64_t offA = 0, offB = 0;
  for (int64_t s = 0; s < steps; ++s) {
    BlasOperand sa = ba, sb = bb;
    sa.data += offA * static_cast<int64_t>(es);
    sb.data += offB * static_cast<int64_t>(es);
    runProducts(t, es, es, t.data, outerDims, sa, sb, m, n, k, Scalars(alpha, beta), static_cast<char*>(c), ldc);
    for (size_t d = repeatedDims.size(); d-- > 0;) {  // odometer, last dimension fastest
      offA += repeatedDims[d].a;
      offB += repeatedDims[d].b;
      if (++index[d] < repeatedDims[d].size) break;
      offA -= repeatedDims[d].a * repeatedDims[d].size;
      offB -= repeatedDims[d].b * repeatedDims[d].size;
      index[d] = 0;
    }
  }
}

void fillRows(DType type, const void* row, int64_t rows, int64_t cols, void* c, int64_t ldc) {
  WEFT_CUDA_DISPATCH_ALL_AND_HALF(type, "fillRows", [&]<class T>() {
    if (rows <= 0 || cols <= 0) return;
    launchFillRows<T>(stream(), static_cast<const T*>(row), rows, cols, static_cast<T*>(c), ldc);
  });
}

}  // namespace weft::kernels::cuda
