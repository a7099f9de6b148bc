// Pipeline schedules as data (pipeline/schedule.h): gpipe, oneFOneB and interleavedOneFOneB (V = 2,
// 3 chunks) for P up to 8 stages and micro-batch counts that P does not divide pass every invariant
// checkSchedule enforces, with the activation peaks each schedule promises; idealBubble against the
// closed forms (P - 1)/(M + P - 1) and (P - 1)/(V·M + P - 1); hand-derived small schedules; broken schedules rejected
// with the stage and action named. No processes.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "pipeline/schedule.h"

using weft::InvalidArgumentError;
using weft::pipeline::Action;
using weft::pipeline::ActionKind;
using weft::pipeline::checkSchedule;
using weft::pipeline::gpipe;
using weft::pipeline::idealBubble;
using weft::pipeline::interleavedOneFOneB;
using weft::pipeline::oneFOneB;
using weft::pipeline::Schedule;
using weft::pipeline::toString;

namespace {

const int kMicrobatches[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 24};

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

TEST_CASE("interleaved 1F1B with V = 2, 3 chunks passes every invariant and holds its warm-up plus one, P 2..8") {
  for (int p = 2; p <= 8; ++p) {
    for (int v : {2, 3}) {
      for (int m : kMicrobatches) {
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(m);
        Schedule s = interleavedOneFOneB(p, v, m);
        REQUIRE(s.numStages() == p);
        REQUIRE(s.chunks == v);
        auto report = checkSchedule(s);
        for (int st = 0; st < p; ++st) {
          const auto& acts = s.stages[static_cast<size_t>(st)];
          // Each chunk is a stage of the V·P model stages: its transfers as a plain stage's.
          size_t length = 0;
          for (int c = 0; c < v; ++c) length += expectedLength(c * p + st, v * p, m);
          CHECK(acts.size() == length);
          const int group = m < p ? m : p + m % p;  // the first group's micro-batches
          const int warmup = std::min((p - st - 1) * 2 + (v - 1) * group, v * m);
          CHECK(report.peakActivations[static_cast<size_t>(st)] == std::min(warmup + 1, v * m));
          // Megatron's orders: forwards by groups of P micro-batches (the first taking the
          // M mod P left over), chunk after chunk in a group; backwards alike, chunks reversed.
          std::vector<std::pair<int, int>> forwards, backwards, want;
          for (const Action& a : acts) {
            if (a.kind == ActionKind::Forward) forwards.emplace_back(a.microbatch, a.chunk);
            if (a.kind == ActionKind::Backward) backwards.emplace_back(a.microbatch, v - 1 - a.chunk);
          }
          for (int g = 0; g < m; g = g == 0 ? group : g + p)
            for (int c = 0; c < v; ++c)
              for (int mb = g; mb < (g == 0 ? group : g + p); ++mb) want.emplace_back(mb, c);
          CHECK(forwards == want);
          CHECK(backwards == want);
        }
      }
    }
  }
}

TEST_CASE("interleavedOneFOneB with one chunk is 1F1B, and chunks without two stages are refused") {
  for (int p = 1; p <= 4; ++p) {
    Schedule a = interleavedOneFOneB(p, 1, 5), b = oneFOneB(p, 5);
    CHECK(a.chunks == 1);
    CHECK(a.stages == b.stages);
  }
  CHECK_THROWS_AS(interleavedOneFOneB(1, 2, 4), InvalidArgumentError);
  CHECK_THROWS_AS(interleavedOneFOneB(2, 0, 4), InvalidArgumentError);
  CHECK_THROWS_AS(interleavedOneFOneB(2, 2, 0), InvalidArgumentError);
  Schedule one{2, {{{ActionKind::Forward, 0}, {ActionKind::Backward, 0}}}, 2};
  CHECK(contains(errorOf(one), "2 chunks need at least 2 stages"));
}

TEST_CASE("the ideal bubble with each stage's own costs: equal costs as before, a slower last stage by formula") {
  // Equal per-action costs give the scalar form (whose costs are per stage, split over its V chunks).
  for (int v : {1, 2}) {
    const auto sched = v == 1 ? oneFOneB(3, 6) : interleavedOneFOneB(3, v, 6);
    const std::vector<double> f(3, 1.5 / v), b(3, 2.5 / v);
    CHECK(idealBubble(sched, f, b) == doctest::Approx(idealBubble(sched, 1.5, 2.5)).epsilon(1e-12));
  }
  // GPipe, P = 2, stage 1 slower in both directions: stage 1 runs its M forwards from f0 on, then its
  // M backwards; stage 0's last backward follows stage 1's last: the step ends at
  // f0 + M·f1 + M·b1 + b0, and the stages were busy M·(f0 + b0) and M·(f1 + b1).
  const double f0 = 1.0, b0 = 2.0, f1 = 1.3, b1 = 2.4;
  for (int m : {1, 2, 4, 8}) {
    CAPTURE(m);
    const double end = f0 + m * f1 + m * b1 + b0;
    const double want = 1.0 - (m * (f0 + b0) + m * (f1 + b1)) / (2.0 * end);
    const std::vector<double> f{f0, f1}, b{b0, b1};
    CHECK(idealBubble(gpipe(2, m), f, b) == doctest::Approx(want).epsilon(1e-12));
  }
  const std::vector<double> one{1.0}, two{1.0, 2.0}, bad{1.0, 0.0};
  CHECK_THROWS_AS(idealBubble(gpipe(2, 2), one, two), InvalidArgumentError);
  CHECK_THROWS_AS(idealBubble(gpipe(2, 2), two, bad), InvalidArgumentError);
}

TEST_CASE("the ideal bubble: (P - 1)/(M + P - 1) for GPipe and 1F1B, (P - 1)/(V·M + P - 1) interleaved for M >= P") {
  for (int p = 1; p <= 8; ++p) {
    for (int m : kMicrobatches) {
      CAPTURE(p);
      CAPTURE(m);
      const double theory = static_cast<double>(p - 1) / (m + p - 1);
      CHECK(idealBubble(gpipe(p, m)) == doctest::Approx(theory).epsilon(1e-12));
      CHECK(idealBubble(oneFOneB(p, m), 1.0, 2.0) == doctest::Approx(theory).epsilon(1e-12));
      CHECK(idealBubble(oneFOneB(p, m), 1.0, 1.0) == doctest::Approx(theory).epsilon(1e-12));
      if (p < 2) continue;
      for (int v : {2, 3}) {
        CAPTURE(v);
        const double interleaved = idealBubble(interleavedOneFOneB(p, v, m));
        const double v1 = static_cast<double>(p - 1) / (v * m + p - 1);
        if (m >= p) {
          CHECK(interleaved == doctest::Approx(v1).epsilon(1e-12));
        } else {
          // Fewer micro-batches than stages: stage 0 waits for each chunk's to come round.
          CHECK(interleaved > v1);
          CHECK(interleaved <= theory + 1e-12);
        }
      }
    }
  }
  CHECK_THROWS_AS(idealBubble(gpipe(2, 2), 0.0, 1.0), InvalidArgumentError);
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
  // P = 2, V = 2, M = 2: model stages 0..3 are (stage 0, chunk 0), (1, 0), (0, 1), (1, 1). Stage 0
  // warms up with (2 - 0 - 1)·2 + (2 - 1)·2 = 4 forwards (all of them), stage 1 with 2.
  Schedule i = interleavedOneFOneB(2, 2, 2);
  CHECK(toString(i.stages[0]) ==
        "F0 SA0 F1 SA1 RA0v1 F0v1 SA0v1 RA1v1 F1v1 SA1v1 RG0v1 B0v1 SG0v1 RG1v1 B1v1 SG1v1 RG0 B0 RG1 B1");
  CHECK(toString(i.stages[1]) ==
        "RA0 F0 SA0 RA1 F1 SA1 RA0v1 F0v1 B0v1 SG0v1 RA1v1 F1v1 B1v1 SG1v1 RG0 B0 SG0 RG1 B1 SG1");
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
  SUBCASE("interleaved: a chunk outside [0, V)") {
    Schedule s = interleavedOneFOneB(2, 2, 2);
    s.stages[1][1].chunk = 2;
    CHECK(contains(errorOf(s), "stage 1, action 1 (F0v2): chunk outside [0, 2)"));
  }
  SUBCASE("interleaved: the last chunk of the last stage sending on") {
    Schedule s = interleavedOneFOneB(2, 2, 1);
    s.stages[1].push_back({ActionKind::SendActivation, 0, 1});
    CHECK(contains(errorOf(s), "(SA0v1): the last stage has no neighbour to send to"));
  }
  SUBCASE("interleaved: stage 0's chunk 1 receiving in another order than the last stage's chunk 0 sends") {
    Schedule s = interleavedOneFOneB(2, 2, 2);
    auto& acts = s.stages[0];
    // Swap RA0v1 F0v1 SA0v1 with RA1v1 F1v1 SA1v1 on stage 0.
    auto at = [&](Action a) { return std::find(acts.begin(), acts.end(), a) - acts.begin(); };
    const auto a = at({ActionKind::RecvActivation, 0, 1}), b = at({ActionKind::RecvActivation, 1, 1});
    REQUIRE(b == a + 3);
    std::swap_ranges(acts.begin() + a, acts.begin() + a + 3, acts.begin() + b);
    CHECK(contains(errorOf(s), "stage 1 chunk 0 sends activations in order [0, 1] but stage 0 chunk 1 receives "
                               "them in order [1, 0]"));
  }
  SUBCASE("interleaved: a deadlock across the wrap from the last stage to the first") {
    // Stage 0 waits for chunk 1's input before sending chunk 0's output.
    Schedule s{1,
               {{{ActionKind::Forward, 0}, {ActionKind::RecvActivation, 0, 1}, {ActionKind::SendActivation, 0},
                 {ActionKind::Forward, 0, 1}, {ActionKind::SendActivation, 0, 1}, {ActionKind::RecvGrad, 0, 1},
                 {ActionKind::Backward, 0, 1}, {ActionKind::SendGrad, 0, 1}, {ActionKind::RecvGrad, 0},
                 {ActionKind::Backward, 0}},
                interleavedOneFOneB(2, 2, 1).stages[1]},
               2};
    std::string e = errorOf(s);
    CHECK(contains(e, "deadlocks"));
    CHECK(contains(e, "stage 0, action 1 (RA0v1)"));
    CHECK(contains(e, "stage 1, action 0 (RA0)"));
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
