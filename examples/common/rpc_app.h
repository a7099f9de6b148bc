// What the RPC example programs (parameter_server, ddp_rpc, rnn, rl) share: waiting for a message
// while watching the peers it depends on (a trainer waiting for its model or for the other
// trainers; a worker that only hosts objects needs no such wait: it calls agent.shutdown() at
// once), and the check after the graceful shutdown that nothing of the job is left in the process.
//
//   auto ps = app::awaitPeers(agent, promise.getFuture(), {0, 1}, "waiting for the model");
//   ...
//   const rpc::ShutdownReport report = agent.shutdown();
//   app::checkShutdown(agent, report, {app::layerCounts("RRefs", rref::debugCounts(agent)),
//                                      app::layerCounts("autograd", dist_autograd::debugCounts(agent))});
//
// Header-only; it needs rpc/agent.h.
#pragma once

#include <chrono>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "examples/common/app.h"
#include "rpc/agent.h"

namespace weft::examples::app {

// Waits for `f`, failing as soon as one of `peers` is gone (a dead process is noticed at once, a
// silent one after the agent's heartbeat misses): Error "<peer> stopped while <me> was <what>".
template <class T>
T awaitPeers(rpc::Agent& agent, Future<T> f, const std::vector<int>& peers, const std::string& what) {
  while (!f.waitFor(std::chrono::milliseconds(200))) {
    for (int r : peers) {
      if (!agent.isAlive(r)) throw Error(agent.worker(r).name + " stopped while " + agent.name() + " was " + what);
    }
  }
  return f.get();
}

// What one layer (RRefs, distributed autograd, the distributed optimizer) still holds.
struct LayerCounts {
  const char* label;
  bool empty;
  std::string text;
};

template <class Counts>
LayerCounts layerCounts(const char* label, const Counts& counts) {
  return {label, counts.empty(), counts.toString()};
}

// After the graceful shutdown: throws Error "unclean shutdown: N workers missing (a, b); <label>
// <counts>; ..." unless every worker answered and every layer is empty; otherwise prints "<name>:
// shut down cleanly". Call agent.shutdown() in a statement of its own and pass its report: as
// arguments of one call, the shutdown and the layers' counts are evaluated in no set order, and
// counts read before the shutdown see the job still running.
inline void checkShutdown(rpc::Agent& agent, const rpc::ShutdownReport& report,
                          std::initializer_list<LayerCounts> layers) {
  bool clean = report.clean();
  std::string message = "unclean shutdown: " + std::to_string(report.missing.size()) + " workers missing";
  for (size_t k = 0; k < report.missing.size(); ++k) message += (k == 0 ? " (" : ", ") + report.missing[k];
  if (!report.missing.empty()) message += ")";
  for (const LayerCounts& layer : layers) {
    clean = clean && layer.empty;
    message += std::string("; ") + layer.label + " " + layer.text;
  }
  if (!clean) throw Error(message);
  say("%s: shut down cleanly\n", agent.name().c_str());
}

}  // namespace weft::examples::app
