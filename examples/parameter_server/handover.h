// The messages the parameter_server job's trainers send one another (main.cpp): trainer_1 hands
// the model it built on the server to the other trainers, and the others tell trainer_1 when
// they have finished training, so that it evaluates the final model. Bound on every rank before
// the agent starts.
//
//   Handover handover;
//   bindHandover(agent, handover);   // before agent.start()
//   agent.call(r, handOver, ps);     // trainer_1, for r = 2..W-1
//   ps = awaitModel(agent, handover);                // trainer r
//   agent.call(1, trainerDone, rank);                // trainer r, when it has finished
//   awaitOtherTrainers(agent, handover);             // trainer_1
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "examples/common/rpc_app.h"

#include "server.h"

namespace weft::examples::parameter_server {

inline const Function<void(RRef<ParameterServer>)> handOver{"parameter_server.handOver"};
inline const Function<void(int64_t)> trainerDone{"parameter_server.trainerDone"};

// What the other trainers tell this one.
struct Handover {
  Promise<RRef<ParameterServer>> server;  // trainers 2..: trainer_1's handle to the model
  Promise<void> trainersDone;             // trainer_1: every other trainer finished
  std::mutex mutex;
  int64_t doneCount = 0;
};

inline void bindHandover(rpc::Agent& agent, Handover& handover) {
  const int trainers = agent.worldSize() - 1;
  agent.registry().impl(handOver, [&handover](RRef<ParameterServer> ps) {
    WEFT_ENFORCE(handover.server.trySetValue(std::move(ps)), StateError, "the model was handed over twice");
  });
  agent.registry().impl(trainerDone, [&handover, trainers](int64_t) {
    std::lock_guard<std::mutex> guard(handover.mutex);
    if (++handover.doneCount == trainers - 1) handover.trainersDone.setValue();
  });
  if (trainers == 1) handover.trainersDone.setValue();
}

// Trainer r >= 2: trainer_1's handle to the model; Error if the server or trainer_1 stops first.
inline RRef<ParameterServer> awaitModel(rpc::Agent& agent, Handover& handover) {
  return app::awaitPeers(agent, handover.server.getFuture(), {0, 1}, "waiting for trainer_1 to build the model");
}

// trainer_1: returns when every other trainer has finished; Error if one of them, or the
// server, stops first.
inline void awaitOtherTrainers(rpc::Agent& agent, Handover& handover) {
  std::vector<int> others;
  for (int r = 0; r < agent.worldSize(); ++r) {
    if (r != 1) others.push_back(r);
  }
  app::awaitPeers(agent, handover.trainersDone.getFuture(), others, "waiting for the other trainers to finish");
}

}  // namespace weft::examples::parameter_server
