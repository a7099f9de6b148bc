// The data-parallel Fashion-MNIST example (examples/fashion_mnist), run as a user runs it, through
// weftrun: 100 steps of the global batch of 64 on one process (no process group), on one process
// of a job and on two, by hand-written per-parameter allreduce, through DDP, and with the
// optimizer state (zero1) or gradients and optimizer state (zero2) sharded. The final weights
// of every data-parallel run must be the single-process ones (bit for bit on one process, within
// float rounding on two), the model must learn, every process must exit 0 after a clean shutdown;
// bad configurations fail at start with a clear message.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "nn/serialize.h"
#include "examples/example_run.h"
#include "captured_text.h"

using weft::testing::runShell;
using weft::testing::countLines;
using weft::testing::countOf;
using weft::testing::realAfter;

#ifdef WEFT_FASHION_MNIST_DP

namespace {

const std::string kWeftrun = WEFT_WEFTRUN;
const std::string kProgram = WEFT_FASHION_MNIST_DP;

struct Result {
  double accuracy = 0;
  double throughput = 0;
  weft::nn::StateDict weights;
};

// One short run (one epoch of 100 steps, one OpenMP thread per process so that the processes do
// not compete for the cores), checked for a clean end; its weights read back from --save.
Result train(int processes, const std::string& mode) {
  const std::string tag = "fashion_mnist_dp_test_" + mode + "_" + std::to_string(processes);
  const std::string csv = tag + ".csv", weights = tag + ".weft";
  const std::string args = " --mode " + mode + " --epochs 1 --max-batches 100 --log-interval 50 --threads 1 --metrics " +
                           csv + " --save " + weights + " 2>&1";
  std::string out;
  const int rc = runShell(kWeftrun + " -n " + std::to_string(processes) + " --grace-period 5 " + kProgram + args, out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("mode " + mode + ", " + std::to_string(processes) + " process(es) x 1 thread(s), global batch 64 (" +
                 std::to_string(64 / processes) + " per process)") != std::string::npos);
  CHECK(out.find("epoch 1 step 50/100 loss ") != std::string::npos);
  CHECK(out.find("epoch 1 step 100/100 loss ") != std::string::npos);
  if (processes > 1) CHECK(out.find("identical on all " + std::to_string(processes) + " replicas") != std::string::npos);
  CHECK(countOf(out, "shut down cleanly") == static_cast<size_t>(processes));
  CHECK(out.find("Error") == std::string::npos);
  // Rank 0's metrics: the header and one row per step.
  CHECK(countLines(csv) == 101);
  Result r;
  r.accuracy = realAfter(out, "final test accuracy: ");
  r.throughput = realAfter(out, "throughput: ");
  REQUIRE_NOTHROW(r.weights = weft::nn::loadStateDictFile(weights));
  std::remove(csv.c_str());
  std::remove(weights.c_str());
  return r;
}

// Largest |a - b| over every parameter; the two must hold the same names and shapes.
double maxDifference(const weft::nn::StateDict& a, const weft::nn::StateDict& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (const auto& [name, ta] : a) {
    CAPTURE(name);
    auto it = b.find(name);
    REQUIRE(it != b.end());
    const weft::Tensor& tb = it->second;
    REQUIRE(ta.shape() == tb.shape());
    for (int64_t i = 0; i < ta.numel(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(ta.data<float>()[i]) - tb.data<float>()[i]));
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("data-parallel Fashion-MNIST on one and two processes ends with the single-process weights") {
  const Result local = train(1, "local");
  // Chance is 0.10; 100 steps of 64 reach about 0.73.
  CHECK(local.accuracy >= 0.6);
  double largest = 0;
  for (const std::string mode : {"allreduce", "ddp", "zero1", "zero2"}) {
    CAPTURE(mode);
    // One process of a job: averaging over a group of one changes nothing, bit for bit.
    const Result one = train(1, mode);
    CHECK(maxDifference(local.weights, one.weights) == 0.0);
    CHECK(one.accuracy == local.accuracy);
    // Two processes: the same examples in each global batch, summed in another order.
    const Result two = train(2, mode);
    const double diff = maxDifference(local.weights, two.weights);
    largest = std::max(largest, diff);
    CHECK(diff <= 1e-5);
    CHECK(std::fabs(two.accuracy - local.accuracy) <= 0.005);
    MESSAGE(mode << ": throughput " << one.throughput << " samples/s on 1 process, " << two.throughput
                 << " on 2 (speed-up " << two.throughput / one.throughput << "x against "
                 << local.throughput << " without a process group); largest weight difference " << diff);
  }
  // The two runs on two processes did differ from one process (or the comparison would prove nothing
  // about averaging); the weights are O(0.1), so 1e-5 is float rounding, not a different step.
  CHECK(largest > 0.0);
}

TEST_CASE("the data-parallel example refuses a global batch that does not split over the processes") {
  std::string out;
  int rc = runShell(kWeftrun + " -n 2 " + kProgram + " --batch-size 63 --metrics /dev/null 2>&1", out);
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find("--batch-size 63 is the global batch and must split evenly over the 2 processes") != std::string::npos);
}

TEST_CASE("the data-parallel example keeps --mode local to a world of one") {
  std::string out;
  int rc = runShell(kWeftrun + " -n 2 " + kProgram + " --mode local --metrics /dev/null 2>&1", out);
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find("--mode local is the single-process baseline; this job has 2 processes") != std::string::npos);
}

TEST_CASE("the data-parallel example rejects an unknown mode with its usage") {
  std::string out;
  int rc = runShell(kProgram + " --mode hogwild 2>&1", out);
  CHECK(rc == 2);
  CHECK(out.find("unknown mode 'hogwild' (ddp, allreduce, zero1, zero2 or local)") != std::string::npos);
  CHECK(out.find("usage: weftrun -n W fashion_mnist") != std::string::npos);
}

TEST_CASE("the data-parallel example names the Debian package when the data are missing") {
  std::string out;
  int rc = runShell(kWeftrun + " -n 2 " + kProgram + " --data-dir /nonexistent-weft-data --metrics /dev/null 2>&1", out);
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find("dataset-fashion-mnist") != std::string::npos);
}

#endif  // WEFT_FASHION_MNIST_DP
