// Elementwise kernels on a CUDA device: kernels/cpu/elementwise.h's functions
// with the same signatures and semantics (integer results wrap, integer
// division by zero is an InvalidArgumentError, the 16-bit types compute in
// float32 and round once), for device pointers, on the current stream.
// Built from the generic loops of kernels/cuda/loops.cuh.
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"
#include "kernels/cpu/elementwise.h"

namespace weft::kernels::cuda {

using cpu::BinaryOp;
using cpu::CompareOp;
using cpu::UnaryOp;

void binary(BinaryOp op, DType type, const void* a, std::span<const int64_t> aStrides, const void* b,
            std::span<const int64_t> bStrides, void* out, std::span<const int64_t> shape);
void unary(UnaryOp op, DType type, const void* in, void* out, int64_t n, double p0 = 0, double p1 = 0);
void axpy(DType type, double alpha, const void* b, void* a, int64_t n);
// As the CPU's: scales and reports whether any element was inf or NaN
// (reads one flag back, so it waits for the stream).
bool scaleAndCheckFinite(DType type, void* x, int64_t n, double scale);
// The same without waiting: ORs 1 into the device int *flag when any element
// was inf or NaN (a loss scaler checks many tensors, then reads one flag).
void scaleAndFlagNonFinite(DType type, void* x, int64_t n, double scale, int* flag);
void unaryBackward(UnaryOp op, DType type, const void* x, const void* y, const void* g, void* gx, int64_t n,
                   double p0 = 0, double p1 = 0);
void compare(CompareOp op, DType type, const void* a, std::span<const int64_t> aStrides, const void* b,
             std::span<const int64_t> bStrides, bool* out, std::span<const int64_t> shape);

}  // namespace weft::kernels::cuda
