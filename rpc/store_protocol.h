// The rendezvous store's wire protocol: frames, operations, limits, and the
// byte-level reader/writer shared by StoreServer and StoreClient.
//
// The store speaks its own small protocol (not rpc/protocol.capnp): it must work
// before any agent exists, and a process that only rendezvouses needs nothing
// else. Everything is little-endian.
//
//   frame    = u32 length | body                  length = bytes of body, 9 <= length <= limit
//   request  = u64 requestId | u8 op     | payload
//   reply    = u64 requestId | u8 status | payload
//   str      = u32 n | n bytes                    (binary-safe; keys and values)
//   keys     = u32 count | count x str
//
// A client chooses request ids: unique among all the requests it ever sends
// (a retried request keeps its id), increasing in the order one thread
// submits them. The server answers every request exactly once per
// connection, except when it closes the connection. Replies to requests that
// wait (Get, Wait) may overtake replies to later requests; all others are
// answered in the order received, and requests of one connection take effect
// in the order received.
//
// status is a weft::StatusCode wire value. A reply with status != Ok carries
// `str message` as its payload (what the error says, e.g. the missing keys of
// a timed-out wait); the payloads below are those of Ok replies.
//
//   op  name        request payload                     Ok reply payload
//   1   Hello       u32 magic "WFST" | u16 version |    u32 maxKeyBytes | u32 maxValueBytes |
//                   str token | u64 clientId            u32 maxKeysPerRequest | u64 serverId
//   2   Set         str key | str value | u64 settled   -
//   3   Get         str key | u64 timeoutMs             str value
//   4   Wait        keys | u64 timeoutMs                -
//   5   Check       keys                                u8 allExist
//   6   Add         str key | i64 delta | u64 settled   i64 newValue
//   7   CompareSet  str key | str expected |            str current
//                   str desired | u64 settled
//   8   Delete      str key | u64 settled               u8 existed
//   9   NumKeys     -                                   i64 count
//
// The first request on a connection must be Hello; until the server accepts
// it, any other request closes the connection. A wrong magic is a protocol
// error (connection closed); a wrong version or token is answered with a
// Protocol status naming the problem, then the connection is closed. The
// version is checked before the rest of the Hello is read, so a client of
// another version always gets that answer.
//
// Reconnection and exactly-once updates. A client picks a random clientId
// once and presents it in the Hello of every connection it opens; serverId
// is random per server, so a client that reconnects can tell a restarted
// server (whose keys are gone) from the one it knew. After a lost connection
// a client reconnects and sends again, with their ids, every request not yet
// answered. The updates (Set, Add, CompareSet, Delete) are applied at most
// once per (clientId, request id): the server keeps its reply to each update
// of a client and answers a repeated id with the kept reply, applying
// nothing. `settled` is the client's promise that it has received (or given
// up on) the reply to every update with a smaller id: the server forgets those
// replies. A server keeps at most Limits::maxKeptRepliesPerClient replies
// (and maxKeptReplyBytesPerClient bytes of them) per client, forgetting the
// oldest first (an update retried after its reply was forgotten this way is
// applied again; the server logs it), and the records of at most
// maxKnownClients clients, forgetting those disconnected longest first. A
// Hello with the clientId of a client still connected closes that client's
// older connection (what is left of a connection cut by a partition) and
// drops its waiting Gets and Waits: the client sends them again. Reads (Get,
// Wait, Check, NumKeys) are simply run again; a repeated Get or Wait carries
// the time left of its timeout.
//
// Semantics (as torch's TCPStore):
//  - Get waits until the key exists; Wait until all keys exist at the same
//    time. timeoutMs = 0 waits without a deadline; on expiry the reply is a
//    Timeout status naming the keys still missing.
//  - Add treats a missing key as 0 and stores the sum as decimal text (so Get
//    reads "5"); a value that is not a decimal int64, or an overflowing sum,
//    is an InvalidArgument reply.
//  - CompareSet: missing key and empty expected -> set desired, return it;
//    missing key otherwise -> return expected, store nothing; existing key
//    equal to expected -> set desired, return it; else return the current value.
//  - Set, Add and a CompareSet that stores wake the waiters of that key.
//
// Hostile input. The length prefix is checked against the largest valid
// request before anything is buffered for it, and each str against its own
// limit before it is copied; buffers grow only with bytes actually received.
// A frame that breaks these rules, an unknown op, trailing bytes after a
// payload, or a request before Hello closes the connection (one log line).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/status.h"

namespace weft::rpc::store {

constexpr uint32_t kMagic = 0x54534657;  // the bytes "WFST"
constexpr uint16_t kVersion = 2;
constexpr size_t kLengthBytes = 4;
constexpr size_t kBodyHeaderBytes = 9;  // requestId + op/status
// An error message longer than this is cut (replies) or refused (client reads).
constexpr uint32_t kMaxMessageBytes = 64 * 1024;

enum class Op : uint8_t {
  Hello = 1,
  Set = 2,
  Get = 3,
  Wait = 4,
  Check = 5,
  Add = 6,
  CompareSet = 7,
  Delete = 8,
  NumKeys = 9,
};
// "hello", "set", ...; "op <n>" for a value no op has.
std::string opName(uint8_t op);

// What a server accepts. The key/value/count limits travel to the client in
// the Hello reply, so a client refuses an oversized argument itself with a
// clear error instead of having its connection closed.
struct Limits {
  uint32_t maxKeyBytes = 4096;
  uint32_t maxValueBytes = 16u << 20;
  uint32_t maxKeysPerRequest = 4096;
  uint32_t maxTokenBytes = 4096;
  // Sum of the sizes of every stored key and value; a Set beyond it fails.
  uint64_t maxStoredBytes = 1ull << 30;
  // Requests of one connection waiting at once (Get and Wait); more fail.
  uint32_t maxWaitersPerConnection = 4096;
  // Connections beyond this are accepted and closed at once.
  uint32_t maxConnections = 4096;
  // Replies queued to a connection that does not read them; past this the
  // connection is closed.
  uint64_t maxWriteBacklogBytes = 64ull << 20;
  // A connection must send its Hello within this time...
  std::chrono::milliseconds helloTimeout{std::chrono::seconds(10)};
  // ... and finish a frame it has started within this time.
  std::chrono::milliseconds frameTimeout{std::chrono::seconds(30)};
  // Replies to updates kept for clients that may retry them (see above).
  uint32_t maxKeptRepliesPerClient = 4096;
  uint64_t maxKeptReplyBytesPerClient = 64ull << 20;
  uint32_t maxKnownClients = 4096;

  // The largest body a valid request can have under these limits.
  uint64_t maxRequestBody() const;
  // The largest body a valid reply can have.
  uint64_t maxReplyBody() const;
};

// Builds one frame: the length prefix is filled in by finish().
class FrameWriter {
 public:
  FrameWriter(uint64_t requestId, uint8_t opOrStatus);
  FrameWriter& u8(uint8_t v);
  FrameWriter& u16(uint16_t v);
  FrameWriter& u32(uint32_t v);
  FrameWriter& u64(uint64_t v);
  FrameWriter& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  FrameWriter& str(std::string_view s);
  FrameWriter& keys(const std::vector<std::string>& ks);
  // The frame's bytes; the writer is spent.
  std::string finish();

 private:
  std::string buf_;
};

// Overwrites the last 8 bytes of a finished frame with v (little-endian): the
// `settled` field of an update, or the timeout of a Get or Wait, when a
// request is sent again.
void patchTrailingU64(std::string& frame, uint64_t v);

// Reads one body. Every read checks the bytes left and the given bound first,
// and throws ProtocolError naming the field when either is broken.
class BodyReader {
 public:
  BodyReader(const char* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8(const char* field);
  uint16_t u16(const char* field);
  uint32_t u32(const char* field);
  uint64_t u64(const char* field);
  int64_t i64(const char* field) { return static_cast<int64_t>(u64(field)); }
  // A str of at most maxBytes; the view points into the frame.
  std::string_view str(const char* field, uint32_t maxBytes);
  std::vector<std::string> keys(uint32_t maxCount, uint32_t maxKeyBytes);
  // Throws ProtocolError when bytes remain.
  void expectEnd(const char* what);
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  void need(size_t n, const char* field);
  const char* p_;
  const char* end_;
};

// A connection's receive buffer: hands libuv space to read into, grows only as
// bytes arrive, and cuts the stream into frames after checking each length
// prefix against maxBody.
class FrameBuffer {
 public:
  explicit FrameBuffer(uint64_t maxBody) : maxBody_(maxBody) {}
  void setMaxBody(uint64_t maxBody) { maxBody_ = maxBody; }
  // Space for the next read (at least 64 KiB, more while a large frame is
  // arriving, never more than twice the bytes already buffered plus 64 KiB).
  char* readSpace(size_t* size);
  // n bytes were written at readSpace().
  void commit(size_t n) { end_ += n; }
  // The next whole frame's body, or false when none is complete yet. Throws
  // ProtocolError when a length prefix is out of range [9, maxBody].
  bool next(std::string_view* body);
  // Drops consumed bytes; call after draining next().
  void compact();
  // Bytes of a frame received but not yet complete.
  bool hasPartialFrame() const { return end_ > start_; }

 private:
  uint64_t maxBody_;
  std::vector<char> data_;
  size_t start_ = 0;  // first unconsumed byte
  size_t end_ = 0;    // one past the last received byte
};

// A key as it appears in messages: quoted, at most 64 bytes shown, bytes that
// are not printable ASCII escaped as \xNN.
std::string describeKey(std::string_view key);
// "'a', 'b', 'c' and 7 more" (at most 8 listed).
std::string describeKeys(const std::vector<std::string>& keys);
// "1.5 s".
std::string describeDuration(std::chrono::milliseconds d);

}  // namespace weft::rpc::store
