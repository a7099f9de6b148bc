// What the example programs share around their training code: reading "--flag value" command
// lines, the usage message, and printing progress lines.
//
//   [[noreturn]] void usage(const std::string& err) {
//     examples::app::exitWithUsage(kProgram, err, "weftrun -n 2", "[--epochs N] [--metrics PATH]\n");
//   }
//   app::FlagReader flags(argc, argv, usage);
//   while (flags.next()) {
//     const std::string& a = flags.flag();
//     const std::string& v = flags.value();
//     if (a == "--epochs") f.epochs = flags.integer();
//     else if (a == "--metrics") f.metrics = v;
//     else flags.unknown();
//   }
//
// Header-only; it needs nothing of weft.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace weft::examples::app {

// Prints "<program>: <err>" and the usage "usage: <launcher> <program> <synopsis>" to stderr, and
// exits with status 2 (a bad command line). `launcher` is empty for a program run alone;
// `synopsis` ends with its own newline and may span several lines.
[[noreturn]] inline void exitWithUsage(const char* program, const std::string& err, const char* launcher,
                                       const char* synopsis) {
  std::fprintf(stderr, "%s: %s\nusage: %s%s%s %s", program, err.c_str(), launcher, *launcher ? " " : "", program,
               synopsis);
  std::exit(2);
}

// Walks a command line of "--flag value" pairs. `usage` reports a bad command line and must not
// return (exitWithUsage); every error below goes through it:
//   "--help" or "-h"           -> usage("help")
//   a flag without its value   -> usage("missing value for F")
//   a value that is no number  -> usage("invalid value 'V' for F")
class FlagReader {
 public:
  using Usage = void (*)(const std::string& err);

  FlagReader(int argc, char** argv, Usage usage) : argc_(argc), argv_(argv), usage_(usage) {}

  // Moves to the next flag; false past the last one. The flag's value is not read yet, so that a
  // flag that takes none (a switch) can be handled before value().
  bool next() {
    if (next_ >= argc_) return false;
    flag_ = argv_[next_++];
    if (flag_ == "--help" || flag_ == "-h") fail("help");
    return true;
  }

  const std::string& flag() const { return flag_; }

  // Reads the word after the current flag (call it once per flag, before anything else reads it).
  const std::string& value() {
    if (next_ >= argc_) fail("missing value for " + flag_);
    value_ = argv_[next_++];
    return value_;
  }

  // The value read by value(), as a whole number in base 10.
  int64_t integer() const {
    char* end = nullptr;
    long long x = std::strtoll(value_.c_str(), &end, 10);
    if (end == value_.c_str() || *end) invalid();
    return static_cast<int64_t>(x);
  }

  // The value read by value(), as a real number; with `finiteOnly`, inf and nan are invalid too.
  double real(bool finiteOnly = false) const {
    char* end = nullptr;
    double x = std::strtod(value_.c_str(), &end);
    if (end == value_.c_str() || *end || (finiteOnly && !std::isfinite(x))) invalid();
    return x;
  }

  [[noreturn]] void unknown() const { fail("unknown flag " + flag_); }

  [[noreturn]] void fail(const std::string& err) const {
    usage_(err);
    std::exit(2);  // `usage` exits itself; this only keeps the contract if it does not
  }

 private:
  [[noreturn]] void invalid() const { fail("invalid value '" + value_ + "' for " + flag_); }

  int argc_;
  char** argv_;
  Usage usage_;
  int next_ = 1;
  std::string flag_;
  std::string value_;
};

// printf to stdout, flushed at once, so that the lines of several processes under weftrun
// interleave whole and in order.
inline void say(const char* format, auto... args) {
  std::printf(format, args...);
  std::fflush(stdout);
}

}  // namespace weft::examples::app
