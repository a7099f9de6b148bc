#include "nn/serialize.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

namespace weft::nn {

// Tensor bytes are written and read as they lie in memory.
static_assert(std::endian::native == std::endian::little, "the weft state file stores little-endian tensor data");

namespace {

// Smallest possible record: nameLen, a one-byte name, dtype, ndim, nbytes.
constexpr uint64_t kMinRecordBytes = 4 + 1 + 1 + 1 + 8;
constexpr uint64_t kHeaderBytes = sizeof(kStateFileMagic) + 4 + 8;

template <class UInt>
void appendLE(std::string& out, UInt v) {
  for (size_t i = 0; i < sizeof(UInt); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <class UInt>
UInt decodeLE(const unsigned char* p) {
  UInt v = 0;
  for (size_t i = 0; i < sizeof(UInt); ++i) v |= static_cast<UInt>(p[i]) << (8 * i);
  return v;
}

// A host-resident, contiguous tensor holding the same values as `t`.
Tensor hostContiguous(const Tensor& t) {
  Tensor h = t.device().isCpu() ? t : t.to(Device::cpu());
  return h.isContiguous() ? h : h.contiguous();
}

// The header of one record, without the data.
std::string recordHeader(const std::string& name, const Tensor& t) {
  WEFT_ENFORCE(t.defined(), InvalidArgumentError, "serializeStateDict: the tensor for key '", name, "' is undefined");
  WEFT_ENFORCE(!name.empty() && name.size() <= kMaxStateNameLength && name.find('\0') == std::string::npos,
               InvalidArgumentError, "serializeStateDict: key '", name, "' must be 1..", kMaxStateNameLength,
               " bytes without NUL");
  std::string out;
  appendLE<uint32_t>(out, static_cast<uint32_t>(name.size()));
  out += name;
  out.push_back(static_cast<char>(t.dtype()));
  out.push_back(static_cast<char>(t.dim()));
  for (int64_t d : t.shape()) appendLE<uint64_t>(out, static_cast<uint64_t>(d));
  appendLE<uint64_t>(out, static_cast<uint64_t>(t.nbytes()));
  return out;
}

std::string fileHeader(uint64_t count) {
  std::string out(kStateFileMagic, sizeof(kStateFileMagic));
  appendLE<uint32_t>(out, kStateFileVersion);
  appendLE<uint64_t>(out, count);
  return out;
}

// Sequential access to `size` bytes of a file image. Every read states what
// it reads, so a short input is reported by field.
class Reader {
 public:
  Reader(std::string source, uint64_t size) : source_(std::move(source)), remaining_(size) {}
  virtual ~Reader() = default;

  uint64_t remaining() const { return remaining_; }
  const std::string& source() const { return source_; }

  void read(void* dst, uint64_t n, const std::string& what) {
    WEFT_ENFORCE(n <= remaining_, InvalidArgumentError, "loadStateDict: '", source_, "' is truncated: ", what,
                 " needs ", n, " bytes but only ", remaining_, " remain");
    if (n) readRaw(dst, n, what);
    remaining_ -= n;
  }
  template <class UInt>
  UInt readLE(const std::string& what) {
    unsigned char buf[sizeof(UInt)];
    read(buf, sizeof(UInt), what);
    return decodeLE<UInt>(buf);
  }

 protected:
  virtual void readRaw(void* dst, uint64_t n, const std::string& what) = 0;

 private:
  std::string source_;
  uint64_t remaining_;
};

class MemoryReader final : public Reader {
 public:
  MemoryReader(std::string_view bytes, std::string source) : Reader(std::move(source), bytes.size()), bytes_(bytes) {}

 protected:
  void readRaw(void* dst, uint64_t n, const std::string&) override {
    std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

class FileReader final : public Reader {
 public:
  FileReader(std::ifstream& in, std::string source, uint64_t size) : Reader(std::move(source), size), in_(in) {}

 protected:
  void readRaw(void* dst, uint64_t n, const std::string& what) override {
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    WEFT_ENFORCE(in_.good() && static_cast<uint64_t>(in_.gcount()) == n, InvalidArgumentError, "loadStateDict: '",
                 source(), "': read error in ", what);
  }

 private:
  std::ifstream& in_;
};

StateDict readStateDict(Reader& r) {
  const std::string& src = r.source();
  char magic[sizeof(kStateFileMagic)];
  r.read(magic, sizeof(magic), "the magic");
  WEFT_ENFORCE(std::memcmp(magic, kStateFileMagic, sizeof(magic)) == 0, InvalidArgumentError, "loadStateDict: '", src,
               "' is not a weft state file (bad magic)");
  uint32_t version = r.readLE<uint32_t>("the version");
  WEFT_ENFORCE(version == kStateFileVersion, InvalidArgumentError, "loadStateDict: '", src, "' has format version ",
               version, "; this build reads version ", kStateFileVersion);
  uint64_t count = r.readLE<uint64_t>("the record count");
  WEFT_ENFORCE(count <= r.remaining() / kMinRecordBytes, InvalidArgumentError, "loadStateDict: '", src,
               "' claims ", count, " records but holds only ", r.remaining(), " more bytes");

  StateDict out;
  for (uint64_t i = 0; i < count; ++i) {
    std::string rec = detail::concat("record ", i);
    uint32_t nameLen = r.readLE<uint32_t>(rec + " name length");
    WEFT_ENFORCE(nameLen >= 1 && nameLen <= kMaxStateNameLength, InvalidArgumentError, "loadStateDict: '", src, "': ",
                 rec, " has a name length of ", nameLen, " (allowed 1..", kMaxStateNameLength, ")");
    std::string name(nameLen, '\0');
    r.read(name.data(), nameLen, rec + " name");
    WEFT_ENFORCE(name.find('\0') == std::string::npos, InvalidArgumentError, "loadStateDict: '", src, "': ", rec,
                 " has a name containing NUL");
    rec = detail::concat("record ", i, " ('", name, "')");
    WEFT_ENFORCE(!out.count(name), InvalidArgumentError, "loadStateDict: '", src, "': ", rec, " repeats a key");

    uint8_t dtypeCode = r.readLE<uint8_t>(rec + " dtype");
    WEFT_ENFORCE(dtypeCode <= static_cast<uint8_t>(kLastDType), InvalidArgumentError, "loadStateDict: '", src,
                 "': ", rec, " has unknown dtype code ", static_cast<int>(dtypeCode));
    DType dtype = static_cast<DType>(dtypeCode);
    uint8_t ndim = r.readLE<uint8_t>(rec + " rank");
    WEFT_ENFORCE(ndim <= kMaxDims, InvalidArgumentError, "loadStateDict: '", src, "': ", rec, " has ",
                 static_cast<int>(ndim), " dimensions (at most ", kMaxDims, ")");
    Shape shape(ndim);
    uint64_t expectBytes = elementSize(dtype);
    bool overflow = false;
    for (uint8_t d = 0; d < ndim; ++d) {
      uint64_t raw = r.readLE<uint64_t>(detail::concat(rec, " dimension ", static_cast<int>(d)));
      WEFT_ENFORCE(raw <= static_cast<uint64_t>(INT64_MAX), InvalidArgumentError, "loadStateDict: '", src, "': ",
                   rec, " has a negative size in dimension ", static_cast<int>(d));
      shape[d] = static_cast<int64_t>(raw);
      overflow = overflow || __builtin_mul_overflow(expectBytes, raw, &expectBytes);
    }
    if (std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end()) {
      expectBytes = 0;
      overflow = false;
    }
    WEFT_ENFORCE(!overflow, InvalidArgumentError, "loadStateDict: '", src, "': ", rec, " has shape ", shape,
                 " whose size overflows");
    uint64_t nbytes = r.readLE<uint64_t>(rec + " byte count");
    WEFT_ENFORCE(nbytes == expectBytes, InvalidArgumentError, "loadStateDict: '", src, "': ", rec, " declares ", nbytes,
                 " data bytes but shape ", shape, " of ", dtypeName(dtype), " needs ", expectBytes);
    WEFT_ENFORCE(nbytes <= r.remaining(), InvalidArgumentError, "loadStateDict: '", src, "' is truncated: ", rec,
                 " data needs ", nbytes, " bytes but only ", r.remaining(), " remain");
    Tensor t = empty(shape, {.dtype = dtype});
    r.read(t.rawData(), nbytes, rec + " data");
    if (dtype == DType::Bool) {
      const auto* p = static_cast<const uint8_t*>(t.rawData());
      const auto* bad = std::find_if(p, p + nbytes, [](uint8_t b) { return b > 1; });
      WEFT_ENFORCE(bad == p + nbytes, InvalidArgumentError, "loadStateDict: '", src, "': ", rec,
                   " is a bool tensor with byte ", static_cast<int>(*bad), " at element ", bad - p,
                   " (a bool is 0 or 1)");
    }
    out.emplace(std::move(name), std::move(t));
  }
  WEFT_ENFORCE(r.remaining() == 0, InvalidArgumentError, "loadStateDict: '", src, "' has ", r.remaining(),
               " unexpected bytes after its last record");
  return out;
}

[[noreturn]] void throwIoError(const char* op, const std::string& what, const std::string& path, int err) {
  std::string msg = detail::concat(op, ": cannot ", what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) throw NotFoundError(msg);
  throw Error(msg);
}

}  // namespace

std::string serializeStateDict(const StateDict& dict) {
  std::string out = fileHeader(dict.size());
  for (const auto& [name, t] : dict) {
    out += recordHeader(name, t);
    Tensor h = hostContiguous(t);
    out.append(static_cast<const char*>(h.rawData()), h.nbytes());
  }
  return out;
}

StateDict deserializeStateDict(std::string_view bytes, const std::string& source) {
  MemoryReader r(bytes, source);
  return readStateDict(r);
}

void saveStateDict(const StateDict& dict, const std::string& path) {
  // Headers are validated before the file is touched.
  std::vector<std::string> headers;
  for (const auto& [name, t] : dict) headers.push_back(recordHeader(name, t));

  std::string tmpl = path + ".tmp-XXXXXX";
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) throwIoError("saveStateDict", "create a temporary file next to", path, errno);
  std::unique_ptr<FILE, int (*)(FILE*)> f(::fdopen(fd, "wb"), &std::fclose);
  if (!f) {
    int err = errno;
    ::close(fd);
    ::unlink(tmpl.c_str());
    throwIoError("saveStateDict", "open", tmpl, err);
  }
  auto fail = [&](int err) {
    f.reset();
    ::unlink(tmpl.c_str());
    throwIoError("saveStateDict", "write", path, err);
  };
  auto put = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f.get()) != n) fail(errno);
  };
  std::string header = fileHeader(dict.size());
  put(header.data(), header.size());
  size_t i = 0;
  for (const auto& [name, t] : dict) {
    put(headers[i].data(), headers[i].size());
    ++i;
    Tensor h = hostContiguous(t);
    put(h.rawData(), h.nbytes());
  }
  if (std::fflush(f.get()) != 0 || ::fsync(fileno(f.get())) != 0) fail(errno);
  if (std::fclose(f.release()) != 0) {
    int err = errno;
    ::unlink(tmpl.c_str());
    throwIoError("saveStateDict", "write", path, err);
  }
  if (std::rename(tmpl.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmpl.c_str());
    throwIoError("saveStateDict", "rename the temporary file onto", path, err);
  }
}

StateDict loadStateDictFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throwIoError("loadStateDict", "open", path, errno);
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0 || !in) throwIoError("loadStateDict", "read", path, errno ? errno : EIO);
  FileReader r(in, path, static_cast<uint64_t>(size));
  return readStateDict(r);
}

}  // namespace weft::nn
