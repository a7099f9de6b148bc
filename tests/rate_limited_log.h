// Counting what weft's rate-limited log lines (common/logging.h) said, in captured stderr.
//
//   weft::testing::EveryLineLogged all;     // limiters built from here on hold nothing back
//   uint64_t n = weft::testing::heldBack(text, "rpc", "127.0.0.1");   // sum of "... and N more from 127.0.0.1"
#pragma once

#include <cstdint>
#include <string>

#include "common/logging.h"

namespace weft::testing {

// While alive, RateLimiters built without a Config let every line through (for tests that
// check one line per event); the previous defaults come back at its end.
class EveryLineLogged {
 public:
  EveryLineLogged() : saved_(logging::rateLimitDefaults()) {
    logging::RateLimitConfig all = saved_;
    all.burst = 1 << 30;
    logging::setRateLimitDefaults(all);
  }
  ~EveryLineLogged() { logging::setRateLimitDefaults(saved_); }
  EveryLineLogged(const EveryLineLogged&) = delete;
  EveryLineLogged& operator=(const EveryLineLogged&) = delete;

 private:
  logging::RateLimitConfig saved_;
};

// The lines of `text` that hold the summary "<prefix>: ... and N more from <key> in the last":
// the sum of their N (written with thousands separators).
inline uint64_t heldBack(const std::string& text, const std::string& prefix, const std::string& key) {
  const std::string head = prefix + ": ... and ";
  const std::string tail = " more from " + key + " in the last ";
  uint64_t total = 0;
  for (size_t pos = text.find(head); pos != std::string::npos; pos = text.find(head, pos + 1)) {
    size_t end = text.find(tail, pos);
    size_t eol = text.find('\n', pos);
    if (end == std::string::npos || (eol != std::string::npos && end > eol)) continue;
    uint64_t n = 0;
    for (size_t i = pos + head.size(); i < end; ++i) {
      if (text[i] >= '0' && text[i] <= '9') n = n * 10 + static_cast<uint64_t>(text[i] - '0');
    }
    total += n;
  }
  return total;
}

}  // namespace weft::testing
