// weft's own float32 GEMM for CPUs with AVX-512: the products of the linear
// layers and of the transformer run here instead of in OpenBLAS when the CPU
// has AVX-512F (kernels/cpu/gemm.cpp decides; WEFT_GEMM=blas turns it off).
//
//   // C[m, n] = alpha * op(A) · op(B) + beta * C, row-major, as cblas_sgemm:
//   if (ownSgemmAvailable()) ownSgemm(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
//
// Why: the products are most of a training step (79% of the wide GPT's), and
// which OpenBLAS kernel runs is the library's choice at load time, made by
// its CPU table or by OPENBLAS_CORETYPE: a Debian 12 OpenBLAS (0.3.21) on a
// CPU newer than its table, or under an environment that names an older core
// (machines set OPENBLAS_CORETYPE=Haswell for reproducibility), runs
// 256-bit AVX2 kernels on a CPU whose FMA units are 512 bits wide. This
// kernel always uses the CPU's widest vectors.
//
// The algorithm is the usual blocked one (Goto; BLIS's loop order):
//   for each chunk of at most kOuterCols (4096) columns of C:
//     for each block of kc <= 256 steps of the sum (k):
//       pack op(B)[block, chunk] into panels of 32 columns (one L1-sized
//       panel per inner step), zero-padded to whole panels;
//       for each chunk of at most kOuterRows (4096) rows:
//         pack op(A)[chunk, block] into strips of 12 rows, zero-padded;
//         C[tile] = alpha * strip · panel + (first block ? beta : 1) * C[tile]
//         for every 12 x 32 tile, in tasks of row blocks x column groups.
// Work is spread over the kernel threads (kernels/cpu/parallel.h): B's
// panels in one job, then the tiles in a second, each task of which packs
// its own strips of A first (so that one thread's reads of A overlap the
// other's arithmetic); a product with too few rows for that many tasks cuts
// the columns into groups too, and packs A beforehand in the first job. The
// micro-kernel holds a 12 x 32 tile of C in 24 of the 32 vector registers
// and adds one rank-1 update per step of k (two loads of B, twelve
// broadcasts of A folded into the FMAs). Packing transposes 16 x 16 blocks
// in registers where the stored operand runs the other way.
//
// Bits: every element of C is the same sequence of fused multiply-adds, in
// the order of k, with the k blocks fixed by k alone; the tasks, the threads
// and the position of an element in its tile do not change it. A product
// therefore gives the same bits on any thread count, and its rows (or
// columns) the same bits as the same rows computed in a smaller product
// with the same k.
//
// Memory: the packed operands of one chunk, held by the calling thread
// between calls (at most (kOuterRows + kOuterCols) * 256 floats, 8 MiB).
#pragma once

#include <cstdint>

namespace weft::kernels::cpu {

// The CPU has AVX-512F and the environment does not say WEFT_GEMM=blas
// (read once).
bool ownSgemmAvailable();

// C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C, with A stored
// [m, k] (or [k, m] when ta) and B stored [k, n] (or [n, k] when tb), all
// row-major with the given leading dimensions (>= the stored row length).
// beta == 0 never reads C. k >= 1, m, n >= 1. Runs on the kernel threads.
// Only call when ownSgemmAvailable().
void ownSgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace weft::kernels::cpu
