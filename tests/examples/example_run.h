// Running an example program the way a user does (through the shell, usually through weftrun) and
// reading what it left behind, for the examples' slow tests.
//
//   std::string out;
//   int rc = weft::testing::runShell(weftrun + " -n 2 " + program + " --seed 1 2>&1", out);
//   CHECK(rc == 0);
//   CHECK(weft::testing::countLines("metrics.csv") == 101);
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace weft::testing {

// Runs `cmd` through the shell and appends its stdout (and stderr when the command redirects it)
// to `out`. Returns its exit status, or 128 + the signal that killed it.
inline int runShell(const std::string& cmd, std::string& out) {
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[1024];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// The number of lines of the file at `path`; -1 when it cannot be opened.
inline int countLines(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return -1;
  int lines = 0;
  for (int c; (c = std::fgetc(f)) != EOF;) lines += c == '\n';
  std::fclose(f);
  return lines;
}

}  // namespace weft::testing
