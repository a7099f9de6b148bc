// rl: REINFORCE on CartPole-v1 with one agent and several observers, over RPC and remote
// references (after PyTorch's examples/distributed/rpc/rl).
//
//   ./build/tools/weftrun/weftrun -n 2 ./build/examples/rl/rl
//       [--max-episodes 2000] [--seed 543] [--lr 0.01] [--gamma 0.99] [--log-interval 10]
//       [--metrics rl_metrics.csv]
//
// Roles, and what lives where:
//   rank 0   "agent": a ReinforceAgent (reinforce.h: the policy, Adam, the episode's
//            log-probabilities and rewards), built through remote() on itself so that it holds
//            an RRef to itself to hand to the observers; an RRef to each observer's Observer.
//   rank 1.. "observer<r>": an Observer with its CartPole environment (cartpole.h); it only
//            serves: its shutdown() answers the agent until the job ends.
// Each episode the agent asks every observer to run an episode (async calls, waited together),
// the observers call back for every action and reward, and the agent takes one REINFORCE step.
// It stops when the running reward exceeds 475 (CartPole-v1 solved) or after --max-episodes and
// prints "solved at episode N ..." or "not solved ...". Every rank checks that nothing is left
// after its shutdown.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rref/rref.h"
#include "examples/common/metrics.h"
#include "examples/common/rpc_app.h"

#include "cartpole.h"
#include "flags.h"
#include "reinforce.h"

using namespace weft;
using namespace weft::examples::rl;
namespace app = weft::examples::app;
using app::say;

namespace {

void runAgent(rpc::Agent& agent, const Flags& flags, app::CsvFile& csv) {
  const int observers = agent.worldSize() - 1;
  const char* name = agent.name().c_str();  // the agent's own string, alive as long as the agent
  // The agent's own object, built through remote() on this worker: `self` is the reference the
  // observers call back through, `learner` the object itself for the updates.
  RRef<ReinforceAgent> self =
      agent.remote<ReinforceAgent>(agent.rank(), static_cast<int64_t>(flags.seed), flags.lr, flags.gamma);
  std::shared_ptr<ReinforceAgent> learner = self.localValue();
  std::vector<RRef<Observer>> obs;
  std::vector<int64_t> observerIds;
  for (int r = 1; r <= observers; ++r) {
    obs.push_back(agent.remote<Observer>(r, static_cast<int64_t>(flags.seed), static_cast<int64_t>(r)));
    observerIds.push_back(r);
  }
  say("%s: policy of %" PRId64 " parameters, %d observer(s), seed %" PRIu64 "\n", name, learner->parameterCount(),
      observers, flags.seed);

  int64_t episodes = 0, totalSteps = 0, windowSteps = 0;
  double running = 0, totalSeconds = 0, windowSeconds = 0;
  bool solved = false;
  while (episodes < flags.maxEpisodes && !solved) {
    ++episodes;
    const auto t0 = app::Clock::now();
    std::vector<Future<int64_t>> runs;
    for (const RRef<Observer>& ob : obs) runs.push_back(ob.rpcAsync(&Observer::runEpisode, self, CartPole::kMaxSteps));
    // A lost observer fails its episode's call at once (DisconnectedError naming it).
    std::vector<int64_t> steps = whenAll(runs).get();
    EpisodeSummary s = learner->finishEpisode(observerIds, steps);
    const double seconds = app::secondsSince(t0);
    running = 0.05 * s.minReward + 0.95 * running;
    double mean = 0;
    for (double r : s.rewards) mean += r;
    mean /= static_cast<double>(s.rewards.size());
    csv.row(episodes, s.minReward, mean, running, s.loss, s.steps, seconds,
            1e3 * seconds / static_cast<double>(s.steps));
    totalSteps += s.steps;
    totalSeconds += seconds;
    windowSteps += s.steps;
    windowSeconds += seconds;
    solved = running > CartPole::kRewardThreshold;
    if (episodes % flags.logInterval == 0 || solved || episodes == flags.maxEpisodes) {
      say("%s: episode %" PRId64 " last reward %.0f (lowest of %d) running reward %.2f %.3f ms/step\n", name, episodes,
          s.minReward, observers, running, 1e3 * windowSeconds / static_cast<double>(windowSteps));
      windowSteps = 0;
      windowSeconds = 0;
    }
  }
  csv.close();
  say("%s at episode %" PRId64 ": running reward %.2f (observers %d, seed %" PRIu64 ", %" PRId64
      " environment steps, %.3f ms per step, %.1f s); metrics in %s\n",
      solved ? "solved" : "not solved", episodes, running, observers, flags.seed, totalSteps,
      1e3 * totalSeconds / static_cast<double>(totalSteps), totalSeconds, flags.metrics.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parseFlags(argc, argv);
  try {
    rpc::Options options = rpc::Options::fromEnv();
    if (options.worldSize < 2) {
      throw Error("needs at least 2 processes (rank 0: the agent, ranks 1..: observers), got a world of " +
                  std::to_string(options.worldSize) + "; start it with weftrun -n 2 " + kProgram);
    }
    options.name = options.rank == 0 ? "agent" : "observer" + std::to_string(options.rank);
    options.validate();
    // The agent's metrics file is opened before the job starts, so that a bad path stops it at once.
    app::CsvFile csv;
    if (options.rank == 0) {
      csv.open(flags.metrics, "episode,reward,mean_reward,running_reward,loss,steps,seconds,ms_per_step");
    }
    rpc::Agent agent(options);
    agent.start();
    if (options.rank == 0) runAgent(agent, flags, csv);
    // The job's end: every rank's RRefs released, every call answered; the counts are read once
    // shutdown() has returned.
    const rpc::ShutdownReport report = agent.shutdown();
    app::checkShutdown(agent, report, {app::layerCounts("RRefs", rref::debugCounts(agent))});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
