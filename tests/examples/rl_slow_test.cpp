// The rl example (examples/rl), run as a user runs it, through weftrun: two observers learn
// CartPole (the running reward climbs far above a random policy's) and every rank shuts down
// cleanly; a run is reproducible from its seed however the observers' calls interleave; bad
// configurations fail at start.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "examples/example_run.h"
#include "captured_text.h"

using weft::testing::runShell;
using weft::testing::countOf;

#ifdef WEFT_RL

namespace {

// The metrics file's rows, each split at the commas; the header line first.
std::vector<std::vector<std::string>> readCsv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, ',');) fields.push_back(f);
    rows.push_back(fields);
  }
  return rows;
}

const std::string kWeftrun = WEFT_WEFTRUN;
const std::string kProgram = WEFT_RL;

}  // namespace

TEST_CASE("two observers of the rl example learn CartPole, reproducibly, and shut down cleanly") {
  const std::string csv = "rl_test_two_observers.csv";
  std::string out;
  int rc = runShell(kWeftrun + " -n 3 --grace-period 5 " + kProgram + " --max-episodes 100 --log-interval 25 --metrics " +
                   csv + " 2>&1",
               out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("agent: policy of 898 parameters, 2 observer(s), seed 543") != std::string::npos);
  auto pos = out.find(" at episode 100: running reward ");
  REQUIRE(pos != std::string::npos);
  const double running = std::atof(out.c_str() + pos + 32);
  // A random policy keeps the pole up for about 22 steps, so its running reward after 100
  // episodes (from 0) is at most ~22; this run reaches about 200.
  CHECK(running > 100);
  CHECK(out.find("(observers 2, seed 543, ") != std::string::npos);
  CHECK(countOf(out, "shut down cleanly") == 3);
  CHECK(out.find("observer1: shut down cleanly") != std::string::npos);
  CHECK(out.find("observer2: shut down cleanly") != std::string::npos);
  CHECK(out.find("Error") == std::string::npos);

  auto rows = readCsv(csv);
  REQUIRE(rows.size() == 101);
  CHECK(rows[0] == std::vector<std::string>{"episode", "reward", "mean_reward", "running_reward", "loss", "steps",
                                            "seconds", "ms_per_step"});
  double first = 0, last = 0;
  for (int i = 1; i <= 10; ++i) first += std::atof(rows[i][2].c_str()) / 10;
  for (int i = 91; i <= 100; ++i) last += std::atof(rows[i][2].c_str()) / 10;
  CAPTURE(first);
  CAPTURE(last);
  CHECK(last > 3 * first);  // the mean episode reward grows from ~20 to several hundred

  // The same seed gives the same episodes: the rewards, the running reward and the loss of the
  // first 20 episodes (the timing columns aside), although the two observers' calls interleave
  // differently.
  const std::string again = "rl_test_again.csv";
  std::string out2;
  rc = runShell(kWeftrun + " -n 3 --grace-period 5 " + kProgram + " --max-episodes 20 --metrics " + again + " 2>&1", out2);
  INFO(out2);
  CHECK(rc == 0);
  auto rows2 = readCsv(again);
  REQUIRE(rows2.size() == 21);
  for (size_t i = 1; i < rows2.size(); ++i) {
    CAPTURE(i);
    for (size_t c = 0; c < 6; ++c) CHECK(rows2[i][c] == rows[i][c]);
  }
  std::remove(csv.c_str());
  std::remove(again.c_str());
}

TEST_CASE("the rl example refuses a world of one process") {
  std::string out;
  int rc = runShell(kWeftrun + " -n 1 " + kProgram + " --metrics /dev/null 2>&1", out);
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find("needs at least 2 processes (rank 0: the agent") != std::string::npos);
}

TEST_CASE("the rl example rejects bad flags with its usage") {
  std::string out;
  CHECK(runShell(kProgram + " --max-episodes 0 2>&1", out) == 2);
  CHECK(out.find("--max-episodes must be at least 1") != std::string::npos);
  CHECK(out.find("usage: weftrun -n W rl") != std::string::npos);
  out.clear();
  CHECK(runShell(kProgram + " --episodes 3 2>&1", out) == 2);
  CHECK(out.find("unknown flag --episodes") != std::string::npos);
}

TEST_CASE("the rl example fails at start when it cannot write its metrics") {
  std::string out;
  int rc = runShell(kWeftrun + " -n 2 --grace-period 5 " + kProgram + " --metrics /nonexistent-weft-dir/rl.csv 2>&1", out);
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find("cannot write the metrics file '/nonexistent-weft-dir/rl.csv'") != std::string::npos);
}

#endif  // WEFT_RL
