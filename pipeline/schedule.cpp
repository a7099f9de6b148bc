#include "pipeline/schedule.h"

#include <algorithm>
#include <sstream>

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
  }
  return s;
}

namespace {

void checkSizes(const char* fn, int stages, int microbatches) {
  WEFT_ENFORCE(stages >= 1, InvalidArgumentError, fn, ": stages must be >= 1, got ", stages);
  WEFT_ENFORCE(microbatches >= 1, InvalidArgumentError, fn, ": microbatches must be >= 1, got ", microbatches);
}

// A stage's forward of mb with its transfers: receive the input from the
// previous stage, compute, send the output to the next.
void appendForward(std::vector<Action>& out, int stage, int stages, int mb) {
  if (stage > 0) out.push_back({ActionKind::RecvActivation, mb});
  out.push_back({ActionKind::Forward, mb});
  if (stage < stages - 1) out.push_back({ActionKind::SendActivation, mb});
}

void appendBackward(std::vector<Action>& out, int stage, int stages, int mb) {
  if (stage < stages - 1) out.push_back({ActionKind::RecvGrad, mb});
  out.push_back({ActionKind::Backward, mb});
  if (stage > 0) out.push_back({ActionKind::SendGrad, mb});
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

// ---- checkSchedule ------------------------------------------------------------

namespace {

constexpr int kKinds = 6;

struct StagePositions {
  // pos[kind][mb]: the action's index in the stage's list, -1 when absent.
  std::vector<std::vector<int>> pos;
};

std::string where(int stage, int index, const Action& a) {
  std::ostringstream os;
  os << "stage " << stage << ", action " << index << " (" << actionKindName(a.kind) << a.microbatch << ")";
  return os.str();
}

bool allowedOn(ActionKind k, int stage, int stages) {
  switch (k) {
    case ActionKind::RecvActivation:
    case ActionKind::SendGrad:
      return stage > 0;
    case ActionKind::SendActivation:
    case ActionKind::RecvGrad:
      return stage < stages - 1;
    default:
      return true;
  }
}

// The micro-batches of the actions of kind k on a stage, in order.
std::vector<int> sequenceOf(const std::vector<Action>& acts, ActionKind k) {
  std::vector<int> out;
  for (const Action& a : acts)
    if (a.kind == k) out.push_back(a.microbatch);
  return out;
}

void requireBefore(const StagePositions& p, int stage, ActionKind first, ActionKind second, int mb) {
  const int a = p.pos[static_cast<size_t>(first)][static_cast<size_t>(mb)];
  const int b = p.pos[static_cast<size_t>(second)][static_cast<size_t>(mb)];
  WEFT_ENFORCE(a >= 0, InvalidArgumentError, "checkSchedule: stage ", stage, " has no ", actionKindName(first), mb);
  WEFT_ENFORCE(b >= 0, InvalidArgumentError, "checkSchedule: stage ", stage, " has no ", actionKindName(second), mb);
  WEFT_ENFORCE(a < b, InvalidArgumentError, "checkSchedule: stage ", stage, " runs ", actionKindName(second), mb,
               " (action ", b, ") before ", actionKindName(first), mb, " (action ", a, ")");
}

}  // namespace

ScheduleReport checkSchedule(const Schedule& schedule) {
  const int stages = schedule.numStages();
  const int m = schedule.microbatches;
  WEFT_ENFORCE(stages >= 1, InvalidArgumentError, "checkSchedule: the schedule has no stage");
  WEFT_ENFORCE(m >= 1, InvalidArgumentError, "checkSchedule: microbatches must be >= 1, got ", m);

  std::vector<StagePositions> positions(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& p = positions[static_cast<size_t>(s)];
    p.pos.assign(kKinds, std::vector<int>(static_cast<size_t>(m), -1));
    const auto& acts = schedule.stages[static_cast<size_t>(s)];
    for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
      const Action& a = acts[static_cast<size_t>(i)];
      WEFT_ENFORCE(a.microbatch >= 0 && a.microbatch < m, InvalidArgumentError, "checkSchedule: ", where(s, i, a),
                   ": micro-batch outside [0, ", m, ")");
      WEFT_ENFORCE(allowedOn(a.kind, s, stages), InvalidArgumentError, "checkSchedule: ", where(s, i, a), ": ",
                   s == 0 ? "the first" : "the last", " stage has no neighbour to ",
                   a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGrad ? "receive from" : "send to");
      int& slot = p.pos[static_cast<size_t>(a.kind)][static_cast<size_t>(a.microbatch)];
      WEFT_ENFORCE(slot < 0, InvalidArgumentError, "checkSchedule: ", where(s, i, a), ": repeats action ", slot);
      slot = i;
    }
    for (int mb = 0; mb < m; ++mb) {
      requireBefore(p, s, ActionKind::Forward, ActionKind::Backward, mb);
      if (s > 0) {
        requireBefore(p, s, ActionKind::RecvActivation, ActionKind::Forward, mb);
        requireBefore(p, s, ActionKind::Backward, ActionKind::SendGrad, mb);
      }
      if (s < stages - 1) {
        requireBefore(p, s, ActionKind::Forward, ActionKind::SendActivation, mb);
        requireBefore(p, s, ActionKind::RecvGrad, ActionKind::Backward, mb);
      }
    }
  }

  // Matching: transfers between two stages pair up in issue order.
  for (int s = 0; s + 1 < stages; ++s) {
    const auto& here = schedule.stages[static_cast<size_t>(s)];
    const auto& next = schedule.stages[static_cast<size_t>(s + 1)];
    const auto sent = sequenceOf(here, ActionKind::SendActivation);
    const auto received = sequenceOf(next, ActionKind::RecvActivation);
    WEFT_ENFORCE(sent == received, InvalidArgumentError, "checkSchedule: stage ", s, " sends activations in order ",
                 sent, " but stage ", s + 1, " receives them in order ", received);
    const auto gradsSent = sequenceOf(next, ActionKind::SendGrad);
    const auto gradsReceived = sequenceOf(here, ActionKind::RecvGrad);
    WEFT_ENFORCE(gradsSent == gradsReceived, InvalidArgumentError, "checkSchedule: stage ", s + 1,
                 " sends gradients in order ", gradsSent, " but stage ", s, " receives them in order ", gradsReceived);
  }

  // Progress: run every stage as far as its receives allow until all end.
  ScheduleReport report;
  report.peakActivations.assign(static_cast<size_t>(stages), 0);
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<int> alive(static_cast<size_t>(stages), 0);
  // sentAct[s][mb]: stage s issued SendActivation(mb); sentGrad[s][mb]: SendGrad(mb).
  std::vector<std::vector<char>> sentAct(static_cast<size_t>(stages), std::vector<char>(static_cast<size_t>(m), 0));
  auto sentGrad = sentAct;
  for (;;) {
    bool moved = false, done = true;
    for (int s = 0; s < stages; ++s) {
      const auto& acts = schedule.stages[static_cast<size_t>(s)];
      size_t& i = next[static_cast<size_t>(s)];
      while (i < acts.size()) {
        const Action& a = acts[i];
        const auto mb = static_cast<size_t>(a.microbatch);
        if (a.kind == ActionKind::RecvActivation && !sentAct[static_cast<size_t>(s - 1)][mb]) break;
        if (a.kind == ActionKind::RecvGrad && !sentGrad[static_cast<size_t>(s + 1)][mb]) break;
        if (a.kind == ActionKind::SendActivation) sentAct[static_cast<size_t>(s)][mb] = 1;
        if (a.kind == ActionKind::SendGrad) sentGrad[static_cast<size_t>(s)][mb] = 1;
        int& live = alive[static_cast<size_t>(s)];
        if (a.kind == ActionKind::Forward) {
          ++live;
          report.peakActivations[static_cast<size_t>(s)] = std::max(report.peakActivations[static_cast<size_t>(s)], live);
        }
        if (a.kind == ActionKind::Backward) --live;
        ++i;
        moved = true;
      }
      done = done && i == acts.size();
    }
    if (done) break;
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
  return report;
}

}  // namespace weft::pipeline
