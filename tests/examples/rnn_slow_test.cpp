// The distributed RNN example (examples/rnn), run as a user runs it, through weftrun: the default
// run learns the periodic sequence (the loss falls below half of ln(ntoken)), distributed autograd's
// gradients equal those of a local replay, the upstream sizes run, a run is reproducible from its
// seed, both ranks shut down cleanly, and bad configurations fail at start.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "examples/rnn/task.h"
#include "examples/example_run.h"
#include "captured_text.h"

using weft::testing::runShell;
using weft::testing::countLines;
using weft::testing::countOf;
using weft::testing::realAfter;

TEST_CASE("PeriodicTask continues every stream across batches and follows its cycle without noise") {
  weft::examples::rnn::PeriodicTask task(5, 3, 0.0, 7);
  auto [x1, y1] = task.next(4);
  auto [x2, y2] = task.next(4);
  REQUIRE(x1.shape() == weft::Shape{4, 3});
  const auto& cycle = task.cycle();
  auto follows = [&](int64_t a, int64_t b) {
    for (size_t k = 0; k < cycle.size(); ++k) {
      if (cycle[k] == a) return cycle[(k + 1) % cycle.size()] == b;
    }
    return false;
  };
  for (int64_t n = 0; n < 3; ++n) {
    CHECK(x2.data<int64_t>()[n] == y1.data<int64_t>()[3 * 3 + n]);
    for (int64_t t = 0; t < 4; ++t) {
      CHECK(follows(x1.data<int64_t>()[t * 3 + n], y1.data<int64_t>()[t * 3 + n]));
      if (t < 3) CHECK(x1.data<int64_t>()[(t + 1) * 3 + n] == y1.data<int64_t>()[t * 3 + n]);
    }
  }
  CHECK_THROWS_AS(weft::examples::rnn::PeriodicTask(1, 3, 0.0, 0), weft::InvalidArgumentError);
  CHECK_THROWS_AS(weft::examples::rnn::PeriodicTask(4, 3, 1.5, 0), weft::InvalidArgumentError);
}

#ifdef WEFT_RNN

namespace {

const std::string kWeftrun = WEFT_WEFTRUN;
const std::string kProgram = WEFT_RNN;

}  // namespace

TEST_CASE("the distributed RNN learns the periodic sequence and shuts down cleanly") {
  const std::string csv = "rnn_test_metrics.csv";
  std::string out;
  int rc = runShell(kWeftrun + " -n 2 --grace-period 5 " + kProgram + " --metrics " + csv + " 2>&1", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("11 parameter tensors (59144 values)") != std::string::npos);
  const double chance = std::log(8.0);
  const double first = realAfter(out, "first 50: ");
  const double last = realAfter(out, "final loss ");
  // Knowing nothing costs ln 8 = 2.08; the default run ends near 0.62 (floor about 0.47).
  CHECK(first > 0.95 * chance);
  CHECK(last < 0.5 * chance);
  CHECK(countOf(out, "shut down cleanly") == 2);
  CHECK(out.find("ps: shut down cleanly") != std::string::npos);
  CHECK(out.find("rror") == std::string::npos);
  CHECK(countLines(csv) == 401);
  std::remove(csv.c_str());
}

TEST_CASE("distributed autograd's gradients equal a local replay's for every parameter") {
  const std::string csv = "rnn_test_check.csv";
  struct Case {
    const char* args;
    double tolerance;
  };
  // float64 without dropout, as the example's README states; float32 with dropout on (the replay
  // draws the same masks) within 1e-5. Both measure 0: the two runs do the same operations.
  for (const Case& c : {Case{"--dtype float64 --dropout 0", 1e-6}, Case{"--dtype float32", 1e-5},
                        Case{"--upstream --dtype float64 --dropout 0", 1e-6}}) {
    CAPTURE(c.args);
    std::string out;
    int rc = runShell(kWeftrun + " -n 2 --grace-period 5 " + kProgram + " --check-gradients --iterations 40 " + c.args +
                     " --metrics " + csv + " 2>&1",
                 out);
    INFO(out);
    CHECK(rc == 0);
    const double diff = realAfter(out, "gradient check: max relative difference ");
    REQUIRE_FALSE(std::isnan(diff));
    CHECK(diff <= c.tolerance);
    CHECK(countOf(out, "shut down cleanly") == 2);
    CHECK(countLines(csv) == 41);
  }
  std::remove(csv.c_str());
}

TEST_CASE("the distributed RNN is reproducible from its seed and runs the upstream sizes") {
  const std::string csv = "rnn_test_seed.csv";
  std::string a, b, c;
  CHECK(runShell(kWeftrun + " -n 2 " + kProgram + " --iterations 60 --seed 5 --metrics " + csv + " 2>&1", a) == 0);
  CHECK(runShell(kWeftrun + " -n 2 " + kProgram + " --iterations 60 --seed 5 --metrics " + csv + " 2>&1", b) == 0);
  const double la = realAfter(a, "final loss "), lb = realAfter(b, "final loss ");
  CHECK_FALSE(std::isnan(la));
  CHECK(la == lb);
  CHECK(runShell(kWeftrun + " -n 2 " + kProgram + " --upstream --metrics " + csv + " 2>&1", c) == 0);
  INFO(c);
  CHECK(c.find("embedding 7x2 and decoder 3->7 on ps, LSTM 2->3 x4 layers here; 19 parameter tensors") !=
        std::string::npos);
  CHECK(c.find("50 iterations of 5 steps x 6 sequences, SGD lr 0.05") != std::string::npos);
  CHECK(countOf(c, "shut down cleanly") == 2);
  std::remove(csv.c_str());
}

TEST_CASE("the distributed RNN refuses a world other than two processes") {
  for (const char* n : {"1", "3"}) {
    std::string out;
    int rc = runShell(kWeftrun + " -n " + n + " " + kProgram + " --metrics /dev/null 2>&1", out);
    INFO(out);
    CHECK(rc == 1);
    CHECK(out.find("needs exactly 2 processes") != std::string::npos);
  }
}

TEST_CASE("the distributed RNN rejects bad flags with its usage") {
  struct Case {
    const char* args;
    const char* message;
  };
  for (const Case& c : {Case{"--dtype float16", "unknown dtype 'float16'"}, Case{"--dropout 1", "--dropout must be"},
                        Case{"--ntoken 1", "--ntoken must be at least 2"}, Case{"--lr -1", "--lr must be positive"},
                        Case{"--iterations x", "invalid value 'x' for --iterations"},
                        Case{"--frobnicate 3", "unknown flag --frobnicate"}}) {
    CAPTURE(c.args);
    std::string out;
    int rc = runShell(kProgram + " " + c.args + " 2>&1", out);
    CHECK(rc == 2);
    CHECK(out.find(c.message) != std::string::npos);
    CHECK(out.find("usage: weftrun -n 2") != std::string::npos);
  }
}

#endif  // WEFT_RNN
