// rl: REINFORCE on CartPole-v1 with one agent and several observers, over RPC and remote
// references (after PyTorch's examples/distributed/rpc/rl). Rank 0 is "agent"; ranks 1..W-1 are
// "observer1".."observer<W-1>", each owning a CartPole environment.
//
//   ./build/tools/weftrun/weftrun -n 2 ./build/examples/rl/rl
//       [--max-episodes 2000] [--seed 543] [--lr 0.01] [--gamma 0.99] [--log-interval 10]
//       [--metrics rl_metrics.csv]
//
// The agent builds its ReinforceAgent (policy, Adam) through remote(...) on itself, so that it
// holds an RRef to itself to hand to the observers, and builds each observer's Observer through
// remote(...) too. Each episode it asks every observer to run an episode (async calls, waited
// together), the observers call back for every action and reward (reinforce.h), and the agent
// takes one REINFORCE step. It stops when the running reward exceeds 475 (CartPole-v1 solved) or
// after --max-episodes, prints "solved at episode N ..." or "not solved ..." and shuts down. The
// observers only host their environments: they call shutdown() at once and serve the agent from
// there until the job ends. Every rank checks that nothing is left after its shutdown.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rref/rref.h"
#include "examples/common/rpc_app.h"

#include "cartpole.h"
#include "reinforce.h"

using namespace weft;
using namespace std::chrono_literals;
using weft::examples::rl::CartPole;
using weft::examples::rl::EpisodeSummary;
using weft::examples::rl::Observer;
using weft::examples::rl::ReinforceAgent;
using Clock = std::chrono::steady_clock;

namespace app = weft::examples::app;

namespace {

using app::say;

constexpr const char* kProgram = "rl";

struct Flags {
  int64_t maxEpisodes = 2000;
  uint64_t seed = 543;
  double lr = 1e-2;
  double gamma = 0.99;
  int64_t logInterval = 10;
  std::string metrics = "rl_metrics.csv";
};

[[noreturn]] void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n W",
                     "[--max-episodes N] [--seed N] [--lr X] [--gamma X] [--log-interval N]\n"
                     "          [--metrics PATH]\n"
                     "  (W >= 2: rank 0 is the agent, ranks 1..W-1 the observers)\n");
}

Flags parseFlags(int argc, char** argv) {
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    const std::string& v = args.value();
    if (a == "--max-episodes") f.maxEpisodes = args.integer();
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--lr") f.lr = args.real();
    else if (a == "--gamma") f.gamma = args.real();
    else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else args.unknown();
  }
  if (f.maxEpisodes < 1) usage("--max-episodes must be at least 1");
  if (f.logInterval < 1) usage("--log-interval must be at least 1");
  if (!(f.lr > 0)) usage("--lr must be positive");
  if (!(f.gamma > 0 && f.gamma <= 1)) usage("--gamma must lie in (0, 1]");
  return f;
}

// After the graceful shutdown: nothing of the job may be left in this process.
void checkShutdown(rpc::Agent& agent, const rpc::ShutdownReport& report) {
  app::checkShutdown(agent, report, {app::layerCounts("RRefs", rref::debugCounts(agent))});
}

// An observer only hosts its environment: its shutdown serves the agent until the whole job ends.
int runObserver(rpc::Agent& agent) {
  checkShutdown(agent, agent.shutdown());
  return 0;
}

int runAgent(rpc::Agent& agent, const Flags& flags, std::ofstream& csv) {
  const int observers = agent.worldSize() - 1;
  std::vector<int> observerRanks;
  std::vector<int64_t> observerIds;
  for (int r = 1; r <= observers; ++r) {
    observerRanks.push_back(r);
    observerIds.push_back(r);
  }
  int64_t episodes = 0;
  bool solved = false;
  double running = 0;
  int64_t totalSteps = 0;
  double totalSeconds = 0;
  {
    // The agent's own object, built through remote() on this worker: `self` is the reference the
    // observers call back through, `learner` the object itself for the updates.
    RRef<ReinforceAgent> self = agent.remote<ReinforceAgent>(agent.rank(), static_cast<int64_t>(flags.seed), flags.lr,
                                                             flags.gamma);
    std::shared_ptr<ReinforceAgent> learner = self.localValue();
    std::vector<RRef<Observer>> obs;
    for (int r : observerRanks) {
      obs.push_back(agent.remote<Observer>(r, static_cast<int64_t>(flags.seed), static_cast<int64_t>(r)));
    }
    say("%s: policy of %" PRId64 " parameters, %d observer(s), seed %" PRIu64 "\n", agent.name().c_str(),
        learner->parameterCount(), observers, flags.seed);

    csv << "episode,reward,mean_reward,running_reward,loss,steps,seconds,ms_per_step\n";

    int64_t windowSteps = 0;
    double windowSeconds = 0;
    while (episodes < flags.maxEpisodes && !solved) {
      ++episodes;
      auto t0 = Clock::now();
      std::vector<Future<int64_t>> runs;
      for (const RRef<Observer>& ob : obs) runs.push_back(ob.rpcAsync(&Observer::runEpisode, self, CartPole::kMaxSteps));
      // A lost observer fails its episode's call at once (DisconnectedError naming it).
      std::vector<int64_t> steps = whenAll(runs).get();
      EpisodeSummary s = learner->finishEpisode(observerIds, steps);
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      running = 0.05 * s.minReward + 0.95 * running;
      double mean = 0;
      for (double r : s.rewards) mean += r;
      mean /= static_cast<double>(s.rewards.size());
      csv << episodes << ',' << s.minReward << ',' << mean << ',' << running << ',' << s.loss << ',' << s.steps << ','
          << seconds << ',' << 1e3 * seconds / static_cast<double>(s.steps) << '\n';
      totalSteps += s.steps;
      totalSeconds += seconds;
      windowSteps += s.steps;
      windowSeconds += seconds;
      solved = running > CartPole::kRewardThreshold;
      if (episodes % flags.logInterval == 0 || solved || episodes == flags.maxEpisodes) {
        say("%s: episode %" PRId64 " last reward %.0f (lowest of %d) running reward %.2f %.3f ms/step\n",
            agent.name().c_str(), episodes, s.minReward, observers, running,
            1e3 * windowSeconds / static_cast<double>(windowSteps));
        windowSteps = 0;
        windowSeconds = 0;
      }
    }
    csv.close();
    if (!csv) throw Error("could not write the metrics file '" + flags.metrics + "'");
    const double msPerStep = 1e3 * totalSeconds / static_cast<double>(totalSteps);
    say("%s at episode %" PRId64 ": running reward %.2f (observers %d, seed %" PRIu64 ", %" PRId64
        " environment steps, %.3f ms per step, %.1f s); metrics in %s\n",
        solved ? "solved" : "not solved", episodes, running, observers, flags.seed, totalSteps, msPerStep,
        totalSeconds, flags.metrics.c_str());
  }
  checkShutdown(agent, agent.shutdown());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parseFlags(argc, argv);
  try {
    rpc::Options options = rpc::Options::fromEnv();
    if (options.worldSize < 2) {
      throw Error("needs at least 2 processes (rank 0: the agent, ranks 1..: observers), got a world of " +
                  std::to_string(options.worldSize) + "; start it with weftrun -n 2 " + kProgram);
    }
    options.name = options.rank == 0 ? "agent" : "observer" + std::to_string(options.rank);
    options.validate();
    // The agent's metrics file is opened before the job starts, so that a bad path stops it at once.
    std::ofstream csv;
    if (options.rank == 0) {
      csv.open(flags.metrics);
      if (!csv) throw Error("cannot write the metrics file '" + flags.metrics + "'");
    }
    rpc::Agent agent(options);
    agent.start();
    return options.rank == 0 ? runAgent(agent, flags, csv) : runObserver(agent);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
