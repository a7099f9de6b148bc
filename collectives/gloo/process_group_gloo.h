// The gloo backend: the ProcessGroup of CPU tensors, over Gloo's TCP transport
// (Debian's libgloo), with rendezvous through weft's store. This header is the
// whole of its interface: createGlooGroup and GlooOptions; the group is used
// through ProcessGroup (collectives/process_group.h). Its internals live in
// collectives/gloo/detail/.
//
// collectives::init() (collectives/init.h) builds the store and the group in
// one call; by hand, with a store of one's own:
//
//   rpc::Options opt = rpc::Options::fromEnv();
//   std::unique_ptr<rpc::StoreServer> server;              // or use agent.store() when an Agent runs
//   if (opt.rank == 0) server = std::make_unique<rpc::StoreServer>(rpc::StoreServer::configFor(opt));
//   rpc::StoreClient store(rpc::StoreClient::configFor(opt));
//   auto pg = collectives::createGlooGroup(store, opt.rank, opt.worldSize,
//                                          {.timeout = std::chrono::seconds(60)});
//   Tensor g = ones({1024});
//   pg->allReduce(g).wait();                                // g == worldSize everywhere
//   auto pair = pg->newGroup({0, 1});                       // every rank calls it
//
// Rendezvous. createGlooGroup is collective: every rank of the group calls it
// with the same name, size and options. Each rank binds its Gloo connections
// to GlooOptions::hostname (by default the address WEFT_SOCKET_IFNAME names,
// else the local address of the route to the store's host; see
// GlooOptions::hostname), puts their addresses under "weft/pg/<name>/" in
// the store and connects to every other rank (one TCP connection per pair,
// Gloo's full mesh), all under one deadline, GlooOptions::timeout from the
// start of the rendezvous. It returns once every rank of the group is
// connected to all (a rank that returned earlier could close a connection
// before the peer's Gloo loop thread took it up, which aborts the peer's
// process inside Gloo). A rank that cannot reach an address a peer gave (refused,
// no route) fails at once, and so does every other rank of the group:
// DisconnectedError naming the ranks, the address, the time taken and
// WEFT_SOCKET_IFNAME. Ranks that have not joined or connected by the
// deadline give TimeoutError naming them (gloo/detail/device.h).
// Sub-groups live under "weft/pg/<name>/sub<k>[r0,r1,...]/" and reuse the
// parent's Gloo device.
//
// Threads. Each group runs its collectives on a thread of its own (posts
// its progress from another, see Timeouts, and watches its connections from
// a third, see Lost connections), one at a
// time in issue order (Gloo ops on one context must never interleave).
// Point-to-point transfers start on the calling thread, so they overlap each
// other and the collectives; their completions are awaited by a pool of
// threads that grows to the number of transfers in flight at once, so one
// transfer's completion never waits behind another's. Gloo adds one thread
// per device (its TCP event loop), which runs under SCHED_BATCH (it never
// preempts on wakeup; same nice value): Gloo's loop busy-polls a connection
// whose lock another thread holds, and a loop thread that preempted the
// holder on a busy CPU would spin until the next scheduler tick, about 4 ms
// per back-to-back collective. SIGPIPE is blocked on all of them and
// around the calls that write on the caller's thread, so a dead peer is an
// error, never a killed process.
//
// Point to point. Gloo's TCP transport aborts the process when a message is
// longer than the receive it lands in, and silently fills part of a longer
// receive with a shorter one; so each transfer first agrees on its size. The
// sender sends a small header (its byte count, dtype and element count) on a
// slot of the tag, with the data right after it up to 1 MiB; larger data
// goes on a slot of its own, and the receiver, once the header is in, posts
// that data's receive with the size announced (into its tensor when the sizes
// are equal, else into a scratch buffer that discards the data). The receiver
// answers each header with a verdict (its own size), which the send waits
// for. Sizes that differ thus fail both sides with ProtocolError naming both
// sizes, and leave the group usable. Costs: every receive posts 1 MiB of
// staging (heap memory whose pages are touched only as far as the data
// reaches); a send completes once the verdict is back (one more crossing); a
// receive of more than 1 MiB takes one more crossing than a bare Gloo
// transfer, a smaller one a copy on each side. Data up to 1 MiB rides in the
// header's message so that it leaves in the sender's own write, at once: data
// on a slot of its own leaves only when the sender's loop thread handles the
// receiver's request for it, and on CPUs that the processes keep busy
// (pipeline stages bound to their cores, weftrun --bind-cpus) that thread
// runs only when its process waits or yields, up to one compute action later
// (bench/pipeline_bench: with 16 KiB inline the bound 2-stage pipeline's
// bubble at M = 8 and 16 was 0.06-0.10 higher than with 1 MiB).
//
// Timeouts. GlooOptions::timeout bounds each op from the moment it starts
// running (a collective waiting behind others in the queue is not yet timed). A
// collective that times out asks the store what the other ranks were doing:
// every rank records the number of the last collective it started, and a
// thread of the group posts it with the rank's wall-clock time to
// "weft/pg/<name>/progress/<rank>" within 50 ms when it changed and every
// second anyway (nothing on the hot path). A rank heard from in the last 3 s
// whose number is lower is reported as not having started the collective
// when last heard ("ranks [2] had not started it when last heard (rank 2 at
// #4, 0.3 s ago)"); an older post is reported only as what it is ("rank 2
// was last heard at #4, 18.0 s ago"): the rank may have started it since
// without reaching the store (a partition); ranks whose progress the store
// cannot give (it is unreachable) are named as unknown. When every rank has
// started it, the rank heard from longest ago is named with the age of its
// last post (a rank stalled inside the collective stops posting). Ages across
// hosts assume their clocks agree.
//
// Lost connections. A peer that dies, or whose connection is cut, fails
// what waits on it at once, whatever the op was doing (a send the socket had
// only partly taken included, which Gloo alone would leave to the timeout):
// a collective in progress fails on every rank, once any connection of the
// group is lost (a collective needs every rank), with DisconnectedError
// naming the ranks whose connections are gone; a point-to-point transfer
// fails once the connection to its peer is (a receive from any of several
// ranks, once all of theirs are), so transfers between live ranks go on.
// An op that had completed before the loss still completes. A wait fails
// about ConnectionWatch::kTries x kRetryAfter after Gloo's loop thread
// reads the loss (gloo/detail/connection_watch.h), far within the timeout.
//
// Call checking (GlooOptions::checkCalls, on by default). Each collective starts
// with one call exchange: every rank sends every other rank a message with its
// call header (op, sequence number, dtype, element count, root, reduce op), so
// every rank learns what each rank called. A mismatch fails that collective on
// every rank with InvalidArgumentError listing what each rank called, and the
// group stays usable. Without the check, a mismatch is undefined behaviour of
// Gloo (a timeout, a wrong result, or an abort inside Gloo): checkCalls =
// false gives up the guarantee that no call of a peer can abort this process.
// Errors Gloo raises on the group's thread are typed: a failed check of
// Gloo's (gloo::EnforceNotMet) is a ProtocolError, a lost connection a
// DisconnectedError, a timeout a TimeoutError; each leaves the group unusable
// (the transport's state is unknown after it).
//
// Small collectives travel whole in the exchange (up to about
// 256 KiB / (size() - 1) bytes: 256 KiB for 2 ranks, 128 KiB for 3):
// an allReduce appends its tensor to its header and every rank reduces the
// ranks' copies locally, in rank order (every rank gets the same bits); a
// broadcast's root appends its tensor; a barrier is the exchange itself. One
// round of messages thus replaces both the check and Gloo's algorithm, so
// such collectives take this path (and are checked) whether or not
// checkCalls is on. Larger ones run their algorithm after the exchange (for
// allReduce, see "Allreduce algorithms"); their header leaves as soon as the
// collective is called, so the peers' headers are usually in when the
// group's thread takes the collective up. Each receive of the exchange is posted with room
// for the largest message any rank may send, so ranks that called different
// things never overrun each other. The exchange keeps staging memory of its
// own: about 1.5 MiB in a group of 2 ranks, under 1 MiB in larger ones.
// bench/collectives_bench compares the group's allReduce with a direct Gloo
// ring allreduce in the same run (--batch-device for a device like this
// group's): the exchange makes small collectives cheaper than Gloo's own,
// and the header round in front of the ring is the one cost at mid sizes.
//
// Allreduce algorithms (GlooOptions::allreduceAlgorithm, the
// WEFT_ALLREDUCE_ALGORITHM variable, or per call with allReduceWith). For a
// tensor of S bytes on N ranks, per rank:
//   ring              Gloo's ring (gloo::allreduce, RING): reduce-scatter then
//                     allgather around the ring, 2(N-1) steps, sends and
//                     receives about 2(N-1)/N x S.
//   ring-chunked      Gloo's AllreduceRingChunked: the same traffic, in
//                     chunks pipelined two at a time, with a notification
//                     message per chunk and step.
//   halving-doubling  Gloo's AllreduceHalvingDoubling: recursive halving
//                     (reduce-scatter) then doubling (allgather), 2 log2(N)
//                     steps for N a power of two (otherwise the ranks beyond
//                     the largest power of two are folded in first), about
//                     2(N-1)/N x S.
//   bcube             Gloo's bcube (gloo::allreduce, BCUBE): groups of peers
//                     exchange in log_base(N) steps.
//   naive             rank 0 receives every rank's tensor, reduces them in
//                     rank order and sends the result back: rank 0 sends and
//                     receives (N-1) x S, the others S each; 2 steps.
//   parallel          every rank sends its tensor to every other rank and
//                     reduces all N in rank order: (N-1) x S each, 1 step.
// naive and parallel are written on the group's connections (the transport
// weft's point-to-point runs on, without its size round) and exist to
// compare against; their results are bit-identical to a reduction in rank
// order, like the call exchange's. Gloo's algorithms reduce in an order the
// algorithm fixes: the same bits on every rank, but not those of a
// rank-ordered sum. The pair-buffer algorithms (ring-chunked,
// halving-doubling) register their buffers for each call and then pass one
// barrier before any data moves (Gloo's TCP loop would otherwise block on a
// message for a buffer not yet registered): one more round per call.
// auto (the default) picks by size, as NCCL's default does (few steps where
// latency dominates, the ring where bandwidth does): a tensor the call
// exchange carries (fusedLimit() bytes or less) travels whole in the
// exchange, one all-to-all round like parallel; larger ones up to
// kBcubeMaxBytes run bcube (about log N steps), larger still ring
// (bandwidth-optimal, Gloo's default, 2(N-1) steps of pipelined segments).
// bench/allreduce_algorithms measured the threshold: on 2 to 4 ranks bcube
// was the fastest of Gloo's algorithms from the fused limit to 4 MiB, ring
// from 16 MiB on. An explicit algorithm bypasses the
// exchange's carrying. The ranks must use the same algorithm for a call:
// the call check compares it (InvalidArgumentError naming each rank's).
//
// Traffic. trafficStats() counts every byte this rank's connections of the
// group send and receive, at the transport (gloo/detail/traffic.h: sends are
// exact; receives on the legacy algorithms' pair buffers count the buffer).
// bench/allreduce_algorithms prints it per algorithm, size and group size.
//
// Destruction. Destroying the group fails collectives still queued with
// StateError, waits for the one running (bounded by the timeout), aborts the
// wait of pending point-to-point transfers (StateError), then closes the
// connections. Peers see their later ops fail with DisconnectedError.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "collectives/process_group.h"
#include "rpc/store.h"

namespace weft::collectives {

// See "Allreduce algorithms".
enum class AllreduceAlgorithm : uint8_t {
  Auto = 0,
  Ring = 1,
  RingChunked = 2,
  HalvingDoubling = 3,
  Bcube = 4,
  Naive = 5,
  Parallel = 6,
};
// "auto", "ring", "ring-chunked", "halving-doubling", "bcube", "naive", "parallel".
const char* allreduceAlgorithmName(AllreduceAlgorithm algorithm);
// The algorithm of that name; InvalidArgumentError naming `what` (where the
// name came from), the name and the names known.
AllreduceAlgorithm parseAllreduceAlgorithm(const std::string& name, const std::string& what);

struct GlooOptions {
  // Bound of rendezvous and of each op; must be > 0. PyTorch's default.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Exchange and compare call headers before each collective (see "Call
  // checking"); every rank of the group passes the same value.
  bool checkCalls = true;
  // The address (or a name resolving to it) this rank's connections bind and
  // peers reach it at. Empty: the address the WEFT_SOCKET_IFNAME variable
  // names (an interface or an address of this machine), else 127.0.0.1 when
  // the store is on a loopback address (the whole job is on this machine),
  // else the local address of this machine's route to the store's host
  // (rpc::localAddressFor, rpc/socket_address.h).
  std::string hostname{};
  // Names the group in the store and in messages; unique among the groups
  // built on one store ([A-Za-z0-9_.-], 1 to 64 characters).
  std::string name = "default";
  // How allReduce runs (see "Allreduce algorithms"); every rank passes the
  // same. Auto: the WEFT_ALLREDUCE_ALGORITHM variable names it when set (an
  // unknown name is an InvalidArgumentError from createGlooGroup naming the
  // variable), else the size rule.
  AllreduceAlgorithm allreduceAlgorithm = AllreduceAlgorithm::Auto;
};

// The largest tensor auto runs with bcube (see "Allreduce algorithms";
// chosen by bench/allreduce_algorithms).
inline constexpr size_t kBcubeMaxBytes = size_t{4} << 20;

// pg.allReduce(tensor, op) with `algorithm` for this call (Auto: the
// group's choice). InvalidArgumentError when pg is not a gloo group.
Work allReduceWith(ProcessGroup& pg, const Tensor& tensor, ReduceOp op, AllreduceAlgorithm algorithm);

// This rank's group of `size` ranks, once every rank has joined (see
// "Rendezvous"). `store` must outlive the group. InvalidArgumentError for a
// bad rank, size or option; TimeoutError / DisconnectedError as described
// under "Rendezvous".
std::unique_ptr<ProcessGroup> createGlooGroup(rpc::StoreClient& store, int rank, int size, GlooOptions options = {});

}  // namespace weft::collectives
