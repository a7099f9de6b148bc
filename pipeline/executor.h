// PipelineExecutor: runs one pipeline stage per process, following a
// Schedule (pipeline/schedule.h), over a ProcessGroup's point-to-point
// transfers: activations forward to the next stage, their gradients back.
// One training step = every action of this stage's list for M micro-batches,
// with gradients accumulated into the stage's parameters' .grad; the
// optimizer then steps this stage's parameters locally.
//
//   auto pg = collectives::init();                          // one rank per stage
//   const int stage = pg->rank(), P = pg->size();
//   auto gpt = std::make_shared<nn::GPT>(cfg, &gen);        // same seed on every rank
//   auto layers = pipeline::gptLayers(gpt);
//   auto mine = pipeline::splitSequential(*layers, pipeline::cutsByParameterCount(*layers, P))[stage];
//   pipeline::PipelineExecutor pipe(*pg, mine, pipeline::oneFOneB(P, /*microbatches=*/4),
//       [](const Tensor& logits, const Tensor& y) {
//         return crossEntropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
//       },
//       {.tied = pipeline::gptTiedParameters(*gpt, stage, P)});
//   nn::optim::AdamW opt(mine->parameters(), {.lr = 3e-4});
//   opt.zeroGrad();
//   Tensor loss = pipe.step(x, y);   // x read on stage 0, y on the last; loss defined on the last
//   opt.step();
//
// Contract.
//  - Stage s is rank s of `pg`; the schedule has pg.size() stages (checked
//    with checkSchedule at construction: InvalidArgumentError otherwise).
//    Every rank constructs its executor with the same schedule and calls
//    step() the same number of times.
//  - step(input, target): stage 0 splits `input` along dim 0 into M equal
//    micro-batches, the last stage splits `target` alike (each must be
//    defined there, with dim 0 divisible by M: InvalidArgumentError naming
//    the size and M); other stages ignore what they are passed. The loss
//    function returns a scalar, the mean over its micro-batch; each
//    micro-batch's loss is scaled by 1/M before its backward, so the
//    accumulated gradients are those of the mean loss over the whole batch,
//    as one single-process step on it (up to float rounding of the sum).
//    Dropout draws from each stage process's own default generator, so with
//    dropout the step equals a single-process one in distribution only.
//    step() returns the mean of the micro-batch losses (detached) on the last
//    stage and an undefined Tensor on the others. It adds into .grad: zero
//    the gradients between steps (the optimizer's zeroGrad).
//  - Shapes are agreed once per step: before the first activation of a step,
//    each stage sends the next the dtype and shape of its output (a small
//    Int64 message); every micro-batch's activation must have them
//    (InvalidArgumentError naming both shapes otherwise). Gradients have the
//    activation's shape. Activations and gradients are sent as they are
//    (contiguous tensors are not copied) and receives land in tensors
//    allocated once per micro-batch.
//  - Sends are isends, waited for at the end of the step, so computation
//    overlaps them; a sent tensor is released as soon as its send completes
//    (checked before each action). A receive blocks the stage, as the schedule says, but is
//    posted early: when a stage takes a received activation (or gradient)
//    it posts the receive of the next one in its list, so that transfer
//    overlaps the computation between them (one extra buffer per kind).
//  - Activations: Forward(mb) keeps mb's input and output (and the autograd
//    graph between them) until Backward(mb) releases them, so the schedule's
//    peakActivations is the number of micro-batches whose activations a stage
//    holds at once.
//
// Tied parameters. A parameter listed in `tied` (TiedParameter, see
// pipeline/stage.h) also lives on stage peerStage; after the step's last
// backward the two stages exchange its gradient and each adds the other's,
// in the order the lists give (both stages list them in the same order).
//
// Data parallel (dp x pp). Several replicas of the pipeline, each a group of
// P ranks (`pg`), train on different parts of a batch; `dataParallel` is the
// group of the ranks that hold this stage in every replica. After the tied
// exchange, the stage's gradients (and, on the last stage, the step's loss)
// are averaged over that group in one allReduce of a flat buffer (float32
// parameters; InvalidArgumentError otherwise), so every
// replica holds the gradients of the mean loss over all replicas' batches
// and takes the same optimizer step. Groups for D replicas of P stages on
// D·P ranks, replica d being ranks d·P .. d·P + P − 1 (every rank calls
// newGroup for every list, in the same order):
//
//   std::unique_ptr<ProcessGroup> pp, dp;
//   for (int d = 0; d < D; ++d) if (auto g = world->newGroup(ranksOfReplica(d))) pp = std::move(g);
//   for (int s = 0; s < P; ++s) if (auto g = world->newGroup(ranksOfStage(s))) dp = std::move(g);
//   PipelineExecutor pipe(*pp, mine, oneFOneB(P, M), loss, {.tied = tied, .dataParallel = dp.get()});
//
// Checkpointing (ExecutorOptions::checkpoint, typically with GPipe). Each
// Forward runs the stage under checkpoint() (tensor/checkpoint.h): a
// micro-batch keeps only its input and output until its Backward, which runs
// the stage's forward again and back-propagates through it; gradients equal
// those without checkpointing, dropout included. An input that requires no
// gradient (the first stage's data) would make checkpoint() run plainly, so
// there, when the stage is a Sequential of several layers, its first layer
// runs plainly and the rest under checkpoint().
//
// Errors. A failed transfer raises the process group's error with the same
// type, its message prefixed by what the stage was doing:
// "pipeline stage 2: receiving the activation of micro-batch 3 from stage 1:
// ...". A stage whose process died gives its neighbours DisconnectedError
// naming its rank; a stage that stalls, TimeoutError after the group's
// timeout. Stages further away hear of it from their failed neighbour in
// turn: DisconnectedError when its process ends, TimeoutError while it lives
// on; no stage waits on a receive forever (the process group bounds each).
// The group is unusable afterwards (StateError), as
// collectives/process_group.h says.
//
// A step that throws leaves receives it posted pending, which could match
// the transfers of a later step: the executor then refuses further steps
// (StateError); recovery is a new process group and executor.
//
// Threading: call step() from one thread; the stage's module must not be
// used elsewhere during a step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/process_group.h"
#include "nn/module.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"

namespace weft::pipeline {

// (output of the last stage for one micro-batch, its target) -> scalar loss.
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

// One action of a step as it ran, in microseconds of the steady clock
// (CLOCK_MONOTONIC: comparable between processes of one machine).
struct TraceEvent {
  ActionKind kind;
  int microbatch;
  double startUs;
  double endUs;
};

// What the last step did on this stage.
struct StepStats {
  double computeSeconds = 0.0;  // in Forward and Backward actions (the loss included)
  double waitSeconds = 0.0;     // blocked on receives and on the sends' completion
  double stepSeconds = 0.0;     // the whole step, from its start to its return
  int peakActivations = 0;      // micro-batches whose activations were alive at once
  // The most tensor bytes live (Storage::memoryStats) above the step's start,
  // sampled after each Forward: the activations the stage holds (and the
  // receive buffers posted), without backward's temporaries. Process-wide:
  // meaningful where the stage's process does nothing else meanwhile.
  size_t activationBytes = 0;
  std::vector<TraceEvent> events;  // Forward, Backward and the receives' waits, in order
};

// The events of stage `stage` as Chrome trace events ("X" events, one
// process per stage, named "stage S"), comma-separated without the enclosing
// brackets, so that the stages' strings joined with commas and wrapped in
// [ ] are a trace file chrome://tracing and Perfetto open.
std::string chromeTraceEvents(int stage, const std::vector<TraceEvent>& events);

struct ExecutorOptions {
  // Parameters shared with another stage (see "Tied parameters").
  std::vector<TiedParameter> tied;
  // The group of this stage's replicas (see "Data parallel"), or null; it
  // must outlive the executor.
  collectives::ProcessGroup* dataParallel = nullptr;
  // Activation checkpointing (see "Checkpointing").
  bool checkpoint = false;
};

class PipelineExecutor {
 public:
  // `loss` is used on the last stage only (may be empty elsewhere).
  PipelineExecutor(collectives::ProcessGroup& pg, std::shared_ptr<nn::Module> stage, Schedule schedule, LossFn loss,
                   ExecutorOptions options = {});

  Tensor step(const Tensor& input, const Tensor& target = Tensor());

  int stage() const { return stage_; }
  int numStages() const { return numStages_; }
  const Schedule& schedule() const { return schedule_; }
  const StepStats& lastStats() const { return stats_; }

 private:
  struct Micro;
  void forward(Micro& m, int mb);
  Tensor checkpointedForward(const Tensor& input);
  void backward(Micro& m, int mb);
  void sendActivation(Micro& m, int mb);
  void recvActivation(Micro& m, int mb);
  void sendGrad(Micro& m, int mb);
  void recvGrad(Micro& m, int mb);
  void exchangeTied();
  // Averages the gradients (and `loss` on the last stage) over dataParallel_.
  void averageOverReplicas(double& loss);
  void waitFor(const collectives::Work& work, const std::string& what);
  // Raises the DisconnectedError or TimeoutError of a failed transfer of this
  // step, if there is one, prefixed with `context`.
  void rethrowFirstFailure(const std::string& context) const;
  uint32_t tagOf(int kind, int mb) const;
  // A receive posted ahead of its action.
  struct Posted {
    int microbatch = -1;
    Tensor buffer;
    collectives::Work work;
  };
  // Takes mb's receive of `kind` (posting it now unless posted ahead) and
  // posts the next receive of that kind in this stage's list.
  Tensor receive(ActionKind kind, int mb, const std::string& what);
  void post(ActionKind kind, int mb);
  void record(ActionKind kind, int mb, double startUs);

  collectives::ProcessGroup& pg_;
  std::shared_ptr<nn::Module> module_;
  Schedule schedule_;
  LossFn loss_;
  std::vector<TiedParameter> tied_;
  collectives::ProcessGroup* dataParallel_;
  bool checkpoint_;
  int stage_;
  int numStages_;
  StepStats stats_;

  // State of the step in progress.
  std::vector<Micro>* micros_ = nullptr;
  // Sends not yet seen complete, with the tensors they read (kept alive until
  // then; dropped as soon as they complete, so that a sent activation is not
  // held longer than its micro-batch).
  struct PendingSend {
    collectives::Work work;
    Tensor buffer;
  };
  std::vector<PendingSend> pendingSends_;
  void send(const Tensor& t, int dst, uint32_t tag);
  void dropCompletedSends();
  void noteActivationBytes();
  size_t liveAtStart_ = 0;
  bool shapeSent_ = false;
  bool shapeKnown_ = false;
  Shape shape_;        // this step's activation shape, received from the previous stage
  DType dtype_ = DType::Float32;
  Shape sentShape_;    // this step's shape sent to the next stage
  DType sentDtype_ = DType::Float32;
  int alive_ = 0;
  size_t position_ = 0;  // the action running, in this stage's list
  bool broken_ = false;  // a step threw: transfers it posted may still be pending
  Posted postedActivation_;
  Posted postedGrad_;
};

}  // namespace weft::pipeline
