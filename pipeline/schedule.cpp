#include "pipeline/schedule.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace weft::pipeline {

const char* actionKindName(ActionKind k) {
  switch (k) {
    case ActionKind::Forward:
      return "F";
    case ActionKind::Backward:
      return "B";
    case ActionKind::SendActivation:
      return "SA";
    case ActionKind::RecvActivation:
      return "RA";
    case ActionKind::SendGrad:
      return "SG";
    case ActionKind::RecvGrad:
      return "RG";
  }
  return "?";
}

std::string toString(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) {
    if (!s.empty()) s += ' ';
    s += actionKindName(a.kind);
    s += std::to_string(a.microbatch);
    if (a.chunk != 0) s += 'v' + std::to_string(a.chunk);
  }
  return s;
}

namespace {

void checkSizes(const char* fn, int stages, int microbatches) {
  WEFT_ENFORCE(stages >= 1, InvalidArgumentError, fn, ": stages must be >= 1, got ", stages);
  WEFT_ENFORCE(microbatches >= 1, InvalidArgumentError, fn, ": microbatches must be >= 1, got ", microbatches);
}

// Chunk c of stage s of P is model stage c·P + s of V·P.
// A stage's forward of mb on a chunk with its transfers: receive the input
// from the previous model stage, compute, send the output to the next.
void appendForward(std::vector<Action>& out, int stage, int stages, int mb, int chunk = 0, int chunks = 1) {
  const int k = chunk * stages + stage;
  if (k > 0) out.push_back({ActionKind::RecvActivation, mb, chunk});
  out.push_back({ActionKind::Forward, mb, chunk});
  if (k < stages * chunks - 1) out.push_back({ActionKind::SendActivation, mb, chunk});
}

void appendBackward(std::vector<Action>& out, int stage, int stages, int mb, int chunk = 0, int chunks = 1) {
  const int k = chunk * stages + stage;
  if (k < stages * chunks - 1) out.push_back({ActionKind::RecvGrad, mb, chunk});
  out.push_back({ActionKind::Backward, mb, chunk});
  if (k > 0) out.push_back({ActionKind::SendGrad, mb, chunk});
}

}  // namespace

Schedule gpipe(int stages, int microbatches) {
  checkSizes("gpipe", stages, microbatches);
  Schedule s{microbatches, std::vector<std::vector<Action>>(static_cast<size_t>(stages))};
  for (int st = 0; st < stages; ++st) {
    auto& acts = s.stages[static_cast<size_t>(st)];
    for (int mb = 0; mb < microbatches; ++mb) appendForward(acts, st, stages, mb);
    for (int mb = 0; mb < microbatches; ++mb) appendBackward(acts, st, stages, mb);
  }
  return s;
}

Schedule oneFOneB(int stages, int microbatches) {
  checkSizes("oneFOneB", stages, microbatches);
  Schedule s{microbatches, std::vector<std::vector<Action>>(static_cast<size_t>(stages))};
  for (int st = 0; st < stages; ++st) {
    auto& acts = s.stages[static_cast<size_t>(st)];
    const int warmup = std::min(stages - st - 1, microbatches);
    int nextForward = 0, nextBackward = 0;
    for (; nextForward < warmup; ++nextForward) appendForward(acts, st, stages, nextForward);
    while (nextForward < microbatches) {
      appendForward(acts, st, stages, nextForward++);
      appendBackward(acts, st, stages, nextBackward++);
    }
    while (nextBackward < microbatches) appendBackward(acts, st, stages, nextBackward++);
  }
  return s;
}

Schedule interleavedOneFOneB(int stages, int chunks, int microbatches) {
  checkSizes("interleavedOneFOneB", stages, microbatches);
  WEFT_ENFORCE(chunks >= 1, InvalidArgumentError, "interleavedOneFOneB: chunks must be >= 1, got ", chunks);
  if (chunks == 1) return oneFOneB(stages, microbatches);
  WEFT_ENFORCE(stages >= 2, InvalidArgumentError, "interleavedOneFOneB: ", chunks,
               " chunks need at least 2 stages, got ", stages);
  // The (micro-batch, chunk) order of the forwards, the same on every stage:
  // groups of micro-batches, chunk after chunk within a group. Groups hold P
  // micro-batches but the first, which takes the M mod P left over as well
  // (all M when M < P): a group shorter than P would leave stage 0 waiting
  // for its micro-batches to come round to the next chunk.
  const int firstGroup = microbatches < stages ? microbatches : stages + microbatches % stages;
  std::vector<std::pair<int, int>> order;
  for (int first = 0; first < microbatches;) {
    const int last = first == 0 ? firstGroup : first + stages;
    for (int c = 0; c < chunks; ++c)
      for (int mb = first; mb < last; ++mb) order.emplace_back(mb, c);
    first = last;
  }
  const int total = static_cast<int>(order.size());
  Schedule s{microbatches, std::vector<std::vector<Action>>(static_cast<size_t>(stages)), chunks};
  for (int st = 0; st < stages; ++st) {
    auto& acts = s.stages[static_cast<size_t>(st)];
    const int warmup = std::min((stages - st - 1) * 2 + (chunks - 1) * firstGroup, total);
    auto forward = [&](int i) {
      const auto [mb, c] = order[static_cast<size_t>(i)];
      appendForward(acts, st, stages, mb, c, chunks);
    };
    auto backward = [&](int i) {
      const auto [mb, c] = order[static_cast<size_t>(i)];
      appendBackward(acts, st, stages, mb, chunks - 1 - c, chunks);
    };
    int nextForward = 0, nextBackward = 0;
    for (; nextForward < warmup; ++nextForward) forward(nextForward);
    while (nextForward < total) {
      forward(nextForward++);
      backward(nextBackward++);
    }
    while (nextBackward < total) backward(nextBackward++);
  }
  return s;
}

// ---- checkSchedule ------------------------------------------------------------

namespace {

constexpr int kKinds = 6;

std::string nameOf(const Action& a) {
  std::string s = actionKindName(a.kind) + std::to_string(a.microbatch);
  if (a.chunk != 0) s += 'v' + std::to_string(a.chunk);
  return s;
}

std::string where(int stage, int index, const Action& a) {
  std::ostringstream os;
  os << "stage " << stage << ", action " << index << " (" << nameOf(a) << ")";
  return os.str();
}

// On model stage k of `modelStages`.
bool allowedOn(ActionKind k, int modelStage, int modelStages) {
  switch (k) {
    case ActionKind::RecvActivation:
    case ActionKind::SendGrad:
      return modelStage > 0;
    case ActionKind::SendActivation:
    case ActionKind::RecvGrad:
      return modelStage < modelStages - 1;
    default:
      return true;
  }
}

// The micro-batches of the actions of kind k on one chunk of a stage, in order.
std::vector<int> sequenceOf(const std::vector<Action>& acts, ActionKind k, int chunk) {
  std::vector<int> out;
  for (const Action& a : acts)
    if (a.kind == k && a.chunk == chunk) out.push_back(a.microbatch);
  return out;
}

// pos[chunk * kKinds + kind][mb]: the action's index in the stage's list, -1 when absent.
using Positions = std::vector<std::vector<int>>;

void requireBefore(const Positions& p, int stage, ActionKind first, ActionKind second, int mb, int chunk) {
  const int a = p[static_cast<size_t>(chunk * kKinds + static_cast<int>(first))][static_cast<size_t>(mb)];
  const int b = p[static_cast<size_t>(chunk * kKinds + static_cast<int>(second))][static_cast<size_t>(mb)];
  const std::string f = nameOf({first, mb, chunk}), s = nameOf({second, mb, chunk});
  WEFT_ENFORCE(a >= 0, InvalidArgumentError, "checkSchedule: stage ", stage, " has no ", f);
  WEFT_ENFORCE(b >= 0, InvalidArgumentError, "checkSchedule: stage ", stage, " has no ", s);
  WEFT_ENFORCE(a < b, InvalidArgumentError, "checkSchedule: stage ", stage, " runs ", s, " (action ", b, ") before ",
               f, " (action ", a, ")");
}

// Runs every stage as far as its receives allow until all end, calling
// step(stage, action, readyAt) for each action run, in an order that respects
// the receives: readyAt is the time its matching send was issued (the value
// step returned for that send), 0 for actions that wait on nothing. Throws
// InvalidArgumentError naming the stuck actions on a deadlock.
template <class Step>
void runSchedule(const Schedule& schedule, Step&& step) {
  const int stages = schedule.numStages();
  const int v = schedule.chunks;
  const int m = schedule.microbatches;
  const size_t modelStages = static_cast<size_t>(stages * v);
  // sentAct[k][mb] / sentGrad[k][mb]: when model stage k issued SendActivation(mb)
  // / SendGrad(mb); negative until it does.
  std::vector<std::vector<double>> sentAct(modelStages, std::vector<double>(static_cast<size_t>(m), -1.0));
  auto sentGrad = sentAct;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  for (;;) {
    bool moved = false, done = true;
    for (int s = 0; s < stages; ++s) {
      const auto& acts = schedule.stages[static_cast<size_t>(s)];
      size_t& i = next[static_cast<size_t>(s)];
      while (i < acts.size()) {
        const Action& a = acts[i];
        const auto mb = static_cast<size_t>(a.microbatch);
        const auto k = static_cast<size_t>(a.chunk * stages + s);
        double readyAt = 0.0;
        if (a.kind == ActionKind::RecvActivation) readyAt = sentAct[k - 1][mb];
        if (a.kind == ActionKind::RecvGrad) readyAt = sentGrad[k + 1][mb];
        if (readyAt < 0) break;
        const double t = step(s, a, readyAt);
        if (a.kind == ActionKind::SendActivation) sentAct[k][mb] = t;
        if (a.kind == ActionKind::SendGrad) sentGrad[k][mb] = t;
        ++i;
        moved = true;
      }
      done = done && i == acts.size();
    }
    if (done) return;
    if (!moved) {
      std::ostringstream os;
      for (int s = 0; s < stages; ++s) {
        const size_t i = next[static_cast<size_t>(s)];
        const auto& acts = schedule.stages[static_cast<size_t>(s)];
        if (i < acts.size()) os << (os.tellp() > 0 ? ", " : "") << where(s, static_cast<int>(i), acts[i]);
      }
      throw InvalidArgumentError("checkSchedule: the schedule deadlocks: every unfinished stage waits on a receive "
                                 "whose send never comes: " + os.str());
    }
  }
}

}  // namespace

ScheduleReport checkSchedule(const Schedule& schedule) {
  const int stages = schedule.numStages();
  const int m = schedule.microbatches;
  const int v = schedule.chunks;
  WEFT_ENFORCE(stages >= 1, InvalidArgumentError, "checkSchedule: the schedule has no stage");
  WEFT_ENFORCE(m >= 1, InvalidArgumentError, "checkSchedule: microbatches must be >= 1, got ", m);
  WEFT_ENFORCE(v >= 1, InvalidArgumentError, "checkSchedule: chunks must be >= 1, got ", v);
  WEFT_ENFORCE(v == 1 || stages >= 2, InvalidArgumentError, "checkSchedule: ", v,
               " chunks need at least 2 stages, the schedule has ", stages);
  const int modelStages = stages * v;

  std::vector<Positions> positions(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& p = positions[static_cast<size_t>(s)];
    p.assign(static_cast<size_t>(kKinds * v), std::vector<int>(static_cast<size_t>(m), -1));
    const auto& acts = schedule.stages[static_cast<size_t>(s)];
    for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
      const Action& a = acts[static_cast<size_t>(i)];
      WEFT_ENFORCE(a.microbatch >= 0 && a.microbatch < m, InvalidArgumentError, "checkSchedule: ", where(s, i, a),
                   ": micro-batch outside [0, ", m, ")");
      WEFT_ENFORCE(a.chunk >= 0 && a.chunk < v, InvalidArgumentError, "checkSchedule: ", where(s, i, a),
                   ": chunk outside [0, ", v, ")");
      const int k = a.chunk * stages + s;
      WEFT_ENFORCE(allowedOn(a.kind, k, modelStages), InvalidArgumentError, "checkSchedule: ", where(s, i, a), ": ",
                   k == 0 ? "the first" : "the last", " stage has no neighbour to ",
                   a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGrad ? "receive from" : "send to");
      int& slot = p[static_cast<size_t>(a.chunk * kKinds + static_cast<int>(a.kind))][static_cast<size_t>(a.microbatch)];
      WEFT_ENFORCE(slot < 0, InvalidArgumentError, "checkSchedule: ", where(s, i, a), ": repeats action ", slot);
      slot = i;
    }
    for (int c = 0; c < v; ++c) {
      const int k = c * stages + s;
      for (int mb = 0; mb < m; ++mb) {
        requireBefore(p, s, ActionKind::Forward, ActionKind::Backward, mb, c);
        if (k > 0) {
          requireBefore(p, s, ActionKind::RecvActivation, ActionKind::Forward, mb, c);
          requireBefore(p, s, ActionKind::Backward, ActionKind::SendGrad, mb, c);
        }
        if (k < modelStages - 1) {
          requireBefore(p, s, ActionKind::Forward, ActionKind::SendActivation, mb, c);
          requireBefore(p, s, ActionKind::RecvGrad, ActionKind::Backward, mb, c);
        }
      }
    }
  }

  // Matching: transfers between two model stages pair up in issue order.
  for (int k = 0; k + 1 < modelStages; ++k) {
    const int s = k % stages, c = k / stages, s2 = (k + 1) % stages, c2 = (k + 1) / stages;
    const auto& here = schedule.stages[static_cast<size_t>(s)];
    const auto& next = schedule.stages[static_cast<size_t>(s2)];
    const std::string from = "stage " + std::to_string(s) + (v > 1 ? " chunk " + std::to_string(c) : "");
    const std::string to = "stage " + std::to_string(s2) + (v > 1 ? " chunk " + std::to_string(c2) : "");
    const auto sent = sequenceOf(here, ActionKind::SendActivation, c);
    const auto received = sequenceOf(next, ActionKind::RecvActivation, c2);
    WEFT_ENFORCE(sent == received, InvalidArgumentError, "checkSchedule: ", from, " sends activations in order ",
                 sent, " but ", to, " receives them in order ", received);
    const auto gradsSent = sequenceOf(next, ActionKind::SendGrad, c2);
    const auto gradsReceived = sequenceOf(here, ActionKind::RecvGrad, c);
    WEFT_ENFORCE(gradsSent == gradsReceived, InvalidArgumentError, "checkSchedule: ", to,
                 " sends gradients in order ", gradsSent, " but ", from, " receives them in order ", gradsReceived);
  }

  // Progress, and the activations alive on each stage along the way.
  ScheduleReport report;
  report.peakActivations.assign(static_cast<size_t>(stages), 0);
  std::vector<int> alive(static_cast<size_t>(stages), 0);
  runSchedule(schedule, [&](int s, const Action& a, double) {
    int& live = alive[static_cast<size_t>(s)];
    if (a.kind == ActionKind::Forward) {
      ++live;
      report.peakActivations[static_cast<size_t>(s)] = std::max(report.peakActivations[static_cast<size_t>(s)], live);
    }
    if (a.kind == ActionKind::Backward) --live;
    return 0.0;
  });
  return report;
}

double idealBubble(const Schedule& schedule, double forwardCost, double backwardCost) {
  WEFT_ENFORCE(forwardCost > 0 && backwardCost > 0, InvalidArgumentError,
               "idealBubble: costs must be positive, got forward ", forwardCost, " and backward ", backwardCost);
  checkSchedule(schedule);
  const std::vector<double> f(static_cast<size_t>(schedule.numStages()), forwardCost / schedule.chunks);
  const std::vector<double> b(static_cast<size_t>(schedule.numStages()), backwardCost / schedule.chunks);
  return idealBubble(schedule, f, b);
}

double idealBubble(const Schedule& schedule, std::span<const double> forwardCost,
                   std::span<const double> backwardCost) {
  checkSchedule(schedule);
  const int stages = schedule.numStages();
  WEFT_ENFORCE(static_cast<int>(forwardCost.size()) == stages && static_cast<int>(backwardCost.size()) == stages,
               InvalidArgumentError, "idealBubble: one forward and one backward cost per stage (", stages,
               "), got ", forwardCost.size(), " and ", backwardCost.size());
  for (int s = 0; s < stages; ++s) {
    const double fs = forwardCost[static_cast<size_t>(s)], bs = backwardCost[static_cast<size_t>(s)];
    WEFT_ENFORCE(fs > 0 && bs > 0, InvalidArgumentError, "idealBubble: costs must be positive, got forward ", fs,
                 " and backward ", bs, " for stage ", s);
  }
  // Each stage's clock: when its last action ended. A receive ends when both
  // the stage reached it and the send was issued; sends take no time.
  std::vector<double> clock(static_cast<size_t>(stages), 0.0), busy(static_cast<size_t>(stages), 0.0);
  runSchedule(schedule, [&](int s, const Action& a, double readyAt) {
    double& t = clock[static_cast<size_t>(s)];
    t = std::max(t, readyAt);
    if (a.kind == ActionKind::Forward || a.kind == ActionKind::Backward) {
      const double cost = a.kind == ActionKind::Forward ? forwardCost[static_cast<size_t>(s)]
                                                        : backwardCost[static_cast<size_t>(s)];
      t += cost;
      busy[static_cast<size_t>(s)] += cost;
    }
    return t;
  });
  const double end = *std::max_element(clock.begin(), clock.end());
  double sumBusy = 0;
  for (double x : busy) sumBusy += x;
  return 1.0 - sumBusy / (stages * end);
}

}  // namespace weft::pipeline
