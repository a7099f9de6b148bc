// weftrun end to end: the built launcher starting real processes (the
// weftrun_probe helper), every run bounded in time, and every probe process
// checked gone afterwards.
#include <doctest/doctest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "affinity.h"
#include "subprocess.h"
#include "tools/weftrun/free_port.h"

using weft::testing::processGone;
using weft::testing::Subprocess;
using namespace std::chrono_literals;

namespace {

const std::string kWeftrun = WEFTRUN_PATH;
const std::string kProbe = WEFTRUN_PROBE_PATH;
constexpr auto kRunLimit = 30s;  // no run here should come close

std::vector<std::string> weftrun(std::vector<std::string> args) {
  args.insert(args.begin(), kWeftrun);
  return args;
}

// The pids the probes printed ("start rank=R pid=P restart=C").
std::vector<pid_t> probePids(const std::string& out) {
  std::vector<pid_t> pids;
  static const std::regex re(R"(start rank=-?\d+ pid=(\d+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) {
    pids.push_back(static_cast<pid_t>(std::stoi((*it)[1])));
  }
  return pids;
}

void checkAllGone(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    CAPTURE(p);
    CHECK(processGone(p, 2000ms));
  }
}

// "[r] KEY=VALUE" lines, by rank.
std::map<int, std::map<std::string, std::string>> envByRank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> env;
  static const std::regex re(R"(^\[(\d+)\] ([A-Z_]+)=(.*)$)");
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (std::regex_match(line, m, re)) env[std::stoi(m[1])][m[2]] = m[3];
  }
  return env;
}

// A fresh directory for the probes' ready files, removed afterwards.
struct SyncDir {
  SyncDir() {
    char tmpl[] = "/tmp/weftrun_test_XXXXXX";
    char* made = ::mkdtemp(tmpl);
    REQUIRE(made != nullptr);
    path = made;
  }
  ~SyncDir() { std::filesystem::remove_all(path); }
  std::string env() const { return "PROBE_SYNC_DIR=" + path; }
  std::string path;
};

// "[rank] text", as --tag-output writes it.
std::string tagged(int rank, const std::string& text) {
  std::string line = "[";
  line += std::to_string(rank);
  line += "] ";
  return line + text;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("each rank sees its rank, world size, local rank and master address in the environment") {
  Subprocess p(weftrun({"-n", "3", "--master-port", "29555", "--tag-output", kProbe, "env"}));
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 0);
  auto env = envByRank(r.out);
  REQUIRE(env.size() == 3);
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    auto& e = env[rank];
    CHECK(e["WEFT_RANK"] == std::to_string(rank));
    CHECK(e["RANK"] == std::to_string(rank));
    CHECK(e["WEFT_WORLD_SIZE"] == "3");
    CHECK(e["WORLD_SIZE"] == "3");
    CHECK(e["WEFT_LOCAL_RANK"] == std::to_string(rank));
    CHECK(e["LOCAL_RANK"] == std::to_string(rank));
    CHECK(e["WEFT_LOCAL_WORLD_SIZE"] == "3");
    CHECK(e["LOCAL_WORLD_SIZE"] == "3");
    CHECK(e["WEFT_NNODES"] == "1");
    CHECK(e["WEFT_NODE_RANK"] == "0");
    CHECK(e["WEFT_MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["WEFT_MASTER_PORT"] == "29555");
    CHECK(e["MASTER_PORT"] == "29555");
    CHECK(e["WEFT_RESTART_COUNT"] == "0");
    CHECK(e["STDIN"] == "eof");
  }
  checkAllGone(probePids(r.out));
}

TEST_CASE("a free master port is chosen and shared by every rank when none is given") {
  Subprocess p(weftrun({"-n", "2", "--tag-output", kProbe, "env"}));
  auto r = p.wait(kRunLimit);
  REQUIRE(r.exitCode == 0);
  auto env = envByRank(r.out);
  REQUIRE(env.size() == 2);
  int port = std::stoi(env[0]["WEFT_MASTER_PORT"]);
  // Below Linux's ephemeral range: the local end of another connection cannot take it before
  // rank 0 binds it.
  CHECK(port >= weft::weftrun::kLowestPort);
  CHECK(port < weft::weftrun::detail::ephemeralLow());
  CHECK(env[1]["WEFT_MASTER_PORT"] == env[0]["WEFT_MASTER_PORT"]);
  CHECK(env[1]["MASTER_PORT"] == env[0]["WEFT_MASTER_PORT"]);
}

TEST_CASE("the master port weftrun chose stays reserved against other launchers and tests while its job runs") {
  auto p = std::make_unique<Subprocess>(
      weftrun({"-n", "1", "/bin/sh", "-c", "echo port=$WEFT_MASTER_PORT pid=$$; exec sleep 25"}));
  REQUIRE(p->readUntil([](const std::string& out, const std::string&) { return out.find('\n') != std::string::npos; },
                       10000ms));
  const std::string line = p->out();
  REQUIRE(line.rfind("port=", 0) == 0);
  const auto port = static_cast<uint16_t>(std::stoi(line.substr(5)));
  const auto rankPid = static_cast<pid_t>(std::stoi(line.substr(line.find("pid=") + 4)));
  // Another process's reservation of that port fails while weftrun holds it...
  const int fd = weft::weftrun::detail::reserve(port);
  CHECK(fd < 0);
  if (fd >= 0) ::close(fd);
  // ...and is free again once weftrun is gone.
  const pid_t pid = p->pid();
  p.reset();
  REQUIRE(processGone(pid, 5000ms));
  CHECK(processGone(rankPid, 5000ms));
  const int again = weft::weftrun::detail::reserve(port);
  CHECK(again >= 0);
  if (again >= 0) ::close(again);
}

TEST_CASE("a reserved port is bindable, below the ephemeral range, and reserved once at a time") {
  weft::weftrun::PortReservation r = weft::weftrun::reserveFreePort();
  CHECK(r.port() >= weft::weftrun::kLowestPort);
  CHECK(r.port() < weft::weftrun::detail::ephemeralLow());
  CHECK(weft::weftrun::detail::bindable(r.port()));
  CHECK(weft::weftrun::detail::reserve(r.port()) < 0);
  const uint16_t port = r.port();
  r = weft::weftrun::PortReservation();
  const int fd = weft::weftrun::detail::reserve(port);
  CHECK(fd >= 0);
  if (fd >= 0) ::close(fd);
}

TEST_CASE("ranks on a later node are numbered after the earlier nodes' ranks") {
  Subprocess p(weftrun({"-n", "2", "--nnodes", "3", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port",
                        "1234", "--tag-output", kProbe, "env"}));
  auto r = p.wait(kRunLimit);
  REQUIRE(r.exitCode == 0);
  auto env = envByRank(r.out);
  REQUIRE(env.size() == 2);
  for (int rank : {2, 3}) {
    CAPTURE(rank);
    auto& e = env[rank];
    CHECK(e["WEFT_RANK"] == std::to_string(rank));
    CHECK(e["WEFT_LOCAL_RANK"] == std::to_string(rank - 2));
    CHECK(e["WEFT_WORLD_SIZE"] == "6");
    CHECK(e["WEFT_NNODES"] == "3");
    CHECK(e["WEFT_NODE_RANK"] == "1");
    CHECK(e["WEFT_MASTER_ADDR"] == "10.1.2.3");
    CHECK(e["MASTER_PORT"] == "1234");
  }
}

TEST_CASE("variables inherited by weftrun are replaced for the ranks, and others pass through") {
  Subprocess p(weftrun({"-n", "2", "--tag-output", kProbe, "env"}),
               {"RANK=99", "WEFT_WORLD_SIZE=99", "MASTER_ADDR=example.invalid", "WEFT_RESTART_COUNT=7"});
  auto r = p.wait(kRunLimit);
  REQUIRE(r.exitCode == 0);
  auto env = envByRank(r.out);
  REQUIRE(env.size() == 2);
  CHECK(env[1]["RANK"] == "1");
  CHECK(env[1]["WEFT_WORLD_SIZE"] == "2");
  CHECK(env[1]["MASTER_ADDR"] == "127.0.0.1");
  CHECK(env[1]["WEFT_RESTART_COUNT"] == "0");
}

TEST_CASE("--socket-ifname reaches the ranks as WEFT_SOCKET_IFNAME, and without it an inherited value passes through") {
  {
    Subprocess p(weftrun({"-n", "2", "--tag-output", "--socket-ifname", "eth7", kProbe, "env"}),
                 {"WEFT_SOCKET_IFNAME=lo"});
    auto r = p.wait(kRunLimit);
    REQUIRE(r.exitCode == 0);
    auto env = envByRank(r.out);
    REQUIRE(env.size() == 2);
    CHECK(env[0]["WEFT_SOCKET_IFNAME"] == "eth7");
    CHECK(env[1]["WEFT_SOCKET_IFNAME"] == "eth7");
  }
  Subprocess p(weftrun({"-n", "1", "--tag-output", kProbe, "env"}), {"WEFT_SOCKET_IFNAME=10.9.8.7"});
  auto r = p.wait(kRunLimit);
  REQUIRE(r.exitCode == 0);
  CHECK(envByRank(r.out)[0]["WEFT_SOCKET_IFNAME"] == "10.9.8.7");
}

TEST_CASE("--heartbeat-interval and --heartbeat-misses reach every rank, replacing inherited values") {
  Subprocess p(weftrun({"-n", "3", "--heartbeat-interval", "7.5", "--heartbeat-misses", "4", "--tag-output", kProbe,
                        "env"}),
               {"WEFT_HEARTBEAT_INTERVAL=1", "WEFT_HEARTBEAT_MISSES=9"});
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 0);
  auto env = envByRank(r.out);
  REQUIRE(env.size() == 3);
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    CHECK(env[rank]["WEFT_HEARTBEAT_INTERVAL"] == "7.5");
    CHECK(env[rank]["WEFT_HEARTBEAT_MISSES"] == "4");
  }
}

TEST_CASE("without the heartbeat options the ranks inherit weftrun's heartbeat settings, or none") {
  {
    Subprocess p(weftrun({"-n", "2", "--tag-output", kProbe, "env"}), {"WEFT_HEARTBEAT_INTERVAL=3"});
    auto r = p.wait(kRunLimit);
    REQUIRE(r.exitCode == 0);
    auto env = envByRank(r.out);
    REQUIRE(env.size() == 2);
    CHECK(env[1]["WEFT_HEARTBEAT_INTERVAL"] == "3");
  }
  Subprocess p(weftrun({"-n", "2", "--tag-output", kProbe, "env"}));
  auto r = p.wait(kRunLimit);
  REQUIRE(r.exitCode == 0);
  auto env = envByRank(r.out);
  REQUIRE(env.size() == 2);
  if (std::getenv("WEFT_HEARTBEAT_INTERVAL") == nullptr) CHECK(env[0]["WEFT_HEARTBEAT_INTERVAL"] == "<unset>");
  if (std::getenv("WEFT_HEARTBEAT_MISSES") == nullptr) CHECK(env[0]["WEFT_HEARTBEAT_MISSES"] == "<unset>");
}

TEST_CASE("tagged output prefixes every line with its rank and never splits a line") {
  constexpr int kRanks = 4;
  constexpr int kLines = 300;
  Subprocess p(weftrun({"-n", std::to_string(kRanks), "--tag-output", kProbe, "lines", std::to_string(kLines)}));
  auto r = p.wait(kRunLimit);
  REQUIRE(r.exitCode == 0);
  static const std::regex line(R"(^\[(\d+)\] rank (\d+) line (\d+) x* end$)");
  std::map<int, std::set<int>> seen;
  for (const std::string* stream : {&r.out, &r.err}) {
    std::istringstream lines(*stream);
    std::string text;
    while (std::getline(lines, text)) {
      if (text.find("start rank=") != std::string::npos) continue;
      std::smatch m;
      CAPTURE(text);
      REQUIRE(std::regex_match(text, m, line));
      CHECK(m[1] == m[2]);  // the tag names the rank that wrote the line
      seen[std::stoi(m[1])].insert(std::stoi(m[3]));
    }
  }
  REQUIRE(seen.size() == kRanks);
  for (auto& [rank, lines] : seen) CHECK(lines.size() == kLines);
  CHECK(count(r.err, "line 9 ") == kRanks);  // every 10th line went to stderr, tagged there
}

TEST_CASE("an unterminated last line is still printed, tagged and terminated") {
  Subprocess p(weftrun({"-n", "2", "--tag-output", kProbe, "partial"}));
  auto r = p.wait(kRunLimit);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("[0] no newline at the end\n") != std::string::npos);
  CHECK(r.out.find("[1] no newline at the end\n") != std::string::npos);
}

TEST_CASE("without --tag-output the ranks write straight to weftrun's output") {
  Subprocess p(weftrun({"-n", "2", kProbe, "partial"}));
  auto r = p.wait(kRunLimit);
  REQUIRE(r.exitCode == 0);
  CHECK(count(r.out, "no newline at the end") == 2);
  CHECK(r.out.find('[') == std::string::npos);
}

TEST_CASE("when every rank succeeds weftrun exits 0 quietly") {
  Subprocess p(weftrun({"-n", "3", kProbe, "exit", "0"}));
  auto r = p.wait(kRunLimit);
  CHECK(r.exitCode == 0);
  CHECK(r.err.empty());
}

TEST_CASE("when one rank exits with 3 weftrun stops the others promptly and exits with 3") {
  SyncDir sync;
  Subprocess p(weftrun({"-n", "4", "--tag-output", kProbe, "fail", "2", "3"}), {sync.env()});
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 3);
  CHECK(r.seconds < 10);  // the others would wait 60 s on their own
  CHECK(r.err.find("rank 2 (pid ") != std::string::npos);
  CHECK(r.err.find("exited with code 3; stopping 3 running ranks") != std::string::npos);
  auto pids = probePids(r.out);
  CHECK(pids.size() == 4);
  checkAllGone(pids);
}

TEST_CASE("a rank killed by a signal makes weftrun exit with 128 plus the signal") {
  SyncDir sync;
  Subprocess p(weftrun({"-n", "3", "--tag-output", kProbe, "selfsignal", "0", std::to_string(SIGUSR1)}),
               {sync.env()});
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 128 + SIGUSR1);
  CHECK(r.err.find("rank 0 (pid ") != std::string::npos);
  CHECK(r.err.find("was killed by signal 10 (SIGUSR1)") != std::string::npos);
  checkAllGone(probePids(r.out));
}

TEST_CASE("ranks that ignore SIGTERM are killed with SIGKILL after the grace period") {
  SyncDir sync;
  Subprocess p(weftrun({"-n", "3", "--grace-period", "0.5", "--tag-output", kProbe, "stubborn", "1", "5"}),
               {sync.env()});
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 5);
  CHECK(r.seconds >= 0.5);
  CHECK(r.seconds < 10);
  CHECK(r.err.find("rank(s) 0, 2 still running 0.5 s after being told to stop; sending SIGKILL") !=
        std::string::npos);
  checkAllGone(probePids(r.out));
}

TEST_CASE("SIGINT and SIGTERM sent to weftrun reach every rank") {
  for (int sig : {SIGINT, SIGTERM}) {
    CAPTURE(sig);
    Subprocess p(weftrun({"-n", "3", "--tag-output", kProbe, "wait-signal"}));
    bool ready = p.readUntil([](const std::string& out, const std::string&) { return count(out, "] ready") == 3; },
                             20000ms);
    REQUIRE(ready);
    REQUIRE(::kill(p.pid(), sig) == 0);  // weftrun alone, not its process group
    auto r = p.wait(kRunLimit);
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode == 128 + sig);
    for (int rank = 0; rank < 3; ++rank) {
      CHECK(r.out.find(tagged(rank, "got signal " + std::to_string(sig))) != std::string::npos);
    }
    CHECK(r.err.find("forwarding it to 3 running ranks") != std::string::npos);
    checkAllGone(probePids(r.out));
  }
}

TEST_CASE("a second SIGINT kills ranks that ignored the first at once, without waiting out the grace period") {
  Subprocess p(weftrun({"-n", "2", "--grace-period", "60", "--tag-output", kProbe, "deaf"}));
  bool ready =
      p.readUntil([](const std::string& out, const std::string&) { return count(out, "] ready") == 2; }, 20000ms);
  REQUIRE(ready);
  REQUIRE(::kill(p.pid(), SIGINT) == 0);
  bool forwarded = p.readUntil(
      [](const std::string&, const std::string& err) { return err.find("forwarding it") != std::string::npos; },
      20000ms);
  REQUIRE(forwarded);
  REQUIRE(::kill(p.pid(), SIGINT) == 0);
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 128 + SIGINT);
  CHECK(r.seconds < 20);  // far below the 60 s grace period
  CHECK(r.err.find("got SIGINT again; sending SIGKILL to 2 running ranks") != std::string::npos);
  checkAllGone(probePids(r.out));
}

TEST_CASE("--max-restarts restarts the whole group and tells each attempt its count") {
  SyncDir sync;
  Subprocess p(weftrun({"-n", "2", "--max-restarts", "3", "--tag-output", kProbe, "restart", "2", "4"}),
               {sync.env()});
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 0);
  for (int attempt = 0; attempt <= 2; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      CHECK(count(r.out, tagged(rank, "start rank=" + std::to_string(rank) + " pid=")) == 3);
      CHECK(r.out.find("restart=" + std::to_string(attempt)) != std::string::npos);
    }
  }
  CHECK(r.out.find("restart=3") == std::string::npos);
  CHECK(count(r.err, "exited with code 4") == 2);
  CHECK(r.err.find("restart 1 of 3") != std::string::npos);
  CHECK(r.err.find("restart 2 of 3") != std::string::npos);
  checkAllGone(probePids(r.out));
}

TEST_CASE("restarts stop at --max-restarts and weftrun returns the last failure's status") {
  SyncDir sync;
  Subprocess p(weftrun({"-n", "2", "--max-restarts", "1", "--tag-output", kProbe, "restart", "5", "4"}),
               {sync.env()});
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 4);
  CHECK(count(r.out, "[0] start rank=0") == 2);
  CHECK(r.out.find("restart=2") == std::string::npos);
  CHECK(r.err.find("giving up after 1 restart") != std::string::npos);
  checkAllGone(probePids(r.out));
}

TEST_CASE("a program that cannot be executed exits 127 without restarts") {
  Subprocess p(weftrun({"-n", "3", "--max-restarts", "5", "/nonexistent/weft/program"}));
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 127);
  CHECK(count(r.err, "cannot execute '/nonexistent/weft/program': No such file or directory") == 1);
  CHECK(r.err.find("restarting") == std::string::npos);

  Subprocess q(weftrun({"-n", "1", "/dev/null"}));  // exists, not executable
  auto s = q.wait(kRunLimit);
  CHECK(s.exitCode == 126);
}

TEST_CASE("usage errors exit with 2 and explain the problem") {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {kProbe, "env"},
      {"-n", "0", kProbe},
      {"-n", "2"},
      {"-n", "2", "--frobnicate", kProbe},
      {"-n", "2", "--nnodes", "2", kProbe},
  };
  for (const auto& args : bad) {
    Subprocess p(weftrun(args));
    auto r = p.wait(kRunLimit);
    CAPTURE(r.err);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("weftrun: ") == 0);
    CHECK(r.err.find("usage: weftrun -n N") != std::string::npos);
    CHECK(r.out.empty());
  }
}

TEST_CASE("--help prints the usage on stdout and exits 0") {
  Subprocess p(weftrun({"--help"}));
  auto r = p.wait(kRunLimit);
  CHECK(r.exitCode == 0);
  CHECK(r.out.find("usage: weftrun -n N") != std::string::npos);
  CHECK(r.out.find("WEFT_RESTART_COUNT") != std::string::npos);
}

TEST_CASE("the ranks die with weftrun when weftrun itself is killed with SIGKILL") {
  Subprocess p(weftrun({"-n", "3", "--tag-output", kProbe, "sleep"}));
  bool started = p.readUntil(
      [](const std::string& out, const std::string&) { return count(out, "start rank=") == 3; }, 20000ms);
  REQUIRE(started);
  auto pids = probePids(p.out());
  REQUIRE(pids.size() == 3);
  REQUIRE(::kill(p.pid(), SIGKILL) == 0);
  auto r = p.wait(kRunLimit);
  CHECK(r.signal == SIGKILL);
  checkAllGone(pids);
}

TEST_CASE("--bind-cpus binds each rank to its own CPUs and gives it as many kernel threads") {
  const std::vector<int> all = weft::testing::thisProcessCpus();
  REQUIRE_FALSE(all.empty());
  const int ranks = std::min<int>(2, static_cast<int>(all.size()));
  Subprocess p(weftrun({"-n", std::to_string(ranks), "--bind-cpus", "--tag-output", kProbe, "env"}));
  auto r = p.wait(kRunLimit);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 0);
  auto env = envByRank(r.out);
  REQUIRE(static_cast<int>(env.size()) == ranks);
  std::string joined;
  const char* userThreads = std::getenv("WEFT_NUM_THREADS");
  for (int rank = 0; rank < ranks; ++rank) {
    CAPTURE(rank);
    const std::string cpus = env[rank]["CPUS"];
    const int count = static_cast<int>(std::count(cpus.begin(), cpus.end(), ',')) + 1;
    CHECK(env[rank]["WEFT_NUM_THREADS"] == (userThreads ? std::string(userThreads) : std::to_string(count)));
    if (!joined.empty()) joined += ',';
    joined += cpus;
  }
  // The slices, in rank order, are weftrun's CPUs, each once.
  std::string want;
  for (int c : all) {
    if (!want.empty()) want += ',';
    want += std::to_string(c);
  }
  CHECK(joined == want);
  checkAllGone(probePids(r.out));

  // More ranks than CPUs: refused before any rank starts.
  Subprocess tooMany(weftrun({"-n", std::to_string(all.size() + 1), "--bind-cpus", kProbe, "env"}));
  auto t = tooMany.wait(kRunLimit);
  REQUIRE_FALSE(t.timedOut);
  CHECK(t.exitCode != 0);
  CHECK(t.err.find("--bind-cpus") != std::string::npos);
  CHECK(t.out.find("WEFT_RANK") == std::string::npos);
}
