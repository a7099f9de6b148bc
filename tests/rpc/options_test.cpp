#include "rpc/options.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "captured_text.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

using namespace weft;
using namespace weft::rpc;
using namespace std::chrono_literals;

using weft::testing::contains;

namespace {

// Every variable Options::fromEnv reads.
const char* const kAllVariables[] = {
    "WEFT_RANK", "WEFT_WORLD_SIZE", "WEFT_LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID",
    "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "WEFT_MASTER_ADDR", "WEFT_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT", "WEFT_WORKER_NAME", "WEFT_LISTEN_ADDR",
    "WEFT_LISTEN_PORT", "WEFT_NUM_WORKER_THREADS", "WEFT_RPC_TIMEOUT", "WEFT_STORE_TIMEOUT", "WEFT_RPC_TOKEN",
    "WEFT_LOG_LEVEL", "WEFT_SHUTDOWN_TIMEOUT", "WEFT_HEARTBEAT_INTERVAL", "WEFT_HEARTBEAT_MISSES",
    "WEFT_SOCKET_IFNAME",
};

// Sets exactly the given variables among those fromEnv reads (all others
// unset, whatever the test's own environment holds) and restores every one
// of them when it goes out of scope.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : kAllVariables) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) {
      bool known = false;
      for (const char* n : kAllVariables) known |= std::string(n) == name;
      REQUIRE_MESSAGE(known, "ScopedEnv: add ", name, " to kAllVariables");
      ::setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The message of the InvalidArgumentError fromEnv throws (fails the test when
// it throws nothing or something else).
std::string fromEnvError() {
  try {
    Options::fromEnv();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  FAIL("Options::fromEnv accepted the environment");
  return "";
}

std::string validateError(const Options& opt) {
  try {
    opt.validate();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  FAIL("Options::validate accepted the options");
  return "";
}

}  // namespace

TEST_CASE("without any launcher variable a process is rank 0 of a world of 1 with the documented defaults") {
  ScopedEnv env({});
  Options opt = Options::fromEnv();
  CHECK(opt.rank == 0);
  CHECK(opt.worldSize == 1);
  CHECK(opt.effectiveLocalRank() == 0);
  CHECK(opt.workerName() == "worker0");
  CHECK(opt.masterAddr == "127.0.0.1");
  CHECK(opt.masterPort == 0);
  CHECK(opt.listenHost() == "127.0.0.1");
  CHECK(opt.listenPort == 0);
  CHECK(opt.numWorkerThreads == 4);
  CHECK(opt.rpcTimeout == 60s);
  CHECK(opt.storeTimeout == 300s);
  CHECK(opt.authToken.empty());
}

TEST_CASE("weftrun's variables are read, and the worker name defaults to worker<rank>") {
  ScopedEnv env({{"WEFT_RANK", "2"},
                 {"WEFT_WORLD_SIZE", "4"},
                 {"WEFT_LOCAL_RANK", "1"},
                 {"WEFT_MASTER_ADDR", "10.0.0.7"},
                 {"WEFT_MASTER_PORT", "29501"}});
  Options opt = Options::fromEnv();
  CHECK(opt.rank == 2);
  CHECK(opt.worldSize == 4);
  CHECK(opt.localRank == 1);
  CHECK(opt.workerName() == "worker2");
  CHECK(opt.masterAddr == "10.0.0.7");
  CHECK(opt.masterPort == 29501);
  CHECK(opt.masterEndpoint() == "10.0.0.7:29501");
  CHECK(opt.socketIfname.empty());  // the default: the local address of the route to 10.0.0.7
}

TEST_CASE("WEFT_ variables win over torchrun's, Slurm's and Open MPI's") {
  ScopedEnv env({{"WEFT_RANK", "1"},
                 {"WEFT_WORLD_SIZE", "2"},
                 {"RANK", "5"},
                 {"WORLD_SIZE", "8"},
                 {"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "1"},
                 {"OMPI_COMM_WORLD_RANK", "3"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"WEFT_MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_ADDR", "10.9.9.9"},
                 {"WEFT_MASTER_PORT", "4000"},
                 {"MASTER_PORT", "5000"}});
  Options opt = Options::fromEnv();
  CHECK(opt.rank == 1);
  CHECK(opt.worldSize == 2);
  CHECK(opt.masterAddr == "127.0.0.1");
  CHECK(opt.masterPort == 4000);
}

TEST_CASE("torchrun's variables are read when no WEFT_ rank is set, and win over Slurm's") {
  ScopedEnv env({{"RANK", "3"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "3"},
                 {"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "2"},
                 {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "29500"}});
  Options opt = Options::fromEnv();
  CHECK(opt.rank == 3);
  CHECK(opt.worldSize == 8);
  CHECK(opt.localRank == 3);
  CHECK(opt.masterAddr == "node0");
  CHECK(opt.masterPort == 29500);
}

TEST_CASE("Slurm's variables are read, and win over Open MPI's") {
  ScopedEnv env({{"SLURM_PROCID", "5"},
                 {"SLURM_NTASKS", "8"},
                 {"SLURM_LOCALID", "1"},
                 {"OMPI_COMM_WORLD_RANK", "0"},
                 {"OMPI_COMM_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "29500"}});
  Options opt = Options::fromEnv();
  CHECK(opt.rank == 5);
  CHECK(opt.worldSize == 8);
  CHECK(opt.localRank == 1);
}

TEST_CASE("Open MPI's variables are read last, and a missing local rank means the rank") {
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "6"},
                 {"OMPI_COMM_WORLD_SIZE", "7"},
                 {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "29500"}});
  Options opt = Options::fromEnv();
  CHECK(opt.rank == 6);
  CHECK(opt.worldSize == 7);
  CHECK(opt.localRank == -1);
  CHECK(opt.effectiveLocalRank() == 6);
}

TEST_CASE("the optional WEFT_ settings are read") {
  ScopedEnv env({{"WEFT_WORKER_NAME", "ps.0:main-1"},
                 {"WEFT_SOCKET_IFNAME", "eth0"},
                 {"WEFT_LISTEN_ADDR", "192.168.1.4"},
                 {"WEFT_LISTEN_PORT", "7000"},
                 {"WEFT_NUM_WORKER_THREADS", "8"},
                 {"WEFT_RPC_TIMEOUT", "2.5"},
                 {"WEFT_STORE_TIMEOUT", "0"},
                 {"WEFT_RPC_TOKEN", "s3cret"},
                 {"WEFT_LOG_LEVEL", "debug"}});
  Options opt = Options::fromEnv();
  CHECK(opt.workerName() == "ps.0:main-1");
  CHECK(opt.socketIfname == "eth0");
  CHECK(opt.listenHost() == "192.168.1.4");
  CHECK(opt.listenPort == 7000);
  CHECK(opt.numWorkerThreads == 8);
  CHECK(opt.rpcTimeout == 2500ms);
  CHECK(opt.storeTimeout == 0ms);
  CHECK(opt.authToken == "s3cret");
  CHECK(opt.logLevel == logging::Level::Debug);
}

TEST_CASE("a tiny positive timeout is rounded up, never to 'no timeout'") {
  ScopedEnv env({{"WEFT_RPC_TIMEOUT", "0.0001"}});
  CHECK(Options::fromEnv().rpcTimeout == 1ms);
}

TEST_CASE("the shutdown and heartbeat settings are read and checked") {
  {
    ScopedEnv env({{"WEFT_SHUTDOWN_TIMEOUT", "7.5"}, {"WEFT_HEARTBEAT_INTERVAL", "0.25"}, {"WEFT_HEARTBEAT_MISSES", "3"}});
    Options opt = Options::fromEnv();
    CHECK(opt.shutdownTimeout == 7500ms);
    CHECK(opt.heartbeatInterval == 250ms);
    CHECK(opt.heartbeatMisses == 3);
  }
  {
    ScopedEnv env({{"WEFT_HEARTBEAT_MISSES", "1"}});
    CHECK(contains(fromEnvError(), "WEFT_HEARTBEAT_MISSES"));
  }
  {
    ScopedEnv env({{"WEFT_SHUTDOWN_TIMEOUT", "0"}});
    CHECK(contains(fromEnvError(), "shutdownTimeout"));
  }
  {
    ScopedEnv env({{"WEFT_HEARTBEAT_INTERVAL", "soon"}});
    CHECK(contains(fromEnvError(), "WEFT_HEARTBEAT_INTERVAL='soon'"));
  }
}

TEST_CASE("values that do not parse are errors naming the variable and the value") {
  SUBCASE("a rank that is not a number") {
    ScopedEnv env({{"WEFT_RANK", "x"}, {"WEFT_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(fromEnvError(), "WEFT_RANK='x' is not an integer"));
  }
  SUBCASE("a world size with trailing junk") {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "4abc"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(fromEnvError(), "WORLD_SIZE='4abc' is not an integer"));
  }
  SUBCASE("an empty rank") {
    ScopedEnv env({{"SLURM_PROCID", ""}, {"SLURM_NTASKS", "2"}});
    CHECK(contains(fromEnvError(), "SLURM_PROCID='' is not an integer"));
  }
  SUBCASE("a fractional rank") {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "1.5"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    CHECK(contains(fromEnvError(), "OMPI_COMM_WORLD_RANK='1.5' is not an integer"));
  }
  SUBCASE("a port that is not a number") {
    ScopedEnv env({{"WEFT_MASTER_PORT", "http"}});
    CHECK(contains(fromEnvError(), "WEFT_MASTER_PORT='http' is not an integer"));
  }
  SUBCASE("a timeout that is not a number of seconds") {
    ScopedEnv env({{"WEFT_RPC_TIMEOUT", "10s"}});
    CHECK(contains(fromEnvError(), "WEFT_RPC_TIMEOUT='10s' is not a number of seconds"));
  }
  SUBCASE("a negative timeout") {
    ScopedEnv env({{"WEFT_STORE_TIMEOUT", "-1"}});
    CHECK(contains(fromEnvError(), "WEFT_STORE_TIMEOUT='-1' is out of range"));
  }
  SUBCASE("an unknown log level") {
    ScopedEnv env({{"WEFT_LOG_LEVEL", "loud"}});
    CHECK(contains(fromEnvError(), "WEFT_LOG_LEVEL='loud' is not one of debug, info, warn, error, off"));
  }
  SUBCASE("zero worker threads") {
    ScopedEnv env({{"WEFT_NUM_WORKER_THREADS", "0"}});
    CHECK(contains(fromEnvError(), "WEFT_NUM_WORKER_THREADS='0' is out of range (1 to 1024)"));
  }
  SUBCASE("a worker name with a space") {
    ScopedEnv env({{"WEFT_WORKER_NAME", "my worker"}});
    CHECK(contains(fromEnvError(), "WEFT_WORKER_NAME='my worker' must be 1 to 128 characters"));
  }
}

TEST_CASE("a rank without a world size, or the reverse, is an error naming the missing variable") {
  SUBCASE("rank alone") {
    ScopedEnv env({{"WEFT_RANK", "1"}, {"WORLD_SIZE", "4"}});
    CHECK(contains(fromEnvError(), "WEFT_RANK is set but WEFT_WORLD_SIZE is not"));
  }
  SUBCASE("world size alone") {
    ScopedEnv env({{"WORLD_SIZE", "4"}});
    CHECK(contains(fromEnvError(), "WORLD_SIZE is set but RANK is not"));
  }
  SUBCASE("local rank alone") {
    ScopedEnv env({{"LOCAL_RANK", "0"}});
    CHECK(contains(fromEnvError(), "LOCAL_RANK is set but RANK is not"));
  }
}

TEST_CASE("ranks and ports out of range are errors") {
  SUBCASE("rank equal to the world size") {
    ScopedEnv env({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    std::string e = fromEnvError();
    CHECK(contains(e, "RANK='4' is out of range for WORLD_SIZE='4'"));
    CHECK(contains(e, "0 to 3"));
  }
  SUBCASE("negative rank") {
    ScopedEnv env({{"RANK", "-1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(fromEnvError(), "RANK='-1' is out of range"));
  }
  SUBCASE("world size zero") {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
    CHECK(contains(fromEnvError(), "WORLD_SIZE='0' is out of range"));
  }
  SUBCASE("local rank beyond the world") {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(fromEnvError(), "LOCAL_RANK='2' is out of range"));
  }
  SUBCASE("port above 65535") {
    ScopedEnv env({{"MASTER_PORT", "70000"}});
    CHECK(contains(fromEnvError(), "MASTER_PORT='70000' is out of range (0 to 65535)"));
  }
  SUBCASE("port 0 in a world of several processes") {
    ScopedEnv env({{"WEFT_RANK", "0"}, {"WEFT_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}});
    CHECK(contains(fromEnvError(), "MASTER_PORT='0' is out of range (1 to 65535)"));
  }
  SUBCASE("a rank too large for an int") {
    ScopedEnv env({{"RANK", "99999999999999999999"}, {"WORLD_SIZE", "2"}});
    CHECK(contains(fromEnvError(), "is out of range"));
  }
}

TEST_CASE("a world of several processes needs the store's address and port") {
  SUBCASE("neither") {
    ScopedEnv env({{"WEFT_RANK", "0"}, {"WEFT_WORLD_SIZE", "2"}});
    std::string e = fromEnvError();
    CHECK(contains(e, "a world of 2 processes needs the rendezvous store's address"));
    CHECK(contains(e, "WEFT_MASTER_ADDR or MASTER_ADDR"));
    CHECK(contains(e, "WEFT_MASTER_PORT or MASTER_PORT"));
  }
  SUBCASE("no port") {
    ScopedEnv env({{"WEFT_RANK", "0"}, {"WEFT_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}});
    std::string e = fromEnvError();
    CHECK(contains(e, "WEFT_MASTER_PORT or MASTER_PORT"));
    CHECK_FALSE(contains(e, "MASTER_ADDR"));
  }
}

TEST_CASE("validate rejects hand-built options with a message naming the field") {
  Options ok;
  CHECK_NOTHROW(ok.validate());

  Options o = ok;
  o.worldSize = 0;
  CHECK(contains(validateError(o), "worldSize 0 must be at least 1"));
  o = ok;
  o.worldSize = 2;
  o.masterPort = 29500;
  o.rank = 2;
  CHECK(contains(validateError(o), "rank 2 is out of range for worldSize 2"));
  o.rank = -1;
  CHECK(contains(validateError(o), "rank -1 is out of range"));
  o = ok;
  o.localRank = -2;
  CHECK(contains(validateError(o), "localRank -2"));
  o = ok;
  o.name = "has space";
  CHECK(contains(validateError(o), "worker name 'has space'"));
  o.name = std::string(129, 'a');
  CHECK(contains(validateError(o), "1 to 128 characters"));
  o = ok;
  o.worldSize = 3;
  o.masterPort = 0;
  CHECK(contains(validateError(o), "masterPort 0"));
  o = ok;
  o.masterAddr = "";
  CHECK(contains(validateError(o), "masterAddr is empty"));
  o = ok;
  o.numWorkerThreads = 0;
  CHECK(contains(validateError(o), "numWorkerThreads 0"));
  o = ok;
  o.rpcTimeout = -1ms;
  CHECK(contains(validateError(o), "rpcTimeout -1 ms"));
  o = ok;
  o.storeTimeout = -5ms;
  CHECK(contains(validateError(o), "storeTimeout -5 ms"));
  o = ok;
  o.authToken = std::string(5000, 't');
  CHECK(contains(validateError(o), "authToken of 5000 bytes"));
}

namespace {

// This machine's addresses by interface (an independent look at getifaddrs).
std::vector<std::pair<std::string, std::string>> machineIpv4() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* list = nullptr;
  REQUIRE(::getifaddrs(&list) == 0);
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = "";
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
    out.emplace_back(i->ifa_name, buf);
  }
  ::freeifaddrs(list);
  return out;
}

std::string invalidArgument(const Options& o) {
  try {
    o.localAddress();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  FAIL("localAddress accepted socketIfname '" << o.socketIfname << "' with master '" << o.masterAddr << "'");
  return "";
}

}  // namespace

TEST_CASE("WEFT_SOCKET_IFNAME names an interface or an address of this machine, and wins over the route") {
  Options o;
  o.masterAddr = "127.0.0.1";
  o.socketIfname = "lo";
  CHECK(o.localAddress() == "127.0.0.1");
  for (const auto& [ifname, address] : machineIpv4()) {
    o.socketIfname = address;
    CHECK(o.localAddress() == address);
    CHECK(o.listenHost() == address);
  }
  o.socketIfname = "nosuchif0";
  std::string err = invalidArgument(o);
  CHECK(contains(err, "WEFT_SOCKET_IFNAME='nosuchif0' is neither an interface nor an IP address of this machine"));
  CHECK(contains(err, "lo 127.0.0.1"));  // the interfaces there are, to choose from
  o.socketIfname = "192.0.2.254";
  bool local = false;
  for (const auto& ia : machineIpv4()) local = local || ia.second == o.socketIfname;
  if (!local) CHECK(contains(invalidArgument(o), "WEFT_SOCKET_IFNAME='192.0.2.254' is not an address of this machine"));
  {
    ScopedEnv env({{"WEFT_SOCKET_IFNAME", ""}});
    CHECK_THROWS_WITH_AS(Options::fromEnv(), doctest::Contains("WEFT_SOCKET_IFNAME is empty"), InvalidArgumentError);
  }
  o.socketIfname = "eth 0";
  CHECK(contains(validateError(o), "socketIfname 'eth 0' is not an interface name or an IP address"));
}

TEST_CASE("the job's address is loopback exactly when the store is on loopback, else the route's local address") {
  Options o;
  for (const char* host : {"127.0.0.1", "127.1.2.3", "localhost", "::1"}) {
    o.masterAddr = host;
    CHECK_MESSAGE(o.localAddress() == "127.0.0.1", host);
    CHECK_MESSAGE(o.listenHost() == "127.0.0.1", host);
    CHECK_MESSAGE(o.advertisedHost() == "127.0.0.1", host);
  }
  // The route to one of this machine's own addresses starts at that address.
  for (const auto& [ifname, address] : machineIpv4()) {
    if (address.rfind("127.", 0) == 0) continue;
    o.masterAddr = address;
    CHECK_MESSAGE(o.localAddress() == address, ifname);
    CHECK_MESSAGE(o.listenHost() == address, ifname);
    CHECK_MESSAGE(o.advertisedHost() == address, ifname);
  }
  o.masterAddr = "no-such-host.invalid";
  std::string err = invalidArgument(o);
  CHECK(contains(err, "no-such-host.invalid"));
  CHECK(contains(err, "WEFT_SOCKET_IFNAME"));
  // WEFT_LISTEN_ADDR binds the agent elsewhere; a wildcard still advertises the job's address.
  o.masterAddr = "127.0.0.1";
  o.listenAddr = "10.1.1.1";
  CHECK(o.listenHost() == "10.1.1.1");
  CHECK(o.advertisedHost() == "10.1.1.1");
  o.listenAddr = "0.0.0.0";
  CHECK(o.listenHost() == "0.0.0.0");
  CHECK(o.advertisedHost() == "127.0.0.1");
  o.listenAddr.clear();
  o.masterAddr = "::1";
  o.masterPort = 80;
  CHECK(o.masterEndpoint() == "[::1]:80");
}
