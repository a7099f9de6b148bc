// collectives::init: a process group in one line, what
// torch.distributed.init_process_group("gloo") is to PyTorch.
//
//   auto pg = weft::collectives::init();                  // the job's place from the environment
//   Tensor g = ...;
//   pg->allReduce(g, ReduceOp::Avg).wait();
//   int me = pg->rank(), world = pg->size();
//
//   // with options: the job's place as rpc::Options, the group's own settings
//   auto pg = weft::collectives::init(weft::rpc::Options::fromEnv(), {.timeout = std::chrono::seconds(60)});
//
//   // with RPC in the same program: the group joins through the agent's store
//   weft::rpc::Agent agent(weft::rpc::Options::fromEnv());
//   ... agent.registry().impl(...) ...
//   agent.start();
//   auto pg = weft::collectives::init(agent);
//   ... agent.call("worker1", fn, x); pg->allReduce(g).wait(); ...
//   pg.reset();                                           // the group before the agent's shutdown
//   agent.shutdown();
//
// The place. init() reads rpc::Options::fromEnv(): under weftrun, torchrun,
// srun or mpirun the launcher's variables give rank, world size and the
// store's address (rpc/options.h lists them); with none of them set, the
// process is rank 0 of a world of 1 and needs no launcher and no setting at
// all: every collective then works as on one rank (allReduce, broadcast, ...
// leave the tensor as it is, allGather copies the input). Every rank of the
// job calls init once; it returns when every rank has joined (Gloo's full
// mesh is connected), or throws as createGlooGroup does (TimeoutError naming
// the ranks that never joined, after the group's timeout). The group is the
// gloo group (collectives/gloo/process_group_gloo.h) "default" unless
// GlooOptions::name says otherwise. Its connections bind the address
// rpc::Options::localAddress() gives (WEFT_SOCKET_IFNAME or
// Options::socketIfname, else the local address of the route to the master
// address) unless GlooOptions::hostname names one.
//
// The store. init(opt) builds the rendezvous store itself: rank 0 serves it
// (on opt.masterAddr:opt.masterPort; a lone process on any free port of
// 127.0.0.1) and every rank holds a client; the group and every sub-group of
// it own them. Destroying the group (and its sub-groups) is the job's end.
// Every other rank then says in the store that it leaves (waiting at most
// opt.shutdownTimeout for rank 0's answer) and closes its client; rank 0
// keeps serving the store until no other rank's client is connected, so that
// no rank loses the store while it still uses it. A rank whose process died
// (or was cut off from the store) has no connection left, so it does not
// hold rank 0 back: rank 0 closes the store as soon as the last connection
// is gone, with a warning naming the ranks that ended without leaving
// ("ranks [2] ended without leaving the group"). A rank still connected
// (stalled, or still working) holds it for at most opt.shutdownTimeout
// (WEFT_SHUTDOWN_TIMEOUT, 60 s by default); rank 0 then closes the store
// with a warning naming the ranks that had not left. Warnings go to the log
// (common/logging.h); the destructor throws nothing.
// init(agent) uses the agent's store instead (the agent must be started: a
// StateError says so otherwise) and owns nothing; destroy the group before
// the agent shuts down.
//
// Rank and world size come from the group (pg->rank(), pg->size()) and, with
// an agent, from the agent (agent.rank(), agent.worldSize()); weft keeps no
// process-wide default group. A process may hold several groups and agents
// (tests run whole jobs inside one process), and an object passed along
// says which one a call uses; pass the group (or a reference to it) to the
// code that needs it.
#pragma once

#include <memory>

#include "collectives/gloo/process_group_gloo.h"
#include "rpc/options.h"

namespace weft::rpc {
class Agent;
}

namespace weft::collectives {

// init(rpc::Options::fromEnv()).
std::unique_ptr<ProcessGroup> init();
// Joins the job `opt` places this process in (rank, world size, store address
// and timeouts; opt is validate()d: InvalidArgumentError naming the field).
std::unique_ptr<ProcessGroup> init(const rpc::Options& opt, GlooOptions options = {});
// The group of the agent's job, through the agent's store (rank and world size
// are the agent's).
std::unique_ptr<ProcessGroup> init(rpc::Agent& agent, GlooOptions options = {});

}  // namespace weft::collectives
