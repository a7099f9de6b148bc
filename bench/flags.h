// The command-line grammar of every weft benchmark, and its one parser:
// `--switch` and `--option VALUE`, in any order. An unknown argument, an
// option without its value or a value that does not parse or is out of range
// is a FlagError naming the flag; a bench prints it with its usage and exits
// with status 2 (parseFlagsOrUsage, or twoProcessMain for the two-process
// benches).
//
//   bench::Flags flags;
//   flags.onSwitch("--quick", [&] { cfg.quick = true; });
//   flags.onValue("--iters", [&](const std::string& v) { cfg.iters = bench::intFlag("--iters", v, 1, 1000000); });
//   if (!bench::parseFlagsOrUsage(flags, argc, argv, "my_bench", kUsage)) return 2;
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

namespace weft::bench {

struct FlagError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class Flags {
 public:
  void onSwitch(const std::string& name, std::function<void()> set) { switches_[name] = std::move(set); }
  void onValue(const std::string& name, std::function<void(const std::string&)> set) {
    values_[name] = std::move(set);
  }

  // Reads argv[first..argc) in order, calling each flag's setter (which may throw FlagError).
  void parse(int argc, char** argv, int first = 1) const {
    for (int i = first; i < argc; ++i) {
      const std::string arg = argv[i];
      if (auto s = switches_.find(arg); s != switches_.end()) {
        s->second();
      } else if (auto v = values_.find(arg); v != values_.end()) {
        if (i + 1 >= argc) throw FlagError(arg + " needs a value");
        v->second(argv[++i]);
      } else {
        throw FlagError("unknown argument '" + arg + "'");
      }
    }
  }

 private:
  std::map<std::string, std::function<void()>> switches_;
  std::map<std::string, std::function<void(const std::string&)>> values_;
};

// `value` as an integer in [lo, hi]; FlagError naming `flag` otherwise.
inline long long intFlag(const std::string& flag, const std::string& value, long long lo, long long hi) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    throw FlagError(flag + ": '" + value + "' is not an integer");
  }
  if (used != value.size()) throw FlagError(flag + ": '" + value + "' is not an integer");
  if (v < lo || v > hi) {
    throw FlagError(flag + " takes " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + value);
  }
  return v;
}

// Parses; on a FlagError prints "name: error" and the usage to stderr and returns false.
inline bool parseFlagsOrUsage(const Flags& flags, int argc, char** argv, const char* name, const char* usage,
                              int first = 1) {
  try {
    flags.parse(argc, argv, first);
    return true;
  } catch (const FlagError& e) {
    std::fprintf(stderr, "%s: %s\n%s", name, e.what(), usage);
    return false;
  }
}

}  // namespace weft::bench
