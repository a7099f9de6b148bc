#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tensor/generator.h"

int main(int argc, char** argv) {
  weft::manualSeed(1234);
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
