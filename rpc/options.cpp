#include "rpc/options.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string_view>

#include "common/error.h"
#include "rpc/socket_address.h"

namespace weft::rpc {
namespace {

constexpr size_t kMaxNameLength = 128;
constexpr size_t kMaxTokenLength = 4096;
constexpr int kMaxWorkerThreads = 1024;
// Larger timeouts are surely mistakes (and would overflow deadline arithmetic).
constexpr double kMaxTimeoutSeconds = 365.0 * 24 * 3600;

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

std::string quoted(const char* var, const std::string& value) { return std::string(var) + "='" + value + "'"; }

constexpr const char* kFromEnv = "Options::fromEnv: ";

// The whole string as a base-10 integer in [lo, hi].
long long parseInt(const char* var, const std::string& value, long long lo, long long hi) {
  long long v = 0;
  const char* first = value.data();
  const char* last = first + value.size();
  if (!value.empty() && *first == '+') ++first;  // from_chars rejects a leading '+'
  auto [end, ec] = std::from_chars(first, last, v);
  WEFT_ENFORCE(ec != std::errc::invalid_argument && end == last && first != last, InvalidArgumentError,
               kFromEnv, quoted(var, value), " is not an integer");
  WEFT_ENFORCE(ec != std::errc::result_out_of_range && v >= lo && v <= hi, InvalidArgumentError,
               kFromEnv, quoted(var, value), " is out of range (", lo, " to ", hi, ")");
  return v;
}

std::chrono::milliseconds parseSeconds(const char* var, const std::string& value) {
  char* end = nullptr;
  double seconds = value.empty() ? NAN : std::strtod(value.c_str(), &end);
  WEFT_ENFORCE(!value.empty() && end == value.c_str() + value.size() && std::isfinite(seconds),
               InvalidArgumentError, kFromEnv, quoted(var, value), " is not a number of seconds");
  WEFT_ENFORCE(seconds >= 0 && seconds <= kMaxTimeoutSeconds, InvalidArgumentError, kFromEnv, quoted(var, value),
               " is out of range (0 to ", kMaxTimeoutSeconds, " seconds; 0 means no timeout)");
  // Round up so that a tiny positive timeout does not become "none".
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

logging::Level parseLevel(const char* var, const std::string& value) {
  if (value == "debug") return logging::Level::Debug;
  if (value == "info") return logging::Level::Info;
  if (value == "warn") return logging::Level::Warn;
  if (value == "error") return logging::Level::Error;
  if (value == "off") return logging::Level::Off;
  throw InvalidArgumentError(kFromEnv + quoted(var, value) + " is not one of debug, info, warn, error, off");
}

// One launcher's names for rank, world size and local rank.
struct PlaceVars {
  const char* rank;
  const char* worldSize;
  const char* localRank;
};
constexpr PlaceVars kPlaceSets[] = {
    {"WEFT_RANK", "WEFT_WORLD_SIZE", "WEFT_LOCAL_RANK"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
};

constexpr long long kMaxWorld = std::numeric_limits<int>::max();

void readPlace(Options& opt) {
  for (const PlaceVars& set : kPlaceSets) {
    auto rank = env(set.rank);
    auto world = env(set.worldSize);
    auto local = env(set.localRank);
    if (!rank && !world && !local) continue;
    WEFT_ENFORCE(rank.has_value(), InvalidArgumentError, kFromEnv, world ? set.worldSize : set.localRank,
                 " is set but ", set.rank, " is not; set both the rank and the world size");
    WEFT_ENFORCE(world.has_value(), InvalidArgumentError, kFromEnv, set.rank, " is set but ",
                 set.worldSize, " is not; set both the rank and the world size");
    opt.worldSize = static_cast<int>(parseInt(set.worldSize, *world, 1, kMaxWorld));
    opt.rank = static_cast<int>(parseInt(set.rank, *rank, 0, kMaxWorld));
    WEFT_ENFORCE(opt.rank < opt.worldSize, InvalidArgumentError, kFromEnv, quoted(set.rank, *rank),
                 " is out of range for ", quoted(set.worldSize, *world), " (ranks are 0 to ", opt.worldSize - 1, ")");
    opt.localRank = local ? static_cast<int>(parseInt(set.localRank, *local, 0, opt.worldSize - 1)) : -1;
    return;
  }
  // No launcher: a process on its own.
  opt.rank = 0;
  opt.worldSize = 1;
  opt.localRank = -1;
}

void readMaster(Options& opt) {
  const char* addrVar = "WEFT_MASTER_ADDR";
  const char* portVar = "WEFT_MASTER_PORT";
  auto addr = env(addrVar);
  if (!addr) addr = env(addrVar = "MASTER_ADDR");
  auto port = env(portVar);
  if (!port) port = env(portVar = "MASTER_PORT");
  if (opt.worldSize > 1 && (!addr || !port)) {
    std::string missing = addr ? "" : "WEFT_MASTER_ADDR or MASTER_ADDR";
    if (!port) missing += std::string(missing.empty() ? "" : ", and ") + "WEFT_MASTER_PORT or MASTER_PORT";
    throw InvalidArgumentError(kFromEnv + ("a world of " + std::to_string(opt.worldSize)) +
                               " processes needs the rendezvous store's address; set " + missing);
  }
  if (addr) {
    WEFT_ENFORCE(!addr->empty(), InvalidArgumentError, kFromEnv, addrVar, " is empty");
    opt.masterAddr = *addr;
  }
  if (port) {
    opt.masterPort = static_cast<uint16_t>(parseInt(portVar, *port, opt.worldSize > 1 ? 1 : 0, 65535));
  }
}

bool validName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}
constexpr const char* kNameRule = "must be 1 to 128 characters from [A-Za-z0-9_.:-]";

}  // namespace

Options Options::fromEnv() {
  Options opt;
  readPlace(opt);
  readMaster(opt);
  if (auto v = env("WEFT_WORKER_NAME")) {
    WEFT_ENFORCE(validName(*v), InvalidArgumentError, kFromEnv, quoted("WEFT_WORKER_NAME", *v), " ", kNameRule);
    opt.name = *v;
  }
  if (auto v = env("WEFT_SOCKET_IFNAME")) {
    WEFT_ENFORCE(!v->empty(), InvalidArgumentError, kFromEnv, "WEFT_SOCKET_IFNAME is empty");
    opt.socketIfname = *v;
  }
  if (auto v = env("WEFT_LISTEN_ADDR")) {
    WEFT_ENFORCE(!v->empty(), InvalidArgumentError, kFromEnv, "WEFT_LISTEN_ADDR is empty");
    opt.listenAddr = *v;
  }
  if (auto v = env("WEFT_LISTEN_PORT")) opt.listenPort = static_cast<uint16_t>(parseInt("WEFT_LISTEN_PORT", *v, 0, 65535));
  if (auto v = env("WEFT_NUM_WORKER_THREADS")) {
    opt.numWorkerThreads = static_cast<int>(parseInt("WEFT_NUM_WORKER_THREADS", *v, 1, kMaxWorkerThreads));
  }
  if (auto v = env("WEFT_RPC_TIMEOUT")) opt.rpcTimeout = parseSeconds("WEFT_RPC_TIMEOUT", *v);
  if (auto v = env("WEFT_STORE_TIMEOUT")) opt.storeTimeout = parseSeconds("WEFT_STORE_TIMEOUT", *v);
  if (auto v = env("WEFT_SHUTDOWN_TIMEOUT")) opt.shutdownTimeout = parseSeconds("WEFT_SHUTDOWN_TIMEOUT", *v);
  if (auto v = env("WEFT_HEARTBEAT_INTERVAL")) opt.heartbeatInterval = parseSeconds("WEFT_HEARTBEAT_INTERVAL", *v);
  if (auto v = env("WEFT_HEARTBEAT_MISSES")) opt.heartbeatMisses = static_cast<int>(parseInt("WEFT_HEARTBEAT_MISSES", *v, 2, 1000));
  if (auto v = env("WEFT_RPC_TOKEN")) opt.authToken = *v;
  opt.logLevel = logging::level();
  if (auto v = env("WEFT_LOG_LEVEL")) opt.logLevel = parseLevel("WEFT_LOG_LEVEL", *v);
  opt.validate();
  return opt;
}

void Options::validate() const {
  WEFT_ENFORCE(worldSize >= 1, InvalidArgumentError, "Options: worldSize ", worldSize, " must be at least 1");
  WEFT_ENFORCE(rank >= 0 && rank < worldSize, InvalidArgumentError, "Options: rank ", rank,
               " is out of range for worldSize ", worldSize, " (ranks are 0 to ", worldSize - 1, ")");
  WEFT_ENFORCE(localRank >= -1 && localRank < worldSize, InvalidArgumentError, "Options: localRank ", localRank,
               " is out of range for worldSize ", worldSize, " (-1 means the same as rank)");
  WEFT_ENFORCE(name.empty() || validName(name), InvalidArgumentError, "Options: worker name '", name, "' ",
               kNameRule);
  WEFT_ENFORCE(!masterAddr.empty(), InvalidArgumentError, "Options: masterAddr is empty");
  WEFT_ENFORCE(worldSize == 1 || masterPort != 0, InvalidArgumentError, "Options: masterPort 0 (any free port) only ",
               "works for a world of 1 process; worldSize is ", worldSize, ", so every process must be given the port");
  WEFT_ENFORCE(numWorkerThreads >= 1 && numWorkerThreads <= kMaxWorkerThreads, InvalidArgumentError,
               "Options: numWorkerThreads ", numWorkerThreads, " is out of range (1 to ", kMaxWorkerThreads, ")");
  constexpr auto kMaxTimeout = std::chrono::milliseconds(static_cast<int64_t>(kMaxTimeoutSeconds * 1000));
  WEFT_ENFORCE(rpcTimeout.count() >= 0 && rpcTimeout <= kMaxTimeout, InvalidArgumentError, "Options: rpcTimeout ",
               rpcTimeout.count(), " ms is out of range (0 = none, at most a year)");
  WEFT_ENFORCE(storeTimeout.count() >= 0 && storeTimeout <= kMaxTimeout, InvalidArgumentError,
               "Options: storeTimeout ", storeTimeout.count(), " ms is out of range (0 = none, at most a year)");
  WEFT_ENFORCE(shutdownTimeout.count() > 0 && shutdownTimeout <= kMaxTimeout, InvalidArgumentError,
               "Options: shutdownTimeout ", shutdownTimeout.count(), " ms is out of range (more than 0, at most a year)");
  WEFT_ENFORCE(heartbeatInterval.count() > 0 && heartbeatInterval <= kMaxTimeout, InvalidArgumentError,
               "Options: heartbeatInterval ", heartbeatInterval.count(),
               " ms is out of range (more than 0, at most a year)");
  WEFT_ENFORCE(heartbeatMisses >= 2 && heartbeatMisses <= 1000, InvalidArgumentError, "Options: heartbeatMisses ",
               heartbeatMisses, " is out of range (2 to 1000)");
  WEFT_ENFORCE(socketIfname.size() <= 255 && socketIfname.find_first_of(" \t\n/") == std::string::npos,
               InvalidArgumentError, "Options: socketIfname '", socketIfname,
               "' is not an interface name or an IP address");
  WEFT_ENFORCE(authToken.size() <= kMaxTokenLength, InvalidArgumentError, "Options: authToken of ", authToken.size(),
               " bytes is longer than ", kMaxTokenLength);
}

std::string Options::workerName() const { return name.empty() ? "worker" + std::to_string(rank) : name; }

std::string Options::localAddress() const { return localAddressFor(socketIfname, masterAddr); }

std::string Options::listenHost() const { return listenAddr.empty() ? localAddress() : listenAddr; }

std::string Options::advertisedHost() const {
  std::string host = listenHost();
  return host == "0.0.0.0" || host == "::" ? localAddress() : host;
}

std::string Options::masterEndpoint() const {
  bool ipv6 = masterAddr.find(':') != std::string::npos;
  return (ipv6 ? "[" + masterAddr + "]" : masterAddr) + ":" + std::to_string(masterPort);
}

bool isLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace weft::rpc
