#include "common/status.h"

#include <cxxabi.h>

#include <cstdlib>
#include <typeinfo>

namespace weft {
namespace {

const std::string& emptyString() {
  static const std::string empty;
  return empty;
}

// "std::out_of_range" rather than "St12out_of_range".
std::string typeName(const std::type_info& type) {
  int rc = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &rc);
  std::string name = (rc == 0 && demangled) ? demangled : type.name();
  std::free(demangled);
  return name;
}

}  // namespace

const char* statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::Ok: return "ok";
    case StatusCode::Failed: return "failed";
    case StatusCode::Timeout: return "timeout";
    case StatusCode::Disconnected: return "disconnected";
    case StatusCode::NotFound: return "not_found";
    case StatusCode::InvalidArgument: return "invalid_argument";
    case StatusCode::Protocol: return "protocol";
    case StatusCode::Cancelled: return "cancelled";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, StatusCode code) { return os << statusCodeName(code); }

std::optional<StatusCode> statusCodeFromWire(uint32_t value) {
  if (value > static_cast<uint32_t>(StatusCode::Cancelled)) return std::nullopt;
  return static_cast<StatusCode>(value);
}

Status::Status(StatusCode code, std::string message) : Status(code, std::move(message), {}, {}) {}

Status::Status(StatusCode code, std::string message, std::string worker, std::string function) {
  if (code == StatusCode::Ok) return;
  rep_ = std::make_shared<const Rep>(Rep{code, std::move(message), std::move(worker), std::move(function)});
}

const std::string& Status::message() const noexcept { return rep_ ? rep_->message : emptyString(); }
const std::string& Status::worker() const noexcept { return rep_ ? rep_->worker : emptyString(); }
const std::string& Status::function() const noexcept { return rep_ ? rep_->function : emptyString(); }

Status Status::withOrigin(std::string worker, std::string function) const {
  if (ok()) return {};
  return {rep_->code, rep_->message, std::move(worker), std::move(function)};
}

std::string Status::describe() const {
  if (ok()) return {};
  std::string s = rep_->message;
  if (!rep_->worker.empty() || !rep_->function.empty()) {
    s += " (";
    if (!rep_->worker.empty()) s += "on worker '" + rep_->worker + "'";
    if (!rep_->worker.empty() && !rep_->function.empty()) s += ", ";
    if (!rep_->function.empty()) s += "in '" + rep_->function + "'";
    s += ")";
  }
  return s;
}

std::string Status::toString() const {
  if (ok()) return "ok";
  return std::string(statusCodeName(rep_->code)) + ": " + describe();
}

bool operator==(const Status& a, const Status& b) {
  if (a.rep_ == b.rep_) return true;
  return a.code() == b.code() && a.message() == b.message() && a.worker() == b.worker() &&
         a.function() == b.function();
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.toString(); }

void throwStatus(const Status& s) {
  WEFT_CHECK(!s.ok()) << "throwStatus called with an ok status";
  using detail::StatusException;
  switch (s.code()) {
    case StatusCode::Ok:
      break;  // excluded by the check above
    case StatusCode::Failed:
      if (s.hasOrigin()) throw StatusException<RemoteError>(s, s.worker(), s.function(), s.message());
      throw StatusException<Error>(s, s.describe());
    case StatusCode::Timeout: throw StatusException<TimeoutError>(s, s.describe());
    case StatusCode::Disconnected: throw StatusException<DisconnectedError>(s, s.describe());
    case StatusCode::NotFound: throw StatusException<NotFoundError>(s, s.describe());
    case StatusCode::InvalidArgument: throw StatusException<InvalidArgumentError>(s, s.describe());
    case StatusCode::Protocol: throw StatusException<ProtocolError>(s, s.describe());
    case StatusCode::Cancelled: throw StatusException<CancelledError>(s, s.describe());
  }
  WEFT_CHECK(false) << "throwStatus: status code " << static_cast<int>(s.code()) << " has no exception type";
  std::abort();  // unreachable: WEFT_CHECK aborts
}

Status statusFromException(const std::exception_ptr& e) noexcept {
  WEFT_CHECK(e != nullptr) << "statusFromException called with a null exception_ptr";
  try {
    std::rethrow_exception(e);
  } catch (const detail::StatusCarrier& carrier) {
    return carrier.status();
  } catch (const RemoteError& err) {
    return {StatusCode::Failed, err.remoteMessage(), err.worker(), err.function()};
  } catch (const TimeoutError& err) {
    return {StatusCode::Timeout, err.what()};
  } catch (const DisconnectedError& err) {
    return {StatusCode::Disconnected, err.what()};
  } catch (const NotFoundError& err) {
    return {StatusCode::NotFound, err.what()};
  } catch (const InvalidArgumentError& err) {
    return {StatusCode::InvalidArgument, err.what()};
  } catch (const ProtocolError& err) {
    return {StatusCode::Protocol, err.what()};
  } catch (const CancelledError& err) {
    return {StatusCode::Cancelled, err.what()};
  } catch (const std::exception& err) {
    return {StatusCode::Failed, typeName(typeid(err)) + ": " + err.what()};
  } catch (...) {
    return {StatusCode::Failed, "unknown exception (not derived from std::exception)"};
  }
}

}  // namespace weft
