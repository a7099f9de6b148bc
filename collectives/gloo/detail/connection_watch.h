// Failing the waits of a gloo group when one of its connections is lost,
// internal to the gloo backend: every unbound buffer of a group's context is
// a WatchedBuffer (traffic.h's CountingContext makes them here), known to the
// context's ConnectionWatch, which fails the waits of the buffers that depend
// on a connection once it is lost.
//
//   auto watch = std::make_shared<detail::ConnectionWatch>(tcpContext);  // its pairs connected
//   watch->start();                                                      // the watching thread
//   auto buffer = watch->createBuffer(ptr, size, ConnectionWatch::Scope::Group);
//   buffer->send(peer, slot);
//   buffer->waitSend(nullptr, timeout);  // gloo::IoException once a connection it depends on is lost
//   watch->stop();                       // before the connections are closed on purpose
//
// Why. When a connection is lost, Gloo's TCP pair fails what is pending on
// it (a receive, a send the peer has not asked for yet), but not a send it has
// begun to write: a message the socket did not take whole (the peer reads
// slowly, or is stopped), or whose write failed with EPIPE or ECONNRESET (the
// peer's reset came in before the pair's loop thread read it), waits in the
// pair's send queue, and Gloo drops that queue without failing the send's
// buffer. The wait for that send would end only at the group's timeout.
//
// How. The watch's thread holds a receive from every peer on a slot nothing
// sends to (kWatchSlot, call_check.h), which Gloo fails as soon as one of
// those connections is lost. The thread then finds which (a receive posted on
// a lost connection throws at once; kProbeSlot) and marks the buffers that
// depend on them failed:
//   Scope::Group  the buffers of collectives (Gloo's and weft's own): failed
//                 when any connection of the context is lost, since a
//                 collective needs every rank (a rank whose neighbours in a
//                 ring are alive would otherwise wait for them while they
//                 fail, keeping their connections to it); one made after a
//                 loss is failed at once.
//   Scope::Peers  the buffers of point-to-point transfers: failed when the
//                 connection to a peer that one of its operations named is
//                 lost (for a receive from any of several ranks, once all of
//                 them are), so that transfers between live ranks go on.
// A wait on a failed buffer still returns an operation that completed (a
// peer that finished and closed its end is no failure), and otherwise throws
// gloo::IoException ("the connection to rank R was lost: <Gloo's reason>").
// Gloo offers one way to end a wait from outside, abortWaitSend/Recv, whose
// abort wins over a completion that came in at the same moment; so a wait the
// watch ends is retried, each retry ended again once it has waited
// kRetryAfter (the ending thread looks every kRetryAfter / 2), and the wait
// fails after kTries ends without a completion: about kTries x kRetryAfter
// after the loss, plus scheduling delays.
//
// Threads. Buffers are made, posted on and waited on from any thread; the
// watch's thread and, after a first loss, a thread that ends the retries run
// inside. Lock order: the watch's mutex, then a Gloo buffer's own; no Gloo
// pair lock is taken under the watch's mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>

namespace weft::collectives::detail {

class ConnectionWatch;

// An unbound buffer of the watched context: forwards to `inner` (one of
// Gloo's TCP transport), its waits through the watch.
class WatchedBuffer final : public gloo::transport::UnboundBuffer {
 public:
  WatchedBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> inner, std::shared_ptr<ConnectionWatch> watch);
  ~WatchedBuffer() override;

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override;
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override;
  void abortWaitRecv() override;
  void abortWaitSend() override;
  void send(int dstRank, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(int srcRank, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(std::vector<int> srcRanks, uint64_t slot, size_t offset, size_t nbytes) override;

  // Records that an operation naming `peers` is about to be posted on the
  // inner buffer past this one (a pair's own send and recv).
  void posting(std::vector<int> peers);
  gloo::transport::UnboundBuffer* inner() { return inner_.get(); }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> inner_;
  std::shared_ptr<ConnectionWatch> watch_;
};

class ConnectionWatch : public std::enable_shared_from_this<ConnectionWatch> {
 public:
  enum class Scope { Group, Peers };

  // The retries of a wait the watch ended (see "How").
  static constexpr int kTries = 3;
  static constexpr std::chrono::milliseconds kRetryAfter{50};

  // `context`: a connected TCP context (every peer's pair).
  explicit ConnectionWatch(std::shared_ptr<gloo::transport::Context> context);
  ~ConnectionWatch();
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  // Starts the watching thread (once).
  void start();
  // Ends the watch's threads and waits for them; call it before the
  // context's connections are closed on purpose, which it would take for
  // losses. Waits go on as unwatched ones.
  void stop();

  std::unique_ptr<WatchedBuffer> createBuffer(void* ptr, size_t size, Scope scope);

 private:
  friend class WatchedBuffer;
  using Clock = std::chrono::steady_clock;

  // One wait in progress on a buffer (a direction: receive or send).
  struct Waiting {
    bool active = false;
    Clock::time_point since;
    bool ended = false;         // the watch aborted it
    bool abortedByUser = false;  // the buffer's own abortWait* was called
  };
  struct Entry {
    Scope scope = Scope::Group;
    bool failed = false;
    std::vector<std::vector<int>> posted;  // the distinct peer lists its operations named
    Waiting waits[2];                      // [0] receive, [1] send
  };

  void removed(WatchedBuffer* buffer);
  void posting(WatchedBuffer* buffer, std::vector<int> peers);
  void userAbort(WatchedBuffer* buffer, bool isRecv);
  bool wait(WatchedBuffer* buffer, bool isRecv, int* rank, std::chrono::milliseconds timeout);

  void watch();
  // Ends, kRetryAfter after they began, the waits on failed buffers.
  void endRetries();
  // Records the connections lost (rank, Gloo's reason) and fails the buffers
  // that depend on them.
  void lost(const std::vector<std::pair<int, std::string>>& peers);
  // Under mutex_: marks a buffer failed and ends its waits in progress.
  void fail(WatchedBuffer* buffer, Entry& entry);
  // Under mutex_: whether every rank of `peers` is lost.
  bool allLost(const std::vector<int>& peers) const;
  // Under mutex_: the error of a wait on a failed buffer.
  std::string lossMessage() const;

  const std::shared_ptr<gloo::transport::Context> context_;
  std::mutex mutex_;  // guards everything below
  std::condition_variable stopped_;
  std::unordered_map<WatchedBuffer*, Entry> buffers_;
  std::vector<bool> lost_;            // by rank
  std::vector<std::string> reasons_;  // by rank: Gloo's reason for a lost connection
  std::vector<int> lostOrder_;        // the lost ranks, in the order they were found
  bool stopping_ = false;
  gloo::transport::UnboundBuffer* probe_ = nullptr;  // the watching receive while the thread waits on it
  std::thread watcher_;
  std::thread retrier_;  // started by the first loss
};

}  // namespace weft::collectives::detail
