// The Fashion-MNIST demo, run as a user runs it: two epochs must reach a test
// accuracy of at least 0.85.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "examples/example_run.h"

using weft::testing::countLines;
using weft::testing::runShell;

TEST_CASE("the Fashion-MNIST MLP demo reaches 85% test accuracy in two epochs") {
  std::string csv = "fashion_mnist_mlp_test.csv";
  std::string out;
  int rc = runShell(std::string(WEFT_FASHION_MNIST_MLP) + " --epochs 2 --csv " + csv, out);
  INFO(out);
  REQUIRE(rc == 0);
  auto pos = out.find("final test accuracy: ");
  REQUIRE(pos != std::string::npos);
  double acc = std::atof(out.c_str() + pos + 21);
  CHECK(acc >= 0.85);
  // One CSV row per iteration: 2 epochs of ceil(60000 / 64) batches.
  int lines = countLines(csv);
  REQUIRE(lines >= 0);
  std::remove(csv.c_str());
  CHECK(lines == 1 + 2 * 938);
}

TEST_CASE("the demo rejects an unknown flag with its usage") {
  std::string out;
  int rc = runShell(std::string(WEFT_FASHION_MNIST_MLP) + " --bogus 1 2>&1", out);
  CHECK(rc == 2);
  CHECK(out.find("unknown flag --bogus") != std::string::npos);
}

TEST_CASE("the demo names the Debian package when the data are missing") {
  std::string out;
  int rc = runShell(std::string(WEFT_FASHION_MNIST_MLP) + " --data-dir /nonexistent-weft-data --csv /dev/null 2>&1", out);
  CHECK(rc == 1);
  CHECK(out.find("dataset-fashion-mnist") != std::string::npos);
}
