// PipelineExecutor: runs one pipeline stage per process, following a
// Schedule (pipeline/schedule.h): activations forward to the next stage,
// their gradients back, through shared memory between stages on one machine
// and the ProcessGroup's point-to-point transfers otherwise.
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
//  - Shapes are agreed once per step: with the first activation of a step,
//    each stage tells the next the dtype and shape of its output (a small
//    Int64 message, or the header of a shared-memory message); every
//    micro-batch's activation must have them (InvalidArgumentError naming
//    both shapes otherwise). Gradients have the activation's shape.
//    Receives land in tensors allocated once per micro-batch.
//  - Through shared memory (see "Shared memory"), a send copies the tensor
//    into the link's ring and is done; a receive waits for its message and
//    copies it out.
//  - Through the group, activations and gradients are sent as they are
//    (contiguous tensors are not copied). Sends are isends, waited for at
//    the end of the step, so computation overlaps them; a sent tensor is
//    released as soon as its send completes (checked before each action). A
//    receive blocks the stage, as the schedule says, but is posted early:
//    when a stage takes a received activation (or gradient) it posts the
//    receive of the next one in its list, so that transfer overlaps the
//    computation between them (one extra buffer per kind). While a send or a
//    posted receive is open, the stage yields its CPU between actions, so
//    that the group's threads (Gloo's loop thread does not preempt on
//    wakeup) move the transfer on when the stages keep every CPU busy.
//  - Activations: Forward(mb) keeps mb's input and output (and the autograd
//    graph between them) until Backward(mb) releases them, so the schedule's
//    peakActivations is the number of micro-batches whose activations a stage
//    holds at once.
//
// Virtual stages (interleaved schedules, Schedule::chunks = V > 1). The stage
// holds V modules, the model's chunks: `chunks[c]` is model stage c·P + s of
// the model cut into V·P pieces (the second constructor; the first is V = 1).
// Each action runs on the chunk it names. Stage 0's chunk 0 reads `input`,
// stage P - 1's chunk V - 1 computes the loss; every other chunk receives its
// input from the previous model stage and sends its output to the next:
// stage s + 1's same chunk, or from stage P - 1 to stage 0's next chunk.
// Every link between two model stages agrees its own shape once per step,
// has its own tags and its own receive posted ahead, so the chunks'
// transfers between two processes never mix. Tied parameters and data
// parallelism cover every chunk's parameters. Errors name the chunk:
// "pipeline stage 0: receiving the activation of micro-batch 3 (chunk 1)
// from stage 1: ...".
//
// Shared memory (ExecutorOptions::sharedMemory, on by default). At its first
// step each stage offers, for every link to a neighbouring model stage, a
// ring it writes (pipeline/shm_ring.h: a memfd, mapped by the neighbour
// through /proc/<pid>/fd): the earlier stage's for the activations, the
// later's for the gradients. Each side maps the other's ring and says
// whether it could (four small messages per link through the group, once);
// a link uses the rings when both sides could: stages of one user on one
// machine. Otherwise (another machine, a process that may not open the
// other's descriptors, WEFT_PIPELINE_SHM=0 or sharedMemory false on either
// side) the link goes through the group for good. A ring holds one slot per
// micro-batch; each step, the earlier stage decides with its first
// activation whether the step's M messages fit both rings
// (ExecutorOptions::sharedMemoryBytes each way, CPU tensors): if not, the
// ring's message headers still carry the shape, and the data of that step
// goes through the group. Why: a transfer through Gloo costs each busy stage
// about 40 system calls and wake-ups of Gloo's loop thread and a waiter
// thread on its own CPU, which showed as 0.04-0.11 of a 2-stage step's
// bubble above the schedule's (README, "Pipeline parallelism"); a ring
// message costs a copy on each side. A stage waiting on a ring spins for
// 20 µs, then sleeps until the neighbour writes, checking every 10 ms that
// the neighbour's process lives. The rings' pages (M messages of the
// largest step, each way, per link) are not in Storage::memoryStats.
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
// naming its rank (through shared memory: "the connection to rank 1 was
// lost: its process (pid N) ended", within about 10 ms); a stage that
// stalls, TimeoutError after the group's timeout (ProcessGroup::timeout,
// also for a wait on a ring). Stages further away hear of it from their
// failed neighbour in turn: DisconnectedError when its process ends,
// TimeoutError while it lives on; no stage waits on a receive forever. A
// failed transfer through the group leaves the group unusable (StateError),
// as collectives/process_group.h says; a failed wait on a ring leaves the
// group as it was.
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
  int chunk = 0;
};

// What the last step did on this stage.
struct StepStats {
  double computeSeconds = 0.0;  // in Forward and Backward actions (the loss included)
  double waitSeconds = 0.0;     // blocked on receives and on the sends' completion
  // On this stage's thread in the transfers, not blocked: the send calls (the
  // copy into the message and the socket writes run inside them), posting
  // receives and taking what they brought, and the yields between actions
  // that let the group's threads move the transfers (see the Contract's
  // point on sends and receives).
  // What the stage's other threads spend on its CPU is not in it.
  double transferSeconds = 0.0;
  double stepSeconds = 0.0;     // the whole step, from its start to its return
  int peakActivations = 0;      // (micro-batch, chunk) pairs whose activations were alive at once
  // The most tensor bytes live (Storage::memoryStats) above the step's start,
  // sampled after each Forward: the activations the stage holds (and the
  // receive buffers posted), without backward's temporaries. Process-wide:
  // meaningful where the stage's process does nothing else meanwhile.
  size_t activationBytes = 0;
  // Forward, Backward, the receives' waits and the send calls, in order.
  std::vector<TraceEvent> events;
  int transfers = 0;  // sends and receives of activations and gradients
  // What this stage wrote into shared-memory rings (see "Shared memory"): each
  // message's 128-byte header, and its data when the data went that way.
  size_t sharedMemoryBytes = 0;
};

// The events of stage `stage` as Chrome trace events ("X" events, one
// process per stage, named "stage S"), comma-separated without the enclosing
// brackets, so that the stages' strings joined with commas and wrapped in
// [ ] are a trace file chrome://tracing and Perfetto open. Categories:
// "compute" (Forward, Backward), "wait" (a receive's wait for its data) and
// "send" (the send call).
std::string chromeTraceEvents(int stage, const std::vector<TraceEvent>& events);

struct ExecutorOptions {
  // Parameters shared with another stage (see "Tied parameters").
  std::vector<TiedParameter> tied;
  // The group of this stage's replicas (see "Data parallel"), or null; it
  // must outlive the executor.
  collectives::ProcessGroup* dataParallel = nullptr;
  // Activation checkpointing (see "Checkpointing").
  bool checkpoint = false;
  // Links to stages on this machine through shared memory (see "Shared
  // memory"); WEFT_PIPELINE_SHM=0 in the environment turns it off for every
  // executor of the process.
  bool sharedMemory = true;
  // The most bytes of one step's messages a shared-memory link carries each
  // way (M messages of the step's activation size); a step with more sends
  // its data through the process group. Address space: pages are allocated as
  // they are first written.
  size_t sharedMemoryBytes = size_t{256} << 20;
};

class PipelineExecutor {
 public:
  // `loss` is used on the last stage only (may be empty elsewhere).
  PipelineExecutor(collectives::ProcessGroup& pg, std::shared_ptr<nn::Module> stage, Schedule schedule, LossFn loss,
                   ExecutorOptions options = {});
  // One module per chunk of an interleaved schedule: chunks.size() ==
  // schedule.chunks, none null (InvalidArgumentError otherwise).
  PipelineExecutor(collectives::ProcessGroup& pg, std::vector<std::shared_ptr<nn::Module>> chunks, Schedule schedule,
                   LossFn loss, ExecutorOptions options = {});

  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  Tensor step(const Tensor& input, const Tensor& target = Tensor());

  int stage() const { return stage_; }
  int numStages() const { return numStages_; }
  const Schedule& schedule() const { return schedule_; }
  const StepStats& lastStats() const { return stats_; }

 private:
  struct Micro;
  void forward(Micro& m, int mb, int chunk);
  Tensor checkpointedForward(const std::shared_ptr<nn::Module>& chunk, const Tensor& input);
  void backward(Micro& m, int mb, int chunk);
  void sendActivation(Micro& m, int mb, int chunk);
  void recvActivation(Micro& m, int mb, int chunk);
  void sendGrad(Micro& m, int mb, int chunk);
  void recvGrad(Micro& m, int mb, int chunk);
  // Model stage chunk·P + stage_ is the first / the last of V·P.
  bool isFirst(int chunk) const { return chunk == 0 && stage_ == 0; }
  bool isLast(int chunk) const { return chunk == chunks() - 1 && stage_ == numStages_ - 1; }
  int chunks() const { return static_cast<int>(modules_.size()); }
  // The chunk of the model stage after chunk `chunk` of this stage.
  int nextChunk(int chunk) const { return (chunk * numStages_ + stage_ + 1) / numStages_; }
  // " (chunk c)" with several chunks, "" otherwise.
  std::string chunkText(int chunk) const;
  std::vector<Tensor> parameters() const;
  void exchangeTied();
  // Averages the gradients (and `loss` on the last stage) over dataParallel_.
  void averageOverReplicas(double& loss);
  void waitFor(const collectives::Work& work, const std::string& what);
  // Raises the DisconnectedError or TimeoutError of a failed transfer of this
  // step, if there is one, prefixed with `context`.
  void rethrowFirstFailure(const std::string& context) const;
  // A link between two model stages is named by the chunk of the later one.
  uint32_t tagOf(int kind, int link, int mb) const;
  // The tag of message `message` of the shared-memory set-up on `link`.
  uint32_t ringTag(int link, int message) const;
  // A receive posted ahead of its action.
  struct Posted {
    int microbatch = -1;
    int chunk = 0;
    Tensor buffer;
    collectives::Work work;
  };
  // Takes the receive of `kind` for (mb, chunk) (posting it now unless posted
  // ahead) and posts the next receive of that kind in this stage's list whose
  // link's shape is known.
  // The receive's trace event starts at `startUs` when given (>= 0), else now.
  Tensor receive(ActionKind kind, int mb, int chunk, const std::string& what, double startUs = -1);
  // False, posting nothing, while the link's shape is unknown.
  bool post(ActionKind kind, int mb, int chunk);
  void record(ActionKind kind, int mb, int chunk, double startUs);

  collectives::ProcessGroup& pg_;
  std::vector<std::shared_ptr<nn::Module>> modules_;  // per chunk
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
  // This step's activation shape on one link, once agreed.
  struct LinkShape {
    bool known = false;
    Shape shape;
    DType dtype = DType::Float32;
  };
  // The shape a shape message or a ring message announces (ProtocolError past the limits),
  // and its writer: kMaxDims + 2 words.
  LinkShape announcedShape(const int64_t* words, int prev) const;
  static void writeShape(const Tensor& t, int64_t* words);
  std::vector<LinkShape> inShape_;   // per chunk: received from the previous model stage
  std::vector<LinkShape> outShape_;  // per chunk: sent to the next model stage
  int alive_ = 0;
  size_t position_ = 0;  // the action running, in this stage's list
  bool broken_ = false;  // a step threw: transfers it posted may still be pending
  Posted postedActivation_;
  Posted postedGrad_;

  // Shared-memory links (see "Shared memory"), per chunk: the link to the
  // next model stage (out) and from the previous one (in); null where the
  // link goes through the process group.
  struct RingLink;
  void setUpRings();
  // Waits for message mb of this step on `ring` (counted as waiting; the caller records the event).
  const int64_t* awaitRing(RingLink& ring, int mb, const std::string& what);
  RingLink* ringOut(int chunk) const;
  RingLink* ringIn(int chunk) const;
  bool sharedMemory_;
  size_t sharedMemoryBytes_;
  bool ringsSetUp_ = false;
  uint64_t steps_ = 0;  // steps started: the generation of the rings' messages
  std::vector<std::unique_ptr<RingLink>> ringsOut_;
  std::vector<std::unique_ptr<RingLink>> ringsIn_;
};

}  // namespace weft::pipeline
