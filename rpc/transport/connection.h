// Connection: one TCP connection between two agents (or an agent's loopback to
// itself), carrying frames (rpc/frame.h) in both directions.
//
//   auto c = transport::Connection::create(loop, fd, limits, {
//       .onFrame = [](transport::Connection& c, rpc::IncomingFrame f) { ... },   // loop thread
//       .onClosed = [](transport::Connection& c, const Status& why) { ... }},    // loop thread, once
//       "worker1 (rank 1)");
//   loop.post([c] { c->startOnLoop(); });
//   c->send(std::move(frame));                                                  // any thread
//
// Reading. The socket is watched with a uv_poll handle on the owning loop; on
// readable, the connection reads straight into FrameDecoder::prepareRead() (tensor
// bytes land in their final Storage) until the socket is drained or a fairness
// budget is spent, and hands each complete frame to onFrame in order. A decoder
// error (hostile or broken bytes) fails the connection: an Abort frame naming the
// problem is written if the socket takes it, then the socket is closed and
// onClosed reports Status{protocol}. End of stream between frames is
// Status{disconnected}; in the middle of a frame, Status{protocol} saying what was
// truncated.
//
// Writing. send() appends the frame to the connection's queue under a mutex.
// Who writes it:
//  - a thread with nothing else queued on this connection writes at once with
//    writev (the caller's own thread: no hop through the loop on the latency path);
//  - on the loop thread inside a WriteBatch (every read callback is one), frames
//    are queued and the batch writes each touched connection once at its end;
//  - a pool thread under load (ThreadPool::underLoad) leaves the write to the
//    loop, posting one flush however many frames join the queue meanwhile;
//  - when the socket is full (EAGAIN), the rest waits for the loop's writable
//    callback; frames sent meanwhile join the queue.
// A queue of small frames is written by one writev of up to IOV_MAX spans: this
// coalescing is what makes thousands of small calls per second cheap. Frames are
// written in the order send() was called (per thread; across threads in the
// order they took the mutex).
//
// Failing. A socket error (a reset, as when the peer's process dies with bytes
// unread in its socket; a TCP timeout) closes the connection as soon as the
// loop sees it: the frames that arrived before it are delivered, then onClosed
// reports Status{disconnected} naming the error. So does a failed read or
// write; nothing leaves a dead socket unwatched until the next heartbeat.
//
// Liveness. lastReceivedOnLoop() is when bytes last arrived; lastHeardOnLoop()
// also counts the moment a full socket took more bytes (the peer's process read
// what was queued, so a peer busy reading a long stream is heard although its
// own frames wait behind it); hasUnreadBytesOnLoop() tells whether bytes are
// waiting in the socket, not yet read.
//
// Closing. close(status) closes at once (queued frames are dropped); fail(status)
// writes an Abort first; closeGracefully() writes what is queued, half-closes
// (shutdown SHUT_WR) and closes when the peer's end of stream arrives, or at
// once on a socket error (a peer that resets instead of ending its stream, as
// one that closed abruptly does when this side's last frames reach it). onClosed
// runs once in every case, on the loop thread, after which send() returns false.
// Statuses say what happened ("connection closed by the peer", "frame 3: ...");
// the owner adds description() where it reports them.
//
// Thread-safety: send, close, fail and closeGracefully from any thread; the
// functions whose names end in OnLoop on the loop thread (rpc/uv_loop.h,
// "Loop-thread functions").
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "rpc/frame.h"
#include "rpc/uv_loop.h"

struct uv_poll_s;

namespace weft::rpc::transport {

// Counters a set of connections shares (an agent's statistics).
struct TransportCounters {
  std::atomic<uint64_t> writeSyscalls{0};
  std::atomic<uint64_t> framesWritten{0};
  std::atomic<uint64_t> bytesWritten{0};  // to the sockets, framing included
  std::atomic<uint64_t> bytesRead{0};     // from the sockets
};

class Connection;

// While one is alive on the loop thread, send() from that thread only queues;
// the batch writes each connection it touched once, when it ends. Nested
// batches join the outermost.
class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(const WriteBatch&) = delete;
  WriteBatch& operator=(const WriteBatch&) = delete;

  static WriteBatch* current();
  void add(std::shared_ptr<Connection> connection);

 private:
  bool outermost_;
  std::vector<std::shared_ptr<Connection>> connections_;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  struct Handlers {
    std::function<void(Connection&, IncomingFrame)> onFrame;
    std::function<void(Connection&, const Status&)> onClosed;
  };

  // Takes ownership of fd, a connected TCP socket (made non-blocking here).
  static std::shared_ptr<Connection> create(UvLoop& loop, int fd, FrameLimits limits, Handlers handlers,
                                            std::string description, TransportCounters* counters = nullptr);
  // A connection to this same process: a sent frame is decoded (one copy of its
  // bytes) and delivered to onFrame on the loop thread, in order.
  static std::shared_ptr<Connection> loopback(UvLoop& loop, FrameLimits limits, Handlers handlers,
                                              std::string description);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts watching the socket. Once.
  void startOnLoop();

  // Queues frame for writing (see "Writing"); false when the connection is
  // closed or closing (the frame is dropped).
  bool send(OutgoingFrame frame);

  void close(Status why);
  void fail(Status why);
  void closeGracefully();

  bool closed() const;
  bool isLoopback() const { return fd_ < 0; }
  const std::string& description() const { return description_; }
  // The peer's "host:port" as the socket reports it ("self" for a loopback connection).
  const std::string& remoteAddress() const { return remote_; }
  // Names the connection in later log lines and statuses (e.g. once the peer has
  // said who it is).
  void setDescription(std::string description);
  // See FrameDecoder::setLimits.
  void setLimitsOnLoop(const FrameLimits& limits) {
    WEFT_DCHECK_ON_LOOP(loop_);
    decoder_.setLimits(limits);
  }
  // When bytes last arrived (or the connection started).
  std::chrono::steady_clock::time_point lastReceivedOnLoop() const {
    WEFT_DCHECK_ON_LOOP(loop_);
    return lastReceived_;
  }
  // When bytes last arrived, or the socket, full, took more.
  std::chrono::steady_clock::time_point lastHeardOnLoop() const {
    WEFT_DCHECK_ON_LOOP(loop_);
    return lastHeard_;
  }
  // Bytes have arrived that the connection has not read yet.
  bool hasUnreadBytesOnLoop() const;

 private:
  friend class WriteBatch;
  Connection(UvLoop& loop, int fd, FrameLimits limits, Handlers handlers, std::string description,
             TransportCounters* counters);

  static void onPoll(uv_poll_s* handle, int status, int events);
  // Reads until the socket is drained or a fairness budget is spent; true in
  // the latter case (more may be waiting).
  bool onReadableOnLoop();
  // "socket error: <the socket's pending error, else the poll status>".
  std::string socketError(int pollStatus) const;
  void onWritableOnLoop();
  void deliverLoopbackOnLoop(std::vector<std::byte> bytes);
  void deliverFramesOnLoop();
  // Writes from the queue until it is empty or the socket is full. writeMutex_ held.
  void flushLocked(std::unique_lock<std::mutex>& lock);
  // Flushes and, when the queue stays non-empty, watches for writable.
  void flushOnLoop();
  void updatePollLocked();
  void closeNowOnLoop(Status why);
  void afterDrainLocked();

  UvLoop& loop_;
  int fd_;
  std::string description_;
  std::string remote_;
  TransportCounters* counters_;
  Handlers handlers_;
  FrameDecoder decoder_;
  bool fdOwned_;                // fd_ is open and closing it is ours (not the poll handle's)
  uv_poll_s* poll_ = nullptr;  // loop thread
  std::chrono::steady_clock::time_point lastReceived_;
  std::chrono::steady_clock::time_point lastHeard_;  // loop thread
  bool started_ = false;
  bool closeReported_ = false;  // loop thread

  mutable std::mutex writeMutex_;
  std::deque<OutgoingFrame> queue_;  // under writeMutex_
  size_t frontSpan_ = 0;             // progress inside queue_.front()
  size_t frontOffset_ = 0;
  uint64_t bytesWritten_ = 0;        // under writeMutex_
  bool awaitingWritable_ = false;    // the loop writes the rest when the socket drains
  bool flushPosted_ = false;         // a flush task is queued on the loop
  bool inBatch_ = false;             // a WriteBatch on the loop thread will flush
  bool closing_ = false;             // closeGracefully: no new frames, half-close once drained
  bool halfClosed_ = false;
  bool closed_ = false;
  bool pollWritable_ = false;        // what the poll handle currently watches (loop thread)
};

}  // namespace weft::rpc::transport
