// Reading what a test captured (a child process's output, a log, an error
// message): substring checks and the numbers and text that follow a label.
//
//   CHECK(weft::testing::contains(out, "rank 1 started"));
//   auto pids = weft::testing::numbersAfter(out, "pid ");      // "pid 4711 ... pid 4712" -> {4711, 4712}
//   std::string why = weft::testing::restOfLine(out, "error: ");
#pragma once

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace weft::testing {

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The text after the first `label` up to the end of its line; empty when label is absent.
inline std::string restOfLine(const std::string& text, const std::string& label) {
  size_t pos = text.find(label);
  if (pos == std::string::npos) return {};
  size_t start = pos + label.size();
  return text.substr(start, text.find('\n', start) - start);
}

// The number following each occurrence of `label`, in order ("pid 4711" -> 4711 for label
// "pid "); a fraction is cut at its point, an occurrence not followed by a digit is skipped.
inline std::vector<long long> numbersAfter(const std::string& text, const std::string& label) {
  std::vector<long long> out;
  for (size_t pos = text.find(label); pos != std::string::npos; pos = text.find(label, pos + 1)) {
    size_t start = pos + label.size();
    size_t end = start;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end > start) out.push_back(std::stoll(text.substr(start, end - start)));
  }
  return out;
}

// The number right after the first `label`; -1 when there is none.
inline long long numberAfter(const std::string& text, const std::string& label) {
  std::string rest = restOfLine(text, label);
  size_t end = 0;
  while (end < rest.size() && rest[end] >= '0' && rest[end] <= '9') ++end;
  return end == 0 ? -1 : std::stoll(rest.substr(0, end));
}

// How many times `what` occurs in `text` (overlapping occurrences count).
inline size_t countOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// The real number right after the first `label` (as atof reads it: 0 when no number follows);
// NaN when label is absent.
inline double realAfter(const std::string& text, const std::string& label) {
  size_t pos = text.find(label);
  return pos == std::string::npos ? std::nan("") : std::atof(text.c_str() + pos + label.size());
}

}  // namespace weft::testing
