// weftrun's command line: what the user asked for, and the help text.
//
//   weftrun -n 4 --tag-output --max-restarts 2 ./train --epochs 3
//   weftrun -n 4 --heartbeat-interval 6 ./train   # a silent rank is declared dead after 30 s
//
//   weft::weftrun::Options o = weft::weftrun::parseOptions({"-n", "4", "./train"});
//   o.worldSize();          // 4
//   o.globalRank(2);        // 2 on node 0; node_rank * N + 2 in general
//
// Options come first; the first argument that is not an option (or everything
// after "--") is the program, and the rest are its arguments, passed through
// untouched. Numbers must be whole (no trailing junk). Every mistake raises
// UsageError with a message naming the option and the offending value; weftrun
// prints it with the usage and exits 2.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace weft::weftrun {

inline constexpr const char* kDefaultMasterAddr = "127.0.0.1";
inline constexpr double kDefaultGraceSeconds = 10.0;

// Raised for any malformed command line.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Options {
  int procsPerNode = 0;  // -n: processes started on this machine
  int nnodes = 1;        // machines in the group, each running one weftrun
  int nodeRank = 0;      // this machine's index in [0, nnodes)
  std::string masterAddr = kDefaultMasterAddr;
  // 0 = weftrun picks a free port below the ephemeral range before each
  // attempt and holds it reserved while the attempt runs (free_port.h).
  int masterPort = 0;
  // --socket-ifname: the interface or address of this machine the processes
  // bind and give their peers, passed on as WEFT_SOCKET_IFNAME; empty leaves
  // that variable as weftrun found it.
  std::string socketIfname;
  bool tagOutput = false;
  int maxRestarts = 0;
  // Time between SIGTERM and SIGKILL when weftrun stops ranks.
  double graceSeconds = kDefaultGraceSeconds;
  // --heartbeat-interval / --heartbeat-misses, as given (validated): every rank
  // gets them as WEFT_HEARTBEAT_INTERVAL / WEFT_HEARTBEAT_MISSES. Empty: not
  // set, so the ranks see whatever weftrun's environment says (else weft's
  // defaults, 2 s x 5).
  std::string heartbeatInterval;
  std::string heartbeatMisses;
  // --bind-cpus: each local rank bound to its own slice of weftrun's CPUs,
  // WEFT_NUM_THREADS its size unless set (cpu_binding.h).
  bool bindCpus = false;
  bool help = false;                 // -h/--help: print usage, run nothing
  std::vector<std::string> command;  // program, then its arguments

  int worldSize() const { return procsPerNode * nnodes; }
  int globalRank(int localRank) const { return nodeRank * procsPerNode + localRank; }
};

// Parses argv[1..] (the program name excluded). Throws UsageError.
Options parseOptions(const std::vector<std::string>& args);

// The full help text, ending with a newline.
std::string usageText();

}  // namespace weft::weftrun
