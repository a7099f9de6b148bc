// weft's exception types and the checks that raise them.
//
// Two kinds of failure, two macros:
//  - a bug in weft (an invariant broken): WEFT_CHECK(cond) << values; prints
//    file:line and the values, then aborts.
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

#define WEFT_ENFORCE(cond, ErrorType, ...)                    \
  do {                                                        \
    if (!(cond)) throw ErrorType(::weft::detail::concat(__VA_ARGS__)); \
  } while (0)
