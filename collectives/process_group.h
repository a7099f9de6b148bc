// ProcessGroup: collective communication among a fixed set of processes (the
// ranks 0..size-1 of a group), the data-parallel side of weft next to RPC.
// Backends, one folder each, whose header declares its factory and options:
// gloo (CPU tensors over TCP, collectives/gloo/process_group_gloo.h) and nccl
// (CUDA tensors, collectives/nccl/process_group_nccl.h, in CUDA builds).
//
//   #include "collectives/init.h"
//   auto pg = collectives::init();                        // the job from the environment (collectives/init.h)
//   // or: collectives::init(rpc::Options::fromEnv(), {.timeout = 60s}); collectives::init(agent);
//   Tensor g = ...;                                       // contiguous CPU tensor
//   collectives::Work w = pg->allReduce(g, ReduceOp::Avg);// async: returns at once
//   w.wait();                                             // g now holds the average over the ranks
//   std::vector<Tensor> parts(pg->size(), Tensor());      // filled by allGather: one tensor per rank
//   pg->allGather(parts, g).wait();
//   pg->send(t, /*dst=*/1, /*tag=*/7);                    // blocking point to point
//   Work r = pg->irecvAny(buf, 7); r.wait(); int from = r.sourceRank();
//   auto evens = pg->newGroup({0, 2});                    // every rank calls; null where not a member
//
// Set-up by hand (a store of one's own) is in gloo/process_group_gloo.h; objects
// rather than tensors move with collectives/object_collectives.h.
//
// Reduce ops: Sum, Avg (the sum divided by size(); floating dtypes only),
// Product, Min and Max, each element-wise over the ranks' tensors.
//
// Semantics, like torch.distributed:
//  - In place. allReduce, broadcast and reduce write their result into the
//    tensor passed (reduce: on the root only; others keep their input).
//    Outputs are tensors the caller allocated, whose shape and dtype are
//    checked: allGather fills `outputs` (size() tensors shaped like the input;
//    undefined entries are allocated for the caller, so a vector of undefined
//    tensors works), gather fills them on the root only, scatter and
//    reduceScatter fill `output` from size() inputs (reduceScatter's may be
//    of uneven sizes), allToAll splits input and
//    output into size() equal chunks along dim 0 (chunk i goes to rank i).
//  - Tensors must be contiguous CPU tensors; any dtype moves (broadcast,
//    gather, send, ...; bool included), reductions take the dtypes listed at
//    ReduceOp below. A call that breaks these rules throws
//    InvalidArgumentError at once, naming the op, the argument and its shape
//    or dtype; nothing is queued and no Work is returned.
//  - Every rank of the group calls the same collectives in the same order,
//    with the same shapes, dtypes, roots and ops (a mismatch is an error, see
//    below). A root or peer rank is a rank of this group.
//  - Async. Every call returns a Work at once (send/recv/barrierSync are the
//    blocking shorthands). Collectives of one group run one at a time, in the
//    order they were called, on the group's own thread; point-to-point
//    transfers start at once, independently of the collectives, and complete
//    in any order. Tensors passed must not be touched until the Work
//    completes.
//
// Errors (from Work::wait(), see work.h):
//  - TimeoutError: the op did not finish within the group timeout (default 30
//    minutes, like PyTorch). Names the op, its sequence number, the group and,
//    for a collective, the ranks that never entered it ("ranks [2] have not
//    called allReduce #5", learnt from the progress each rank posts to the
//    store).
//  - DisconnectedError: the connection to a peer was lost (its process died):
//    prompt, never a hang; names the rank(s) whose connection was lost.
//  - InvalidArgumentError: the ranks called different collectives, or the same
//    one with different dtypes, sizes, roots or reduce ops. Every rank learns
//    it from the call headers the ranks exchange before each collective (gloo:
//    Options::checkCalls, on by default) and fails that op alike; the group
//    stays usable.
//  - ProtocolError: a point-to-point transfer whose two sides disagree on its
//    size (the receiver's tensor holds more or fewer bytes than the sender's):
//    both the send and the receive fail, each naming both sizes ("rank 0 sent
//    12 elements of float32 (48 bytes), but this receive's tensor holds 4
//    elements of float32 (16 bytes)"); nothing is written into the receiver's
//    tensor and the group stays usable. Also bytes from a peer that are no
//    weft message at all; the group is then unusable.
//  - StateError: the group is unusable: an earlier op failed with a timeout or
//    a lost connection (the transport state is then unknown), or the group was
//    destroyed while the op was queued. The message repeats the first failure.
//
// Threads. The methods may be called from any thread, but collectives from
// several threads are ordered only as the calls happen to interleave, and
// every rank must issue them in the same order: issue them from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/work.h"
#include "tensor/tensor.h"

namespace weft::rpc {
class StoreClient;
}

namespace weft::collectives {

// How allReduce, reduce and reduceScatter combine the ranks' tensors,
// element by element (x_r is element i of rank r's tensor):
//   Sum      x_0 + x_1 + ... + x_{size-1}
//   Avg      Sum / size(), computed as Sum then one division per element
//   Product  x_0 * x_1 * ... * x_{size-1}
//   Min      the smallest x_r
//   Max      the largest x_r
// Per dtype (gloo backend):
//   float32, float64  every op, in that precision. The order in which ranks'
//                     values are added is fixed by the algorithm (gloo:
//                     "Allreduce algorithms"), not always by rank, so
//                     Sum/Avg/Product may differ from a rank-ordered sum in
//                     the last bits; the result is the same on every rank.
//                     A NaN on any rank makes Sum/Avg/Product NaN; Min/Max of
//                     values with a NaN are unspecified.
//   float16           every op; each partial result is rounded to float16.
//   int64, int32,     Sum, Product, Min, Max, exact; Sum and Product wrap
//   uint8             around on overflow (modulo 2^64, 2^32, 2^8) as in
//                     PyTorch. Avg is refused (it needs a floating dtype:
//                     convert first, or Sum and divide).
//   bool, bfloat16    not reduced (InvalidArgumentError naming the op and the
//                     dtype); for a mask, convert to uint8 and use Max (any)
//                     or Min (all).
enum class ReduceOp : uint8_t { Sum = 0, Avg = 1, Product = 2, Min = 3, Max = 4 };
const char* reduceOpName(ReduceOp op);  // "sum", "avg", ...

// What a process group put on the wire and took off it, counted by the
// backend at its transport (gloo: every send and every completed receive of
// the group's connections, whichever layer posted it: the collective
// algorithms, the call exchange, point-to-point transfers; see
// gloo/detail/traffic.h). Bytes are payload bytes, without the transport's
// fixed-size per-message framing; a message is one send or receive.
// Counters of a sub-group are its own.
struct TrafficStats {
  int64_t bytesSent = 0;
  int64_t bytesReceived = 0;
  int64_t messagesSent = 0;
  int64_t messagesReceived = 0;
  // Sends of more than kControlMessageBytes: the messages that carry tensor
  // data, apart from notifications, barriers and headers (an algorithm's
  // communication steps).
  int64_t dataMessagesSent = 0;
  static constexpr int64_t kControlMessageBytes = 64;
};

// "[0, 2, 3]", for messages.
std::string rankList(const std::vector<int>& ranks);

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backendName() const = 0;
  // The group's name, used in error messages ("default", "default/sub1[0,2]").
  virtual const std::string& name() const = 0;
  // How long an op may run before it fails with TimeoutError (the backend's
  // options); layers that wait on their own (pipeline/shm_ring.h) use the same.
  virtual std::chrono::milliseconds timeout() const = 0;

  // ---- collectives ------------------------------------------------------------
  // Copies root's tensor into every other rank's `tensor`.
  virtual Work broadcast(const Tensor& tensor, int root) = 0;
  virtual Work allReduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // The reduction lands in root's tensor; the other ranks' tensors are unchanged.
  virtual Work reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::Sum) = 0;
  // outputs[i] receives rank i's input. `outputs` has size() entries (an empty
  // vector is resized); undefined entries are allocated like `input`.
  virtual Work allGather(std::vector<Tensor>& outputs, const Tensor& input) = 0;
  // allGather into one tensor of size() * input.numel() elements (rank i's
  // input at offset i * numel), without the copies of the vector form.
  virtual Work allGatherInto(const Tensor& output, const Tensor& input) = 0;
  // As allGather, on root only; other ranks pass an empty vector.
  virtual Work gather(std::vector<Tensor>& outputs, const Tensor& input, int root) = 0;
  // output on rank i receives root's inputs[i]; other ranks pass no inputs.
  virtual Work scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) = 0;
  // output on rank i receives the reduction over the ranks of their inputs[i].
  // The inputs may differ in size (a flat buffer cut into shards of uneven
  // length: pass views of it, nothing is copied); inputs[i] has the dtype of
  // the output, and inputs[rank()] its number of elements. Every rank passes
  // the same sizes (gloo: checked with the call, InvalidArgumentError).
  virtual Work reduceScatter(const Tensor& output, const std::vector<Tensor>& inputs,
                             ReduceOp op = ReduceOp::Sum) = 0;
  // input and output have the same shape, dim 0 divisible by size(): chunk i of
  // the input goes to rank i, chunk j of the output comes from rank j.
  virtual Work allToAll(const Tensor& output, const Tensor& input) = 0;
  virtual Work barrier() = 0;

  // ---- point to point -----------------------------------------------------------
  // Tags are in [0, 2^32): a send matches the receive with the same tag; two
  // transfers with the same tag between the same ranks match in issue order.
  // The receiver's tensor must hold exactly the bytes sent (dtypes may differ):
  // otherwise both sides fail with ProtocolError (see "Errors").
  virtual Work isend(const Tensor& tensor, int dst, uint32_t tag = 0) = 0;
  virtual Work irecv(const Tensor& tensor, int src, uint32_t tag = 0) = 0;
  // Receives from whichever of `srcs` sends first with this tag
  // (Work::sourceRank() says which).
  virtual Work irecvFrom(const Tensor& tensor, const std::vector<int>& srcs, uint32_t tag = 0) = 0;
  // irecvFrom every other rank.
  Work irecvAny(const Tensor& tensor, uint32_t tag = 0);
  // Blocking forms: wait() on the Work.
  void send(const Tensor& tensor, int dst, uint32_t tag = 0);
  void recv(const Tensor& tensor, int src, uint32_t tag = 0);
  // Returns the rank the tensor came from.
  int recvAny(const Tensor& tensor, uint32_t tag = 0);

  // ---- traffic -------------------------------------------------------------------
  // This rank's traffic on this group since it was built or last reset (see
  // TrafficStats). Any thread; a reset while ops run splits their traffic
  // between the two readings. Backends that do not count (nccl) return zeros.
  virtual TrafficStats trafficStats() const { return {}; }
  virtual void resetTrafficStats() {}

  // ---- sub-groups ------------------------------------------------------------------
  // A group of the given ranks of this group (new rank i is ranks[i] here),
  // with its own connections and store prefix. Collective over this group:
  // every rank of it calls newGroup with the same list, in the same order
  // relative to its other newGroup calls; a rank not in the list gets null.
  // The ranks compare their lists first (through the store: each posts its
  // own and reads the others', bounded by the group's timeout), so that every
  // rank of the group fails alike instead of some waiting for a sub-group that
  // never forms.
  // InvalidArgumentError at once for an empty list, a repeated or
  // out-of-range rank; InvalidArgumentError on every rank when the ranks
  // passed different lists, naming what each passed ("newGroup #0 on group
  // 'default': the ranks passed different rank lists: rank 0 passed [0, 2],
  // rank 1 passed [0, 1], ..."); TimeoutError naming the ranks that never
  // called this newGroup. This group stays usable after either.
  virtual std::unique_ptr<ProcessGroup> newGroup(const std::vector<int>& ranks) = 0;

 protected:
  // What every backend checks the same way (InvalidArgumentError naming `op`).
  // checkTensor: a tensor this backend can take (defined, contiguous, on its
  // device); `what` names the argument ("tensor", "outputs[2]").
  virtual void checkTensor(const Tensor& t, const char* op, const std::string& what) const = 0;
  // checkTensor, and the dtype and shape of `ref` (described as `refWhat`).
  void checkLike(const Tensor& t, const Tensor& ref, const char* op, const std::string& what,
                 const std::string& refWhat) const;
  // The per-rank outputs of allGather / gather: an empty vector is resized to
  // size(), undefined entries are allocated like `input` (on its device), and
  // each is checkLike the input.
  void prepareOutputs(std::vector<Tensor>& outputs, const Tensor& input, const char* op) const;
  void checkRoot(int root, const char* op) const;
  // role: "source" or "destination"; a rank may not send to or receive from itself.
  void checkPeer(int peer, const char* op, const char* role) const;
  // newGroup's first step on every backend: numbers the call (sub-group
  // `index`), posts `ranks` under "<prefix>newGroup/<index>/<rank>" in
  // `store`, checks them (non-empty, every rank of this group at most once)
  // and waits for the other ranks' lists, within `timeout`; see newGroup for
  // the errors. Returns the index.
  int agreeOnSubgroup(rpc::StoreClient& store, const std::string& prefix, std::chrono::milliseconds timeout,
                      const std::vector<int>& ranks);
  // This rank's position in `ranks`, or -1 when it is not in it.
  int rankIn(const std::vector<int>& ranks) const;
  // The name of sub-group number `index` of group `parent`: "parent/sub1[0,2]".
  static std::string subgroupName(const std::string& parent, int index, const std::vector<int>& ranks);
  // A group name: 1 to 64 characters from [A-Za-z0-9_.-]; backend names the class for the message.
  static void checkGroupName(const char* backend, const std::string& name);

  // A backend's destructor, for the ops queued for the group's thread but not
  // started: under `mutex`, sets `stopping` (the backend refuses ops from
  // then on) and takes every op out of `queue`, then wakes the thread
  // (`wake`) and fails each op's Work with StateError "<op>: the process
  // group was destroyed before <notStarted>" once `drop(op)` has released
  // what the op holds. Op has a member `Work work`.
  template <class Op, class Drop>
  static void cancelQueued(std::mutex& mutex, std::deque<Op>& queue, bool& stopping, std::condition_variable& wake,
                           const char* notStarted, Drop&& drop) {
    std::deque<Op> cancelled;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
      cancelled.swap(queue);
    }
    wake.notify_all();
    for (Op& op : cancelled) {
      drop(op);
      op.work.fail(destroyedBefore(op.work, notStarted));
    }
  }

  const int rank_;
  const int size_;

 private:
  static std::exception_ptr destroyedBefore(const Work& work, const char* notStarted);
  void checkSubgroupRanks(const std::vector<int>& ranks) const;
  std::atomic<int> nextSubgroup_{0};
};

}  // namespace weft::collectives
