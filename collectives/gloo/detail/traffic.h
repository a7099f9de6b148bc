// Counting what a gloo group puts on the wire: the transport context every
// group's Gloo context runs on (MeshContext installs it), internal to the
// gloo backend. ProcessGroup::trafficStats() reads the counter.
//
//   auto counter = std::make_shared<detail::TrafficCounter>();
//   auto counted = std::make_shared<detail::CountingContext>(tcpContext, counter);  // wraps every pair and buffer
//   ... Gloo and weft post their sends and receives through `counted` ...
//   TrafficStats s = counter->read();
//
// The context's unbound buffers are also watched (connection_watch.h): a
// lost connection fails the waits that depend on it. A buffer from
// createUnboundBuffer(ptr, size) is a collective's (ConnectionWatch::Scope::
// Group), which is how Gloo's collectives make theirs; point-to-point
// transfers ask for Scope::Peers.
//
// What counts. Every send posted through the context adds its byte count
// (the payload Gloo's TCP transport writes after its own fixed-size message
// preamble) and one message, whichever layer posts it: Gloo's collectives
// (unbound buffers, and the pair buffers of the legacy algorithms such as
// halving-doubling), weft's call exchange, point-to-point transfers and the
// hand-written allreduce algorithms. A receive counts once it completes,
// with the bytes the receive was posted for; weft's own receives that are
// posted with room for more than arrives (the call exchange, the size
// header of a point-to-point transfer) restate what arrived with
// countReceivedAs. A receive that never completes (the probe of lost
// connections, the exchange's receives posted ahead) never counts. One
// inexactness: a receive on a pair buffer (Gloo's legacy algorithms,
// ring-chunked and halving-doubling) counts the buffer's size, since Gloo
// does not say how much of it a message filled; ring-chunked's last chunk
// is shorter than its buffer, so its received bytes can exceed what the
// peers sent (by up to a chunk per step, which shows on small tensors).
// Sent bytes are exact everywhere.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include "collectives/gloo/detail/connection_watch.h"
#include "collectives/process_group.h"

namespace weft::collectives::detail {

class TrafficCounter {
 public:
  void sent(size_t bytes) {
    bytesSent_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    messagesSent_.fetch_add(1, std::memory_order_relaxed);
    if (static_cast<int64_t>(bytes) > TrafficStats::kControlMessageBytes) {
      dataMessagesSent_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void received(size_t bytes) {
    bytesReceived_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    messagesReceived_.fetch_add(1, std::memory_order_relaxed);
  }
  // A received message was `bytes` shorter than counted.
  void receivedLess(size_t bytes) { bytesReceived_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed); }
  TrafficStats read() const;
  void reset();

 private:
  std::atomic<int64_t> bytesSent_{0};
  std::atomic<int64_t> bytesReceived_{0};
  std::atomic<int64_t> messagesSent_{0};
  std::atomic<int64_t> messagesReceived_{0};
  std::atomic<int64_t> dataMessagesSent_{0};
};

// A transport context that forwards everything to `inner` (a connected TCP
// context), counts through `counter` and watches the connections (its
// ConnectionWatch runs from construction until stopWatching() or the
// destructor). Its pairs and buffers wrap the inner ones; the inner context
// must not be used directly afterwards.
class CountingContext final : public gloo::transport::Context {
 public:
  CountingContext(std::shared_ptr<gloo::transport::Context> inner, std::shared_ptr<TrafficCounter> counter);
  ~CountingContext() override;

  std::unique_ptr<gloo::transport::Pair>& getPair(int rank) override;
  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override;
  // A collective's buffer (ConnectionWatch::Scope::Group).
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr, size_t size) override;
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr, size_t size,
                                                                      ConnectionWatch::Scope scope);

  const std::shared_ptr<TrafficCounter>& counter() const { return counter_; }

  // Ends the watch: before the connections are closed on purpose.
  void stopWatching();

 private:
  std::shared_ptr<gloo::transport::Context> inner_;
  std::shared_ptr<TrafficCounter> counter_;
  std::shared_ptr<ConnectionWatch> watch_;  // shared with the buffers it watches
};

// For a receive posted on a buffer of a CountingContext with room for more
// than arrived: the message that completed it held `bytes`. Call after its
// wait returned, before the buffer's next receive completes.
void countReceivedAs(gloo::transport::UnboundBuffer& buffer, size_t bytes);

}  // namespace weft::collectives::detail
