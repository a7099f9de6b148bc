// The rendezvous store: a TCP key-value store that rank 0 serves and every rank
// uses to find the others, count arrivals and wait for each other before the
// RPC agents connect (and that Gloo's rendezvous can use later).
//
//   weft::rpc::Options opt = weft::rpc::Options::fromEnv();
//   std::unique_ptr<weft::rpc::StoreServer> server;
//   if (opt.rank == 0) server = std::make_unique<weft::rpc::StoreServer>(weft::rpc::StoreServer::configFor(opt));
//   weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));   // retries until rank 0 listens
//   store.set("addr/" + opt.workerName(), myAddress);
//   store.barrier("joined", opt.worldSize, 30s);                // TimeoutError says how many arrived
//   std::string peer = store.get("addr/worker1", 10s);          // blocks until set, or TimeoutError naming the key
//   int64_t ticket = store.add("tickets", 1);                   // atomic counter
//
// Wire protocol: frames of `u32 length | u64 requestId | u8 op | payload`,
// answered by `u32 length | u64 requestId | u8 status | payload`; the full
// specification, the operations' exact semantics (those of torch's TCPStore)
// and the limits are in rpc/store_protocol.h.
//
// Threads. Server and client each run on a UvLoop (rpc/uv_loop.h): their own,
// or one passed in (e.g. the Agent's), which must then outlive them. Their
// state is touched only on that loop's thread; the methods below post to it.
//
// StoreClient. Every method may be called from any thread, concurrently, on
// one shared client; requests submitted by one thread take effect in the order
// submitted. Each operation exists in two forms: `xAsync(...)` returns a Future
// completed on the loop thread (continuations attached before completion run
// there and must not block), and the blocking `x(...)` waits for it, which is
// a bug (WEFT_CHECK) on the loop thread itself.
//
// Reconnection. A lost connection (the server closed it, or the network
// failed it: a vanished or partitioned machine is noticed within about 30 s,
// see detectDeadPeers in rpc/socket_address.h) does not fail the calls
// pending on it: the client reconnects, retrying for up to
// Config::connectTimeout, and sends every unanswered call again, so a
// partition shorter than the timeouts in force fails nothing. Calls made
// meanwhile wait for the connection; each call stays bounded by its own
// deadline. Updates (set, add, compareSet, deleteKey) take effect exactly
// once even when their reply was lost and they are sent again (the server
// keeps its replies per client, see store_protocol.h); reads are simply run
// again (a get/wait with the time left of its timeout). Reconnecting stops
// for good, failing every pending call and every later one, when the server
// refuses the connection (it no longer listens: its process ended), when the
// server that answers is another one (restarted: its keys are gone), or when
// connectTimeout passes.
//
// Failures, from get() or the blocking form:
//  - TimeoutError: a get/wait/barrier deadline passed (names the keys still
//    missing), or the connected server did not answer within the client's
//    timeout;
//  - DisconnectedError: the connection is lost and could not be made again in
//    time: a call whose deadline passes while the client reconnects, or every
//    call once reconnecting has stopped (see above); the message names the
//    server's address, how long ago the connection was lost and why, and the
//    reconnection attempts;
//  - CancelledError: the client was closed while the call was pending;
//  - InvalidArgumentError: thrown at once by the call itself for an empty key
//    or a key/value/key count above the server's limits (learnt at connect);
//    from the future, for an add on a value that is not an integer or a set
//    the store has no room for;
//  - ProtocolError: the server rejected the handshake (version or token), or
//    sent bytes that break the protocol (the connection is then closed, and
//    every pending call fails with it).
// Timeouts are std::chrono::milliseconds; zero means none (wait forever). The
// overloads without one use Config::timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/future.h"
#include "rpc/options.h"
#include "rpc/store_protocol.h"
#include "rpc/uv_loop.h"

namespace weft::rpc {

// Serves the store. Binds and listens in the constructor; serves until close()
// or destruction, which close every connection: clients see their pending
// calls fail with DisconnectedError. Hostile or broken peers (garbage,
// oversized or truncated frames, wrong token, silent half-open connections,
// floods of connections) cost only their own connection (see store_protocol.h);
// the line logged for each is rate-limited per client address (three per 10 s,
// then a summary: common/logging.h).
class StoreServer {
 public:
  struct Config {
    // Address to bind: a name or literal (IPv4 or IPv6). Binding to a
    // specific address serves only on that interface; "0.0.0.0" serves all.
    std::string host = "127.0.0.1";
    uint16_t port = 0;  // 0: any free port (see port())
    // Clients must present this token in their Hello; empty accepts any.
    std::string token;
    store::Limits limits;
  };
  // Host and port from opt.masterAddr/masterPort, token from opt.authToken.
  static Config configFor(const Options& opt);

  // Throws weft::Error naming the address when it cannot bind or listen (e.g.
  // the port is in use), InvalidArgumentError when the host does not resolve.
  // loop == nullptr: the server runs its own loop thread.
  explicit StoreServer(Config config, UvLoop* loop = nullptr);
  // close().
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // The port actually bound (the ephemeral one when Config::port was 0).
  uint16_t port() const noexcept { return port_; }
  const std::string& host() const noexcept { return config_.host; }

  struct Stats {
    size_t connections = 0;        // open, including those not yet through Hello
    size_t keys = 0;
    size_t waiters = 0;            // Get/Wait requests waiting
    uint64_t storedBytes = 0;      // keys plus values
    uint64_t droppedConnections = 0;  // closed for a protocol violation, timeout, backlog or over the limit
    size_t knownClients = 0;          // clients remembered for their reconnection, connected or not
    uint64_t keptReplies = 0;         // replies to updates kept for their retry
  };
  // A snapshot, taken on the loop thread (the caller blocks for it).
  Stats stats() const;

  // Stops listening and closes every connection, each once the replies
  // already made to it are written (at most a second later); requests still
  // waiting are dropped unanswered (their clients see the connection close).
  // Blocks until every socket is closed; not on the loop thread (WEFT_CHECK).
  // Idempotent.
  void close();

 private:
  class Impl;
  Config config_;
  uint16_t port_ = 0;
  std::unique_ptr<UvLoop> ownedLoop_;  // declared before impl_: destroyed after it
  UvLoop* loop_;
  std::unique_ptr<Impl> impl_;
};

class StoreClient {
 public:
  struct Config {
    std::string host = "127.0.0.1";
    uint16_t port = 0;
    std::string token;
    // Who serves the store, named beside its address in every error ("the
    // server at 127.0.0.1:29500 (rank 0)"); empty: the address alone.
    std::string serverName;
    // The constructor retries refused or failed connections (the server may
    // start later) until this has passed; zero retries forever. After a lost
    // connection, the client tries to reconnect for this long too.
    std::chrono::milliseconds connectTimeout{std::chrono::seconds(60)};
    // Default timeout of get/wait/barrier, and how long any other call waits
    // for its reply; zero means none.
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  };
  // Host and port from opt.masterAddr/masterPort, token from opt.authToken,
  // both timeouts from opt.storeTimeout; the server is rank 0 (the agent's
  // rank 0 serves the store).
  static Config configFor(const Options& opt);

  // Connects, blocking until the server accepted the Hello. Throws
  // TimeoutError (naming the address, the attempts and the last error) when
  // connectTimeout passes, ProtocolError when the server rejects the handshake,
  // InvalidArgumentError when the host does not resolve. Not on the loop
  // thread of `loop` (WEFT_CHECK). loop == nullptr: the client runs its own.
  explicit StoreClient(Config config, UvLoop* loop = nullptr);
  // close().
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Stores value under key, replacing any previous value; wakes its waiters.
  void set(const std::string& key, std::string value);
  Future<void> setAsync(const std::string& key, std::string value);

  // The value of key, waiting until it exists (or the timeout passes).
  std::string get(const std::string& key);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  Future<std::string> getAsync(const std::string& key, std::chrono::milliseconds timeout);

  // Waits until every key exists at the same time.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  Future<void> waitAsync(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // Whether every key exists now; never waits.
  bool check(const std::vector<std::string>& keys);
  Future<bool> checkAsync(const std::vector<std::string>& keys);

  // Adds delta to the integer stored under key (a missing key counts as 0),
  // atomically across every client; returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  Future<int64_t> addAsync(const std::string& key, int64_t delta);

  // torch's compare_set: see store_protocol.h. Returns the value now current
  // (the expected value when the key is missing and expected is not empty).
  std::string compareSet(const std::string& key, std::string expected, std::string desired);
  Future<std::string> compareSetAsync(const std::string& key, std::string expected, std::string desired);

  // Removes key; true when it existed. Waiters on it keep waiting.
  bool deleteKey(const std::string& key);
  Future<bool> deleteKeyAsync(const std::string& key);

  int64_t numKeys();
  Future<int64_t> numKeysAsync();

  // Blocks until worldSize callers have entered the barrier called `name`
  // (counted with add, released with one key per round). Reusable: the k-th
  // call of every participant meets the k-th calls of the others, provided all
  // participants pass the same worldSize. On timeout, TimeoutError says how
  // many had arrived. Uses the keys "weft/barrier/<name>/...". Not an exit
  // barrier for the process serving the store: a participant may still be
  // waiting for its release when the last one returns. To leave last, have the
  // others set a key each and wait() for all of them.
  void barrier(const std::string& name, int worldSize);
  void barrier(const std::string& name, int worldSize, std::chrono::milliseconds timeout);
  Future<void> barrierAsync(const std::string& name, int worldSize, std::chrono::milliseconds timeout);

  // False while the client reconnects, and once it has stopped or is closed.
  bool connected() const;
  // Limits the server announced at connect.
  uint32_t maxKeyBytes() const noexcept { return serverLimits_.maxKeyBytes; }
  uint32_t maxValueBytes() const noexcept { return serverLimits_.maxValueBytes; }
  uint32_t maxKeysPerRequest() const noexcept { return serverLimits_.maxKeysPerRequest; }
  // "host:port".
  const std::string& endpoint() const noexcept { return endpoint_; }

  // Fails every pending call with CancelledError and closes the connection;
  // blocks until it is closed; not on the loop thread (WEFT_CHECK). Idempotent.
  void close();

 private:
  class Impl;
  void checkKey(const std::string& key, const char* op) const;
  void checkKeys(const std::vector<std::string>& keys, const char* op) const;
  void checkValue(const std::string& value, const char* op, const char* what) const;
  void checkBlockingAllowed(const char* op) const;

  Config config_;
  std::string endpoint_;
  store::Limits serverLimits_;  // the announced fields only; written before the constructor returns
  std::unique_ptr<UvLoop> ownedLoop_;
  UvLoop* loop_;
  std::shared_ptr<Impl> impl_;  // shared: tasks and continuations on the loop keep it alive
};

}  // namespace weft::rpc
