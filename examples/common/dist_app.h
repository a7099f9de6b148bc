// The job's end for the example programs that use the whole RPC stack (RRefs, distributed
// autograd, the distributed optimizer): the graceful shutdown, then the check that none of the
// three layers holds anything of the job any more.
//
//   app::shutdownCleanly(agent);  // prints "<name>: shut down cleanly" or throws Error
//
// Header-only; it needs dist_optim (and so rref and dist_autograd).
#pragma once

#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "examples/common/rpc_app.h"
#include "rpc/agent.h"
#include "rref/rref.h"

namespace weft::examples::app {

// agent.shutdown(), then checkShutdown over the RRefs, the autograd contexts and the optimizers.
inline void shutdownCleanly(rpc::Agent& agent) {
  const rpc::ShutdownReport report = agent.shutdown();
  checkShutdown(agent, report,
                {layerCounts("RRefs", rref::debugCounts(agent)),
                 layerCounts("autograd", dist_autograd::debugCounts(agent)),
                 layerCounts("optimizer", dist_optim::debugCounts(agent))});
}

}  // namespace weft::examples::app
