// The Gloo TCP device the gloo backend runs on, and the SIGPIPE guard every
// thread that writes to Gloo's sockets needs: internal to the gloo backend
// (gloo/process_group_gloo.cpp) and to bench/collectives_bench, whose direct
// Gloo baseline runs on a device made the same way.
//
//   auto device = detail::createTcpDevice("127.0.0.1");   // loop thread: SCHED_BATCH, SIGPIPE blocked
//   detail::blockSigpipeOnThisThread();                   // a thread that posts Gloo ops
//   { detail::SigpipeBlock block; buffer->send(peer, slot); }  // or for one call on a user's thread
//
// Signals. Gloo writes to its sockets from the calling thread and its own loop
// thread; a peer that died turns such a write into SIGPIPE, which would kill
// the process. Blocked, the write fails with EPIPE and Gloo reports the error.
//
// Connecting. MeshContext replaces Gloo's own full-mesh connect so that the
// whole rendezvous keeps to one deadline and a peer's unreachable address
// fails every rank at once, and so that no rank closes a connection before
// its peer's loop thread has taken it up (see "Closing" below).
//
// Closing. Gloo's loop thread accepts each incoming connection and asks for
// its peer's name; when the connection was reset before that (its other end
// was hard-closed: Gloo's Pair::close, which closeConnections calls, resets
// it), the name is gone and Gloo throws on its loop thread, which aborts the
// process.
// The dialling side's kernel completes a connection without the accepting
// side's loop thread, so a rank could otherwise finish connecting, return,
// close its connections (its program ending at once) and abort a peer whose
// loop thread was late; the other way round, a dialling peer whose loop
// thread was late took the reset for a refused connect and failed its
// rendezvous. Hence connectMesh returns only once every rank has
// said that all its connections are up, and a rank that fails the connect
// lets its loop thread take up the connections it dialled (kDialGrace)
// before it hard-closes the pairs still waiting. What remains: a failing rank
// whose loop thread is later than kDialGrace, and a reset arriving in the
// instant between Gloo's check of a dialled connection (which reports an
// earlier reset as a failed connect) and its name lookup; closing a listening
// pair resets the connections dialled into it. A rank that dies closes its
// connections without a reset, which the peer's loop thread takes up as a
// lost connection.
//
// Scheduling. Gloo's TCP loop thread handles a connection's events only when
// it gets the connection's lock with try_lock; otherwise it returns to epoll,
// which (level-triggered) reports the same event at once: it busy-polls until
// the thread holding the lock lets go. A thread that posts an operation holds
// that lock across its socket write, and the write wakes the peer, whose
// answer wakes this loop thread; a woken thread normally preempts the running
// one, so on a busy CPU the poster is preempted with the lock held and the
// loop thread spins until the next scheduler tick (4 ms at HZ=250) hands the
// CPU back. Back-to-back collectives (a training step's gradients) hit this on
// nearly every op when the machine's CPUs are busy. Under SCHED_BATCH the
// loop thread never preempts on wakeup: it runs once the poster releases the
// lock and blocks. SCHED_BATCH needs no privilege and keeps the nice value;
// the loop thread inherits the policy (and the signal mask) of the thread that
// creates the device, so the device is created under both.
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include "collectives/gloo/detail/traffic.h"
#include "rpc/store.h"

namespace weft::collectives::detail {

// Blocks SIGPIPE on the calling thread for good (a thread of the backend's own).
void blockSigpipeOnThisThread();

// Blocks SIGPIPE on the calling thread for a scope (threads created inside
// inherit the blocked mask); a SIGPIPE raised meanwhile is consumed before the
// previous mask is restored.
class SigpipeBlock {
 public:
  SigpipeBlock();
  ~SigpipeBlock();
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t previous_;
  bool wasPending_ = false;
};

// A Gloo TCP device on `hostname` whose loop thread runs SCHED_BATCH (unless
// the calling thread has a real-time or other explicit policy, which it then
// inherits) with SIGPIPE blocked; the calling thread's own policy is left as
// it was. Error naming the host when Gloo cannot create it. Every connection
// of the device listens on, and is given to peers as, that address.
std::shared_ptr<gloo::transport::Device> createTcpDevice(const std::string& hostname);

// The address a Gloo device of this process binds when none is given: the
// address rpc::localAddressFor (rpc/socket_address.h) picks from
// WEFT_SOCKET_IFNAME and the store's host (`storeEndpoint`, "host:port").
// InvalidArgumentError naming the setting when it cannot be found.
std::string defaultDeviceAddress(const std::string& storeEndpoint);

// A Gloo context whose full-mesh connect runs under one deadline, unlike
// gloo::rendezvous::Context::connectFullMesh (which waits for each peer's
// address and each connection in turn, each for up to 5 times the timeout).
//
//   auto ctx = std::make_shared<detail::MeshContext>(rank, size);
//   ctx->setTimeout(timeout);
//   ctx->connectMesh(store, "weft/pg/default/", device, timeout, "group 'default' (rank 1 of 4)");
//
// Each rank creates one Gloo pair per peer (each listening on the device's
// address), puts their addresses under "<prefix>mesh/<rank>", waits for every
// peer's, then connects every pair at once (one short-lived thread per peer);
// once all are up it sets "<prefix>mesh/up/<rank>" and waits for every
// peer's (see "Closing" above).
// A connection that fails (refused, unreachable: the address a peer gave
// cannot be reached from here) fails this rank at once and is posted under
// "<prefix>mesh/failed", which fails every other rank of the group at once
// too (DisconnectedError naming the rank, the address, the time taken and
// WEFT_SOCKET_IFNAME). A peer that has not given its address or connected by
// the deadline gives TimeoutError naming those ranks and their addresses; a
// rank connected to all whose peers have not all said so by the deadline
// gives TimeoutError naming those ranks, posted for the group like a failed
// connection. A rank that times out after another rank posted a failure
// fails with that rank's message instead.
// Store errors pass through (DisconnectedError when the store is gone).
class MeshContext final : public gloo::rendezvous::Context {
 public:
  MeshContext(int rank, int size)
      : gloo::rendezvous::Context(rank, size), traffic_(std::make_shared<TrafficCounter>()) {}

  void connectMesh(rpc::StoreClient& store, const std::string& prefix,
                   const std::shared_ptr<gloo::transport::Device>& device, std::chrono::milliseconds timeout,
                   const std::string& label);

  // What this context's connections carried, from connectMesh on: every
  // pair and buffer of the context is a counting one (traffic.h).
  TrafficCounter& traffic() { return *traffic_; }

  // After connectMesh, the connections are watched (connection_watch.h):
  // createUnboundBuffer gives a collective's buffer, failed once any
  // connection is lost; createPeerBuffer one of a point-to-point transfer,
  // failed once the connection to a peer its operations name is lost.
  std::unique_ptr<gloo::transport::UnboundBuffer> createPeerBuffer(void* ptr, size_t size);
  // Ends the watch: before closeConnections().
  void stopWatching();

 private:
  std::shared_ptr<TrafficCounter> traffic_;
  std::shared_ptr<CountingContext> counting_;  // the transport context, from connectMesh on
};

}  // namespace weft::collectives::detail
