// Pipeline schedules as data (pipeline/schedule.h): gpipe and oneFOneB for P up to 8 stages and
// micro-batch counts that P does not divide pass every invariant checkSchedule enforces, with the
// activation peaks each schedule promises; hand-derived small schedules; broken schedules rejected
// with the stage and action named. No processes.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "pipeline/schedule.h"

using weft::InvalidArgumentError;
using weft::pipeline::Action;
using weft::pipeline::ActionKind;
using weft::pipeline::checkSchedule;
using weft::pipeline::gpipe;
using weft::pipeline::oneFOneB;
using weft::pipeline::Schedule;
using weft::pipeline::toString;

namespace {

const int kMicrobatches[] = {1, 2, 3, 4, 5, 7, 8, 13, 16};

// Transfers per micro-batch on stage s of P: RA and SG unless first, SA and RG unless last.
size_t expectedLength(int s, int p, int m) {
  size_t perMb = 2;
  if (s > 0) perMb += 2;
  if (s < p - 1) perMb += 2;
  return perMb * static_cast<size_t>(m);
}

std::string errorOf(const Schedule& s) {
  try {
    checkSchedule(s);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("gpipe keeps every micro-batch alive on every stage and passes every invariant, P 1..8") {
  for (int p = 1; p <= 8; ++p) {
    for (int m : kMicrobatches) {
      CAPTURE(p);
      CAPTURE(m);
      Schedule s = gpipe(p, m);
      REQUIRE(s.numStages() == p);
      auto report = checkSchedule(s);
      for (int st = 0; st < p; ++st) {
        CHECK(s.stages[static_cast<size_t>(st)].size() == expectedLength(st, p, m));
        CHECK(report.peakActivations[static_cast<size_t>(st)] == m);
      }
    }
  }
}

TEST_CASE("1F1B holds at most min(P - s, M) micro-batches on stage s and passes every invariant, P 1..8") {
  for (int p = 1; p <= 8; ++p) {
    for (int m : kMicrobatches) {
      CAPTURE(p);
      CAPTURE(m);
      Schedule s = oneFOneB(p, m);
      auto report = checkSchedule(s);
      for (int st = 0; st < p; ++st) {
        CHECK(s.stages[static_cast<size_t>(st)].size() == expectedLength(st, p, m));
        CHECK(report.peakActivations[static_cast<size_t>(st)] == std::min(p - st, m));
        CHECK(report.peakActivations[static_cast<size_t>(st)] <= p);
      }
      // After warm-up the stage alternates: no two forwards follow each other once a backward ran
      // until the forwards are exhausted.
      for (int st = 0; st < p; ++st) {
        const auto& acts = s.stages[static_cast<size_t>(st)];
        int forwards = 0, backwards = 0;
        for (const Action& a : acts) {
          if (a.kind == ActionKind::Forward) {
            ++forwards;
            CHECK(forwards - backwards <= std::min(p - st, m));
          }
          if (a.kind == ActionKind::Backward) {
            CHECK(a.microbatch == backwards);  // backwards in micro-batch order
            ++backwards;
          }
        }
      }
    }
  }
}

TEST_CASE("the small schedules read as derived by hand") {
  Schedule g = gpipe(2, 2);
  CHECK(toString(g.stages[0]) == "F0 SA0 F1 SA1 RG0 B0 RG1 B1");
  CHECK(toString(g.stages[1]) == "RA0 F0 RA1 F1 B0 SG0 B1 SG1");
  Schedule f = oneFOneB(2, 3);
  CHECK(toString(f.stages[0]) == "F0 SA0 F1 SA1 RG0 B0 F2 SA2 RG1 B1 RG2 B2");
  CHECK(toString(f.stages[1]) == "RA0 F0 B0 SG0 RA1 F1 B1 SG1 RA2 F2 B2 SG2");
  Schedule f3 = oneFOneB(3, 2);
  CHECK(toString(f3.stages[0]) == "F0 SA0 F1 SA1 RG0 B0 RG1 B1");
  CHECK(toString(f3.stages[1]) == "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 SG0 RG1 B1 SG1");
  CHECK(toString(f3.stages[2]) == "RA0 F0 B0 SG0 RA1 F1 B1 SG1");
  Schedule one = oneFOneB(1, 2);
  CHECK(toString(one.stages[0]) == "F0 B0 F1 B1");
}

TEST_CASE("schedules of no stage or no micro-batch are refused") {
  CHECK_THROWS_AS(gpipe(0, 4), InvalidArgumentError);
  CHECK_THROWS_AS(oneFOneB(2, 0), InvalidArgumentError);
  CHECK(contains(errorOf(Schedule{0, {{}}}), "microbatches must be >= 1"));
  CHECK(contains(errorOf(Schedule{2, {}}), "no stage"));
}

TEST_CASE("broken schedules are rejected naming the stage and the action") {
  SUBCASE("a backward before its forward") {
    Schedule s{1, {{{ActionKind::Backward, 0}, {ActionKind::Forward, 0}}}};
    CHECK(contains(errorOf(s), "stage 0 runs B0 (action 0) before F0 (action 1)"));
  }
  SUBCASE("a micro-batch without its backward") {
    Schedule s{2, {{{ActionKind::Forward, 0}, {ActionKind::Forward, 1}, {ActionKind::Backward, 0}}}};
    CHECK(contains(errorOf(s), "stage 0 has no B1"));
  }
  SUBCASE("a micro-batch outside [0, M)") {
    Schedule s{1, {{{ActionKind::Forward, 0}, {ActionKind::Backward, 1}}}};
    CHECK(contains(errorOf(s), "stage 0, action 1 (B1): micro-batch outside [0, 1)"));
  }
  SUBCASE("a repeated action") {
    Schedule s{1, {{{ActionKind::Forward, 0}, {ActionKind::Forward, 0}, {ActionKind::Backward, 0}}}};
    CHECK(contains(errorOf(s), "stage 0, action 1 (F0): repeats action 0"));
  }
  SUBCASE("the first stage receiving an activation") {
    Schedule s = gpipe(2, 1);
    s.stages[0].insert(s.stages[0].begin(), Action{ActionKind::RecvActivation, 0});
    CHECK(contains(errorOf(s), "stage 0, action 0 (RA0): the first stage has no neighbour to receive from"));
  }
  SUBCASE("a stage forwarding before it received its input") {
    Schedule s = gpipe(2, 1);
    std::swap(s.stages[1][0], s.stages[1][1]);  // F0 RA0 ...
    CHECK(contains(errorOf(s), "stage 1 runs F0 (action 0) before RA0 (action 1)"));
  }
  SUBCASE("a missing send") {
    Schedule s = gpipe(2, 1);
    s.stages[0].erase(s.stages[0].begin() + 1);  // F0 [SA0 dropped] RG0 B0
    CHECK(contains(errorOf(s), "stage 0 has no SA0"));
  }
  SUBCASE("sends and receives in different orders") {
    Schedule s = gpipe(2, 2);
    // stage 1 receives micro-batch 1 first: RA1 F1 RA0 F0 ...
    s.stages[1] = {{ActionKind::RecvActivation, 1}, {ActionKind::Forward, 1}, {ActionKind::RecvActivation, 0},
                   {ActionKind::Forward, 0},        {ActionKind::Backward, 0}, {ActionKind::SendGrad, 0},
                   {ActionKind::Backward, 1},       {ActionKind::SendGrad, 1}};
    CHECK(contains(errorOf(s), "stage 0 sends activations in order [0, 1] but stage 1 receives them in order [1, 0]"));
  }
  SUBCASE("a deadlock: stage 0 waits for a gradient before sending the activation") {
    Schedule s{1,
               {{{ActionKind::Forward, 0}, {ActionKind::RecvGrad, 0}, {ActionKind::SendActivation, 0},
                 {ActionKind::Backward, 0}},
                {{ActionKind::RecvActivation, 0}, {ActionKind::Forward, 0}, {ActionKind::Backward, 0},
                 {ActionKind::SendGrad, 0}}}};
    std::string e = errorOf(s);
    CHECK(contains(e, "deadlocks"));
    CHECK(contains(e, "stage 0, action 1 (RG0)"));
    CHECK(contains(e, "stage 1, action 0 (RA0)"));
  }
}
