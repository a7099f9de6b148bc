#include "common/status.h"

#include <doctest/doctest.h>

#include <sstream>
#include <stdexcept>

using namespace weft;

namespace {

// The exception throwStatus raises for s, as an exception_ptr.
std::exception_ptr thrown(const Status& s) {
  try {
    throwStatus(s);
  } catch (...) {
    return std::current_exception();
  }
}

template <class E>
std::exception_ptr thrownAs(E e) {
  return std::make_exception_ptr(std::move(e));
}

}  // namespace

TEST_CASE("a default Status is ok and carries nothing") {
  Status s;
  CHECK(s.ok());
  CHECK(s.code() == StatusCode::Ok);
  CHECK(s.message().empty());
  CHECK(s.worker().empty());
  CHECK_FALSE(s.hasOrigin());
  CHECK(s.toString() == "ok");
  CHECK(s == Status());
}

TEST_CASE("an Ok code with a message still makes the ok status") {
  Status s(StatusCode::Ok, "ignored");
  CHECK(s.ok());
  CHECK(s.message().empty());
  CHECK(s.withOrigin("w", "f").ok());
}

TEST_CASE("each factory makes its code and keeps the message") {
  CHECK(Status::failed("m").code() == StatusCode::Failed);
  CHECK(Status::timeout("m").code() == StatusCode::Timeout);
  CHECK(Status::disconnected("m").code() == StatusCode::Disconnected);
  CHECK(Status::notFound("m").code() == StatusCode::NotFound);
  CHECK(Status::invalidArgument("m").code() == StatusCode::InvalidArgument);
  CHECK(Status::protocol("m").code() == StatusCode::Protocol);
  CHECK(Status::cancelled("m").code() == StatusCode::Cancelled);
  Status s = Status::timeout("call timed out");
  CHECK_FALSE(s.ok());
  CHECK(s.message() == "call timed out");
}

TEST_CASE("withOrigin names the worker and function without touching the original") {
  Status local = Status::failed("boom");
  Status remote = local.withOrigin("worker1", "add");
  CHECK_FALSE(local.hasOrigin());
  CHECK(remote.hasOrigin());
  CHECK(remote.worker() == "worker1");
  CHECK(remote.function() == "add");
  CHECK(remote.message() == "boom");
  CHECK(remote.describe() == "boom (on worker 'worker1', in 'add')");
  CHECK(remote.toString() == "failed: boom (on worker 'worker1', in 'add')");
  CHECK(local.toString() == "failed: boom");
  CHECK_FALSE(local == remote);
}

TEST_CASE("statuses compare by code, message and origin") {
  CHECK(Status::timeout("a") == Status::timeout("a"));
  CHECK_FALSE(Status::timeout("a") == Status::timeout("b"));
  CHECK_FALSE(Status::timeout("a") == Status::cancelled("a"));
  CHECK_FALSE(Status::timeout("a").withOrigin("w", "f") == Status::timeout("a").withOrigin("w", "g"));
  CHECK_FALSE(Status::failed("a") == Status());
}

TEST_CASE("a status prints as its code name and description") {
  std::ostringstream os;
  os << Status::notFound("no function 'sub'").withOrigin("ps", "") << " / " << StatusCode::InvalidArgument;
  CHECK(os.str() == "not_found: no function 'sub' (on worker 'ps') / invalid_argument");
}

TEST_CASE("wire values map back to codes and unknown values are rejected") {
  for (uint32_t v = 0; v <= 7; ++v) {
    auto code = statusCodeFromWire(v);
    REQUIRE(code.has_value());
    CHECK(static_cast<uint32_t>(*code) == v);
  }
  CHECK(statusCodeName(StatusCode::Cancelled) == std::string("cancelled"));
  CHECK_FALSE(statusCodeFromWire(8).has_value());
  CHECK_FALSE(statusCodeFromWire(0xffffffffu).has_value());
}

TEST_CASE("throwStatus raises the typed exception of each code") {
  CHECK_THROWS_AS(throwStatus(Status::timeout("t")), TimeoutError);
  CHECK_THROWS_AS(throwStatus(Status::disconnected("d")), DisconnectedError);
  CHECK_THROWS_AS(throwStatus(Status::notFound("n")), NotFoundError);
  CHECK_THROWS_AS(throwStatus(Status::invalidArgument("i")), InvalidArgumentError);
  CHECK_THROWS_AS(throwStatus(Status::protocol("p")), ProtocolError);
  CHECK_THROWS_AS(throwStatus(Status::cancelled("c")), CancelledError);
  CHECK_THROWS_WITH_AS(throwStatus(Status::timeout("waited 2 s").withOrigin("ps", "push")),
                       "waited 2 s (on worker 'ps', in 'push')", TimeoutError);
}

TEST_CASE("a failed status from another worker is a RemoteError naming worker, function and message") {
  Status s = Status::failed("std::runtime_error: boom").withOrigin("worker1", "add");
  try {
    throwStatus(s);
    FAIL("throwStatus returned");
  } catch (const RemoteError& e) {
    CHECK(e.worker() == "worker1");
    CHECK(e.function() == "add");
    CHECK(e.remoteMessage() == "std::runtime_error: boom");
    CHECK(std::string(e.what()) == "remote error on worker 'worker1' in 'add': std::runtime_error: boom");
  }
}

TEST_CASE("a local failed status is a plain weft::Error, not a RemoteError") {
  std::exception_ptr e = thrown(Status::failed("disk full"));
  CHECK_THROWS_WITH_AS(std::rethrow_exception(e), "disk full", Error);
  bool remote = false;
  try {
    std::rethrow_exception(e);
  } catch (const RemoteError&) {
    remote = true;
  } catch (const Error&) {
  }
  CHECK_FALSE(remote);
}

TEST_CASE("every status survives throwStatus and statusFromException unchanged") {
  const Status cases[] = {
      Status::failed("boom"),
      Status::failed("boom").withOrigin("w1", "add"),
      Status::timeout("late").withOrigin("w2", "slow"),
      Status::disconnected("gone"),
      Status::notFound("no function 'x'").withOrigin("ps", "x"),
      Status::invalidArgument("bad shape"),
      Status::protocol("truncated frame").withOrigin("w3", ""),
      Status::cancelled("cancelled by caller"),
  };
  for (const Status& s : cases) {
    CAPTURE(s);
    CHECK(statusFromException(thrown(s)) == s);
  }
}

TEST_CASE("weft exceptions thrown directly map to their codes") {
  CHECK(statusFromException(thrownAs(TimeoutError("t"))) == Status::timeout("t"));
  CHECK(statusFromException(thrownAs(DisconnectedError("d"))) == Status::disconnected("d"));
  CHECK(statusFromException(thrownAs(NotFoundError("n"))) == Status::notFound("n"));
  CHECK(statusFromException(thrownAs(InvalidArgumentError("i"))) == Status::invalidArgument("i"));
  CHECK(statusFromException(thrownAs(ProtocolError("p"))) == Status::protocol("p"));
  CHECK(statusFromException(thrownAs(CancelledError("c"))) == Status::cancelled("c"));
  CHECK(statusFromException(thrownAs(RemoteError("w", "f", "m"))) == Status::failed("m").withOrigin("w", "f"));
}

TEST_CASE("other exceptions become Failed with their type name and message") {
  CHECK(statusFromException(thrownAs(std::out_of_range("vector::at"))) ==
        Status::failed("std::out_of_range: vector::at"));
  CHECK(statusFromException(thrownAs(StateError("graph freed"))) == Status::failed("weft::StateError: graph freed"));
  Status unknown = statusFromException(std::make_exception_ptr(42));
  CHECK(unknown.code() == StatusCode::Failed);
  CHECK(unknown.message().find("unknown exception") != std::string::npos);
}
