#include "bench/flags.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

using weft::bench::FlagError;
using weft::bench::Flags;

// argv for `args` (argv[0] is the program's name).
struct Argv {
  explicit Argv(std::vector<std::string> args) : strings(std::move(args)) {
    strings.insert(strings.begin(), "bench");
    for (auto& s : strings) pointers.push_back(s.data());
  }
  int argc() const { return static_cast<int>(pointers.size()); }
  char** argv() { return pointers.data(); }
  std::vector<std::string> strings;
  std::vector<char*> pointers;
};

std::string errorOf(const Flags& flags, std::vector<std::string> args, int first = 1) {
  Argv a(std::move(args));
  try {
    flags.parse(a.argc(), a.argv(), first);
  } catch (const FlagError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("bench flags: switches and options are read in any order") {
  bool quick = false;
  long long iters = 0;
  std::string sizes;
  Flags flags;
  flags.onSwitch("--quick", [&] { quick = true; });
  flags.onValue("--iters", [&](const std::string& v) { iters = weft::bench::intFlag("--iters", v, 1, 100); });
  flags.onValue("--sizes", [&](const std::string& v) { sizes = v; });
  Argv a({"--sizes", "8,64K", "--quick", "--iters", "42"});
  flags.parse(a.argc(), a.argv());
  CHECK(quick);
  CHECK(iters == 42);
  CHECK(sizes == "8,64K");
}

TEST_CASE("bench flags: arguments before `first` are not read") {
  long long world = 0;
  Flags flags;
  flags.onValue("--world", [&](const std::string& v) { world = weft::bench::intFlag("--world", v, 2, 16); });
  Argv a({"--rank", "1", "29500", "--world", "3"});
  flags.parse(a.argc(), a.argv(), 4);
  CHECK(world == 3);
}

TEST_CASE("bench flags: an unknown argument, a missing value and a bad value name the flag") {
  Flags flags;
  flags.onSwitch("--quick", [] {});
  flags.onValue("--iters", [](const std::string& v) { weft::bench::intFlag("--iters", v, 1, 100); });
  CHECK(errorOf(flags, {"--fast"}) == "unknown argument '--fast'");
  CHECK(errorOf(flags, {"--quick", "--iters"}) == "--iters needs a value");
  CHECK(errorOf(flags, {"--iters", "12x"}) == "--iters: '12x' is not an integer");
  CHECK(errorOf(flags, {"--iters", "many"}) == "--iters: 'many' is not an integer");
  CHECK(errorOf(flags, {"--iters", "0"}) == "--iters takes 1 to 100, got 0");
  CHECK(errorOf(flags, {"--iters", "101"}) == "--iters takes 1 to 100, got 101");
  CHECK(errorOf(flags, {"--quick", "--iters", "100"}).empty());
}
