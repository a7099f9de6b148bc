// weftrun: starts a group of weft processes on this machine. See README.md in
// this folder and `weftrun --help`.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "tools/weftrun/launcher.h"
#include "tools/weftrun/options.h"

int main(int argc, char** argv) {
  using namespace weft::weftrun;
  Options options;
  try {
    options = parseOptions(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "weftrun: %s\nusage: weftrun -n N [options] [--] program [args...]\n"
                 "Run 'weftrun --help' for the options.\n", e.what());
    return 2;
  }
  if (options.help) {
    std::fputs(usageText().c_str(), stdout);
    return 0;
  }
  try {
    return launch(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
