// StoreClient: connection, requests and replies on the loop thread, behind the
// thread-safe API of rpc/store.h.
//
// States (loop thread):  Connecting -> Handshaking -> Ready -> Closed
//   Connecting/Handshaking may fall back to Connecting (after a retry delay)
//   until the connect deadline. A Ready connection that is lost goes back to
//   Connecting (reconnecting_): requests stay pending and are sent again once
//   Ready. Closed is final (rejected handshake, connect or reconnect timeout,
//   a server that refuses connections or was restarted, close()).
// Tables (loop thread):
//   pending_     request id -> what was asked, its frame (kept to send it
//                again) and how to complete its future
//   unsettled_   ids of the pending updates; the smallest is sent as every
//                update's `settled` field (store_protocol.h)
//   deadlines_   (reply deadline, request id); one timer serves them all
// Request ids come from an atomic counter so that frames are encoded on the
// calling thread; id 0 is the Hello.
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/logging.h"
#include "rpc/socket_address.h"
#include "rpc/store.h"

namespace weft::rpc {

using store::BodyReader;
using store::FrameWriter;
using store::Op;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr uint64_t kHelloId = 0;
constexpr milliseconds kFirstRetryDelay{10};
constexpr milliseconds kMaxRetryDelay{250};
// How long one connection attempt (connect and hello) may take before it is
// abandoned and retried (a partitioned network drops it silently); doubled
// after each attempt that runs out, up to the maximum.
constexpr milliseconds kFirstAttemptTimeout{2000};
constexpr milliseconds kMaxAttemptTimeout{16000};
// How much longer than a get/wait's own timeout the client waits for the
// server to report it, before giving up on the server itself.
constexpr milliseconds kReplyGrace{2000};

std::string barrierPrefix(const std::string& name) { return "weft/barrier/" + name + "/"; }

uint64_t randomClientId() {
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id ^ (static_cast<uint64_t>(::getpid()) << 16) ^
         static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
}

std::string secondsSince(Clock::time_point t) {
  return store::describeDuration(std::chrono::duration_cast<milliseconds>(Clock::now() - t));
}

}  // namespace

class StoreClient::Impl : public std::enable_shared_from_this<Impl> {
 public:
  // Completes a request: with the reply's payload when s is ok, else with s.
  using Completion = std::function<void(const Status& s, BodyReader* payload)>;

  // How a request is sent again after a reconnection.
  enum class Kind {
    Read,     // run again as it is
    Waiting,  // Get, Wait: its trailing timeout becomes the time left
    Update,   // Set, Add, CompareSet, Delete: its trailing `settled` is refreshed; the server dedups it
  };

  Impl(UvLoop& loop, Config config, SocketAddress address, std::string endpoint)
      : loop_(loop),
        config_(std::move(config)),
        address_(address),
        endpoint_(std::move(endpoint)),
        clientId_(randomClientId()) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  uint64_t nextRequestId() { return nextId_.fetch_add(1, std::memory_order_relaxed); }
  bool connected() const { return connected_.load(std::memory_order_acquire); }
  const std::string& endpoint() const { return endpoint_; }

  // Sends a frame built on the calling thread (any thread) and returns the
  // future of its reply, decoded by decode(BodyReader&) -> T.
  template <class T, class Decode>
  Future<T> request(uint64_t id, std::string what, std::string frame, std::optional<milliseconds> replyTimeout,
                    Kind kind, Decode decode) {
    Promise<T> promise;
    Future<T> result = promise.getFuture();
    Pending p;
    p.what = std::move(what);
    p.replyTimeout = replyTimeout;
    p.kind = kind;
    p.frame = std::make_shared<std::string>(std::move(frame));
    p.complete = [promise, decode](const Status& s, BodyReader* payload) mutable {
      if (!s.ok()) {
        promise.setError(s);
      } else if constexpr (std::is_void_v<T>) {
        decode(*payload);
        promise.setValue();
      } else {
        promise.setValue(decode(*payload));
      }
    };
    bool posted = loop_.post([self = shared_from_this(), id, p = std::move(p)]() mutable {
      self->startOnLoop(id, std::move(p));
    });
    if (!posted) {
      promise.setError(Status::disconnected("store: cannot send a request to the server at " + endpoint_ +
                                            ": the client's event loop has stopped"));
    }
    return result;
  }

  // ---- connecting (loop thread) -------------------------------------------------------

  void startConnectOnLoop(Promise<store::Limits> connected) {
    WEFT_DCHECK_ON_LOOP(loop_);
    connectPromise_ = std::move(connected);
    uv_loop_t* loop = loop_.raw();
    for (uv_timer_t* t : {&connectTimer_, &retryTimer_, &replyTimer_, &attemptTimer_}) {
      uv_timer_init(loop, t);
      t->data = this;
      ++openHandles_;
    }
    if (config_.connectTimeout.count() > 0) {
      uv_timer_start(&connectTimer_, &Impl::onConnectDeadline, static_cast<uint64_t>(config_.connectTimeout.count()), 0);
    }
    attemptOnLoop();
  }

  // ---- closing (loop thread) -----------------------------------------------------------

  void beginCloseOnLoop(Promise<void> done) {
    WEFT_DCHECK_ON_LOOP(loop_);
    closeWaiters_.push_back(std::move(done));
    if (!closing_) {
      closing_ = true;
      setClosedOnLoop("the client was closed");
      failAllOnLoop(StatusCode::Cancelled, [this](const Pending& p) {
    WEFT_DCHECK_ON_LOOP(loop_);
        return "store: the client was closed while waiting for " + p.what + " (server " + endpoint_ + ")";
      });
      if (connectPromise_.has_value()) {
        connectPromise_->setError(Status::cancelled("store: the client was closed while connecting to " + endpoint_));
        connectPromise_.reset();
      }
      closeSocketOnLoop(false);
      for (uv_timer_t* t : {&connectTimer_, &retryTimer_, &replyTimer_, &attemptTimer_}) {
        uv_close(reinterpret_cast<uv_handle_t*>(t), &Impl::onHandleClosed);
      }
    }
    maybeFinishCloseOnLoop();
  }

  // ---- operations (any thread) -------------------------------------------------------
  // Arguments are checked by StoreClient before they get here.

  Future<void> setAsync(const std::string& key, std::string value) {
    uint64_t id = nextRequestId();
    std::string frame = FrameWriter(id, static_cast<uint8_t>(Op::Set)).str(key).str(value).u64(0).finish();
    return request<void>(id, "set(" + store::describeKey(key) + ")", std::move(frame), replyTimeout(), Kind::Update,
                         [](BodyReader& r) { r.expectEnd("set reply"); });
  }

  Future<std::string> getAsync(const std::string& key, milliseconds timeout) {
    uint64_t id = nextRequestId();
    std::string frame = FrameWriter(id, static_cast<uint8_t>(Op::Get))
                            .str(key)
                            .u64(static_cast<uint64_t>(timeout.count()))
                            .finish();
    return request<std::string>(id, "get(" + store::describeKey(key) + ")", std::move(frame),
                                waitingReplyTimeout(timeout), Kind::Waiting, [](BodyReader& r) {
                                  std::string value(r.str("value", UINT32_MAX));
                                  r.expectEnd("get reply");
                                  return value;
                                });
  }

  Future<void> waitAsync(const std::vector<std::string>& keys, milliseconds timeout) {
    uint64_t id = nextRequestId();
    std::string frame = FrameWriter(id, static_cast<uint8_t>(Op::Wait))
                            .keys(keys)
                            .u64(static_cast<uint64_t>(timeout.count()))
                            .finish();
    return request<void>(id, "wait(" + store::describeKeys(keys) + ")", std::move(frame),
                         waitingReplyTimeout(timeout), Kind::Waiting,
                         [](BodyReader& r) { r.expectEnd("wait reply"); });
  }

  Future<bool> checkAsync(const std::vector<std::string>& keys) {
    uint64_t id = nextRequestId();
    std::string frame = FrameWriter(id, static_cast<uint8_t>(Op::Check)).keys(keys).finish();
    return request<bool>(id, "check(" + store::describeKeys(keys) + ")", std::move(frame), replyTimeout(),
                         Kind::Read, [](BodyReader& r) {
                           bool all = r.u8("allExist") != 0;
                           r.expectEnd("check reply");
                           return all;
                         });
  }

  Future<int64_t> addAsync(const std::string& key, int64_t delta) {
    uint64_t id = nextRequestId();
    std::string frame = FrameWriter(id, static_cast<uint8_t>(Op::Add)).str(key).i64(delta).u64(0).finish();
    return request<int64_t>(id, "add(" + store::describeKey(key) + ", " + std::to_string(delta) + ")",
                            std::move(frame), replyTimeout(), Kind::Update, [](BodyReader& r) {
                              int64_t value = r.i64("value");
                              r.expectEnd("add reply");
                              return value;
                            });
  }

  Future<std::string> compareSetAsync(const std::string& key, std::string expected, std::string desired) {
    uint64_t id = nextRequestId();
    std::string frame =
        FrameWriter(id, static_cast<uint8_t>(Op::CompareSet)).str(key).str(expected).str(desired).u64(0).finish();
    return request<std::string>(id, "compareSet(" + store::describeKey(key) + ")", std::move(frame),
                                replyTimeout(), Kind::Update, [](BodyReader& r) {
                                  std::string value(r.str("value", UINT32_MAX));
                                  r.expectEnd("compareSet reply");
                                  return value;
                                });
  }

  Future<bool> deleteKeyAsync(const std::string& key) {
    uint64_t id = nextRequestId();
    std::string frame = FrameWriter(id, static_cast<uint8_t>(Op::Delete)).str(key).u64(0).finish();
    return request<bool>(id, "deleteKey(" + store::describeKey(key) + ")", std::move(frame), replyTimeout(),
                         Kind::Update, [](BodyReader& r) {
                           bool existed = r.u8("existed") != 0;
                           r.expectEnd("deleteKey reply");
                           return existed;
                         });
  }

  Future<int64_t> numKeysAsync() {
    uint64_t id = nextRequestId();
    std::string frame = FrameWriter(id, static_cast<uint8_t>(Op::NumKeys)).finish();
    return request<int64_t>(id, "numKeys()", std::move(frame), replyTimeout(), Kind::Read, [](BodyReader& r) {
      int64_t n = r.i64("count");
      r.expectEnd("numKeys reply");
      return n;
    });
  }

  // Round k of a barrier: the participants' k-th arrivals raise the counter
  // from k*W+1 to (k+1)*W; the one that reaches (k+1)*W sets "round<k>", which
  // the others wait for. That one also deletes "round<k-1>": every participant
  // has left round k-1, or it could not have arrived for round k.
  Future<void> barrierAsync(const std::string& name, int worldSize, milliseconds timeout) {
    std::string prefix = barrierPrefix(name);
    Clock::time_point start = Clock::now();
    Promise<void> done;
    Future<void> result = done.getFuture();
    auto self = shared_from_this();
    addAsync(prefix + "count", 1)
        .onComplete([self, done, prefix, name, worldSize, timeout, start](const Future<int64_t>& arrival) mutable {
          if (arrival.hasError()) {
            done.setError(arrival.exception());
            return;
          }
          int64_t n = arrival.get();
          int64_t round = (n - 1) / worldSize;
          std::string release = prefix + "round" + std::to_string(round);
          if (n % worldSize == 0) {
            done.setFrom(self->setAsync(release, "1"));
            if (round > 0) self->deleteKeyAsync(prefix + "round" + std::to_string(round - 1));
            return;
          }
          milliseconds remaining{0};
          if (timeout.count() > 0) {
            auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
            remaining = std::max(milliseconds(1), timeout - elapsed);
          }
          self->waitAsync({release}, remaining)
              .onComplete([self, done, prefix, name, worldSize, timeout, round](const Future<void>& released) mutable {
                if (!released.hasError()) {
                  done.setValue();
                  return;
                }
                if (released.status().code() != StatusCode::Timeout) {
                  done.setError(released.exception());
                  return;
                }
                // Say how far the round got: the counter, read by adding 0.
                self->addAsync(prefix + "count", 0)
                    .onComplete([done, name, worldSize, timeout, round](const Future<int64_t>& count) mutable {
                      std::string arrived =
                          count.hasError() ? "an unknown number"
                                           : std::to_string(std::clamp<int64_t>(count.get() - round * worldSize, 0,
                                                                                worldSize));
                      done.setError(Status::timeout("store: barrier '" + name + "' timed out after " +
                                                    store::describeDuration(timeout) + ": " + arrived + " of " +
                                                    std::to_string(worldSize) + " participants arrived"));
                    });
              });
        });
    return result;
  }

 private:
  enum class State { Connecting, Handshaking, Ready, Closed };

  struct Pending {
    std::string what;  // "get('key')": names the request in errors
    std::optional<milliseconds> replyTimeout;
    Completion complete;
    Kind kind = Kind::Read;
    std::shared_ptr<std::string> frame;  // kept until answered, to be sent again after a reconnection
    Clock::time_point started{};
  };

  struct WriteRequest {
    uv_write_t req{};
    Impl* client = nullptr;
    uint64_t generation = 0;  // of the socket it was written to
    std::shared_ptr<std::string> bytes;
  };

  static Impl* self(uv_handle_t* h) { return static_cast<Impl*>(h->data); }

  // How long a non-waiting request waits for its reply.
  std::optional<milliseconds> replyTimeout() const {
    if (config_.timeout.count() == 0) return std::nullopt;
    return config_.timeout;
  }
  // For get/wait: the server reports their own timeout; the client gives up
  // on the server only a grace period later.
  static std::optional<milliseconds> waitingReplyTimeout(milliseconds timeout) {
    if (timeout.count() == 0) return std::nullopt;
    return timeout + kReplyGrace;
  }

  // ---- connection attempts -----------------------------------------------------------

  void attemptOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    ++attempts_;
    ++generation_;
    state_ = State::Connecting;
    uv_tcp_init(loop_.raw(), &tcp_);
    tcp_.data = this;
    socketOpen_ = true;
    ++openHandles_;
    in_ = store::FrameBuffer(store::Limits().maxReplyBody());
    connectRequest_.data = this;
    uv_timer_start(&attemptTimer_, &Impl::onAttemptTimeout, static_cast<uint64_t>(attemptTimeout_.count()), 0);
    int rc = uv_tcp_connect(&connectRequest_, &tcp_, address_.sockaddr(), &Impl::onConnected);
    if (rc < 0) attemptFailedOnLoop(uv_strerror(rc), rc == UV_ECONNREFUSED);
  }

  static void onConnected(uv_connect_t* req, int status) {
    Impl* s = static_cast<Impl*>(req->data);
    if (status == UV_ECANCELED || s->state_ != State::Connecting) return;  // we closed the socket
    if (status < 0) return s->attemptFailedOnLoop(uv_strerror(status), status == UV_ECONNREFUSED);
    uv_tcp_nodelay(&s->tcp_, 1);
    uv_os_fd_t fd;
    if (uv_fileno(reinterpret_cast<uv_handle_t*>(&s->tcp_), &fd) == 0) detectDeadPeers(fd);
    uv_read_start(reinterpret_cast<uv_stream_t*>(&s->tcp_), &Impl::onAlloc, &Impl::onRead);
    s->state_ = State::Handshaking;
    s->writeOnLoop(std::make_shared<std::string>(FrameWriter(kHelloId, static_cast<uint8_t>(Op::Hello))
                                               .u32(store::kMagic)
                                               .u16(store::kVersion)
                                               .str(s->config_.token)
                                               .u64(s->clientId_)
                                               .finish()));
  }

  // This attempt failed in a way worth retrying: close the socket, retry after
  // a delay (unless the connect deadline fires first). While reconnecting, a
  // refused connection is final: the host answered and nothing listens, so
  // the server (which is never restarted in place) is gone.
  void attemptFailedOnLoop(const std::string& error, bool refused = false) {
    WEFT_DCHECK_ON_LOOP(loop_);
    lastError_ = error;
    uv_timer_stop(&attemptTimer_);
    if (reconnecting_ && refused) {
      return connectionLostOnLoop(StatusCode::Disconnected,
                            lostDetailOnLoop() + ", and reconnecting was refused (" + error +
                                "): the server no longer listens");
    }
    retryDelay_ = retryDelay_.count() == 0 ? kFirstRetryDelay : std::min(retryDelay_ * 2, kMaxRetryDelay);
    state_ = State::Connecting;
    closeSocketOnLoop(true);
  }

  static void onRetry(uv_timer_t* t) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(t));
    if (s->state_ == State::Connecting && !s->socketOpen_) s->attemptOnLoop();
  }

  static void onAttemptTimeout(uv_timer_t* t) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(t));
    if (s->state_ != State::Connecting && s->state_ != State::Handshaking) return;
    milliseconds spent = s->attemptTimeout_;
    s->attemptTimeout_ = std::min(s->attemptTimeout_ * 2, kMaxAttemptTimeout);
    s->attemptFailedOnLoop(std::string(s->state_ == State::Connecting ? "no connection" : "no answer to the hello") +
                     " within " + store::describeDuration(spent));
  }

  static void onConnectDeadline(uv_timer_t* t) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(t));
    if (s->state_ != State::Connecting && s->state_ != State::Handshaking) return;
    if (s->reconnecting_) {
      return s->connectionLostOnLoop(StatusCode::Disconnected,
                               s->lostDetailOnLoop() + ", and reconnecting did not succeed within " +
                                   store::describeDuration(s->config_.connectTimeout) + " (" + s->attemptsSoFarOnLoop());
    }
    std::string message = "store: could not connect to the server at " + s->endpoint_ + " within " +
                          store::describeDuration(s->config_.connectTimeout) + " (" + std::to_string(s->attempts_) +
                          " attempt(s); last error: " + (s->lastError_.empty() ? "none" : s->lastError_) + ")";
    s->failConnectOnLoop(Status::timeout(message));
  }

  void failConnectOnLoop(const Status& status) {
    WEFT_DCHECK_ON_LOOP(loop_);
    setClosedOnLoop(status.message());
    closeSocketOnLoop(false);
    stopConnectTimersOnLoop();
    if (connectPromise_.has_value()) {
      connectPromise_->setError(status);
      connectPromise_.reset();
    }
  }

  void stopConnectTimersOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (closing_) return;
    uv_timer_stop(&retryTimer_);
    uv_timer_stop(&connectTimer_);
    uv_timer_stop(&attemptTimer_);
  }

  void handleHelloReplyOnLoop(BodyReader& r) {
    WEFT_DCHECK_ON_LOOP(loop_);
    uint64_t id = r.u64("request id");
    WEFT_ENFORCE(id == kHelloId, ProtocolError, "store: a reply to request ", id, " before the hello reply");
    std::optional<StatusCode> code = statusCodeFromWire(r.u8("status"));
    WEFT_ENFORCE(code.has_value(), ProtocolError, "store: the hello reply carries an unknown status");
    if (*code != StatusCode::Ok) {
      std::string message(r.str("message", store::kMaxMessageBytes));
      if (reconnecting_) {
        return connectionLostOnLoop(*code, lostDetailOnLoop() + ", and the server refused the reconnection: " + message);
      }
      failConnectOnLoop(Status(*code, "store: the server at " + endpoint_ + " refused the connection: " + message));
      return;
    }
    store::Limits limits;
    limits.maxKeyBytes = r.u32("maxKeyBytes");
    limits.maxValueBytes = r.u32("maxValueBytes");
    limits.maxKeysPerRequest = r.u32("maxKeysPerRequest");
    uint64_t serverId = r.u64("serverId");
    r.expectEnd("hello reply");
    if (reconnecting_ && serverId != serverId_) {
      return connectionLostOnLoop(StatusCode::Disconnected,
                            lostDetailOnLoop() + ", and the server that answered the reconnection is another one (the "
                                           "store was restarted: what it held is gone)");
    }
    serverId_ = serverId;
    in_.setMaxBody(std::min<uint64_t>(limits.maxReplyBody(), UINT32_MAX));
    state_ = State::Ready;
    connected_.store(true, std::memory_order_release);
    attemptTimeout_ = kFirstAttemptTimeout;
    stopConnectTimersOnLoop();
    if (reconnecting_) {
      reconnecting_ = false;
      WEFT_LOG(Info) << "store: reconnected to the server at " << endpoint_ << " " << secondsSince(lostAt_)
                     << " after losing the connection (" << lostReason_ << "; " << attempts_
                     << " attempt(s)); sending its " << pending_.size() << " unanswered request(s) again";
      for (auto& entry : pending_) {
        if (state_ != State::Ready) break;  // lost again while sending
        sendOnLoop(entry.second, false);
      }
      return;
    }
    WEFT_LOG(Debug) << "store: connected to " << endpoint_ << " after " << attempts_ << " attempt(s)";
    connectPromise_->setValue(limits);
    connectPromise_.reset();
  }

  // ---- losing and regaining the connection -----------------------------------------------

  // The connection that was Ready is gone: reconnect, keeping every pending
  // request (each still bounded by its own deadline), for at most
  // connectTimeout.
  void beginReconnectOnLoop(const std::string& reason) {
    WEFT_DCHECK_ON_LOOP(loop_);
    WEFT_LOG(Info) << "store: lost the connection to the server at " << endpoint_ << " (" << reason
                   << "); reconnecting";
    reconnecting_ = true;
    lostAt_ = Clock::now();
    lostReason_ = reason;
    attempts_ = 0;
    lastError_.clear();
    retryDelay_ = kFirstRetryDelay;
    attemptTimeout_ = kFirstAttemptTimeout;
    connected_.store(false, std::memory_order_release);
    state_ = State::Connecting;
    if (config_.connectTimeout.count() > 0) {
      uv_timer_start(&connectTimer_, &Impl::onConnectDeadline, static_cast<uint64_t>(config_.connectTimeout.count()),
                     0);
    }
    closeSocketOnLoop(true);
  }

  // "the connection was lost 1.2 s ago (the server closed the connection)"
  std::string lostDetailOnLoop() const {
    WEFT_DCHECK_ON_LOOP(loop_);
    return "the connection was lost " + secondsSince(lostAt_) + " ago (" + lostReason_ + ")";
  }
  // "3 attempt(s); last error: ...)" (the caller opened the parenthesis).
  std::string attemptsSoFarOnLoop() const {
    WEFT_DCHECK_ON_LOOP(loop_);
    return std::to_string(attempts_) + " attempt(s)" + (lastError_.empty() ? "" : "; last error: " + lastError_) + ")";
  }

  // ---- requests -----------------------------------------------------------------------

  void startOnLoop(uint64_t id, Pending p) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (state_ == State::Closed) {
      p.complete(Status::disconnected("store: cannot " + p.what + ": not connected to the server at " + endpoint_ +
                                      " (" + closeReason_ + ")"),
                 nullptr);
      return;
    }
    p.started = Clock::now();
    if (p.replyTimeout) {
      Clock::time_point deadline = p.started + *p.replyTimeout;
      deadlines_.emplace(deadline, id);
      deadlineOf_[id] = deadline;
      armReplyTimerOnLoop();
    }
    if (p.kind == Kind::Update) unsettled_.insert(id);
    Pending& stored = pending_.emplace(id, std::move(p)).first->second;
    // While reconnecting it waits in pending_ and goes out once Ready.
    if (state_ == State::Ready) sendOnLoop(stored, true);
  }

  // Writes a pending request on the current connection, refreshing the
  // fields that change between sends (store_protocol.h). `fresh`: sent as
  // soon as it was submitted.
  void sendOnLoop(Pending& p, bool fresh) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (p.kind == Kind::Update) {
      store::patchTrailingU64(*p.frame, *unsettled_.begin());
    } else if (p.kind == Kind::Waiting && !fresh && p.replyTimeout) {
      // The server times the wait from when it receives it: give it only the time left.
      auto waitTimeout = *p.replyTimeout - kReplyGrace;
      auto left = waitTimeout - std::chrono::duration_cast<milliseconds>(Clock::now() - p.started);
      store::patchTrailingU64(*p.frame, static_cast<uint64_t>(std::max<int64_t>(1, left.count())));
    }
    writeOnLoop(p.frame);
  }

  void writeOnLoop(std::shared_ptr<std::string> bytes) {
    WEFT_DCHECK_ON_LOOP(loop_);
    auto* w = new WriteRequest;
    w->client = this;
    w->generation = generation_;
    w->bytes = std::move(bytes);
    w->req.data = w;
    uv_buf_t buf = uv_buf_init(w->bytes->data(), static_cast<unsigned>(w->bytes->size()));
    int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&tcp_), &buf, 1, &Impl::onWritten);
    if (rc < 0) {
      delete w;
      connectionFailedOnLoop(std::string("writing failed: ") + uv_strerror(rc));
    }
  }

  static void onWritten(uv_write_t* req, int status) {
    std::unique_ptr<WriteRequest> w(static_cast<WriteRequest*>(req->data));
    // A write to a socket given up already says nothing about the current one.
    if (status < 0 && status != UV_ECANCELED && w->generation == w->client->generation_) {
      w->client->connectionFailedOnLoop(std::string("writing failed: ") + uv_strerror(status));
    }
  }

  static void onAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
    size_t size = 0;
    char* space = self(h)->in_.readSpace(&size);
    *buf = uv_buf_init(space, static_cast<unsigned>(std::min<size_t>(size, UINT_MAX)));
  }

  static void onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t*) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(stream));
    if (nread < 0) {
      s->connectionFailedOnLoop(nread == UV_EOF ? "the server closed the connection"
                                          : std::string("the connection failed: ") + uv_strerror(static_cast<int>(nread)));
      return;
    }
    if (nread == 0) return;
    s->in_.commit(static_cast<size_t>(nread));
    try {
      std::string_view body;
      while ((s->state_ == State::Handshaking || s->state_ == State::Ready) && s->in_.next(&body)) {
        BodyReader r(body.data(), body.size());
        if (s->state_ == State::Handshaking) {
          s->handleHelloReplyOnLoop(r);
        } else {
          s->handleReplyOnLoop(r);
        }
      }
      s->in_.compact();
    } catch (const ProtocolError& e) {
      // Not a weft store, or a broken one: retrying will not help.
      if (s->state_ == State::Handshaking && !s->reconnecting_) {
        s->failConnectOnLoop(Status::protocol("store: the server at " + s->endpoint_ +
                                        " does not speak the store protocol: " + e.what()));
      } else {
        s->connectionLostOnLoop(StatusCode::Protocol, std::string("the server sent a malformed reply (") + e.what() + ")");
      }
    }
  }

  void handleReplyOnLoop(BodyReader& r) {
    WEFT_DCHECK_ON_LOOP(loop_);
    uint64_t id = r.u64("request id");
    std::optional<StatusCode> code = statusCodeFromWire(r.u8("status"));
    WEFT_ENFORCE(code.has_value(), ProtocolError, "store: a reply carries an unknown status");
    auto it = pending_.find(id);
    if (it == pending_.end()) {
      // The request timed out here already; its reply is dropped.
      WEFT_LOG(Debug) << "store: dropping a late reply to request " << id;
      return;
    }
    Pending p = std::move(it->second);
    pending_.erase(it);
    unsettled_.erase(id);
    forgetDeadlineOnLoop(id);
    if (*code != StatusCode::Ok) {
      std::string message(r.str("message", store::kMaxMessageBytes));
      p.complete(Status(*code, std::move(message)), nullptr);
      return;
    }
    try {
      p.complete(Status(), &r);
    } catch (const ProtocolError& e) {
      // The promise is still open: decoding failed before it was completed.
      p.complete(Status::protocol(std::string(e.what()) + " in the reply to " + p.what), nullptr);
      throw;
    }
  }

  // A connection failure: retried while connecting, a reconnection once Ready.
  void connectionFailedOnLoop(const std::string& reason) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (state_ == State::Closed) return;
    if (state_ == State::Ready) return beginReconnectOnLoop(reason);
    attemptFailedOnLoop(reason);
  }

  // Final: the client is Closed and every pending call fails with
  // "lost the connection to the server at <endpoint> while waiting for
  // <what>: <detail>".
  void connectionLostOnLoop(StatusCode code, const std::string& detail) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (state_ == State::Closed) return;
    WEFT_LOG(Info) << "store: giving up on the server at " << endpoint_ << ": " << detail;
    setClosedOnLoop("lost: " + detail);
    closeSocketOnLoop(false);
    stopConnectTimersOnLoop();
    reconnecting_ = false;
    failAllOnLoop(code, [&](const Pending& p) {
      return "store: lost the connection to the server at " + endpoint_ + " while waiting for " + p.what + ": " +
             detail;
    });
  }

  void setClosedOnLoop(const std::string& reason) {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (state_ == State::Closed) return;
    state_ = State::Closed;
    closeReason_ = reason;
    connected_.store(false, std::memory_order_release);
  }

  // Fails every pending request; their continuations may submit new requests,
  // which fail too (state_ is Closed by now).
  template <class Message>
  void failAllOnLoop(StatusCode code, Message message) {
    WEFT_DCHECK_ON_LOOP(loop_);
    std::map<uint64_t, Pending> failing;
    failing.swap(pending_);
    unsettled_.clear();
    deadlines_.clear();
    deadlineOf_.clear();
    for (auto& [id, p] : failing) p.complete(Status(code, message(p)), nullptr);
  }

  // ---- reply deadlines -----------------------------------------------------------------

  void forgetDeadlineOnLoop(uint64_t id) {
    WEFT_DCHECK_ON_LOOP(loop_);
    auto it = deadlineOf_.find(id);
    if (it == deadlineOf_.end()) return;
    deadlines_.erase({it->second, id});
    deadlineOf_.erase(it);
  }

  void armReplyTimerOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (closing_) return;
    if (deadlines_.empty()) {
      uv_timer_stop(&replyTimer_);
      return;
    }
    auto wait = std::chrono::ceil<milliseconds>(deadlines_.begin()->first - Clock::now());
    uv_timer_start(&replyTimer_, &Impl::onReplyDeadline, static_cast<uint64_t>(std::max<int64_t>(1, wait.count())), 0);
  }

  static void onReplyDeadline(uv_timer_t* t) {
    Impl* s = self(reinterpret_cast<uv_handle_t*>(t));
    Clock::time_point now = Clock::now();
    while (!s->deadlines_.empty() && s->deadlines_.begin()->first <= now) {
      uint64_t id = s->deadlines_.begin()->second;
      s->forgetDeadlineOnLoop(id);
      auto it = s->pending_.find(id);
      if (it == s->pending_.end()) continue;
      Pending p = std::move(it->second);
      s->pending_.erase(it);
      s->unsettled_.erase(id);
      if (s->reconnecting_) {
        p.complete(Status::disconnected("store: lost the connection to the server at " + s->endpoint_ +
                                        " while waiting for " + p.what + ": " + s->lostDetailOnLoop() +
                                        ", and reconnecting has not succeeded within the call's " +
                                        store::describeDuration(*p.replyTimeout) + " (" + s->attemptsSoFarOnLoop()),
                   nullptr);
        continue;
      }
      p.complete(Status::timeout("store: the server at " + s->endpoint_ + " did not answer " + p.what + " within " +
                                 store::describeDuration(*p.replyTimeout)),
                 nullptr);
    }
    s->armReplyTimerOnLoop();
  }

  // ---- handles --------------------------------------------------------------------------

  // Closes the socket if open; with retry, the next attempt starts after the
  // retry delay once it is closed.
  void closeSocketOnLoop(bool retry) {
    WEFT_DCHECK_ON_LOOP(loop_);
    retryAfterClose_ = retry;
    if (!socketOpen_ || socketClosing_) return;
    socketClosing_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), &Impl::onSocketClosed);
  }

  static void onSocketClosed(uv_handle_t* h) {
    Impl* s = self(h);
    s->socketOpen_ = false;
    s->socketClosing_ = false;
    --s->openHandles_;
    if (s->retryAfterClose_ && !s->closing_ && s->state_ == State::Connecting) {
      uv_timer_start(&s->retryTimer_, &Impl::onRetry, static_cast<uint64_t>(s->retryDelay_.count()), 0);
    }
    s->maybeFinishCloseOnLoop();
  }

  static void onHandleClosed(uv_handle_t* h) {
    Impl* s = self(h);
    --s->openHandles_;
    s->maybeFinishCloseOnLoop();
  }

  void maybeFinishCloseOnLoop() {
    WEFT_DCHECK_ON_LOOP(loop_);
    if (!closing_ || openHandles_ > 0) return;
    std::vector<Promise<void>> waiters;
    waiters.swap(closeWaiters_);
    for (Promise<void>& p : waiters) p.setValue();
  }

  UvLoop& loop_;
  const Config config_;  // a copy: tasks may run this after the StoreClient is gone
  const SocketAddress address_;
  const std::string endpoint_;
  const uint64_t clientId_;  // the same on every connection: the server dedups retried updates by it
  std::atomic<uint64_t> nextId_{kHelloId + 1};
  std::atomic<bool> connected_{false};

  // Loop thread.
  State state_ = State::Connecting;
  std::string closeReason_;
  std::optional<Promise<store::Limits>> connectPromise_;
  int attempts_ = 0;  // of this connection or reconnection
  std::string lastError_;
  milliseconds retryDelay_{0};
  milliseconds attemptTimeout_{kFirstAttemptTimeout};
  uint64_t generation_ = 0;  // of tcp_: one per attempt
  uint64_t serverId_ = 0;    // learnt at the first hello
  bool reconnecting_ = false;
  Clock::time_point lostAt_{};
  std::string lostReason_;

  uv_tcp_t tcp_{};
  uv_connect_t connectRequest_{};
  uv_timer_t connectTimer_{};  // the connect deadline, then each reconnection's
  uv_timer_t retryTimer_{};
  uv_timer_t replyTimer_{};
  uv_timer_t attemptTimer_{};
  bool socketOpen_ = false;
  bool socketClosing_ = false;
  bool retryAfterClose_ = false;
  int openHandles_ = 0;
  bool closing_ = false;
  std::vector<Promise<void>> closeWaiters_;

  store::FrameBuffer in_{0};
  std::map<uint64_t, Pending> pending_;  // ordered: sent again and failed in id order
  std::set<uint64_t> unsettled_;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines_;
  std::map<uint64_t, Clock::time_point> deadlineOf_;
};

// ---- StoreClient --------------------------------------------------------------------

namespace {

std::string formatEndpoint(const std::string& host, uint16_t port) {
  bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void checkTimeout(milliseconds timeout, const char* op) {
  WEFT_ENFORCE(timeout.count() >= 0, InvalidArgumentError, "StoreClient::", op, ": negative timeout ",
               timeout.count(), " ms (0 means none)");
}

}  // namespace

StoreClient::Config StoreClient::configFor(const Options& opt) {
  Config c;
  c.host = opt.masterAddr;
  c.port = opt.masterPort;
  c.token = opt.authToken;
  c.connectTimeout = opt.storeTimeout;
  c.timeout = opt.storeTimeout;
  c.serverName = "rank 0";
  return c;
}

StoreClient::StoreClient(Config config, UvLoop* loop) : config_(std::move(config)) {
  WEFT_ENFORCE(config_.port != 0, InvalidArgumentError, "StoreClient: port 0 names no server (host '",
               config_.host, "')");
  WEFT_ENFORCE(config_.connectTimeout.count() >= 0 && config_.timeout.count() >= 0, InvalidArgumentError,
               "StoreClient: negative timeout (0 means none)");
  endpoint_ = formatEndpoint(config_.host, config_.port);
  if (!loop) {
    ownedLoop_ = std::make_unique<UvLoop>("weft-store-cli");
    loop = ownedLoop_.get();
  }
  loop_ = loop;
  checkBlockingAllowed("StoreClient");

  // Names are resolved here, on the calling thread: getaddrinfo blocks. A name
  // server that does not answer (EAI_AGAIN) is retried like a refused connection.
  Clock::time_point deadline = Clock::now() + config_.connectTimeout;
  // The address as errors name it: with the server's owner, so that a worker
  // that loses the store names the peer it lost.
  const std::string described = config_.serverName.empty() ? endpoint_ : endpoint_ + " (" + config_.serverName + ")";
  std::optional<SocketAddress> address;
  std::string temporaryFailure;
  while (!(address = SocketAddress::resolve(config_.host, config_.port, &temporaryFailure))) {
    WEFT_ENFORCE(config_.connectTimeout.count() == 0 || Clock::now() < deadline, TimeoutError,
                 "store: could not connect to the server at ", described, " within ",
                 store::describeDuration(config_.connectTimeout), ": ", temporaryFailure);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  impl_ = std::make_shared<Impl>(*loop_, config_, *address, described);
  Promise<store::Limits> connected;
  Future<store::Limits> limits = connected.getFuture();
  bool posted = loop_->post([impl = impl_, connected]() mutable { impl->startConnectOnLoop(std::move(connected)); });
  WEFT_ENFORCE(posted, StateError, "StoreClient: the event loop '", loop_->name(), "' has stopped");
  try {
    serverLimits_ = limits.get();
  } catch (...) {
    close();
    throw;
  }
}

StoreClient::~StoreClient() { close(); }

void StoreClient::close() {
  checkBlockingAllowed("close");
  Promise<void> done;
  Future<void> closed = done.getFuture();
  // A loop that has stopped already closed our handles (see UvLoop::stop).
  if (loop_->post([impl = impl_, done]() mutable { impl->beginCloseOnLoop(std::move(done)); })) closed.get();
}

bool StoreClient::connected() const { return impl_->connected(); }

void StoreClient::checkBlockingAllowed(const char* op) const {
  WEFT_CHECK(!loop_->inLoopThread()) << "StoreClient::" << op << " blocks, and was called on the thread of event loop '"
                                     << loop_->name() << "' that serves it; use the Async form there";
}

void StoreClient::checkKey(const std::string& key, const char* op) const {
  WEFT_ENFORCE(!key.empty(), InvalidArgumentError, "StoreClient::", op, ": empty key");
  WEFT_ENFORCE(key.size() <= serverLimits_.maxKeyBytes, InvalidArgumentError, "StoreClient::", op, ": key ",
               store::describeKey(key), " of ", key.size(), " bytes exceeds the server's limit of ",
               serverLimits_.maxKeyBytes);
}

void StoreClient::checkKeys(const std::vector<std::string>& keys, const char* op) const {
  WEFT_ENFORCE(keys.size() <= serverLimits_.maxKeysPerRequest, InvalidArgumentError, "StoreClient::", op, ": ",
               keys.size(), " keys exceed the server's limit of ", serverLimits_.maxKeysPerRequest, " per request");
  for (const std::string& k : keys) checkKey(k, op);
}

void StoreClient::checkValue(const std::string& value, const char* op, const char* what) const {
  WEFT_ENFORCE(value.size() <= serverLimits_.maxValueBytes, InvalidArgumentError, "StoreClient::", op, ": ", what,
               " of ", value.size(), " bytes exceeds the server's limit of ", serverLimits_.maxValueBytes);
}

Future<void> StoreClient::setAsync(const std::string& key, std::string value) {
  checkKey(key, "set");
  checkValue(value, "set", "value");
  return impl_->setAsync(key, std::move(value));
}
void StoreClient::set(const std::string& key, std::string value) {
  checkBlockingAllowed("set");
  setAsync(key, std::move(value)).get();
}

Future<std::string> StoreClient::getAsync(const std::string& key, milliseconds timeout) {
  checkKey(key, "get");
  checkTimeout(timeout, "get");
  return impl_->getAsync(key, timeout);
}
std::string StoreClient::get(const std::string& key) { return get(key, config_.timeout); }
std::string StoreClient::get(const std::string& key, milliseconds timeout) {
  checkBlockingAllowed("get");
  return getAsync(key, timeout).get();
}

Future<void> StoreClient::waitAsync(const std::vector<std::string>& keys, milliseconds timeout) {
  checkKeys(keys, "wait");
  checkTimeout(timeout, "wait");
  return impl_->waitAsync(keys, timeout);
}
void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, config_.timeout); }
void StoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  checkBlockingAllowed("wait");
  waitAsync(keys, timeout).get();
}

Future<bool> StoreClient::checkAsync(const std::vector<std::string>& keys) {
  checkKeys(keys, "check");
  return impl_->checkAsync(keys);
}
bool StoreClient::check(const std::vector<std::string>& keys) {
  checkBlockingAllowed("check");
  return checkAsync(keys).get();
}

Future<int64_t> StoreClient::addAsync(const std::string& key, int64_t delta) {
  checkKey(key, "add");
  return impl_->addAsync(key, delta);
}
int64_t StoreClient::add(const std::string& key, int64_t delta) {
  checkBlockingAllowed("add");
  return addAsync(key, delta).get();
}

Future<std::string> StoreClient::compareSetAsync(const std::string& key, std::string expected, std::string desired) {
  checkKey(key, "compareSet");
  checkValue(expected, "compareSet", "expected value");
  checkValue(desired, "compareSet", "desired value");
  return impl_->compareSetAsync(key, std::move(expected), std::move(desired));
}
std::string StoreClient::compareSet(const std::string& key, std::string expected, std::string desired) {
  checkBlockingAllowed("compareSet");
  return compareSetAsync(key, std::move(expected), std::move(desired)).get();
}

Future<bool> StoreClient::deleteKeyAsync(const std::string& key) {
  checkKey(key, "deleteKey");
  return impl_->deleteKeyAsync(key);
}
bool StoreClient::deleteKey(const std::string& key) {
  checkBlockingAllowed("deleteKey");
  return deleteKeyAsync(key).get();
}

Future<int64_t> StoreClient::numKeysAsync() { return impl_->numKeysAsync(); }
int64_t StoreClient::numKeys() {
  checkBlockingAllowed("numKeys");
  return numKeysAsync().get();
}

Future<void> StoreClient::barrierAsync(const std::string& name, int worldSize, milliseconds timeout) {
  WEFT_ENFORCE(!name.empty(), InvalidArgumentError, "StoreClient::barrier: empty name");
  WEFT_ENFORCE(worldSize >= 1, InvalidArgumentError, "StoreClient::barrier('", name, "'): worldSize ", worldSize,
               " must be at least 1");
  checkTimeout(timeout, "barrier");
  // The longest key the barrier uses: the prefix and a 19-digit round number.
  checkKey(barrierPrefix(name) + "round" + std::string(19, '9'), "barrier");
  return impl_->barrierAsync(name, worldSize, timeout);
}
void StoreClient::barrier(const std::string& name, int worldSize) { barrier(name, worldSize, config_.timeout); }
void StoreClient::barrier(const std::string& name, int worldSize, milliseconds timeout) {
  checkBlockingAllowed("barrier");
  barrierAsync(name, worldSize, timeout).get();
}

}  // namespace weft::rpc
