#include "common/error.h"

#include <cstdio>
#include <cstdlib>

namespace weft::detail {

CheckFailure::CheckFailure(const char* file, int line, const char* cond) {
  os_ << file << ':' << line << ": check failed: " << cond << ' ';
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", os_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace weft::detail
