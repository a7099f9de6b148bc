// In-process tests of weftrun's option parsing and output tagging.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "affinity.h"
#include "tools/weftrun/cpu_binding.h"
#include "tools/weftrun/line_tagger.h"
#include "tools/weftrun/options.h"

using namespace weft::weftrun;

TEST_CASE("weftrun options: defaults, then the program and its arguments untouched") {
  Options o = parseOptions({"-n", "4", "./train", "--epochs", "3", "-n", "9"});
  CHECK(o.procsPerNode == 4);
  CHECK(o.nnodes == 1);
  CHECK(o.nodeRank == 0);
  CHECK(o.masterAddr == "127.0.0.1");
  CHECK(o.masterPort == 0);
  CHECK_FALSE(o.tagOutput);
  CHECK(o.maxRestarts == 0);
  CHECK(o.graceSeconds == kDefaultGraceSeconds);
  CHECK(o.heartbeatInterval.empty());
  CHECK(o.heartbeatMisses.empty());
  CHECK(o.command == std::vector<std::string>{"./train", "--epochs", "3", "-n", "9"});
  CHECK(o.worldSize() == 4);
}

TEST_CASE("weftrun options: every option in both spellings") {
  Options o = parseOptions({"-n2", "--nnodes=3", "--node-rank", "2", "--master-addr", "10.0.0.7", "--master-port=29500",
                            "--socket-ifname", "eth1", "--tag-output", "--max-restarts", "5", "--grace-period=0.25",
                            "--", "-prog", "x"});
  CHECK(o.procsPerNode == 2);
  CHECK(o.nnodes == 3);
  CHECK(o.nodeRank == 2);
  CHECK(o.masterAddr == "10.0.0.7");
  CHECK(o.masterPort == 29500);
  CHECK(o.socketIfname == "eth1");
  CHECK(parseOptions({"-n", "1", "--socket-ifname=10.0.0.9", "p"}).socketIfname == "10.0.0.9");
  CHECK(o.tagOutput);
  CHECK(o.maxRestarts == 5);
  CHECK(o.graceSeconds == 0.25);
  CHECK(o.command == std::vector<std::string>{"-prog", "x"});
  CHECK(o.worldSize() == 6);
  CHECK(o.globalRank(0) == 4);
  CHECK(o.globalRank(1) == 5);
  CHECK(parseOptions({"--nproc-per-node", "3", "p"}).procsPerNode == 3);
}

TEST_CASE("weftrun options: the heartbeat window, in both spellings, passed on as given") {
  Options o = parseOptions({"-n", "2", "--heartbeat-interval", "2.5", "--heartbeat-misses=8", "p"});
  CHECK(o.heartbeatInterval == "2.5");
  CHECK(o.heartbeatMisses == "8");
  o = parseOptions({"-n", "2", "--heartbeat-interval=60", "--heartbeat-misses", "2", "p"});
  CHECK(o.heartbeatInterval == "60");
  CHECK(o.heartbeatMisses == "2");
  CHECK(usageText().find("--heartbeat-interval") != std::string::npos);
  CHECK(usageText().find("--heartbeat-misses") != std::string::npos);
}

TEST_CASE("weftrun options: --help stops parsing") {
  CHECK(parseOptions({"--help"}).help);
  CHECK(parseOptions({"-n", "2", "-h", "--bogus"}).help);
  CHECK(usageText().find("--max-restarts") != std::string::npos);
}

TEST_CASE("weftrun options: each mistake is a UsageError naming the option and value") {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const Case cases[] = {
      {{}, "-n N is required"},
      {{"prog"}, "-n N is required"},
      {{"-n", "2"}, "no program given"},
      {{"-n"}, "-n expects a value"},
      {{"-n", "0", "p"}, "-n expects an integer from 1 to 4096, got '0'"},
      {{"-n", "two", "p"}, "got 'two'"},
      {{"-n", "2x", "p"}, "got '2x'"},
      {{"-n", "", "p"}, "got ''"},
      {{"-n", "2", "--bogus", "p"}, "unknown option '--bogus'"},
      {{"-n", "2", "--master-port", "70000", "p"}, "--master-port expects an integer from 1 to 65535, got '70000'"},
      {{"-n", "2", "--master-addr=", "p"}, "--master-addr expects a host name"},
      {{"-n", "2", "--max-restarts", "-1", "p"}, "--max-restarts expects an integer"},
      {{"-n", "2", "--grace-period", "soon", "p"}, "--grace-period expects a number of seconds"},
      {{"-n", "2", "--grace-period", "-1", "p"}, "--grace-period expects a number of seconds"},
      {{"-n", "2", "--tag-output=yes", "p"}, "--tag-output takes no value"},
      {{"-n", "2", "--heartbeat-interval", "0", "p"}, "--heartbeat-interval expects a number of seconds above 0"},
      {{"-n", "2", "--heartbeat-interval", "-2", "p"}, "got '-2'"},
      {{"-n", "2", "--heartbeat-interval", "2s", "p"}, "got '2s'"},
      {{"-n", "2", "--heartbeat-interval=", "p"}, "got ''"},
      {{"-n", "2", "--heartbeat-interval", "1e9", "p"}, "got '1e9'"},
      {{"-n", "2", "--heartbeat-interval"}, "--heartbeat-interval expects a value"},
      {{"-n", "2", "--heartbeat-misses", "1", "p"}, "--heartbeat-misses expects an integer from 2 to 1000, got '1'"},
      {{"-n", "2", "--heartbeat-misses", "1001", "p"}, "got '1001'"},
      {{"-n", "2", "--heartbeat-misses", "2.5", "p"}, "got '2.5'"},
      {{"-n", "2", "--socket-ifname=", "p"}, "--socket-ifname expects an interface name or an IP address"},
      {{"-n", "2", "--socket-ifname", "eth 0", "p"}, "got 'eth 0'"},
      {{"-n", "2", "--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "--master-port", "1", "p"},
       "--node-rank 2 must be below --nnodes 2"},
      {{"-n", "2", "--nnodes", "2", "--master-port", "1", "p"}, "--nnodes 2 needs --master-addr"},
      {{"-n", "2", "--nnodes", "2", "--master-addr", "a", "p"}, "--nnodes 2 needs --master-port"},
      {{"-n", "4096", "--nnodes", "4096", "--master-addr", "a", "--master-port", "1", "p"}, "exceeds the largest world size"},
  };
  for (const Case& c : cases) {
    std::string joined;
    for (const auto& a : c.args) joined += "'" + a + "' ";
    CAPTURE(joined);
    CHECK_THROWS_WITH_AS(parseOptions(c.args), doctest::Contains(c.message), UsageError);
  }
}

TEST_CASE("the line tagger emits only whole lines, each tagged") {
  LineTagger t("[3] ");
  CHECK(t.feed("hel") == "");
  CHECK(t.feed("lo\nwor") == "[3] hello\n");
  CHECK(t.feed("ld\n\nx\ny") == "[3] world\n[3] \n[3] x\n");
  CHECK(t.finish() == "[3] y\n");
  CHECK(t.finish() == "");
  CHECK(t.feed("z\n") == "[3] z\n");
  CHECK(t.finish() == "");
}

TEST_CASE("the line tagger cuts lines longer than its limit and keeps exact-limit lines whole") {
  const size_t max = LineTagger::kMaxLine;
  LineTagger t("[0] ");
  std::string exact(max, 'a');
  CHECK(t.feed(exact) == "");
  CHECK(t.feed("\n") == "[0] " + exact + "\n");

  std::string longer(max + 10, 'b');
  std::string out = t.feed(longer);
  CHECK(out == "[0] " + std::string(max, 'b') + "\n");
  CHECK(t.feed("c\n") == "[0] " + std::string(10, 'b') + "c\n");

  std::string huge(3 * max + 1, 'd');
  out = t.feed(huge);
  CHECK(out.size() == 3 * (4 + max + 1));
  CHECK(t.finish() == "[0] d\n");
}

TEST_CASE("weftrun --bind-cpus: parsed, and the CPUs cut into disjoint slices as even as the count allows") {
  CHECK_FALSE(parseOptions({"-n", "2", "p"}).bindCpus);
  CHECK(parseOptions({"-n", "2", "--bind-cpus", "p"}).bindCpus);
  CHECK_THROWS_AS(parseOptions({"-n", "2", "--bind-cpus=yes", "p"}), UsageError);
  const std::vector<int> all = weft::testing::thisProcessCpus();
  REQUIRE_FALSE(all.empty());
  const int count = static_cast<int>(all.size());
  for (int ranks = 1; ranks <= count; ++ranks) {
    CAPTURE(ranks);
    std::vector<std::vector<int>> shares = cpuShares(ranks);
    REQUIRE(static_cast<int>(shares.size()) == ranks);
    std::vector<int> joined;
    for (const auto& s : shares) {
      CHECK(static_cast<int>(s.size()) >= count / ranks);
      CHECK(static_cast<int>(s.size()) <= (count + ranks - 1) / ranks);
      joined.insert(joined.end(), s.begin(), s.end());
    }
    CHECK(joined == all);  // in order, each CPU once
  }
  try {
    cpuShares(count + 1);
    FAIL("more ranks than CPUs must be refused");
  } catch (const UsageError& e) {
    const std::string what = e.what();
    CHECK(what.find(std::to_string(count + 1) + " processes") != std::string::npos);
    CHECK(what.find("only " + std::to_string(count) + " CPUs") != std::string::npos);
  }
}
