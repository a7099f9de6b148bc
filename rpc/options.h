// Options: what one process of a weft job needs to know to join it — its name
// and place in the group, where the rendezvous store is, and the settings of
// its RPC agent.
//
// Programs usually take everything from the environment their launcher set:
//
//   weft::rpc::Options opt = weft::rpc::Options::fromEnv();   // throws InvalidArgumentError naming the variable
//   opt.numWorkerThreads = 8;                                  // then adjust in code
//   opt.validate();
//   weft::rpc::Agent agent(opt);
//
// or build them by hand (tests, embedding in another launcher):
//
//   weft::rpc::Options opt;
//   opt.rank = 0; opt.worldSize = 2; opt.masterPort = 29500;
//   opt.validate();                       // fills nothing in; workerName() gives "worker0"
//
// Environment (fromEnv). A process's place comes from the first of these sets
// that is present (a set is present when any of its variables is set), the
// order tools/weftrun/README.md documents:
//   1. WEFT_RANK, WEFT_WORLD_SIZE, WEFT_LOCAL_RANK          (weftrun)
//   2. RANK, WORLD_SIZE, LOCAL_RANK                         (torchrun and the like)
//   3. SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID            (srun)
//   4. OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK (mpirun)
// Rank and world size must both come from that set; the local rank may be
// missing, and is then taken to be the rank (right on one machine, the only
// case where a launcher omits it). No set at all means a single process:
// rank 0 of a world of 1.
// The store's address: WEFT_MASTER_ADDR / WEFT_MASTER_PORT, else MASTER_ADDR /
// MASTER_PORT. Both are required when the world has more than one process;
// alone, a process defaults to 127.0.0.1 and port 0 (any free port).
// The rest, all optional:
//   WEFT_WORKER_NAME          name (default "worker<rank>")
//   WEFT_SOCKET_IFNAME        the interface name ("eth0") or IP address of this machine
//                             that the agent's listener and every Gloo process group bind
//                             and give their peers (weftrun --socket-ifname). Default: the
//                             local address of this machine's route to the master address,
//                             127.0.0.1 when the master address is a loopback one. See
//                             localAddress().
//   WEFT_LISTEN_ADDR          the address the agent's RPC listener binds, overriding
//                             WEFT_SOCKET_IFNAME for the agent alone (0.0.0.0 or :: binds
//                             every interface and still gives peers the WEFT_SOCKET_IFNAME
//                             address); see listenHost()
//   WEFT_LISTEN_PORT          its port (default 0: any free port)
//   WEFT_NUM_WORKER_THREADS   threads running user handlers (default 4)
//   WEFT_RPC_TIMEOUT          default RPC timeout in seconds, fractional allowed, 0 = none (default 60)
//   WEFT_STORE_TIMEOUT        rendezvous and store timeout in seconds, 0 = none (default 300)
//   WEFT_SHUTDOWN_TIMEOUT     how long a graceful shutdown drains the calls still in flight once
//                             every worker has called it, seconds (default 60); the wait for
//                             the others to call it has no deadline
//   WEFT_HEARTBEAT_INTERVAL   seconds of silence before a ping (default 2); a peer silent
//                             for WEFT_HEARTBEAT_MISSES intervals (default 5) is declared dead
//   WEFT_RPC_TOKEN            shared secret checked at every handshake (default none)
//   WEFT_LOG_LEVEL            debug, info, warn, error or off (default warn)
// A value that does not parse is an error naming the variable and the value
// ("WEFT_RANK='x' is not an integer"); nothing is silently ignored.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/logging.h"

namespace weft::rpc {

struct Options {
  // Set by hand, or empty for the default "worker<rank>" (see workerName()).
  // 1 to 128 characters from [A-Za-z0-9_.:-].
  std::string name;
  int rank = 0;
  int worldSize = 1;
  // Rank among the processes on this machine; -1 means "the same as rank".
  int localRank = -1;

  // Where rank 0 serves the rendezvous store. Port 0 lets rank 0 pick a free
  // port, which only works for a world of one (nobody else could find it).
  std::string masterAddr = "127.0.0.1";
  uint16_t masterPort = 0;

  // The interface name or IP address of this machine that its weft sockets
  // bind and give their peers (WEFT_SOCKET_IFNAME); empty picks the default,
  // the local address of the route to masterAddr. See localAddress().
  std::string socketIfname;

  // Where this process's RPC listener binds, overriding socketIfname for the
  // agent alone; empty (the default) binds localAddress(). "0.0.0.0" or "::"
  // binds every interface; peers are then given localAddress(). See
  // listenHost() and advertisedHost().
  std::string listenAddr;
  uint16_t listenPort = 0;

  int numWorkerThreads = 4;
  // Zero means no timeout.
  std::chrono::milliseconds rpcTimeout{std::chrono::seconds(60)};
  std::chrono::milliseconds storeTimeout{std::chrono::seconds(300)};
  // How long a graceful Agent::shutdown() waits, once every worker has joined its barrier, for
  // the calls still in flight to finish; must be > 0. The wait for the workers to join has no
  // deadline: it ends when the last one joins, or at once when one is lost (rpc/agent.h).
  std::chrono::milliseconds shutdownTimeout{std::chrono::seconds(60)};
  // Failure detection: a connection silent for heartbeatInterval gets a ping; one
  // silent for heartbeatMisses intervals is declared dead. A closed socket is
  // noticed at once regardless. Interval > 0, misses >= 2.
  std::chrono::milliseconds heartbeatInterval{std::chrono::seconds(2)};
  int heartbeatMisses = 5;
  // Shared secret every handshake must present; empty disables the check.
  std::string authToken;
  // Applied by Agent::start(). Defaults to the level the process already has
  // (WEFT_LOG_LEVEL, else warn).
  logging::Level logLevel = logging::level();

  // Reads the environment as described above, then validate()s. Throws
  // InvalidArgumentError naming the variable at fault.
  static Options fromEnv();

  // Checks every field; throws InvalidArgumentError naming the field and value.
  void validate() const;

  // name, or "worker<rank>" when name is empty.
  std::string workerName() const;
  // localRank, or rank when localRank is -1.
  int effectiveLocalRank() const { return localRank >= 0 ? localRank : rank; }
  // This machine's address for the job: rpc::localAddressFor(socketIfname,
  // masterAddr) (socket_address.h). With socketIfname empty: 127.0.0.1 when
  // masterAddr is a loopback address, else the local address of the route to
  // masterAddr. InvalidArgumentError naming WEFT_SOCKET_IFNAME when the
  // setting names no interface or address of this machine, or no route leads
  // to masterAddr.
  std::string localAddress() const;
  // The address the agent's listener binds: listenAddr, or localAddress().
  std::string listenHost() const;
  // The address the agent gives its peers: listenHost(), or localAddress()
  // when that is a wildcard (0.0.0.0, ::).
  std::string advertisedHost() const;
  // "host:port" of the store (IPv6 literals in brackets).
  std::string masterEndpoint() const;
};

// True for "localhost", 127.0.0.0/8 and ::1.
bool isLoopbackHost(const std::string& host);

}  // namespace weft::rpc
