// Status: how weft's runtime reports a failure internally, and how that
// failure becomes a typed exception at the user API (and back).
//
// Inside the RPC layer a failure travels as a value: a code from a small set,
// a message, and, once it has crossed the wire, the worker and the function it
// came from. At the user API it is thrown as the exception matching its code:
//
//   weft::Status s = weft::Status::timeout("call to 'ps' (function 'push') timed out after 2.0 s");
//   if (!s.ok()) weft::throwStatus(s);                     // throws weft::TimeoutError
//
//   try { handler(); } catch (...) {                       // a user handler failed
//     weft::Status s = weft::statusFromException(std::current_exception());
//     reply(s.withOrigin("worker1", "add"));               // the caller's get() throws RemoteError
//   }
//
// Code -> exception (throwStatus):
//   Failed          -> RemoteError when the status has an origin worker, else weft::Error
//   Timeout         -> TimeoutError            Disconnected    -> DisconnectedError
//   NotFound        -> NotFoundError           InvalidArgument -> InvalidArgumentError
//   Protocol        -> ProtocolError           Cancelled       -> CancelledError
// The exception's what() names the origin when there is one. statusFromException
// inverts this exactly for exceptions thrown by throwStatus (code, message and
// origin survive the round trip); other weft exceptions of those types map to
// their code, and any other exception maps to Failed with its dynamic type name
// and what() as the message ("std::out_of_range: vector::at").
//
// Status is immutable and cheap to copy (an ok status holds no allocation, an
// error shares its representation); it may be shared between threads freely.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "common/error.h"

namespace weft {

// The numeric values are part of the wire format: never renumber.
enum class StatusCode : uint8_t {
  Ok = 0,
  Failed = 1,           // the operation ran and failed (e.g. a remote handler threw)
  Timeout = 2,          // it did not complete before its deadline
  Disconnected = 3,     // the peer's connection dropped or its process died
  NotFound = 4,         // a named thing (worker, function, type, key) does not exist
  InvalidArgument = 5,  // the arguments cannot be accepted
  Protocol = 6,         // bytes from a peer broke the wire protocol
  Cancelled = 7,        // cancelled before it completed
};

const char* statusCodeName(StatusCode code);  // "ok", "failed", "timeout", ...
std::ostream& operator<<(std::ostream& os, StatusCode code);
// The code with this wire value, or nullopt for a value no code has (a decoder
// rejects such a message as a protocol error rather than trusting it).
std::optional<StatusCode> statusCodeFromWire(uint32_t value);

class Status {
 public:
  // The ok status.
  Status() noexcept = default;
  // A status with this code and message. Code Ok yields the ok status (the
  // message is dropped: an ok status carries nothing).
  Status(StatusCode code, std::string message);
  // The same with the origin a status carries after crossing the wire: the
  // worker where it arose and the function being served there (either may be
  // empty when unknown).
  Status(StatusCode code, std::string message, std::string worker, std::string function);

  static Status failed(std::string message) { return {StatusCode::Failed, std::move(message)}; }
  static Status timeout(std::string message) { return {StatusCode::Timeout, std::move(message)}; }
  static Status disconnected(std::string message) { return {StatusCode::Disconnected, std::move(message)}; }
  static Status notFound(std::string message) { return {StatusCode::NotFound, std::move(message)}; }
  static Status invalidArgument(std::string message) { return {StatusCode::InvalidArgument, std::move(message)}; }
  static Status protocol(std::string message) { return {StatusCode::Protocol, std::move(message)}; }
  static Status cancelled(std::string message) { return {StatusCode::Cancelled, std::move(message)}; }

  bool ok() const noexcept { return rep_ == nullptr; }
  StatusCode code() const noexcept { return rep_ ? rep_->code : StatusCode::Ok; }
  // Empty for the ok status.
  const std::string& message() const noexcept;
  const std::string& worker() const noexcept;
  const std::string& function() const noexcept;
  bool hasOrigin() const noexcept { return !worker().empty(); }

  // A copy with the origin replaced. The ok status stays ok.
  Status withOrigin(std::string worker, std::string function) const;

  // The message followed by the origin when there is one:
  //   "boom (on worker 'w1', in 'add')". Empty for ok.
  std::string describe() const;
  // "ok", or the code name then describe(): "timeout: call timed out (on worker 'w1', in 'add')".
  std::string toString() const;

  // Equal when code, message and origin are all equal.
  friend bool operator==(const Status& a, const Status& b);

 private:
  struct Rep {
    StatusCode code;
    std::string message;
    std::string worker;
    std::string function;
  };
  std::shared_ptr<const Rep> rep_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

// Throws the exception matching s's code (table above). s must not be ok: that
// is a bug and aborts through WEFT_CHECK.
[[noreturn]] void throwStatus(const Status& s);

// The Status describing the exception held by e (table above). e must not be
// null (a bug: WEFT_CHECK). Never throws.
Status statusFromException(const std::exception_ptr& e) noexcept;

namespace detail {

// Mixed into the exceptions throwStatus raises so statusFromException recovers
// the exact Status instead of re-reading what().
class StatusCarrier {
 public:
  explicit StatusCarrier(Status s) : status_(std::move(s)) {}
  const Status& status() const noexcept { return status_; }

 private:
  Status status_;
};

// The exception type throwStatus throws: catchable as E (the typed error the
// user sees), and carrying the Status it came from.
template <class E>
class StatusException final : public E, public StatusCarrier {
 public:
  template <class... Args>
  explicit StatusException(Status s, Args&&... args) : E(std::forward<Args>(args)...), StatusCarrier(std::move(s)) {}
};

}  // namespace detail
}  // namespace weft
