#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "common/error.h"
#include "kernels/cpu/loops.h"

namespace weft::data {
namespace {

constexpr size_t kPrefixBytes = 4;
// Bytes decompressed per gzread call: large enough to stream at zlib's speed,
// small enough that a lying header costs at most this much beyond the data.
constexpr size_t kReadChunk = size_t{8} << 20;

struct Header {
  IdxType type;
  Shape dims;
  size_t headerBytes;
  size_t dataBytes;
};

bool knownType(uint8_t code) {
  switch (code) {
    case 0x08: case 0x09: case 0x0B: case 0x0C: case 0x0D: case 0x0E: return true;
    default: return false;
  }
}

std::string hexByte(uint8_t b) {
  const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

std::string dimsString(const Shape& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s.push_back('x');
    s.append(std::to_string(dims[i]));
  }
  return s;
}

// Validates the 4-byte prefix (two zero bytes, type code, dimension count)
// and returns the dimension count.
int checkPrefix(const uint8_t* p, const std::string& name) {
  WEFT_ENFORCE(p[0] == 0 && p[1] == 0, InvalidArgumentError, "IDX file ", name,
               ": bad magic (the first two bytes must be zero, found ", int(p[0]), " and ", int(p[1]),
               "); not an IDX file, or a gzip file that is damaged");
  WEFT_ENFORCE(knownType(p[2]), InvalidArgumentError, "IDX file ", name, ": unknown element type code ",
               hexByte(p[2]),
               " (expected 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32 or 0x0E float64)");
  WEFT_ENFORCE(p[3] >= 1 && p[3] <= kIdxMaxDims, InvalidArgumentError, "IDX file ", name, ": ", int(p[3]),
               " dimensions declared; expected 1 to ", kIdxMaxDims);
  return p[3];
}

// Decodes the dimension list that follows the prefix and computes the data
// size it promises, refusing sizes that overflow.
Header decodeDims(const uint8_t* prefix, const uint8_t* dimBytes, const std::string& name) {
  Header h{static_cast<IdxType>(prefix[2]), {}, kPrefixBytes + 4 * size_t{prefix[3]}, 0};
  size_t bytes = idxElementSize(h.type);
  for (int d = 0; d < prefix[3]; ++d) {
    const uint8_t* q = dimBytes + 4 * d;
    const uint32_t v = (uint32_t{q[0]} << 24) | (uint32_t{q[1]} << 16) | (uint32_t{q[2]} << 8) | q[3];
    h.dims.push_back(static_cast<int64_t>(v));
    WEFT_ENFORCE(!__builtin_mul_overflow(bytes, size_t{v}, &bytes) && bytes <= (size_t{1} << 48),
                 InvalidArgumentError, "IDX file ", name, ": dimensions ", dimsString(h.dims),
                 "... describe more data than any file can hold");
  }
  h.dataBytes = bytes;
  return h;
}

std::string sizeDescription(const Header& h) {
  return dimsString(h.dims) + " " + idxTypeName(h.type) + " = " + std::to_string(h.dataBytes) + " data bytes";
}

// Closes a gzFile on scope exit.
struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

std::string gzMessage(gzFile f) {
  int code = 0;
  const char* msg = gzerror(f, &code);
  return msg && *msg ? msg : "unknown zlib error";
}

// Reads up to n bytes; returns how many were read (fewer only at the end of
// the stream). A zlib error (corrupt or truncated gzip) is an
// InvalidArgumentError naming the file.
size_t readFully(gzFile f, uint8_t* dst, size_t n, const std::string& name) {
  size_t got = 0;
  while (got < n) {
    const unsigned want = static_cast<unsigned>(std::min(n - got, kReadChunk));
    const int r = gzread(f, dst + got, want);
    if (r < 0) {
      throw InvalidArgumentError(detail::concat("IDX file ", name, ": gzip data is corrupt (zlib: ", gzMessage(f), ")"));
    }
    if (r == 0) {
      int code = Z_OK;
      gzerror(f, &code);
      WEFT_ENFORCE(code == Z_OK, InvalidArgumentError, "IDX file ", name,
                   ": gzip stream ends early or is corrupt (zlib: ", gzMessage(f), ")");
      break;
    }
    got += static_cast<size_t>(r);
  }
  return got;
}

template <class T>
T loadBigEndian(const uint8_t* p) {
  uint8_t tmp[sizeof(T)];
  for (size_t k = 0; k < sizeof(T); ++k) tmp[k] = p[sizeof(T) - 1 - k];
  T v;
  std::memcpy(&v, tmp, sizeof(T));
  return v;
}

// Decodes element i of an IDX array of type `type` as a value of type Out.
template <class Out>
void decodeRange(IdxType type, const uint8_t* src, Out* dst, int64_t begin, int64_t end) {
  switch (type) {
    case IdxType::UInt8:
      for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<Out>(src[i]);
      break;
    case IdxType::Int8:
      for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<Out>(static_cast<int8_t>(src[i]));
      break;
    case IdxType::Int16:
      for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<Out>(loadBigEndian<int16_t>(src + 2 * i));
      break;
    case IdxType::Int32:
      for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<Out>(loadBigEndian<int32_t>(src + 4 * i));
      break;
    case IdxType::Float32:
      for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<Out>(loadBigEndian<float>(src + 4 * i));
      break;
    case IdxType::Float64:
      for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<Out>(loadBigEndian<double>(src + 8 * i));
      break;
  }
}

bool isIntegerType(IdxType t) { return t != IdxType::Float32 && t != IdxType::Float64; }

}  // namespace

size_t idxElementSize(IdxType t) {
  switch (t) {
    case IdxType::UInt8:
    case IdxType::Int8: return 1;
    case IdxType::Int16: return 2;
    case IdxType::Int32:
    case IdxType::Float32: return 4;
    case IdxType::Float64: return 8;
  }
  return 0;
}

const char* idxTypeName(IdxType t) {
  switch (t) {
    case IdxType::UInt8: return "uint8";
    case IdxType::Int8: return "int8";
    case IdxType::Int16: return "int16";
    case IdxType::Int32: return "int32";
    case IdxType::Float32: return "float32";
    case IdxType::Float64: return "float64";
  }
  return "unknown";
}

IdxArray parseIdx(const uint8_t* data, size_t size, const std::string& name) {
  WEFT_ENFORCE(size >= kPrefixBytes, InvalidArgumentError, "IDX file ", name, ": truncated: ", size,
               " bytes, shorter than the 4-byte header");
  const int ndims = checkPrefix(data, name);
  WEFT_ENFORCE(size >= kPrefixBytes + 4 * size_t(ndims), InvalidArgumentError, "IDX file ", name,
               ": truncated inside the header: ", ndims, " dimensions need ", kPrefixBytes + 4 * ndims,
               " header bytes, the file holds ", size);
  Header h = decodeDims(data, data + kPrefixBytes, name);
  const size_t present = size - h.headerBytes;
  WEFT_ENFORCE(present >= h.dataBytes, InvalidArgumentError, "IDX file ", name, ": truncated: the header promises ",
               sizeDescription(h), ", the file holds ", present);
  WEFT_ENFORCE(present == h.dataBytes, InvalidArgumentError, "IDX file ", name, ": ", present - h.dataBytes,
               " unexpected bytes after the ", sizeDescription(h), " the header promises");
  IdxArray a;
  a.type = h.type;
  a.dims = std::move(h.dims);
  a.bytes.assign(data + h.headerBytes, data + size);
  return a;
}

IdxArray readIdx(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  WEFT_ENFORCE(fs::exists(st), NotFoundError, "IDX file ", path, ": no such file");
  WEFT_ENFORCE(fs::is_regular_file(st), InvalidArgumentError, "IDX file ", path, ": not a regular file");

  GzHandle f(gzopen(path.c_str(), "rb"));
  WEFT_ENFORCE(f != nullptr, InvalidArgumentError, "IDX file ", path, ": cannot open: ", std::strerror(errno));
  gzbuffer(f.get(), 1u << 17);

  uint8_t head[kPrefixBytes + 4 * kIdxMaxDims];
  size_t got = readFully(f.get(), head, kPrefixBytes, path);
  WEFT_ENFORCE(got == kPrefixBytes, InvalidArgumentError, "IDX file ", path, ": truncated: ", got,
               " bytes, shorter than the 4-byte header");
  const int ndims = checkPrefix(head, path);
  got = readFully(f.get(), head + kPrefixBytes, 4 * size_t(ndims), path);
  WEFT_ENFORCE(got == 4 * size_t(ndims), InvalidArgumentError, "IDX file ", path, ": truncated inside the header: ",
               ndims, " dimensions need ", kPrefixBytes + 4 * ndims, " header bytes, the file holds ",
               kPrefixBytes + got);
  Header h = decodeDims(head, head + kPrefixBytes, path);

  IdxArray a;
  a.type = h.type;
  a.dims = h.dims;
  // Grow with the data actually present, never trusting the header's size
  // for the allocation.
  size_t have = 0;
  while (have < h.dataBytes) {
    const size_t next = std::min(h.dataBytes, have + kReadChunk);
    a.bytes.resize(next);
    const size_t r = readFully(f.get(), a.bytes.data() + have, next - have, path);
    have += r;
    WEFT_ENFORCE(have == next, InvalidArgumentError, "IDX file ", path, ": truncated: the header promises ",
                 sizeDescription(h), ", the file holds ", have);
  }
  uint8_t extra[64];
  const size_t trailing = readFully(f.get(), extra, sizeof(extra), path);
  WEFT_ENFORCE(trailing == 0, InvalidArgumentError, "IDX file ", path,
               ": unexpected bytes after the ", sizeDescription(h), " the header promises");
  return a;
}

Tensor idxToTensor(const IdxArray& a, DType dtype) {
  const int64_t n = a.numel();
  WEFT_ENFORCE(a.bytes.size() == static_cast<size_t>(n) * idxElementSize(a.type), InvalidArgumentError,
               "idxToTensor: ", a.bytes.size(), " bytes do not hold ", dimsString(a.dims), " ", idxTypeName(a.type));
  WEFT_ENFORCE(dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Int64, InvalidArgumentError,
               "idxToTensor: unsupported target dtype ", dtypeName(dtype), " (float32, float64 or int64)");
  WEFT_ENFORCE(dtype != DType::Int64 || isIntegerType(a.type), InvalidArgumentError,
               "idxToTensor: cannot convert ", idxTypeName(a.type), " elements to int64 without rounding");
  Tensor out = empty(a.dims, {.dtype = dtype});
  const uint8_t* src = a.bytes.data();
  auto run = [&]<class T>(T* dst) {
    kernels::cpu::parallelFor(n, kernels::cpu::kParallelGrain,
                              [&](int64_t b, int64_t e) { decodeRange<T>(a.type, src, dst, b, e); });
  };
  switch (dtype) {
    case DType::Float32: run(out.data<float>()); break;
    case DType::Float64: run(out.data<double>()); break;
    default: run(out.data<int64_t>()); break;
  }
  return out;
}

Tensor readIdxImages(const std::string& path, bool scale) {
  IdxArray a = readIdx(path);
  WEFT_ENFORCE(a.type == IdxType::UInt8 && a.dims.size() == 3, InvalidArgumentError, "IDX image file ", path,
               ": expected [N, rows, cols] uint8, found ", dimsString(a.dims), " ", idxTypeName(a.type));
  Tensor out = empty(a.dims, {.dtype = DType::Float32});
  const uint8_t* src = a.bytes.data();
  float* dst = out.data<float>();
  // Division, not multiplication by 1/255, so values equal torchvision's
  // ToTensor (`byte_tensor.float().div(255)`) bit for bit.
  const float divisor = scale ? 255.0f : 1.0f;
  kernels::cpu::parallelFor(a.numel(), kernels::cpu::kParallelGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = static_cast<float>(src[i]) / divisor;
  });
  return out;
}

Tensor readIdxLabels(const std::string& path) {
  IdxArray a = readIdx(path);
  WEFT_ENFORCE(a.type == IdxType::UInt8 && a.dims.size() == 1, InvalidArgumentError, "IDX label file ", path,
               ": expected [N] uint8, found ", dimsString(a.dims), " ", idxTypeName(a.type));
  return idxToTensor(a, DType::Int64);
}

}  // namespace weft::data
