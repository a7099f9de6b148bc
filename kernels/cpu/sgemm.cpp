#include "kernels/cpu/sgemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cpu/parallel.h"

namespace weft::kernels::cpu {
namespace {

constexpr int kMR = 12;            // rows of a micro-tile (a strip of packed A)
constexpr int kNR = 32;            // columns of a micro-tile (a panel of packed B): two vectors
constexpr int64_t kKC = 256;       // most steps of k per block: a panel is 32 KiB, in L1
constexpr int64_t kOuterRows = 4096;  // rows of A packed at once
constexpr int64_t kOuterCols = 4096;  // columns of B packed at once
constexpr int64_t kBlockStrips = 16;  // strips per task (192 rows: 192 KiB of packed A, in L2)
constexpr int64_t kPackGroup = 16;    // strips or panels packed per task
// Below this many multiply-adds a product runs on the calling thread alone.
constexpr double kParallelWork = 1 << 19;

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};

// The calling thread's packing buffers, grown on demand and kept.
struct PackBuffers {
  std::unique_ptr<float, AlignedFree> a, b;
  int64_t aSize = 0, bSize = 0;

  static float* reserve(std::unique_ptr<float, AlignedFree>& p, int64_t& size, int64_t want) {
    if (want > size) {
      p.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((want + 15) / 16 * 16) * sizeof(float))));
      if (!p) throw std::bad_alloc();
      size = want;
    }
    return p.get();
  }
};

thread_local PackBuffers tPack;

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")

inline __mmask16 lowMask(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}

// Transposes the 16 x 16 matrix in rows[0..16) in place: rows[j][i] becomes
// the old rows[i][j]. Three rounds of shuffles: pairs of floats, pairs of
// doubles, then 128-bit lanes (twice).
__attribute__((always_inline)) inline void transpose16(__m512 (&rows)[16]) {
  __m512 t[16], u[16], v[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
  }
  // u[4g + j]: column 4L + j of rows 4g..4g+3, in 128-bit lane L.
  for (int g = 0; g < 4; ++g) {
    const __m512d lo0 = _mm512_castps_pd(t[4 * g]), lo1 = _mm512_castps_pd(t[4 * g + 2]);
    const __m512d hi0 = _mm512_castps_pd(t[4 * g + 1]), hi1 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);
    v[4 + j] = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd);
    v[8 + j] = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
    v[12 + j] = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
  }
  for (int j = 0; j < 4; ++j) {
    rows[j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0x88);
    rows[8 + j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0xdd);
    rows[4 + j] = _mm512_shuffle_f32x4(v[4 + j], v[12 + j], 0x88);
    rows[12 + j] = _mm512_shuffle_f32x4(v[4 + j], v[12 + j], 0xdd);
  }
}

// Loads up to 16 stored rows (`count` valid, zeros after) of `len` <= 16
// elements from src (leading dimension ld), transposes them and stores
// column q (q < len) as `count`-or-more lanes at dst + q * dstStride, writing
// `lanes` lanes.
__attribute__((always_inline)) inline void transposeBlock(const float* src, int64_t ld, int64_t count, int64_t len,
                                                          float* dst, int64_t dstStride, int lanes) {
  __m512 rows[16];
  const __mmask16 m = lowMask(len);
  for (int r = 0; r < 16; ++r) rows[r] = r < count ? _mm512_maskz_loadu_ps(m, src + r * ld) : _mm512_setzero_ps();
  transpose16(rows);
  const __mmask16 out = lowMask(lanes);
  for (int q = 0; q < len; ++q) _mm512_mask_storeu_ps(dst + q * dstStride, out, rows[q]);
}

// Strip of kMR rows of op(A) (rows i0.., valid `rows`), steps p0..p0+kc:
// dst[p * kMR + r] = op(A)[i0 + r, p0 + p], zero for r >= rows.
void packStripA(bool ta, const float* a, int64_t lda, int64_t i0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  if (ta) {  // stored [k, m]: the strip's rows are contiguous in each stored row
    const __mmask16 m = lowMask(rows);
    const __mmask16 out = lowMask(kMR);
    const float* src = a + p0 * lda + i0;
    for (int64_t p = 0; p < kc; ++p) {
      _mm512_mask_storeu_ps(dst + p * kMR, out, _mm512_maskz_loadu_ps(m, src + p * lda));
    }
    return;
  }
  // Stored [m, k]: transposed 16 steps of k at a time.
  const float* src = a + i0 * lda + p0;
  for (int64_t p = 0; p < kc; p += 16) {
    transposeBlock(src + p, lda, rows, std::min<int64_t>(16, kc - p), dst + p * kMR, kMR, kMR);
  }
}

// Panel of kNR columns of op(B) (columns j0.., valid `cols`), steps p0..:
// dst[p * kNR + c] = op(B)[p0 + p, j0 + c], zero for c >= cols.
void packPanelB(bool tb, const float* b, int64_t ldb, int64_t j0, int64_t cols, int64_t p0, int64_t kc, float* dst) {
  if (!tb) {  // stored [k, n]: the panel's columns are contiguous
    const __mmask16 m0 = lowMask(cols), m1 = lowMask(std::max<int64_t>(cols - 16, 0));
    const float* src = b + p0 * ldb + j0;
    for (int64_t p = 0; p < kc; ++p) {
      _mm512_store_ps(dst + p * kNR, _mm512_maskz_loadu_ps(m0, src + p * ldb));
      _mm512_store_ps(dst + p * kNR + 16, _mm512_maskz_loadu_ps(m1, src + p * ldb + 16));
    }
    return;
  }
  // Stored [n, k]: transposed in two halves of 16 columns, 16 steps at a time.
  const float* src = b + j0 * ldb + p0;
  for (int64_t p = 0; p < kc; p += 16) {
    const int64_t len = std::min<int64_t>(16, kc - p);
    transposeBlock(src + p, ldb, std::min<int64_t>(cols, 16), len, dst + p * kNR, kNR, 16);
    transposeBlock(src + 16 * ldb + p, ldb, std::max<int64_t>(cols - 16, 0), len, dst + p * kNR + 16, kNR, 16);
  }
}

// C[tile] = alpha * strip · panel + beta * C[tile] (beta == 0: C not read),
// for the valid rows x cols of a kMR x kNR tile.
void microKernel(int64_t kc, const float* __restrict pa, const float* __restrict pb, float* __restrict c, int64_t ldc,
                 int rows, int cols, float alpha, float beta) {
  __m512 acc0[kMR], acc1[kMR];
#pragma GCC unroll 12
  for (int r = 0; r < kMR; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
#pragma GCC unroll 2
  for (int64_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_load_ps(pb), b1 = _mm512_load_ps(pb + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kMR; ++r) {
      const __m512 av = _mm512_set1_ps(pa[r]);
      acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
    }
    pa += kMR;
    pb += kNR;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (rows == kMR && cols == kNR) {
#pragma GCC unroll 12
    for (int r = 0; r < kMR; ++r) {
      float* row = c + r * ldc;
      __m512 v0 = _mm512_mul_ps(va, acc0[r]), v1 = _mm512_mul_ps(va, acc1[r]);
      if (beta != 0.0f) {
        v0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row), v0);
        v1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row + 16), v1);
      }
      _mm512_storeu_ps(row, v0);
      _mm512_storeu_ps(row + 16, v1);
    }
    return;
  }
  // An edge tile: the same operations, masked to the valid part.
  alignas(64) float tile[kMR][kNR];
#pragma GCC unroll 12
  for (int r = 0; r < kMR; ++r) {
    _mm512_store_ps(tile[r], acc0[r]);
    _mm512_store_ps(tile[r] + 16, acc1[r]);
  }
  const __mmask16 m0 = lowMask(cols), m1 = lowMask(std::max(cols - 16, 0));
  for (int r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    __m512 v0 = _mm512_mul_ps(va, _mm512_load_ps(tile[r])), v1 = _mm512_mul_ps(va, _mm512_load_ps(tile[r] + 16));
    if (beta != 0.0f) {
      v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), v0);
      v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), v1);
    }
    _mm512_mask_storeu_ps(row, m0, v0);
    _mm512_mask_storeu_ps(row + 16, m1, v1);
  }
}

struct Problem {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
};

void run(const Problem& pr) {
  const double work = static_cast<double>(pr.m) * static_cast<double>(pr.n) * static_cast<double>(pr.k);
  const int threads = work < kParallelWork ? 1 : threadsFor(1 << 20, numThreads());
  // k blocks: as even as the block limit allows, fixed by k alone.
  const int64_t kBlocks = ceilDiv(pr.k, kKC);
  const int64_t kcMax = ceilDiv(pr.k, kBlocks);
  const int64_t mcMax = std::min(pr.m, kOuterRows), ncMax = std::min(pr.n, kOuterCols);
  float* packA = PackBuffers::reserve(tPack.a, tPack.aSize, ceilDiv(mcMax, kMR) * kMR * kcMax);
  float* packB = PackBuffers::reserve(tPack.b, tPack.bSize, ceilDiv(ncMax, kNR) * kNR * kcMax);

  for (int64_t j0 = 0; j0 < pr.n; j0 += kOuterCols) {
    const int64_t nc = std::min(kOuterCols, pr.n - j0);
    const int64_t panels = ceilDiv(nc, kNR);
    for (int64_t kb = 0; kb < kBlocks; ++kb) {
      const int64_t p0 = kb * kcMax, kc = std::min(kcMax, pr.k - p0);
      const float beta = kb == 0 ? pr.beta : 1.0f;
      for (int64_t i0 = 0; i0 < pr.m; i0 += kOuterRows) {
        const int64_t mc = std::min(kOuterRows, pr.m - i0);
        const int64_t strips = ceilDiv(mc, kMR);
        // Tiles: row blocks of at most kBlockStrips strips (as even as the
        // strips allow, a multiple of the threads in number) x column groups,
        // enough tasks for the threads to share evenly.
        const int64_t rowBlocks = ceilDiv(ceilDiv(strips, kBlockStrips), threads) * threads;
        const int64_t colGroups =
            threads == 1 ? 1 : std::min(panels, std::max<int64_t>(1, ceilDiv(4 * threads, rowBlocks)));
        const int64_t groupPanels = ceilDiv(panels, colGroups);
        const int64_t groups = ceilDiv(panels, groupPanels);
        // With one column group a task packs its own strips of A just before
        // it uses them (one thread's reads of A overlap the other's
        // arithmetic); with several, A is packed once, beforehand.
        const bool packAInTask = groups == 1;
        auto packStrips = [&](int64_t sBegin, int64_t sEnd) {
          for (int64_t s = sBegin; s < sEnd; ++s) {
            const int64_t r0 = s * kMR;
            packStripA(pr.ta, pr.a, pr.lda, i0 + r0, std::min<int64_t>(kMR, mc - r0), p0, kc, packA + s * kMR * kc);
          }
        };
        // B's panels (once per k block) and, unless the tasks do it, A's
        // strips, in one job.
        const int64_t aTasks = packAInTask ? 0 : ceilDiv(strips, kPackGroup);
        const int64_t bTasks = i0 == 0 ? ceilDiv(panels, kPackGroup) : 0;
        if (aTasks + bTasks > 0) {
          parallelRun(aTasks + bTasks, threads, [&](int64_t task, int) {
            if (task < aTasks) {
              packStrips(task * kPackGroup, std::min(strips, (task + 1) * kPackGroup));
              return;
            }
            const int64_t t = task - aTasks;
            for (int64_t q = t * kPackGroup, e = std::min(panels, q + kPackGroup); q < e; ++q) {
              const int64_t c0 = q * kNR;
              packPanelB(pr.tb, pr.b, pr.ldb, j0 + c0, std::min<int64_t>(kNR, nc - c0), p0, kc, packB + q * kNR * kc);
            }
          });
        }
        parallelRun(rowBlocks * groups, threads, [&](int64_t task, int) {
          const int64_t rb = task / groups, g = task % groups;
          const int64_t sBegin = rb * strips / rowBlocks, sEnd = (rb + 1) * strips / rowBlocks;
          const int64_t qBegin = g * groupPanels, qEnd = std::min(panels, qBegin + groupPanels);
          if (packAInTask) packStrips(sBegin, sEnd);
          for (int64_t q = qBegin; q < qEnd; ++q) {
            const int64_t c0 = q * kNR;
            const int cols = static_cast<int>(std::min<int64_t>(kNR, nc - c0));
            const float* pb = packB + q * kNR * kc;
            for (int64_t s = sBegin; s < sEnd; ++s) {
              const int64_t r0 = s * kMR;
              const int rows = static_cast<int>(std::min<int64_t>(kMR, mc - r0));
              microKernel(kc, packA + s * kMR * kc, pb, pr.c + (i0 + r0) * pr.ldc + j0 + c0, pr.ldc, rows, cols,
                          pr.alpha, beta);
            }
          }
        });
      }
    }
  }
}

#pragma GCC pop_options

bool readAvailable() {
  const char* choice = std::getenv("WEFT_GEMM");
  if (choice != nullptr && std::strcmp(choice, "blas") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
}

}  // namespace

bool ownSgemmAvailable() {
  static const bool available = readAvailable();
  return available;
}

void ownSgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  run(Problem{ta, tb, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc});
}

}  // namespace weft::kernels::cpu
