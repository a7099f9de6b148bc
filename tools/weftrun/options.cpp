#include "tools/weftrun/options.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>

namespace weft::weftrun {
namespace {

constexpr int kMaxProcsPerNode = 4096;
constexpr int kMaxNodes = 65536;
constexpr int kMaxWorldSize = 1 << 20;
constexpr int kMaxRestarts = 1000000;
constexpr double kMaxGraceSeconds = 3600;
// The bounds weft's RPC options accept (rpc/options.h): an interval above 0 and
// up to a year, 2 to 1000 misses.
constexpr double kMaxHeartbeatSeconds = 365.0 * 24 * 3600;
constexpr int kMinHeartbeatMisses = 2;
constexpr int kMaxHeartbeatMisses = 1000;

int parseInt(const std::string& option, const std::string& text, int lo, int hi) {
  int v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < lo || v > hi) {
    throw UsageError(option + " expects an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                     ", got '" + text + "'");
  }
  return v;
}

double parseSeconds(const std::string& option, const std::string& text) {
  char* end = nullptr;
  double v = text.empty() ? -1 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < 0 || v > kMaxGraceSeconds) {
    throw UsageError(option + " expects a number of seconds from 0 to " + std::to_string(int(kMaxGraceSeconds)) +
                     ", got '" + text + "'");
  }
  return v;
}

// A positive number of seconds, returned as given.
std::string parseInterval(const std::string& option, const std::string& text) {
  char* end = nullptr;
  double v = text.empty() ? -1 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v <= 0 || v > kMaxHeartbeatSeconds) {
    throw UsageError(option + " expects a number of seconds above 0 and up to " +
                     std::to_string(static_cast<long long>(kMaxHeartbeatSeconds)) + ", got '" + text + "'");
  }
  return text;
}

}  // namespace

Options parseOptions(const std::vector<std::string>& args) {
  Options o;
  bool sawProcs = false;
  bool sawAddr = false;
  bool sawPort = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program

    // "--name=value", "-nN", or the value in the next argument.
    std::string name = arg;
    std::optional<std::string> inlineValue;
    if (arg.starts_with("--")) {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        inlineValue = arg.substr(eq + 1);
      }
    } else if (arg.starts_with("-n") && arg.size() > 2) {
      name = "-n";
      inlineValue = arg.substr(2);
    }
    auto value = [&]() -> std::string {
      if (inlineValue) return *inlineValue;
      if (i + 1 >= args.size()) throw UsageError(name + " expects a value");
      return args[++i];
    };
    auto noValue = [&] {
      if (inlineValue) throw UsageError(name + " takes no value, got '" + *inlineValue + "'");
    };

    if (name == "-h" || name == "--help") {
      noValue();
      o.help = true;
      return o;
    } else if (name == "-n" || name == "--nproc-per-node") {
      o.procsPerNode = parseInt(name, value(), 1, kMaxProcsPerNode);
      sawProcs = true;
    } else if (name == "--nnodes") {
      o.nnodes = parseInt(name, value(), 1, kMaxNodes);
    } else if (name == "--node-rank") {
      o.nodeRank = parseInt(name, value(), 0, kMaxNodes - 1);
    } else if (name == "--master-addr") {
      o.masterAddr = value();
      if (o.masterAddr.empty()) throw UsageError("--master-addr expects a host name or address, got ''");
      sawAddr = true;
    } else if (name == "--master-port") {
      o.masterPort = parseInt(name, value(), 1, 65535);
      sawPort = true;
    } else if (name == "--socket-ifname") {
      o.socketIfname = value();
      if (o.socketIfname.empty() || o.socketIfname.find_first_of(" \t\n/") != std::string::npos) {
        throw UsageError("--socket-ifname expects an interface name or an IP address of this machine, got '" +
                         o.socketIfname + "'");
      }
    } else if (name == "--tag-output") {
      noValue();
      o.tagOutput = true;
    } else if (name == "--bind-cpus") {
      noValue();
      o.bindCpus = true;
    } else if (name == "--max-restarts") {
      o.maxRestarts = parseInt(name, value(), 0, kMaxRestarts);
    } else if (name == "--grace-period") {
      o.graceSeconds = parseSeconds(name, value());
    } else if (name == "--heartbeat-interval") {
      o.heartbeatInterval = parseInterval(name, value());
    } else if (name == "--heartbeat-misses") {
      o.heartbeatMisses = std::to_string(parseInt(name, value(), kMinHeartbeatMisses, kMaxHeartbeatMisses));
    } else {
      throw UsageError("unknown option '" + arg + "'");
    }
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());

  if (!sawProcs) throw UsageError("-n N is required: the number of processes to start on this machine");
  if (o.command.empty()) throw UsageError("no program given");
  if (o.nodeRank >= o.nnodes) {
    throw UsageError("--node-rank " + std::to_string(o.nodeRank) + " must be below --nnodes " +
                     std::to_string(o.nnodes));
  }
  if (static_cast<long long>(o.procsPerNode) * o.nnodes > kMaxWorldSize) {
    throw UsageError("-n " + std::to_string(o.procsPerNode) + " times --nnodes " + std::to_string(o.nnodes) +
                     " exceeds the largest world size, " + std::to_string(kMaxWorldSize));
  }
  if (o.nnodes > 1 && !sawAddr) {
    throw UsageError("--nnodes " + std::to_string(o.nnodes) +
                     " needs --master-addr: the address of node 0, reachable from every node");
  }
  if (o.nnodes > 1 && !sawPort) {
    throw UsageError("--nnodes " + std::to_string(o.nnodes) + " needs --master-port: every node must use the same port");
  }
  return o;
}

std::string usageText() {
  return R"(usage: weftrun -n N [options] [--] program [args...]

Starts N copies of program on this machine and tells each its place in the
group through the environment:
  WEFT_RANK, RANK               global rank: node_rank * N + local rank
  WEFT_WORLD_SIZE, WORLD_SIZE   N * nnodes
  WEFT_LOCAL_RANK, LOCAL_RANK   rank on this machine, 0..N-1
  WEFT_LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE   N
  WEFT_NNODES, WEFT_NODE_RANK   the machines taking part, and this one's index
  WEFT_MASTER_ADDR, MASTER_ADDR, WEFT_MASTER_PORT, MASTER_PORT
                                where rank 0 serves the rendezvous store
  WEFT_RESTART_COUNT            0 on the first attempt, then 1, 2, ...
  WEFT_SOCKET_IFNAME            --socket-ifname, when given
  WEFT_HEARTBEAT_INTERVAL, WEFT_HEARTBEAT_MISSES
                                only when --heartbeat-interval / --heartbeat-misses
                                are given

When a process fails (non-zero exit or a signal) weftrun stops the others
(SIGTERM, then SIGKILL after the grace period) and exits with the failed
rank's status: its exit code, or 128 + the signal number. SIGINT, SIGTERM and
SIGHUP sent to weftrun are forwarded to every process; weftrun then exits with
128 + that signal. A program that cannot be executed makes weftrun exit 127
(not found) or 126 (not executable).

options:
  -n, --nproc-per-node N  processes to start on this machine (required)
  --nnodes M              machines in the group, each running weftrun (default 1)
  --node-rank R           this machine's index, 0..M-1 (default 0)
  --master-addr A         address of node 0 (default 127.0.0.1; required when M > 1)
  --master-port P         port of the rendezvous store (default: a free port,
                          chosen anew for each attempt; required when M > 1)
  --socket-ifname I       interface name or IP address of this machine that the
                          processes bind and give their peers (default: the
                          local address of the route to the master address)
  --tag-output            prefix every line of output with "[rank] "
  --bind-cpus             bind each process to its own slice of weftrun's CPUs
                          (as even as the count allows; an error when there are
                          fewer CPUs than processes) and set WEFT_NUM_THREADS to
                          the slice's size unless the environment sets it
  --max-restarts K        after a failure, restart the whole group up to K times
                          (default 0)
  --grace-period S        seconds between SIGTERM and SIGKILL when stopping
                          processes (default 10)
  --heartbeat-interval S  seconds of silence before a rank pings a peer, for
                          every rank (WEFT_HEARTBEAT_INTERVAL; weft's default 2)
  --heartbeat-misses K    intervals of silence after which a peer is declared
                          dead, 2..1000 (WEFT_HEARTBEAT_MISSES; default 5).
                          S x K is how long a rank's whole process may pause
                          (stopped, frozen for a checkpoint, swapped out)
                          before the others fail their calls to it: 10 s by
                          default
  -h, --help              show this help

The processes read /dev/null as stdin and each runs in its own process group.
)";
}

}  // namespace weft::weftrun
