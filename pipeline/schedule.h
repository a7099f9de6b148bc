// Pipeline schedules as data: for each of P stages, the list of actions it
// runs in one training step over M micro-batches. A schedule is produced by a
// small function (gpipe, oneFOneB, interleavedOneFOneB) and run by one executor
// (pipeline/executor.h); checkSchedule proves a schedule's invariants without
// running a model.
//
//   pipeline::Schedule s = pipeline::oneFOneB(/*stages=*/4, /*microbatches=*/6);
//   pipeline::ScheduleReport r = pipeline::checkSchedule(s);   // throws if broken
//   r.peakActivations[0];                                       // 4: at most P alive
//   std::cout << pipeline::toString(s.stages[1]);               // "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 SG0 ..."
//   pipeline::Schedule v = pipeline::interleavedOneFOneB(4, /*chunks=*/2, 8);   // virtual stages
//   pipeline::idealBubble(v);                                   // 3/19: (P - 1)/(V·M + P - 1)
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
// Virtual stages (interleaved schedules). A schedule of V chunks cuts the
// model into V·P model stages; stage (process) s holds chunks 0..V-1, chunk c
// being model stage c·P + s. Every action names its chunk: Forward(mb, c) runs
// chunk c; SendActivation(mb, c) sends chunk c's output to the next model
// stage, c·P + s + 1 (on stage s + 1, chunk c; from the last stage, to stage 0,
// chunk c + 1), and RecvGrad(mb, c) receives its gradient back from there;
// RecvActivation(mb, c) / SendGrad(mb, c) face the previous model stage alike.
// The first model stage (stage 0, chunk 0) reads the data, the last (stage
// P - 1, chunk V - 1) computes the loss. V = 1 is the plain pipeline above,
// every action of chunk 0. In the rules below, read "stage" as "model stage"
// and "micro-batch" as "(micro-batch, chunk)".
//
// Invariants checkSchedule enforces (InvalidArgumentError naming the stage,
// the action's position and what is wrong):
//  - shape: at least one stage, chunk and micro-batch (two stages or more
//    when V > 1); every action's micro-batch in [0, M) and chunk in [0, V);
//    every stage runs Forward(mb) and Backward(mb) exactly once for
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
// The report gives each stage's peak number of (micro-batch, chunk) pairs
// whose activations are alive (forwarded, not yet backwarded): with V chunks
// each holds about 1/V of a whole stage's activations.
//
// Threading: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <span>
#include <vector>

namespace weft::pipeline {

enum class ActionKind : uint8_t { Forward, Backward, SendActivation, RecvActivation, SendGrad, RecvGrad };
// "F", "B", "SA", "RA", "SG", "RG".
const char* actionKindName(ActionKind k);

struct Action {
  ActionKind kind;
  int microbatch;
  int chunk = 0;  // the virtual stage on this stage (0 without interleaving)
  bool operator==(const Action&) const = default;
};

struct Schedule {
  int microbatches = 0;
  std::vector<std::vector<Action>> stages;  // stages[s]: stage s's actions, in order
  int chunks = 1;                           // V: model chunks (virtual stages) per stage
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

// Interleaved 1F1B (Megatron-LM's schedule with virtual stages): stage s
// holds V = `chunks` model chunks. Its forwards run in groups of micro-batches,
// chunk after chunk within a group: F(0,c0) .. F(G-1,c0), F(0,c1) ..
// F(G-1,c1), .., then the next group; its backwards run in the same order
// with the chunks reversed (V - 1 first). Groups hold P micro-batches, but
// the first holds G = P + (M mod P) (all M when M < P), so that no group is
// shorter than the P stages a micro-batch crosses before its next chunk.
// Stage s runs min((P - s - 1)·2 + (V - 1)·G, V·M) warm-up forwards, then
// alternates one forward and one backward, then drains the backwards: at
// most one more (micro-batch, chunk) than its warm-up is alive (V·M at
// most). Each chunk being 1/V of a stage, the bubble shrinks V-fold against
// 1F1B: with equal chunks, forward f and backward b per micro-batch on each
// stage, and free communication, a step takes (M + (P - 1)/V)·(f + b) for
// M >= P, a bubble fraction of (P - 1)/(V·M + P - 1) (idealBubble gives
// exactly that); for M < P stage 0 waits for each chunk's micro-batches to
// come round, and the bubble lies between that and 1F1B's. chunks == 1 gives
// oneFOneB(stages, microbatches); chunks > 1 needs stages >= 2
// (InvalidArgumentError otherwise, and for chunks < 1 as gpipe does).
Schedule interleavedOneFOneB(int stages, int chunks, int microbatches);

// The fraction of a step a stage idles, averaged over the stages, if every
// forward of a chunk took forwardCost / V and every backward backwardCost / V,
// communication were free, and every action started as soon as the schedule
// and its receives allow: 1 - (the stages' busy time) / (P · the step's end).
// The schedule's theory to set a measured bubble beside. The schedule must
// pass checkSchedule; costs must be positive (InvalidArgumentError otherwise).
double idealBubble(const Schedule& schedule, double forwardCost = 1.0, double backwardCost = 2.0);

// The same with each stage's own costs of one action (one chunk's forward or
// backward): forwardCost[s] and backwardCost[s] for stage s, e.g. measured
// medians. With uneven stages the bubble is what that imbalance costs under
// free communication, so a measured bubble minus this is what the transfers
// and the executor cost. One positive cost per stage each
// (InvalidArgumentError otherwise).
double idealBubble(const Schedule& schedule, std::span<const double> forwardCost,
                   std::span<const double> backwardCost);

struct ScheduleReport {
  std::vector<int> peakActivations;  // per stage
};

// Checks the invariants above; InvalidArgumentError on the first violation.
ScheduleReport checkSchedule(const Schedule& schedule);

// "RA0 F0 SA0 ..." (actionKindName and the micro-batch, then "v" and the
// chunk where it is not 0: "F3v1").
std::string toString(const std::vector<Action>& actions);

}  // namespace weft::pipeline
