// A job across two machines, as the weftrun README runs it: two network namespaces joined by a
// veth pair (10.213.1.1/24 and 10.213.1.2/24, nothing else reachable from either), created and
// removed by the test, and one `weftrun -n 2 --nnodes 2 --node-rank R` in each (`ip netns exec`)
// running tests/collectives/helpers/multinode_worker.cpp. With the default address setting the
// job runs an allReduce, a send/recv across the machines, an RPC call and an RRef; with a wrong
// one (loopback on both machines, or an address the other machine has no route to) it fails
// well within its timeouts, every rank, with a message naming the address tried and
// WEFT_SOCKET_IFNAME. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2: without them each
// test prints "SKIP: <why>" and exits 77, which CTest reports as skipped.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "captured_text.h"
#include "tools/subprocess.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::Subprocess;

namespace {

constexpr const char* kNode0Addr = "10.213.1.1";
constexpr const char* kNode1Addr = "10.213.1.2";
// Addresses on one node that the other node has no route to. Gloo's
// connection between two ranks is dialled by the rank with the larger address, so the process
// group tests put the unreachable address below node 0's, and the agent (where the higher rank
// dials) on node 0.
constexpr const char* kUnreachableOnNode0 = "10.213.2.1";
constexpr const char* kUnreachableOnNode1 = "10.213.0.1";
constexpr const char* kMasterPort = "29500";
// The agent's store timeout and the process group's timeout (multinode_worker.cpp) are 30 s; a
// wrong address must fail well within them.
constexpr auto kFailFastBound = 15s;
constexpr auto kJobLimit = 90s;

std::string ipTool() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

[[noreturn]] void skip(const std::string& why) {
  std::printf("SKIP: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

// Runs `ip args...`; the result (bounded at 20 s).
Subprocess::Result ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv{ipTool()};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess p(argv);
  return p.wait(20s);
}

void ipOrFail(const std::vector<std::string>& args) {
  auto r = ip(args);
  std::string joined;
  for (const auto& a : args) joined += " " + a;
  if (r.exitCode != 0) throw std::runtime_error("ip" + joined + " failed: " + r.err);
}

// Kills every process inside namespace `ns` and removes it.
void removeNamespace(const std::string& ns) {
  for (int round = 0; round < 50; ++round) {
    auto r = ip({"netns", "pids", ns});
    std::istringstream pids(r.out);
    bool any = false;
    for (long pid; pids >> pid;) {
      any = true;
      ::kill(static_cast<pid_t>(pid), SIGKILL);
    }
    if (!any) break;
    std::this_thread::sleep_for(20ms);
  }
  ip({"netns", "del", ns});
}

// Two namespaces "weftmn<pid>a" (node 0) and "weftmn<pid>b" (node 1) joined by a veth pair; the
// pair's ends are created inside the namespaces, so nothing is added to the test's own network.
// The destructor kills whatever still runs inside them and removes both, also after a failure.
// Namespaces left by an earlier run of this test that was killed (its pid gone) are removed first.
class TwoMachines {
 public:
  TwoMachines() {
    if (ipTool().empty()) skip("iproute2's ip is not installed");
    if (::geteuid() != 0) skip("creating network namespaces needs root");
    removeStale();
    // Only the options given to weftrun choose the address.
    ::unsetenv("WEFT_SOCKET_IFNAME");
    const std::string tag = "weftmn" + std::to_string(::getpid());
    node0_ = tag + "a";
    node1_ = tag + "b";
    auto probe = ip({"netns", "add", node0_});
    if (probe.exitCode != 0) skip("ip netns add is not permitted here: " + firstLine(probe.err));
    try {
      ipOrFail({"netns", "add", node1_});
      ipOrFail({"link", "add", "mn0", "netns", node0_, "type", "veth", "peer", "name", "mn1", "netns", node1_});
      ipOrFail({"-n", node0_, "addr", "add", std::string(kNode0Addr) + "/24", "dev", "mn0"});
      ipOrFail({"-n", node1_, "addr", "add", std::string(kNode1Addr) + "/24", "dev", "mn1"});
      // On each node, an address on a second veth pair whose both ends stay on that node.
      for (const std::string& ns : {node0_, node1_}) {
        ipOrFail({"-n", ns, "link", "add", "mnlocal", "type", "veth", "peer", "name", "mnlocal1"});
        ipOrFail({"-n", ns, "addr", "add",
                  std::string(ns == node0_ ? kUnreachableOnNode0 : kUnreachableOnNode1) + "/24", "dev", "mnlocal"});
        for (const char* dev : {"lo", "mnlocal", "mnlocal1"}) ipOrFail({"-n", ns, "link", "set", dev, "up"});
      }
      ipOrFail({"-n", node0_, "link", "set", "mn0", "up"});
      ipOrFail({"-n", node1_, "link", "set", "mn1", "up"});
    } catch (...) {
      cleanUp();
      throw;
    }
  }
  ~TwoMachines() { cleanUp(); }
  TwoMachines(const TwoMachines&) = delete;
  TwoMachines& operator=(const TwoMachines&) = delete;

  const std::string& node(int r) const { return r == 0 ? node0_ : node1_; }

  // Starts weftrun for node `r` inside its namespace, with `extra` weftrun options.
  std::unique_ptr<Subprocess> weftrun(int r, const std::string& scenario, const std::vector<std::string>& extra) const {
    std::vector<std::string> argv{ipTool(), "netns", "exec", node(r), WEFTRUN_PATH,
                                  "-n", "2", "--nnodes", "2", "--node-rank", std::to_string(r),
                                  "--master-addr", kNode0Addr, "--master-port", kMasterPort, "--tag-output"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(MULTINODE_WORKER_PATH);
    argv.push_back(scenario);
    return std::make_unique<Subprocess>(argv, std::vector<std::string>{"WEFT_STORE_TIMEOUT=30"});
  }

 private:
  static std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

  void cleanUp() {
    for (std::string* ns : {&node0_, &node1_}) {
      if (ns->empty()) continue;
      removeNamespace(*ns);
      ns->clear();
    }
  }

  static void removeStale() {
    auto r = ip({"netns", "list"});
    static const std::regex re(R"(^weftmn(\d+)[ab]\b)");
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, re)) continue;
      struct stat st;
      if (::stat(("/proc/" + m[1].str()).c_str(), &st) == 0) continue;  // its test is still running
      removeNamespace(line.substr(0, line.find(' ')));
    }
  }

  std::string node0_;
  std::string node1_;
};

struct Outcome {
  Subprocess::Result node[2];
  double seconds = 0;  // until both weftruns ended
  std::string all() const {
    return "node 0 exit " + std::to_string(node[0].exitCode) + " (" + std::to_string(node[0].seconds) +
           " s)\nstdout:\n" + node[0].out + "stderr:\n" + node[0].err + "\nnode 1 exit " +
           std::to_string(node[1].exitCode) + " (" + std::to_string(node[1].seconds) + " s)\nstdout:\n" +
           node[1].out + "stderr:\n" + node[1].err;
  }
};

// Both nodes' weftruns, each with its own extra options, until both end (bounded).
Outcome runJob(const TwoMachines& net, const std::string& scenario, const std::vector<std::string>& extra0,
               const std::vector<std::string>& extra1) {
  auto began = Subprocess::Clock::now();
  auto n0 = net.weftrun(0, scenario, extra0);
  auto n1 = net.weftrun(1, scenario, extra1);
  Outcome o;
  o.node[0] = n0->wait(kJobLimit);
  o.node[1] = n1->wait(std::max(1ms, std::chrono::duration_cast<std::chrono::milliseconds>(
                                          kJobLimit - (Subprocess::Clock::now() - began))));
  o.seconds = std::chrono::duration<double>(Subprocess::Clock::now() - began).count();
  return o;
}

std::string line(int rank, const std::string& rest) {
  const std::string r = std::to_string(rank);
  std::string out = "[";
  out.append(r).append("] rank ").append(r).append(" ").append(rest);
  return out;
}

// Every rank failed fast, and the job's output says what happened and what to change.
void checkFailedFast(const Outcome& o, const std::vector<std::string>& phrases) {
  INFO(o.all());
  CHECK_FALSE(o.node[0].timedOut);
  CHECK_FALSE(o.node[1].timedOut);
  CHECK(o.node[0].exitCode != 0);
  CHECK(o.node[1].exitCode != 0);
  CHECK(o.seconds < std::chrono::duration<double>(kFailFastBound).count());
  const std::string err = o.node[0].err + o.node[1].err;
  for (const std::string& p : phrases) CHECK_MESSAGE(contains(err, p), p);
  for (int r = 0; r < 4; ++r) CHECK_FALSE(contains(o.node[r / 2].out, line(r, "done")));
  MESSAGE("the job failed after " << o.seconds << " s");
}

}  // namespace

TEST_CASE("a job on two machines runs an allReduce, send/recv, an RPC and an RRef with the default address") {
  TwoMachines net;
  Outcome o = runJob(net, "job", {}, {});
  INFO(o.all());
  REQUIRE_FALSE(o.node[0].timedOut);
  REQUIRE_FALSE(o.node[1].timedOut);
  CHECK(o.node[0].exitCode == 0);
  CHECK(o.node[1].exitCode == 0);
  for (int r = 0; r < 4; ++r) {
    const std::string& out = o.node[r / 2].out;
    const int peer = (r + 2) % 4;
    // Each machine's address is the local end of its route to the master.
    CHECK(contains(out, line(r, std::string("address ") + (r < 2 ? kNode0Addr : kNode1Addr) + "\n")));
    CHECK(contains(out, line(r, "allreduce 10\n")));
    CHECK(contains(out, line(r, "recv " + std::to_string(100 + peer) + "\n")));
    CHECK(contains(out, line(r, "rpc from " + std::to_string(r) + " to " + std::to_string(peer) + " node " +
                                    std::to_string(peer / 2) + " at " + (peer < 2 ? kNode0Addr : kNode1Addr) +
                                    "\n")));
    CHECK(contains(out, line(r, "rref " + std::to_string(1000 + r) + "\n")));
    CHECK(contains(out, line(r, "done\n")));
    CHECK(contains(out, line(r, "shutdown graceful 1")));
  }
  MESSAGE("the job took " << o.seconds << " s");
}

TEST_CASE("the process group alone runs across two machines with the default address") {
  TwoMachines net;
  Outcome o = runJob(net, "pg", {}, {});
  INFO(o.all());
  CHECK(o.node[0].exitCode == 0);
  CHECK(o.node[1].exitCode == 0);
  for (int r = 0; r < 4; ++r) {
    CHECK(contains(o.node[r / 2].out, line(r, "allreduce 10\n")));
    CHECK(contains(o.node[r / 2].out, line(r, "done\n")));
  }
}

TEST_CASE("--socket-ifname lo on both machines fails the job fast, naming the address and the setting") {
  TwoMachines net;
  Outcome o = runJob(net, "job", {"--socket-ifname", "lo"}, {"--socket-ifname", "lo"});
  // Node 1's ranks dial node 0's ranks at the loopback address they gave.
  checkFailedFast(o, {"cannot connect to", "at 127.0.0.1:", "Connection refused",
                      "a loopback address, which only its own machine reaches", "WEFT_SOCKET_IFNAME",
                      "weftrun --socket-ifname"});
}

TEST_CASE("an address the other machine cannot reach fails the job fast, naming it and the setting") {
  TwoMachines net;
  Outcome o = runJob(net, "job", {"--socket-ifname", "mnlocal"}, {});
  checkFailedFast(o, {"cannot connect to", std::string("at ") + kUnreachableOnNode0 + ":", "Network is unreachable",
                      "WEFT_SOCKET_IFNAME"});
}

TEST_CASE("the process group with a loopback address on both machines fails fast on every rank") {
  TwoMachines net;
  Outcome o = runJob(net, "pg", {"--socket-ifname", "127.0.0.1"}, {"--socket-ifname", "127.0.0.1"});
  checkFailedFast(o, {"could not connect to rank", "at 127.0.0.1:", "Connection refused",
                      "a loopback address, which only its own machine reaches", "WEFT_SOCKET_IFNAME"});
}

TEST_CASE("the process group with an address the other machine cannot reach fails fast") {
  TwoMachines net;
  Outcome o = runJob(net, "pg", {}, {"--socket-ifname", kUnreachableOnNode1});
  checkFailedFast(o, {"could not connect to rank", std::string("at ") + kUnreachableOnNode1 + ":",
                      "Network is unreachable", "WEFT_SOCKET_IFNAME"});
}
