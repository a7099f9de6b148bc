// The call check of the gloo backend (process_group_gloo.h, "Call
// checking"), internal to it: CallHeader, what one rank called, and
// CallExchange, the one round of messages in which every rank of a group
// sends every other rank its header, with the data of a small collective
// appended, so that every rank learns what each rank called and, when they
// all called the same small collective, holds the data it needs to finish it
// locally.
//
//   CallExchange exchange(context, rank, size, maxData);  // once per group (allocates the staging memory)
//   exchange.run(mine, data, bytes, deadline);            // collective thread only; Gloo's exceptions pass through
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
// Slots. Run k uses slot kExchangeSlotBase + k, which nothing else on the
// context uses: Gloo's own collectives build theirs from prefixes 1 to 8 in
// the top byte, user point-to-point tags are below 2^32. Every rank runs the
// same sequence of exchanges (one per collective with checkCalls on; one per
// small collective in any case, see process_group_gloo.h), so k agrees.
//
// Receives posted ahead. Gloo's TCP transport sends a message at once when
// the peer's receive for its slot is already known, and otherwise waits for
// the receiver's notice (one more crossing). So each run ends by posting the
// receives of the next run, into the other of two staging areas: the data of
// run k stays readable until run k + 1 ends. A run returns only after every
// receive and send of its own has completed. After a run that threw, the
// exchange must not be used again (the group is unusable then anyway).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

namespace weft::collectives::gloo_detail {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// The time left until `deadline` as Gloo takes it (at least 1 ms: Gloo reads
// 0 as "no timeout").
std::chrono::milliseconds timeoutUntil(Deadline deadline);

constexpr size_t kHeaderWords = 8;
constexpr size_t kHeaderBytes = kHeaderWords * sizeof(int64_t);
// Top byte 'w': Gloo's collectives build their slots from prefixes 1 to 8 in
// the top byte, user point-to-point tags are below 2^32.
constexpr uint64_t kExchangeSlotBase = uint64_t{0x77} << 56;
// The slot of the receives that find which peers' connections failed
// (ProcessGroupGloo's lostPeers); nothing is ever sent to it.
constexpr uint64_t kProbeSlot = uint64_t{0x78} << 56;

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

  bool operator==(const CallHeader&) const = default;
  // "allReduce #3(float32, 10 elements, op sum)"
  std::string describe() const;
};

class CallExchange {
 public:
  // `maxData`: the most bytes of data any rank of the group sends with its header.
  CallExchange(const std::shared_ptr<gloo::Context>& context, int rank, int size, size_t maxData);
  ~CallExchange();
  CallExchange(const CallExchange&) = delete;
  CallExchange& operator=(const CallExchange&) = delete;

  // Sends `mine` and `bytes` (<= maxData) of `data` to every other rank and
  // receives theirs. Throws what Gloo throws: an IoException on a lost
  // connection, or one saying "Timed out" when a message has not arrived (or
  // not left) by `deadline`.
  void run(const CallHeader& mine, const void* data, size_t bytes, Deadline deadline);

  // After run(), until the next one ends: rank r's header (null when what it
  // sent is not a call header), its data and the data's length in bytes. Rank
  // `rank`'s own are what it sent.
  const CallHeader* headerOf(int r) const;
  const uint8_t* dataOf(int r) const;
  size_t dataBytesOf(int r) const;

 private:
  const uint8_t* messageOf(int r) const;
  // Posts run `run`'s receives into staging area run % 2.
  void postReceives(uint64_t run);

  const int rank_;
  const int size_;
  const size_t maxData_;
  const size_t capacity_;      // of one message: kHeaderBytes + maxData_
  std::vector<uint8_t> send_;  // capacity_
  // Two staging areas of capacity_ per rank (this rank's part unused), each
  // with one buffer per peer (null for this rank): one pending receive per
  // buffer, so a completion is known to come from its rank.
  std::array<std::vector<uint8_t>, 2> recv_;
  std::unique_ptr<gloo::transport::UnboundBuffer> sendBuffer_;
  std::array<std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>, 2> recvBuffers_;
  uint64_t runs_ = 0;         // runs started; run k uses slot kExchangeSlotBase + k
  uint64_t postedUpTo_ = 0;   // runs whose receives are posted
  std::vector<CallHeader> headers_;
  std::vector<bool> valid_;
  std::vector<size_t> dataBytes_;
};

}  // namespace weft::collectives::gloo_detail
