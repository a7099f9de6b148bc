// The hybrid DDP + remote embedding example (examples/ddp_rpc), run as a user runs it, through
// weftrun with its four processes: a shorter run on the learnable target learns (the loss falls
// below half of ln 8), the two Linear replicas end bit-identical, the table on ps changed, every
// rank shuts down cleanly; upstream's random target runs too; bad configurations fail at start.
// Also the example's batches and targets on their own.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "examples/ddp_rpc/batch.h"
#include "tensor/ops.h"
#include "examples/example_run.h"
#include "captured_text.h"

using weft::testing::runShell;
using weft::testing::countLines;
using weft::testing::countOf;

using namespace weft::examples::ddp_rpc;

TEST_CASE("ddp_rpc batches hold 20 to 50 ids in bags of 1 to 9 with targets in range") {
  weft::Generator gen(3);
  weft::Tensor table = weft::randn({kNumEmbeddings, kEmbeddingDim});
  Teacher teacher(table, 3);
  for (int i = 0; i < 200; ++i) {
    for (TargetMode mode : {TargetMode::Learnable, TargetMode::Random}) {
      Batch b = makeBatch(gen, mode, &teacher);
      const int64_t n = b.indices.numel();
      CHECK(n >= kMinIds);
      CHECK(n <= kMaxIds);
      REQUIRE(b.offsets.numel() == b.bags);
      REQUIRE(b.target.numel() == b.bags);
      const int64_t* ids = b.indices.data<int64_t>();
      const int64_t* off = b.offsets.data<int64_t>();
      const int64_t* tgt = b.target.data<int64_t>();
      CHECK(off[0] == 0);
      for (int64_t k = 0; k < n; ++k) CHECK((ids[k] >= 0 && ids[k] < kNumEmbeddings));
      for (int64_t k = 0; k < b.bags; ++k) {
        const int64_t end = k + 1 < b.bags ? off[k + 1] : n;
        CHECK(end - off[k] >= 1);
        CHECK(end - off[k] <= kMaxBagStep);
        CHECK((tgt[k] >= 0 && tgt[k] < kClasses));
        if (mode == TargetMode::Learnable) CHECK(tgt[k] == teacher.classOf(ids, off[k], end));
      }
    }
  }
}

TEST_CASE("the learnable target is the class the initial table projected by P ranks first") {
  // A table whose row i is i * e0 and a teacher: a bag's class depends only on the sum of its
  // ids, and the same bag always gets the same class; P comes from the seed alone.
  std::vector<float> rows(static_cast<size_t>(kNumEmbeddings * kEmbeddingDim), 0.0f);
  for (int64_t i = 0; i < kNumEmbeddings; ++i) rows[static_cast<size_t>(i * kEmbeddingDim)] = static_cast<float>(i);
  weft::Tensor table = weft::fromVector(rows, {kNumEmbeddings, kEmbeddingDim});
  Teacher a(table, 11), b(table, 11);
  const int64_t bag1[] = {3, 4};
  const int64_t bag2[] = {7};
  const int64_t bag3[] = {0, 0};
  CHECK(a.classOf(bag1, 0, 2) == a.classOf(bag2, 0, 1));  // both sum to 7 along e0
  CHECK(a.classOf(bag1, 0, 2) == b.classOf(bag1, 0, 2));
  CHECK(a.classOf(bag3, 0, 2) == 0);                     // all scores 0: the smallest class
  // Over many bags of a random table the classes are spread over all 8.
  weft::Generator gen(5);
  Teacher t(weft::randn({kNumEmbeddings, kEmbeddingDim}, {}, &gen), 0);
  std::vector<int64_t> counts(static_cast<size_t>(kClasses), 0);
  for (int i = 0; i < 300; ++i) {
    Batch batch = makeBatch(gen, TargetMode::Learnable, &t);
    for (int64_t k = 0; k < batch.bags; ++k) ++counts[static_cast<size_t>(batch.target.data<int64_t>()[k])];
  }
  for (int64_t c : counts) CHECK(c > 0);
  CHECK(classEntropy(counts) > 1.5);
  CHECK(classEntropy({5, 5, 5, 5, 5, 5, 5, 5}) == doctest::Approx(std::log(8.0)));
  CHECK_THROWS_AS(Teacher(weft::randn({10, kEmbeddingDim}), 0), weft::InvalidArgumentError);
  CHECK_THROWS_AS(makeBatch(gen, TargetMode::Learnable, nullptr), weft::InvalidArgumentError);
  CHECK_THROWS_AS(parseTargetMode("hogwild"), weft::InvalidArgumentError);
}

#ifdef WEFT_DDP_RPC

namespace {

// The numbers of the master's summary line.
struct Summary {
  double first0 = 0, last0 = 0, first1 = 0, last1 = 0;
  long changedRows = -1;
  bool identical = false;
};

Summary parseSummary(const std::string& out) {
  Summary s;
  auto pos = out.find("final: loss ");
  REQUIRE(pos != std::string::npos);
  REQUIRE(std::sscanf(out.c_str() + pos, "final: loss %lf -> %lf (trainer0), %lf -> %lf (trainer1)", &s.first0,
                      &s.last0, &s.first1, &s.last1) == 4);
  auto rows = out.find("table changed in ", pos);
  REQUIRE(rows != std::string::npos);
  REQUIRE(std::sscanf(out.c_str() + rows, "table changed in %ld of 100 rows", &s.changedRows) == 1);
  s.identical = out.find("replicas bit-identical", pos) != std::string::npos;
  return s;
}

const std::string kWeftrun = WEFT_WEFTRUN;
const std::string kProgram = WEFT_DDP_RPC;

}  // namespace

TEST_CASE("ddp_rpc learns the learnable target with identical replicas and a changed table") {
  const std::string csv = "ddp_rpc_test_learnable.csv";
  const std::string csv1 = "ddp_rpc_test_learnable.trainer1.csv";
  std::string out;
  // 40 epochs of 10 batches per trainer (a third of the default run): the last epoch's mean loss
  // is 0.33-0.49 for seeds 0-5, from 2.1-2.5 in the first; chance (and upstream's random target)
  // stays at ln 8 = 2.08. The test requires half of ln 8, the goal the default run is held to.
  int rc = runShell(kWeftrun + " -n 4 --grace-period 5 " + kProgram + " --epochs 40 --metrics " + csv + " 2>&1", out);
  INFO(out);
  CHECK(rc == 0);
  Summary s = parseSummary(out);
  const double halfLn8 = std::log(8.0) / 2;
  CHECK(s.first0 > 1.5);
  CHECK(s.first1 > 1.5);
  CHECK(s.last0 < halfLn8);
  CHECK(s.last1 < halfLn8);
  CHECK(s.identical);
  CHECK(countOf(out, "Linear replica identical to the other trainer's") == 2);
  CHECK(s.changedRows > 0);
  CHECK(out.find("400 iterations per trainer") != std::string::npos);
  // Every rank reports a clean shutdown: no RRef, autograd context or optimizer state left.
  CHECK(countOf(out, "shut down cleanly") == 4);
  for (const char* role : {"trainer0", "trainer1", "master", "ps"}) {
    CHECK(out.find(std::string(role) + ": shut down cleanly") != std::string::npos);
  }
  CHECK(out.find("Error") == std::string::npos);
  // One metrics row per batch and trainer, plus the header.
  CHECK(countLines(csv) == 401);
  CHECK(countLines(csv1) == 401);
  std::remove(csv.c_str());
  std::remove(csv1.c_str());
}

TEST_CASE("ddp_rpc runs upstream's random target, which it cannot learn") {
  const std::string csv = "ddp_rpc_test_random.csv";
  const std::string csv1 = "ddp_rpc_test_random.trainer1.csv";
  std::string out;
  int rc = runShell(kWeftrun + " -n 4 --grace-period 5 " + kProgram + " --epochs 5 --target random --metrics " + csv +
                   " 2>&1",
               out);
  INFO(out);
  CHECK(rc == 0);
  Summary s = parseSummary(out);
  CHECK(s.last0 > 1.8);
  CHECK(s.last1 > 1.8);
  CHECK(s.identical);
  CHECK(s.changedRows > 0);
  CHECK(out.find("target random") != std::string::npos);
  CHECK(countOf(out, "shut down cleanly") == 4);
  CHECK(countLines(csv) == 51);
  CHECK(countLines(csv1) == 51);
  std::remove(csv.c_str());
  std::remove(csv1.c_str());
}

TEST_CASE("ddp_rpc refuses a world other than 4 processes") {
  std::string out;
  int rc = runShell(kWeftrun + " -n 3 " + kProgram + " --metrics /dev/null 2>&1", out);
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find("needs exactly 4 processes (trainer0, trainer1, master, ps), got a world of 3") !=
        std::string::npos);
}

TEST_CASE("ddp_rpc rejects an unknown target mode and bad numbers with its usage") {
  std::string out;
  CHECK(runShell(kProgram + " --target hogwild 2>&1", out) == 2);
  CHECK(out.find("unknown target mode 'hogwild'") != std::string::npos);
  CHECK(out.find("usage: weftrun -n 4 ddp_rpc") != std::string::npos);
  out.clear();
  CHECK(runShell(kProgram + " --epochs 0 2>&1", out) == 2);
  CHECK(out.find("--epochs must be at least 1") != std::string::npos);
  out.clear();
  CHECK(runShell(kProgram + " --timeout 0 2>&1", out) == 2);
  CHECK(out.find("--timeout must be positive") != std::string::npos);
}

#endif  // WEFT_DDP_RPC
