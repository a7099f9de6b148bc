// Pipeline schedules as data: for each of P stages, the list of actions it
// runs in one training step over M micro-batches. A schedule is produced by a
// small function (gpipe, oneFOneB) and run by one executor
// (pipeline/executor.h); checkSchedule proves a schedule's invariants without
// running a model.
//
//   pipeline::Schedule s = pipeline::oneFOneB(/*stages=*/4, /*microbatches=*/6);
//   pipeline::ScheduleReport r = pipeline::checkSchedule(s);   // throws if broken
//   r.peakActivations[0];                                       // 4: at most P alive
//   std::cout << pipeline::toString(s.stages[1]);               // "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 SG0 ..."
//
// Actions. Forward(mb) runs the stage's module on micro-batch mb's input and
// keeps what backward needs (the activations of mb stay alive until
// Backward(mb)); Backward(mb) back-propagates mb's output gradient (on the last
// stage: the loss of mb) into the stage's parameters and its input.
// RecvActivation(mb) / SendActivation(mb) move mb's activation from stage s to
// stage s + 1; RecvGrad(mb) / SendGrad(mb) move the gradient of that activation
// back from s + 1 to s. A send never blocks its stage (isend); a receive blocks
// until the matching send has been issued.
//
// Invariants checkSchedule enforces (InvalidArgumentError naming the stage,
// the action's position and what is wrong):
//  - shape: at least one stage and micro-batch; every action's micro-batch in
//    [0, M); every stage runs Forward(mb) and Backward(mb) exactly once for
//    every mb, Forward before Backward;
//  - data flow: on stage s > 0 RecvActivation(mb) precedes Forward(mb) and
//    SendGrad(mb) follows Backward(mb); on stage s < P - 1 SendActivation(mb)
//    follows Forward(mb) and RecvGrad(mb) precedes Backward(mb); the first
//    stage receives no activation and sends no gradient, the last sends no
//    activation and receives no gradient; each of these once per mb;
//  - matching: every send has its receive on the neighbouring stage, in the
//    same order (transfers between two stages match in issue order);
//  - progress: running all stages together, with non-blocking sends and
//    blocking receives, reaches the end: no stage waits forever (the check
//    names the stages and the actions they are stuck on otherwise).
// The report gives each stage's peak number of micro-batches whose activations
// are alive (forwarded, not yet backwarded).
//
// Threading: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::pipeline {

enum class ActionKind : uint8_t { Forward, Backward, SendActivation, RecvActivation, SendGrad, RecvGrad };
// "F", "B", "SA", "RA", "SG", "RG".
const char* actionKindName(ActionKind k);

struct Action {
  ActionKind kind;
  int microbatch;
  bool operator==(const Action&) const = default;
};

struct Schedule {
  int microbatches = 0;
  std::vector<std::vector<Action>> stages;  // stages[s]: stage s's actions, in order
  int numStages() const { return static_cast<int>(stages.size()); }
};

// GPipe: every micro-batch's forward, then every micro-batch's backward, both
// in micro-batch order. M activations alive on every stage. stages >= 1, microbatches >= 1 (InvalidArgumentError otherwise).
Schedule gpipe(int stages, int microbatches);

// 1F1B (PipeDream-Flush): stage s runs min(P - s - 1, M) warm-up forwards,
// then alternates one forward and one backward, then drains the remaining
// backwards. At most min(P - s, M) micro-batches' activations are alive on
// stage s. Same argument checks as gpipe.
Schedule oneFOneB(int stages, int microbatches);

struct ScheduleReport {
  std::vector<int> peakActivations;  // per stage
};

// Checks the invariants above; InvalidArgumentError on the first violation.
ScheduleReport checkSchedule(const Schedule& schedule);

// "RA0 F0 SA0 ..." (actionKindName and the micro-batch).
std::string toString(const std::vector<Action>& actions);

}  // namespace weft::pipeline
