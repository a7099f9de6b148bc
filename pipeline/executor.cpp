#include "pipeline/executor.h"

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "common/error.h"
#include "nn/sequential.h"
#include "pipeline/shm_ring.h"
#include "tensor/autograd.h"
#include "tensor/checkpoint.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

namespace weft::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

// Tags: one per transfer kind and micro-batch, so that a transfer can only
// ever match the one it is meant for; kept within [kTagBase, 2^32).
constexpr uint32_t kTagBase = 0x70000000u;
constexpr int kKindActivation = 0, kKindGrad = 1, kKindShape = 2, kKindTied = 3, kKindRing = 4, kKinds = 5;
// The ring set-up's messages on a link (ringTag): each side's descriptor, then
// whether it mapped the other's ring.
constexpr int kRingActivationDescriptor = 0, kRingGradDescriptor = 1, kRingActivationAck = 2, kRingGradAck = 3,
              kRingMessages = 4;
// A ring message's header words: 1 when the data is in the ring (else it goes
// through the process group), then from kRingDtype on the shape message's
// words (dtype, ndim, the sizes).
constexpr int kRingFlag = 0, kRingDtype = 1;
constexpr int kMaxMicrobatches = (1 << 26) - 1;

// The shape message: [dtype, ndim, size_0, ..., size_{ndim-1}, 0...].
constexpr int kMaxDims = 8;
constexpr int64_t kShapeLen = 2 + kMaxDims;
// The largest activation a shape message may announce, in bytes.
constexpr int64_t kMaxActivationBytes = int64_t{1} << 40;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double nowUs() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

template <class E>
[[noreturn]] void rethrowAs(const E& e, const std::string& context) {
  throw E(context + e.what());
}

bool sharedMemoryAllowed() {
  const char* env = std::getenv("WEFT_PIPELINE_SHM");
  return env == nullptr || std::string(env) != "0";
}

}  // namespace

struct PipelineExecutor::RingLink {
  std::unique_ptr<detail::ShmRing> mine;    // written here: activations out, or gradients back
  std::unique_ptr<detail::ShmRing> theirs;  // read here
  std::unique_ptr<detail::PeerProcess> peer;
  bool viaRing = false;  // this step's data in the rings (else the rings carry the headers, the group the data)
};

struct PipelineExecutor::Micro {
  Tensor input;    // the micro-batch's input (received activations require grad)
  Tensor output;   // the stage's output; on the last stage, the loss
  Tensor target;   // last stage only
  Tensor gradOut;  // the received gradient of output
  bool alive = false;
};

PipelineExecutor::PipelineExecutor(collectives::ProcessGroup& pg, std::shared_ptr<nn::Module> stage, Schedule schedule,
                                   LossFn loss, ExecutorOptions options)
    : PipelineExecutor(pg, std::vector<std::shared_ptr<nn::Module>>{std::move(stage)}, std::move(schedule),
                       std::move(loss), std::move(options)) {}

PipelineExecutor::PipelineExecutor(collectives::ProcessGroup& pg, std::vector<std::shared_ptr<nn::Module>> chunks,
                                   Schedule schedule, LossFn loss, ExecutorOptions options)
    : pg_(pg),
      modules_(std::move(chunks)),
      schedule_(std::move(schedule)),
      loss_(std::move(loss)),
      tied_(std::move(options.tied)),
      dataParallel_(options.dataParallel),
      checkpoint_(options.checkpoint),
      stage_(pg.rank()),
      numStages_(pg.size()),
      sharedMemory_(options.sharedMemory && sharedMemoryAllowed()),
      sharedMemoryBytes_(options.sharedMemoryBytes) {
  WEFT_ENFORCE(static_cast<int>(modules_.size()) == schedule_.chunks, InvalidArgumentError, "PipelineExecutor: ",
               modules_.size(), " chunk modules for a schedule of ", schedule_.chunks, " chunks");
  for (size_t c = 0; c < modules_.size(); ++c)
    WEFT_ENFORCE(modules_[c] != nullptr, InvalidArgumentError, "PipelineExecutor: null stage module",
                 modules_.size() > 1 ? " for chunk " + std::to_string(c) : std::string());
  WEFT_ENFORCE(schedule_.numStages() == numStages_, InvalidArgumentError, "PipelineExecutor: the schedule has ",
               schedule_.numStages(), " stages, but the process group has ", numStages_, " ranks");
  WEFT_ENFORCE(static_cast<int64_t>(schedule_.microbatches) * schedule_.chunks <= kMaxMicrobatches,
               InvalidArgumentError, "PipelineExecutor: at most ", kMaxMicrobatches,
               " micro-batches times chunks, got ", schedule_.microbatches, " x ", schedule_.chunks);
  checkSchedule(schedule_);
  WEFT_ENFORCE(stage_ != numStages_ - 1 || static_cast<bool>(loss_), InvalidArgumentError,
               "PipelineExecutor: the last stage needs a loss function");
  for (size_t i = 0; i < tied_.size(); ++i) {
    const TiedParameter& t = tied_[i];
    WEFT_ENFORCE(t.parameter.defined() && t.parameter.requiresGrad(), InvalidArgumentError,
                 "PipelineExecutor: tied parameter ", i, " is not a defined parameter that requires grad");
    WEFT_ENFORCE(t.peerStage >= 0 && t.peerStage < numStages_ && t.peerStage != stage_, InvalidArgumentError,
                 "PipelineExecutor: tied parameter ", i, " names peer stage ", t.peerStage, " from stage ", stage_,
                 " of ", numStages_);
  }
}

PipelineExecutor::~PipelineExecutor() = default;

std::string PipelineExecutor::chunkText(int chunk) const {
  return chunks() > 1 ? " (chunk " + std::to_string(chunk) + ")" : std::string();
}

std::vector<Tensor> PipelineExecutor::parameters() const {
  std::vector<Tensor> out;
  for (const auto& m : modules_) {
    for (const Tensor& p : m->parameters()) {
      bool seen = false;
      for (const Tensor& q : out) seen = seen || q.sameAs(p);
      if (!seen) out.push_back(p);
    }
  }
  return out;
}

uint32_t PipelineExecutor::ringTag(int link, int message) const {
  // Slots of their own (not link·M + mb: the set-up has 4 messages per link whatever M is).
  const auto slot = static_cast<uint32_t>(link) * kRingMessages + static_cast<uint32_t>(message);
  return kTagBase + slot * kKinds + static_cast<uint32_t>(kKindRing);
}

uint32_t PipelineExecutor::tagOf(int kind, int link, int mb) const {
  const auto slot = static_cast<uint32_t>(link) * static_cast<uint32_t>(schedule_.microbatches) + static_cast<uint32_t>(mb);
  return kTagBase + slot * kKinds + static_cast<uint32_t>(kind);
}

void PipelineExecutor::waitFor(const collectives::Work& work, const std::string& what) {
  const auto t0 = Clock::now();
  const std::string context = "pipeline stage " + std::to_string(stage_) + ": " + what + ": ";
  try {
    work.wait();
  } catch (const DisconnectedError& e) {
    rethrowAs(e, context);
  } catch (const TimeoutError& e) {
    rethrowAs(e, context);
  } catch (const ProtocolError& e) {
    rethrowAs(e, context);
  } catch (const StateError& e) {
    // The group broke on another transfer first (a send to a stage that
    // died, say): raise that transfer's error, whose type says what happened.
    rethrowFirstFailure(context);
    rethrowAs(e, context);
  } catch (const InvalidArgumentError& e) {
    rethrowAs(e, context);
  } catch (const RemoteError&) {
    throw;
  } catch (const Error& e) {
    rethrowAs(e, context);
  }
  stats_.waitSeconds += secondsSince(t0);
}

void PipelineExecutor::rethrowFirstFailure(const std::string& context) const {
  std::vector<collectives::Work> works;
  for (const PendingSend& p : pendingSends_) works.push_back(p.work);
  works.push_back(postedActivation_.work);
  works.push_back(postedGrad_.work);
  for (const collectives::Work& w : works) {
    if (!w.valid() || !w.isCompleted() || w.isSuccess()) continue;
    try {
      w.wait();
    } catch (const DisconnectedError& e) {
      rethrowAs(e, context);
    } catch (const TimeoutError& e) {
      rethrowAs(e, context);
    } catch (const Error&) {
    }
  }
}

Tensor PipelineExecutor::step(const Tensor& input, const Tensor& target) {
  const int m = schedule_.microbatches;
  const int v = chunks();
  // micros[c * M + mb]: micro-batch mb on chunk c.
  std::vector<Micro> micros(static_cast<size_t>(m * v));
  auto splitInto = [m](const Tensor& t, const char* what, Micro* out, bool isTarget) {
    WEFT_ENFORCE(t.defined() && t.dim() >= 1 && t.size(0) % m == 0 && t.size(0) > 0, InvalidArgumentError,
                 "PipelineExecutor::step: ", what, " must have a dim 0 divisible by the ", m,
                 " micro-batches, got ", t.defined() ? shapeString(t.shape()) : std::string("undefined"));
    const int64_t rows = t.size(0) / m;
    for (int mb = 0; mb < m; ++mb) {
      Tensor part = t.narrow(0, mb * rows, rows);
      (isTarget ? out[mb].target : out[mb].input) = part;
    }
  };
  if (stage_ == 0) splitInto(input, "input", micros.data(), false);
  if (stage_ == numStages_ - 1) splitInto(target, "target", micros.data() + static_cast<ptrdiff_t>((v - 1) * m), true);

  WEFT_ENFORCE(!broken_, StateError, "PipelineExecutor::step: stage ", stage_,
               ": an earlier step failed, and transfers it left pending may match this step's; build a new "
               "process group and executor");
  broken_ = true;
  const auto stepStart = Clock::now();
  stats_ = StepStats{};
  micros_ = &micros;
  postedActivation_ = Posted{};
  postedGrad_ = Posted{};
  pendingSends_.clear();
  liveAtStart_ = Storage::memoryStats().liveBytes;
  ++steps_;
  if (!ringsSetUp_) setUpRings();
  for (auto* rings : {&ringsOut_, &ringsIn_}) {
    for (auto& r : *rings) {
      if (r != nullptr) r->viaRing = false;
    }
  }
  inShape_.assign(static_cast<size_t>(v), LinkShape{});
  outShape_.assign(static_cast<size_t>(v), LinkShape{});
  alive_ = 0;
  struct Reset {
    PipelineExecutor* self;
    ~Reset() {
      self->micros_ = nullptr;
      self->pendingSends_.clear();
    }
  } reset{this};

  const auto& actions = schedule_.stages[static_cast<size_t>(stage_)];
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    position_ = i;
    dropCompletedSends();
    // A transfer in flight moves only when the group's threads run: Gloo's loop
    // thread (under SCHED_BATCH, collectives/gloo/detail/device.h) does not
    // preempt this thread on wakeup, so on CPUs that the stages keep busy a
    // reply that came in during the last action would otherwise wait for the
    // end of this thread's time slice (up to a scheduler tick, 4 ms).
    // Yielding between actions lets it run; with nothing else runnable it
    // returns at once.
    if (!pendingSends_.empty() || postedActivation_.work.valid() || postedGrad_.work.valid()) {
      const auto yieldStart = Clock::now();
      std::this_thread::yield();
      stats_.transferSeconds += secondsSince(yieldStart);
    }
    const bool transfer = a.kind != ActionKind::Forward && a.kind != ActionKind::Backward;
    const auto actionStart = Clock::now();
    const double waitedBefore = stats_.waitSeconds;
    Micro& mi = micros[static_cast<size_t>(a.chunk * m + a.microbatch)];
    switch (a.kind) {
      case ActionKind::Forward:
        forward(mi, a.microbatch, a.chunk);
        break;
      case ActionKind::Backward:
        backward(mi, a.microbatch, a.chunk);
        break;
      case ActionKind::SendActivation:
        sendActivation(mi, a.microbatch, a.chunk);
        break;
      case ActionKind::RecvActivation:
        recvActivation(mi, a.microbatch, a.chunk);
        break;
      case ActionKind::SendGrad:
        sendGrad(mi, a.microbatch, a.chunk);
        break;
      case ActionKind::RecvGrad:
        recvGrad(mi, a.microbatch, a.chunk);
        break;
    }
    if (transfer) {
      stats_.transferSeconds += secondsSince(actionStart) - (stats_.waitSeconds - waitedBefore);
      ++stats_.transfers;
    }
  }
  for (size_t i = 0; i < pendingSends_.size(); ++i) waitFor(pendingSends_[i].work, "completing its sends");
  pendingSends_.clear();
  exchangeTied();
  double loss = 0.0;
  if (stage_ == numStages_ - 1) {
    for (int mb = 0; mb < m; ++mb) loss += micros[static_cast<size_t>((v - 1) * m + mb)].output.item<double>();
    loss /= m;
  }
  if (dataParallel_ != nullptr) averageOverReplicas(loss);
  stats_.stepSeconds = secondsSince(stepStart);
  broken_ = false;
  return stage_ == numStages_ - 1 ? full({}, loss) : Tensor();
}

void PipelineExecutor::forward(Micro& m, int mb, int chunk) {
  WEFT_ENFORCE(m.input.defined(), StateError, "pipeline stage ", stage_, ": micro-batch ", mb, chunkText(chunk),
               " has no input at its forward");
  const auto t0 = Clock::now();
  const double startUs = nowUs();
  const auto& module = modules_[static_cast<size_t>(chunk)];
  Tensor out = checkpoint_ ? checkpointedForward(module, m.input) : module->forward(m.input);
  if (isLast(chunk)) {
    Tensor loss = loss_(out, m.target);
    WEFT_ENFORCE(loss.defined() && loss.numel() == 1, InvalidArgumentError,
                 "PipelineExecutor: the loss function must return a scalar, got ",
                 loss.defined() ? shapeString(loss.shape()) : std::string("undefined"));
    out = loss;
  }
  m.output = out;
  m.alive = true;
  stats_.peakActivations = std::max(stats_.peakActivations, ++alive_);
  stats_.computeSeconds += secondsSince(t0);
  record(ActionKind::Forward, mb, chunk, startUs);
  noteActivationBytes();
}

Tensor PipelineExecutor::checkpointedForward(const std::shared_ptr<nn::Module>& chunk, const Tensor& input) {
  std::shared_ptr<nn::Module> module = chunk;
  Tensor x = input;
  if (!input.requiresGrad()) {
    auto seq = std::dynamic_pointer_cast<nn::Sequential>(chunk);
    if (seq != nullptr && seq->size() >= 2) {
      x = seq->at(0)->forward(input);
      auto rest = std::make_shared<nn::Sequential>();
      for (size_t i = 1; i < seq->size(); ++i) rest->push_back(seq->at(i));
      module = rest;
    }
  }
  return checkpoint([module](const Tensor& t) { return module->forward(t); }, x);
}

void PipelineExecutor::backward(Micro& m, int mb, int chunk) {
  const auto t0 = Clock::now();
  const double startUs = nowUs();
  if (isLast(chunk)) {
    mul(m.output, 1.0 / schedule_.microbatches).backward();
  } else {
    WEFT_ENFORCE(m.gradOut.defined(), StateError, "pipeline stage ", stage_, ": micro-batch ", mb, chunkText(chunk),
                 " has no output gradient at its backward");
    if (m.output.requiresGrad()) m.output.backward(m.gradOut);
  }
  // The activations of mb are released here; the input stays for SendGrad.
  m.output = isLast(chunk) ? m.output.detach() : Tensor();
  m.gradOut = Tensor();
  m.alive = false;
  --alive_;
  stats_.computeSeconds += secondsSince(t0);
  record(ActionKind::Backward, mb, chunk, startUs);
}

void PipelineExecutor::sendActivation(Micro& m, int mb, int chunk) {
  const double startUs = nowUs();
  const int next = (stage_ + 1) % numStages_;
  const int link = nextChunk(chunk);
  LinkShape& sent = outShape_[static_cast<size_t>(chunk)];
  Tensor out = m.output.detach().contiguous();
  RingLink* ring = ringOut(chunk);
  if (!sent.known) {
    WEFT_ENFORCE(out.dim() <= kMaxDims, InvalidArgumentError, "pipeline stage ", stage_, ": an activation has at most ",
                 kMaxDims, " dimensions, got shape ", out.shape());
    if (ring != nullptr) {
      // The ring's message headers carry the shape; the data goes with them
      // when the step's M messages fit.
      ring->viaRing = out.device().isCpu() && ring->mine->fits(out.nbytes()) && ring->theirs->fits(out.nbytes());
    } else {
      Tensor meta = zeros({kShapeLen}, {.dtype = DType::Int64});
      writeShape(out, meta.data<int64_t>());
      send(meta, next, tagOf(kKindShape, link, 0));
    }
    sent = {true, out.shape(), out.dtype()};
  }
  WEFT_ENFORCE(out.shape() == sent.shape && out.dtype() == sent.dtype, InvalidArgumentError, "pipeline stage ",
               stage_, ": micro-batch ", mb, chunkText(chunk), "'s activation is ", out.shape(), " ",
               dtypeName(out.dtype()), ", but this step's activations are ", sent.shape, " ", dtypeName(sent.dtype),
               " (every micro-batch of a step must have the same shape)");
  if (ring != nullptr) {
    std::array<int64_t, detail::ShmRing::kHeaderWords> h{};
    h[kRingFlag] = ring->viaRing ? 1 : 0;
    writeShape(out, h.data() + kRingDtype);
    ring->mine->publish(steps_, mb, h.data(), ring->viaRing ? out.rawData() : nullptr, out.nbytes());
    stats_.sharedMemoryBytes += detail::ShmRing::kSlotHeaderBytes + (ring->viaRing ? out.nbytes() : 0);
  }
  if (ring == nullptr || !ring->viaRing) send(out, next, tagOf(kKindActivation, link, mb));
  record(ActionKind::SendActivation, mb, chunk, startUs);
}

void PipelineExecutor::writeShape(const Tensor& t, int64_t* p) {
  // What announcedShape reads: dtype, ndim, the sizes.
  p[0] = static_cast<int64_t>(t.dtype());
  p[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) p[2 + d] = t.size(d);
}

PipelineExecutor::LinkShape PipelineExecutor::announcedShape(const int64_t* p, int prev) const {
  // p: dtype, ndim, the sizes (a shape message, or a ring message's header from its dtype on).
  WEFT_ENFORCE(p[0] >= 0 && p[0] <= static_cast<int64_t>(kLastDType) && p[1] >= 0 && p[1] <= kMaxDims, ProtocolError,
               "pipeline stage ", stage_, ": stage ", prev, " announced dtype code ", p[0], " and ", p[1],
               " dimensions");
  Shape shape;
  int64_t numel = 1;
  for (int64_t d = 0; d < p[1]; ++d) {
    WEFT_ENFORCE(p[2 + d] >= 0 && (p[2 + d] == 0 || numel <= kMaxActivationBytes / p[2 + d]), ProtocolError,
                 "pipeline stage ", stage_, ": stage ", prev, " announced an activation size ", p[2 + d],
                 " in dimension ", d, " beyond the limit of ", kMaxActivationBytes, " bytes");
    numel *= p[2 + d];
    shape.push_back(p[2 + d]);
  }
  const auto dtype = static_cast<DType>(p[0]);
  WEFT_ENFORCE(numel * static_cast<int64_t>(elementSize(dtype)) <= kMaxActivationBytes, ProtocolError,
               "pipeline stage ", stage_, ": stage ", prev, " announced an activation of shape ", shape,
               " beyond the limit of ", kMaxActivationBytes, " bytes");
  return {true, shape, dtype};
}

void PipelineExecutor::recvActivation(Micro& m, int mb, int chunk) {
  const int prev = (stage_ + numStages_ - 1) % numStages_;
  LinkShape& in = inShape_[static_cast<size_t>(chunk)];
  const std::string what = "receiving the activation of micro-batch " + std::to_string(mb) + chunkText(chunk) +
                           " from stage " + std::to_string(prev);
  double startUs = -1;  // where the data comes through the group after a ring's header, the wait began here
  if (RingLink* ring = ringIn(chunk)) {
    // The message's header carries the step's shape, and says whether its data
    // came with it.
    startUs = nowUs();
    const int64_t* h = awaitRing(*ring, mb, what);
    if (!in.known) {
      WEFT_ENFORCE(h[kRingFlag] == 0 || h[kRingFlag] == 1, ProtocolError, "pipeline stage ", stage_, ": stage ",
                   prev, " wrote a ring message with flag ", h[kRingFlag]);
      in = announcedShape(h + kRingDtype, prev);
      ring->viaRing = h[kRingFlag] == 1;
      const size_t bytes = static_cast<size_t>(shapeNumel(in.shape)) * elementSize(in.dtype);
      WEFT_ENFORCE(!ring->viaRing || (ring->theirs->fits(bytes) && ring->mine->fits(bytes)), ProtocolError,
                   "pipeline stage ", stage_, ": stage ", prev, " put an activation of shape ", in.shape,
                   " in a ring too small for it");
    }
    if (ring->viaRing) {
      Tensor buf = empty(in.shape, {.dtype = in.dtype});
      record(ActionKind::RecvActivation, mb, chunk, startUs);
      ring->theirs->copyOut(mb, buf.nbytes(), buf.rawData());
      if (isFloating(in.dtype)) buf.requiresGrad_();
      m.input = buf;
      return;
    }
  } else if (!in.known) {
    Tensor meta = zeros({kShapeLen}, {.dtype = DType::Int64});
    waitFor(pg_.irecv(meta, prev, tagOf(kKindShape, chunk, 0)),
            "receiving the activation shape" + chunkText(chunk) + " from stage " + std::to_string(prev));
    in = announcedShape(meta.data<int64_t>(), prev);
  }
  Tensor buf = receive(ActionKind::RecvActivation, mb, chunk, what, startUs);
  if (isFloating(in.dtype)) buf.requiresGrad_();
  m.input = buf;
}

void PipelineExecutor::send(const Tensor& t, int dst, uint32_t tag) {
  pendingSends_.push_back({pg_.isend(t, dst, tag), t});
}

void PipelineExecutor::dropCompletedSends() {
  std::erase_if(pendingSends_, [](const PendingSend& p) { return p.work.isCompleted() && p.work.isSuccess(); });
}

void PipelineExecutor::noteActivationBytes() {
  const size_t live = Storage::memoryStats().liveBytes;
  if (live > liveAtStart_) stats_.activationBytes = std::max(stats_.activationBytes, live - liveAtStart_);
}

bool PipelineExecutor::post(ActionKind kind, int mb, int chunk) {
  const bool activation = kind == ActionKind::RecvActivation;
  const LinkShape& link = activation ? inShape_[static_cast<size_t>(chunk)] : outShape_[static_cast<size_t>(chunk)];
  if (!link.known) return false;
  const RingLink* ring = activation ? ringIn(chunk) : ringOut(chunk);
  if (ring != nullptr && ring->viaRing) return false;  // the data comes through the ring
  Posted& p = activation ? postedActivation_ : postedGrad_;
  p.microbatch = mb;
  p.chunk = chunk;
  p.buffer = empty(link.shape, {.dtype = link.dtype});
  p.work = activation ? pg_.irecv(p.buffer, (stage_ + numStages_ - 1) % numStages_, tagOf(kKindActivation, chunk, mb))
                      : pg_.irecv(p.buffer, (stage_ + 1) % numStages_, tagOf(kKindGrad, nextChunk(chunk), mb));
  return true;
}

Tensor PipelineExecutor::receive(ActionKind kind, int mb, int chunk, const std::string& what, double startUs) {
  Posted& p = kind == ActionKind::RecvActivation ? postedActivation_ : postedGrad_;
  if (p.microbatch != mb || p.chunk != chunk) {
    WEFT_ENFORCE(p.microbatch < 0, StateError, "pipeline stage ", stage_, ": a receive of micro-batch ", p.microbatch,
                 chunkText(p.chunk), " is posted ahead of ", mb, chunkText(chunk));
    WEFT_ENFORCE(post(kind, mb, chunk), StateError, "pipeline stage ", stage_, ": ", what,
                 ": the activation shape is not known");
  }
  if (startUs < 0) startUs = nowUs();
  waitFor(p.work, what);
  record(kind, mb, chunk, startUs);
  Tensor buf = p.buffer;
  p = Posted{};
  const auto& actions = schedule_.stages[static_cast<size_t>(stage_)];
  for (size_t i = position_ + 1; i < actions.size(); ++i) {
    if (actions[i].kind == kind) {
      post(kind, actions[i].microbatch, actions[i].chunk);
      break;
    }
  }
  return buf;
}

void PipelineExecutor::record(ActionKind kind, int mb, int chunk, double startUs) {
  stats_.events.push_back({kind, mb, startUs, nowUs(), chunk});
}

std::string chromeTraceEvents(int stage, const std::vector<TraceEvent>& events) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"stage %d\"}}",
                stage, stage);
  out += line;
  for (const TraceEvent& e : events) {
    const bool compute = e.kind == ActionKind::Forward || e.kind == ActionKind::Backward;
    const bool send = e.kind == ActionKind::SendActivation || e.kind == ActionKind::SendGrad;
    char name[48];
    if (e.chunk != 0) {
      std::snprintf(name, sizeof name, "%s%dv%d", actionKindName(e.kind), e.microbatch, e.chunk);
    } else {
      std::snprintf(name, sizeof name, "%s%d", actionKindName(e.kind), e.microbatch);
    }
    std::snprintf(line, sizeof line,
                  ",{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,"
                  "\"dur\":%.3f}",
                  name, compute ? "compute" : send ? "send" : "wait", stage, e.startUs, e.endUs - e.startUs);
    out += line;
  }
  return out;
}

void PipelineExecutor::sendGrad(Micro& m, int mb, int chunk) {
  const double startUs = nowUs();
  const LinkShape& in = inShape_[static_cast<size_t>(chunk)];
  Tensor g = m.input.defined() ? m.input.grad() : Tensor();
  g = g.defined() ? g.contiguous() : zeros(in.shape, {.dtype = in.dtype});
  RingLink* ring = ringIn(chunk);
  if (ring != nullptr && ring->viaRing) {
    std::array<int64_t, detail::ShmRing::kHeaderWords> h{};
    h[kRingFlag] = 1;
    ring->mine->publish(steps_, mb, h.data(), g.rawData(), g.nbytes());
    stats_.sharedMemoryBytes += detail::ShmRing::kSlotHeaderBytes + g.nbytes();
  } else {
    send(g, (stage_ + numStages_ - 1) % numStages_, tagOf(kKindGrad, chunk, mb));
  }
  m.input = Tensor();
  record(ActionKind::SendGrad, mb, chunk, startUs);
}

void PipelineExecutor::recvGrad(Micro& m, int mb, int chunk) {
  const int next = (stage_ + 1) % numStages_;
  const std::string what = "receiving the gradient of micro-batch " + std::to_string(mb) + chunkText(chunk) +
                           " from stage " + std::to_string(next);
  RingLink* ring = ringOut(chunk);
  if (ring != nullptr && ring->viaRing) {
    const LinkShape& link = outShape_[static_cast<size_t>(chunk)];
    const double startUs = nowUs();
    awaitRing(*ring, mb, what);
    record(ActionKind::RecvGrad, mb, chunk, startUs);
    Tensor buf = empty(link.shape, {.dtype = link.dtype});
    ring->theirs->copyOut(mb, buf.nbytes(), buf.rawData());
    m.gradOut = buf;
    return;
  }
  m.gradOut = receive(ActionKind::RecvGrad, mb, chunk, what);
}

const int64_t* PipelineExecutor::awaitRing(RingLink& ring, int mb, const std::string& what) {
  const auto t0 = Clock::now();
  const int64_t* h = ring.theirs->await(steps_, mb, *ring.peer, t0 + pg_.timeout(),
                                        "pipeline stage " + std::to_string(stage_) + ": " + what);
  stats_.waitSeconds += secondsSince(t0);
  return h;
}

PipelineExecutor::RingLink* PipelineExecutor::ringOut(int chunk) const {
  return ringsOut_.empty() ? nullptr : ringsOut_[static_cast<size_t>(chunk)].get();
}

PipelineExecutor::RingLink* PipelineExecutor::ringIn(int chunk) const {
  return ringsIn_.empty() ? nullptr : ringsIn_[static_cast<size_t>(chunk)].get();
}

void PipelineExecutor::setUpRings() {
  ringsSetUp_ = true;
  const int v = chunks();
  ringsOut_.resize(static_cast<size_t>(v));
  ringsIn_.resize(static_cast<size_t>(v));
  if (numStages_ == 1) return;
  const int m = schedule_.microbatches;
  // Each link between two model stages has two rings: the activations',
  // written by the earlier stage, and the gradients', written by the later.
  // Both sides offer theirs, map the other's and say whether they could; the
  // link uses shared memory when both could.
  struct Side {
    int chunk;
    bool out;  // the link to the next model stage (this stage writes its activations)
    int peer;
    int link;  // tagOf's link: the later stage's chunk
    std::unique_ptr<detail::ShmRing> mine{}, theirs{};
    detail::RingDescriptor theirDescriptor{};
    Tensor myWords{}, theirWords{}, myAck{}, theirAck{};
  };
  std::vector<Side> sides;
  for (int c = 0; c < v; ++c) {
    if (!isLast(c)) sides.push_back({.chunk = c, .out = true, .peer = (stage_ + 1) % numStages_, .link = nextChunk(c)});
    if (!isFirst(c)) sides.push_back({.chunk = c, .out = false, .peer = (stage_ + numStages_ - 1) % numStages_, .link = c});
  }
  auto linkText = [this](const Side& s) {
    return std::string("setting up the shared-memory link") + chunkText(s.chunk) + " with stage " +
           std::to_string(s.peer);
  };
  std::vector<collectives::Work> works;
  for (Side& s : sides) {
    detail::RingDescriptor d;
    if (sharedMemory_) {
      try {
        s.mine = detail::ShmRing::create(m, sharedMemoryBytes_);
        d = s.mine->descriptor();
      } catch (const Error&) {
        s.mine.reset();  // the system refused: this link goes through the group
      }
    }
    s.myWords = zeros({detail::RingDescriptor::kWords}, {.dtype = DType::Int64});
    s.theirWords = zeros({detail::RingDescriptor::kWords}, {.dtype = DType::Int64});
    d.toWords(s.myWords.data<int64_t>());
    const int mine = s.out ? kRingActivationDescriptor : kRingGradDescriptor;
    const int theirs = s.out ? kRingGradDescriptor : kRingActivationDescriptor;
    works.push_back(pg_.isend(s.myWords, s.peer, ringTag(s.link, mine)));
    works.push_back(pg_.irecv(s.theirWords, s.peer, ringTag(s.link, theirs)));
  }
  for (size_t i = 0; i < works.size(); ++i) waitFor(works[i], linkText(sides[i / 2]));
  works.clear();
  for (Side& s : sides) {
    s.theirDescriptor = detail::RingDescriptor::fromWords(s.theirWords.data<int64_t>());
    std::string why;
    if (s.mine != nullptr) s.theirs = detail::ShmRing::attach(s.theirDescriptor, m, &why);
    s.myAck = full({1}, s.theirs != nullptr ? 1.0 : 0.0, {.dtype = DType::Int64});
    s.theirAck = zeros({1}, {.dtype = DType::Int64});
    const int mine = s.out ? kRingGradAck : kRingActivationAck;
    const int theirs = s.out ? kRingActivationAck : kRingGradAck;
    works.push_back(pg_.isend(s.myAck, s.peer, ringTag(s.link, mine)));
    works.push_back(pg_.irecv(s.theirAck, s.peer, ringTag(s.link, theirs)));
  }
  for (size_t i = 0; i < works.size(); ++i) waitFor(works[i], linkText(sides[i / 2]));
  for (Side& s : sides) {
    if (s.theirs == nullptr || s.theirAck.data<int64_t>()[0] != 1) continue;
    auto link = std::make_unique<RingLink>();
    s.mine->releaseFd();
    link->mine = std::move(s.mine);
    link->theirs = std::move(s.theirs);
    link->peer = std::make_unique<detail::PeerProcess>(s.theirDescriptor.pid, s.peer);
    (s.out ? ringsOut_ : ringsIn_)[static_cast<size_t>(s.chunk)] = std::move(link);
  }
}

void PipelineExecutor::averageOverReplicas(double& loss) {
  const std::vector<Tensor> params = parameters();
  int64_t total = 0;
  for (const Tensor& p : params) total += p.numel();
  const bool last = stage_ == numStages_ - 1;
  Tensor flat = empty({total + (last ? 1 : 0)});
  float* out = flat.data<float>();
  std::vector<Tensor> grads;
  int64_t offset = 0;
  for (const Tensor& p : params) {
    WEFT_ENFORCE(p.dtype() == DType::Float32, InvalidArgumentError, "PipelineExecutor: averaging over replicas takes "
                 "float32 parameters, got ", dtypeName(p.dtype()));
    Tensor g = p.grad();
    if (!g.defined()) {
      g = zerosLike(p.detach());
      p.setGrad(g);
    }
    g = g.detach().contiguous();
    std::memcpy(out + offset, g.data<float>(), static_cast<size_t>(g.numel()) * sizeof(float));
    grads.push_back(p.grad());
    offset += p.numel();
  }
  if (last) out[total] = static_cast<float>(loss);
  waitFor(dataParallel_->allReduce(flat, collectives::ReduceOp::Avg),
          "averaging the gradients over the data-parallel group '" + dataParallel_->name() + "'");
  offset = 0;
  NoGradGuard noGrad;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    grads[i].copy_(flat.narrow(0, offset, n).view(params[i].shape()));
    offset += n;
  }
  if (last) loss = out[total];
}

void PipelineExecutor::exchangeTied() {
  for (size_t i = 0; i < tied_.size(); ++i) {
    const TiedParameter& t = tied_[i];
    Tensor mine = t.parameter.grad();
    mine = mine.defined() ? mine.detach().contiguous() : zerosLike(t.parameter.detach());
    Tensor theirs = emptyLike(mine);
    collectives::Work sent = pg_.isend(mine, t.peerStage, tagOf(kKindTied, 0, static_cast<int>(i)));
    const std::string what = "exchanging the gradient of tied parameter " + std::to_string(i) + " with stage " +
                             std::to_string(t.peerStage);
    waitFor(pg_.irecv(theirs, t.peerStage, tagOf(kKindTied, 0, static_cast<int>(i))), what);
    waitFor(sent, what);
    NoGradGuard noGrad;
    Tensor sum = add(mine, theirs);
    t.parameter.setGrad(sum);
  }
}

}  // namespace weft::pipeline
