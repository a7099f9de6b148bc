// The call check of the gloo backend (gloo/process_group_gloo.h, "Call
// checking"), internal to it: CallHeader, what one rank called, and
// CallExchange, the one round of messages in which every rank of a group
// sends every other rank its header, with the data of a small collective
// appended, so that every rank learns what each rank called and, when they
// all called the same small collective, holds the data it needs to finish it
// locally.
//
//   CallExchange exchange(context, rank, size, maxData);  // once per group (allocates the staging memory)
//   auto out = exchange.post(mine, withData);             // when the op is issued: a bare header leaves now
//   if (withData) exchange.send(*out, data, bytes);       // when it runs: the header with its data leaves
//   exchange.finish(std::move(out), deadline);            // the peers' messages are in
//   for (int r = 0; r < size; ++r) {
//     const CallHeader* h = exchange.headerOf(r);          // null: what rank r sent is not a call header
//     const uint8_t* d = exchange.dataOf(r);               // its data (exchange.dataBytesOf(r) bytes)
//   }
//
// Message from rank i to rank j: [kHeaderBytes of header | data], where data
// is empty or at most maxData bytes. Each rank posts its receive from every
// peer with room for kHeaderBytes + maxData, the most a peer sends whatever
// it called (maxData is the same on every rank of the group): a message never
// exceeds the receive it lands in, even when the ranks called different
// things (Gloo's TCP transport completes a posted receive with a shorter
// message, and aborts the process on a longer one). The header carries the
// data's length, so a receiver knows what came along.
//
// Runs and slots. Each post() starts the next run; run k uses slot
// kExchangeSlotBase + k, which nothing else on the context uses: Gloo's own
// collectives build theirs from prefixes 1 to 8 in the top byte, user
// point-to-point tags are below 2^32. Every rank runs the same sequence of
// exchanges (one per collective with checkCalls on; one per small collective
// in any case, see gloo/process_group_gloo.h), so k agrees.
//
// Early messages. A bare header leaves when its op is issued (post), not when
// the op reaches the front of the group's queue (finish): by the time the
// collective thread takes the op up, the peers' headers are usually in. A
// header with data leaves when the op runs (send), since only then is the
// data final (an op queued before it may still write the same tensor). And
// Gloo's TCP transport sends a message at once when the peer's receive for
// its slot is already known, and otherwise waits for the receiver's notice
// (one more crossing): so each finish ends by posting the receives of the
// next run, into the other of two staging areas. The data of run k stays
// readable until run k + 1 finishes.
//
// Threads and lifetimes. post() may be called from any thread but is
// serialised by the caller (the group's queue lock): it numbers the runs in
// call order. send(), finish() and the accessors run on one thread (the
// collective thread), in run order. A message's staging memory goes back to
// a pool once it has left and the next run has finished (a data message's is
// taken only by send(), so queued collectives hold none); a message whose run
// is never finished (abandon(), or a finish that threw) is kept until the
// exchange is destroyed, since a send of it may still be pending. After a
// finish that threw, no later run can be finished (the group is unusable
// then anyway). Staging memory: two receive areas of kHeaderBytes + maxData
// per rank, and about two send areas of that size.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

namespace weft::collectives::detail {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// The time left until `deadline` as Gloo takes it (at least 1 ms: Gloo reads
// 0 as "no timeout").
std::chrono::milliseconds timeoutUntil(Deadline deadline);

constexpr size_t kHeaderWords = 10;
constexpr size_t kHeaderBytes = kHeaderWords * sizeof(int64_t);
// Top byte 'w': Gloo's collectives build their slots from prefixes 1 to 8 in
// the top byte, user point-to-point tags are below 2^32.
constexpr uint64_t kExchangeSlotBase = uint64_t{0x77} << 56;
// The slot of the receives that find which peers' connections failed
// (ProcessGroupGloo's lostPeers, the ConnectionWatch); nothing is ever sent
// to it.
constexpr uint64_t kProbeSlot = uint64_t{0x78} << 56;
// The receives by which a group's ConnectionWatch (connection_watch.h) learns
// of a lost connection (one per live peer, posted again after each loss;
// nothing is ever sent to it). The hand-written algorithms' own messages use
// top byte 0x7C.
constexpr uint64_t kWatchSlot = uint64_t{0x7D} << 56;
// Point-to-point transfers (ProcessGroupGloo::isend/irecv with user tag t,
// below 2^32): the sender's size header travels on kP2pHeaderBase | t, so
// headers of one tag match in issue order; the data and the receiver's verdict
// on slots of their own, numbered by the sender's count s of transfers to that
// receiver (24 bits, unique among the transfers in flight):
// base | s << 32 | t.
constexpr uint64_t kP2pHeaderBase = uint64_t{0x79} << 56;
constexpr uint64_t kP2pDataBase = uint64_t{0x7A} << 56;
constexpr uint64_t kP2pVerdictBase = uint64_t{0x7B} << 56;
constexpr uint64_t kP2pSeqMask = (uint64_t{1} << 24) - 1;

enum class OpCode : int64_t {
  Broadcast = 1,
  AllReduce,
  Reduce,
  AllGather,
  Gather,
  Scatter,
  ReduceScatter,
  AllToAll,
  Barrier,
};

const char* opName(OpCode op);

// What a rank called. Fields that do not apply to an op are -1.
struct CallHeader {
  OpCode op = OpCode::Barrier;
  int64_t seq = 0;
  int64_t dtype = -1;
  int64_t numel = -1;
  int64_t root = -1;
  int64_t reduceOp = -1;
  // allReduce: the algorithm that runs it (AllreduceAlgorithm, resolved:
  // never Auto); the ranks must agree on it.
  int64_t algorithm = -1;
  // reduceScatter: a hash of the element counts of the ranks' shards, which
  // the ranks must agree on (numel is their sum).
  int64_t split = -1;

  bool operator==(const CallHeader&) const = default;
  // "allReduce #3(float32, 10 elements, op sum)"
  std::string describe() const;
};

class CallExchange {
 public:
  // Memory a message is sent from: kHeaderBytes, or room for the most data.
  struct Staging {
    std::vector<uint8_t> bytes;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };
  // One rank's message of one run, from post() to finish() or abandon().
  struct Outgoing {
    uint64_t run = 0;
    CallHeader header;
    std::unique_ptr<Staging> staging;  // from send() on, for a run with data
    int sends = 0;                     // started
    std::exception_ptr postError;
  };

  // `maxData`: the most bytes of data any rank of the group sends with its header.
  CallExchange(const std::shared_ptr<gloo::Context>& context, int rank, int size, size_t maxData);
  ~CallExchange();
  CallExchange(const CallExchange&) = delete;
  CallExchange& operator=(const CallExchange&) = delete;

  // Starts the next run with this rank's header `mine`. Without data it
  // starts sending the header to every other rank now; with data, send()
  // does. A send that cannot start (a lost connection) is kept and thrown by
  // finish().
  std::unique_ptr<Outgoing> post(const CallHeader& mine, bool withData);
  // For a run posted with data: starts sending `out`'s header with `bytes`
  // (<= maxData) of `data` appended to every other rank.
  void send(Outgoing& out, const void* data, size_t bytes);
  // Receives the other ranks' messages of `out`'s run and waits until `out`
  // has left. Throws what Gloo throws: an IoException on a lost connection, or
  // one saying "Timed out" when a message has not arrived (or not left) by
  // `deadline`.
  void finish(std::unique_ptr<Outgoing> out, Deadline deadline);
  // For a run that will never be finished (its op failed before it ran).
  void abandon(std::unique_ptr<Outgoing> out);

  // After finish(), until the next one: rank r's header (null when what it
  // sent is not a call header), its data and the data's length in bytes. Rank
  // `rank`'s own are what it sent.
  const CallHeader* headerOf(int r) const;
  const uint8_t* dataOf(int r) const;
  size_t dataBytesOf(int r) const;

 private:
  const uint8_t* messageOf(int r) const;
  // Posts run `run`'s receives into staging area run % 2.
  void postReceives(uint64_t run);
  // A staging area of `size` bytes, from the pool or new.
  std::unique_ptr<Staging> takeStaging(size_t size);
  // Writes `out`'s header with `bytes` of data (already in place after it)
  // and starts sending it to every other rank.
  void sendToPeers(Outgoing& out, size_t bytes);
  // Keeps `out` until the exchange is destroyed.
  void retire(std::unique_ptr<Outgoing> out);

  std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int size_;
  const size_t maxData_;
  const size_t capacity_;  // of one message: kHeaderBytes + maxData_
  // Two staging areas of capacity_ per rank (this rank's part unused), each
  // with one buffer per peer (null for this rank): one pending receive per
  // buffer, so a completion is known to come from its rank.
  std::array<std::vector<uint8_t>, 2> recv_;
  std::array<std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>, 2> recvBuffers_;
  uint64_t posted_ = 0;       // runs started by post(); under the caller's lock
  uint64_t receivedUpTo_ = 0; // runs whose receives are posted; finish's thread only
  std::unique_ptr<Outgoing> current_;  // the last finished run's message

  std::mutex poolMutex_;  // guards the pools and retired_
  std::vector<std::unique_ptr<Staging>> headerPool_;  // of kHeaderBytes
  std::vector<std::unique_ptr<Staging>> fullPool_;    // of capacity_
  std::vector<std::unique_ptr<Outgoing>> retired_;

  std::vector<CallHeader> headers_;
  std::vector<bool> valid_;
  std::vector<size_t> dataBytes_;
};

}  // namespace weft::collectives::detail
