// Reader for IDX files, the format of MNIST and Fashion-MNIST
// (http://yann.lecun.com/exdb/mnist/): a big-endian header — two zero bytes,
// a type code, the number of dimensions, then each dimension as a uint32 —
// followed by the elements in row-major order, big-endian.
//
//   using namespace weft::data;
//   Tensor images = readIdxImages("train-images-idx3-ubyte.gz");  // [60000, 28, 28] float32 in [0, 1]
//   Tensor labels = readIdxLabels("train-labels-idx1-ubyte.gz");  // [60000] int64
//   IdxArray raw = readIdx("t10k-images-idx3-ubyte");              // header + raw bytes
//
// Files may be gzip-compressed or plain: zlib reads both transparently. Every
// check happens before the data is trusted: magic, type code, dimension
// count, and that the data length is exactly what the dimensions promise. A
// damaged file is an InvalidArgumentError naming the file and what is wrong;
// a missing one is a NotFoundError. Memory grows only with the bytes actually
// present, so a header claiming absurd sizes cannot trigger a huge allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace weft::data {

// Element types an IDX file may declare (the third header byte).
enum class IdxType : uint8_t {
  UInt8 = 0x08,
  Int8 = 0x09,
  Int16 = 0x0B,
  Int32 = 0x0C,
  Float32 = 0x0D,
  Float64 = 0x0E,
};

// Bytes per element of `t`.
size_t idxElementSize(IdxType t);
const char* idxTypeName(IdxType t);

// One IDX file as stored: its type, dimensions and the element bytes exactly
// as in the file (big-endian for multi-byte types).
struct IdxArray {
  IdxType type = IdxType::UInt8;
  Shape dims;
  std::vector<uint8_t> bytes;

  int64_t numel() const { return shapeNumel(dims); }
};

// Largest number of dimensions accepted (MNIST uses 1 and 3).
inline constexpr int kIdxMaxDims = 8;

// Reads and validates a whole IDX file (gzip or plain).
IdxArray readIdx(const std::string& path);
// Parses IDX content already in memory; `name` is used in error messages.
IdxArray parseIdx(const uint8_t* data, size_t size, const std::string& name);

// Converts the elements to a contiguous CPU tensor of `dtype` (Float32,
// Float64 or Int64) with shape `a.dims`, decoding big-endian values.
Tensor idxToTensor(const IdxArray& a, DType dtype);

// An image file ([N, rows, cols], uint8) as float32: scaled to [0, 1] when
// `scale` (pixel / 255), else the raw 0..255 values. Any other element type
// or dimension count is an InvalidArgumentError naming the file.
Tensor readIdxImages(const std::string& path, bool scale = true);
// A label file ([N], uint8) as int64.
Tensor readIdxLabels(const std::string& path);

}  // namespace weft::data
