// weft's exception types and the checks that raise them.
//
// Two kinds of failure, two macros:
//  - a bug in weft (an invariant broken): WEFT_CHECK(cond) << values; prints
//    file:line and the values, then aborts. WEFT_DCHECK(cond) << values is the
//    same check where it runs too often to pay for in an optimised build: it is
//    compiled in where NDEBUG is not defined (Debug) or WEFT_DEBUG_CHECKS is
//    (the sanitizer build, WEFT_SANITIZE=ON, defines it), and compiled out
//    otherwise (Release, RelWithDebInfo), cond and values unevaluated.
//  - bad input from a user or a peer: WEFT_ENFORCE(cond, ErrorType, parts...)
//    throws ErrorType with the parts concatenated; the message must name the
//    operation and the offending shapes / ids / values.
//
//   WEFT_ENFORCE(a.dim() == 2, InvalidArgumentError, "mm: expected a 2-D tensor, got shape ", a.shape());
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace weft {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Shapes, dtypes, devices or values that an operation cannot accept.
class InvalidArgumentError : public Error {
 public:
  using Error::Error;
};
// An index outside the valid range.
class IndexError : public Error {
 public:
  using Error::Error;
};
// Something named (a file, a function, a key) does not exist.
class NotFoundError : public Error {
 public:
  using Error::Error;
};
// An operation is not possible in the current state (e.g. a second backward
// through a freed graph).
class StateError : public Error {
 public:
  using Error::Error;
};

// A device (CUDA) runtime or library call failed: an out-of-memory, a failed
// kernel launch, a lost device. Names the op and the device, e.g.
// "matmul on cuda:0: cudaErrorMemoryAllocation: out of memory".
class DeviceError : public Error {
 public:
  using Error::Error;
};

// ---- failures of distributed operations (see common/status.h) -----------------

// A call failed on another worker: its handler threw, or the remote runtime
// failed while serving it. Names the worker and function where it happened;
// what() reads "remote error on worker 'w1' in 'add': std::runtime_error: boom".
class RemoteError : public Error {
 public:
  RemoteError(std::string worker, std::string function, std::string remoteMessage)
      : Error(describe(worker, function, remoteMessage)),
        worker_(std::move(worker)),
        function_(std::move(function)),
        remoteMessage_(std::move(remoteMessage)) {}
  const std::string& worker() const noexcept { return worker_; }
  const std::string& function() const noexcept { return function_; }
  // The message as raised on the remote worker, without the origin.
  const std::string& remoteMessage() const noexcept { return remoteMessage_; }

 private:
  static std::string describe(const std::string& worker, const std::string& function, const std::string& message) {
    std::string s = "remote error on worker '" + worker + "'";
    if (!function.empty()) s += " in '" + function + "'";
    return s + ": " + message;
  }
  std::string worker_;
  std::string function_;
  std::string remoteMessage_;
};
// An operation did not complete before its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};
// The connection to a peer dropped or its process died, so the operation
// cannot complete.
class DisconnectedError : public Error {
 public:
  using Error::Error;
};
// Bytes from a peer broke the wire protocol (malformed, truncated, oversized,
// wrong version or types that do not match the declaration).
class ProtocolError : public Error {
 public:
  using Error::Error;
};
// The operation was cancelled before it completed.
class CancelledError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <class T>
void appendPart(std::ostringstream& os, const T& v) {
  os << v;
}
template <class T>
void appendPart(std::ostringstream& os, const std::vector<T>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (appendPart(os, parts), ...);
  return os.str();
}

// Collects `<< values` after a failed WEFT_CHECK and aborts when destroyed.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond);
  [[noreturn]] ~CheckFailure();
  template <class T>
  CheckFailure& operator<<(const T& v) {
    appendPart(os_, v);
    return *this;
  }

 private:
  std::ostringstream os_;
};

}  // namespace detail
}  // namespace weft

#define WEFT_CHECK(cond) \
  if (cond) {            \
  } else                 \
    ::weft::detail::CheckFailure(__FILE__, __LINE__, #cond)

#if !defined(NDEBUG) || defined(WEFT_DEBUG_CHECKS)
#define WEFT_DCHECK(cond) WEFT_CHECK(cond)
#else
#define WEFT_DCHECK(cond) \
  if (true) {             \
  } else                  \
    ::weft::detail::CheckFailure(__FILE__, __LINE__, #cond)
#endif

#define WEFT_ENFORCE(cond, ErrorType, ...)                    \
  do {                                                        \
    if (!(cond)) throw ErrorType(::weft::detail::concat(__VA_ARGS__)); \
  } while (0)
