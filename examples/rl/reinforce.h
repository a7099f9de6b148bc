// The agent and the observers of the rl example (after PyTorch's
// examples/distributed/rpc/rl): REINFORCE on CartPole-v1, with the policy on one worker and the
// environments on the others.
//
//   // on the agent, rank 0
//   RRef<ReinforceAgent> self = agent.remote<ReinforceAgent>(agent.name(), seed, lr, gamma);
//   RRef<Observer> ob = agent.remote<Observer>("observer1", seed, int64_t{1});
//   Future<int64_t> steps = ob.rpcAsync(&Observer::runEpisode, self, CartPole::kMaxSteps);
//   steps.get();                                    // the episode ran, one call back per step
//   EpisodeSummary s = self.localValue()->finishEpisode();   // the REINFORCE update
//
// Call pattern. The agent asks each observer to run an episode (Observer::runEpisode); at each
// step the observer asks the agent for an action (ReinforceAgent::selectAction: the policy's
// action probabilities, an action sampled from them, its log-probability kept for the update)
// and then reports the reward (ReinforceAgent::reportReward). The calls nest (agent -> observer
// -> agent), and no thread waits for them: runEpisode returns a future at once and carries the
// episode on as a chain of continuations, one step per reply, so neither side ever holds a
// handler thread while a call of the other is outstanding.
//
// Randomness. The policy's initial weights come from Generator(seed). Each observer r has its
// own generator on the agent (for its dropout masks and its action samples) and its environment
// its own start states, all derived from (seed, r). Within an episode the policy is fixed, so an
// observer's episode depends only on its own random streams, not on how the observers' calls
// interleave: a run is reproducible from the seed for any number of observers.
//
// Thread-safety: the agent's methods run on its handler threads, several at once (one call per
// observer at a time); they take the agent's lock. An Observer runs one episode at a time
// (StateError otherwise).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/future.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "nn/sequential.h"
#include "rref/rref.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"

#include "cartpole.h"

namespace weft::examples::rl {

// splitmix64 of (seed, stream): the seed of one random stream of the run.
uint64_t streamSeed(uint64_t seed, uint64_t stream);

// Linear 4->128, Dropout 0.6, ReLU, Linear 128->2, Softmax: the action probabilities of a batch
// of states [N, 4] -> [N, 2].
class Policy {
 public:
  explicit Policy(uint64_t seed);
  // Dropout draws its mask from `gen` (training mode); not thread-safe.
  Tensor forward(const Tensor& states, Generator& gen);
  std::vector<Tensor> parameters() const { return net_->parameters(); }
  int64_t parameterCount() const;

 private:
  std::shared_ptr<nn::Sequential> net_;
  std::shared_ptr<nn::Dropout> dropout_;
};

// What one REINFORCE update saw: per observer (by rank order) the episode's reward, and the
// update's loss.
struct EpisodeSummary {
  std::vector<double> rewards;
  double minReward = 0;
  double loss = 0;
  int64_t steps = 0;  // environment steps of all observers together
};

class ReinforceAgent {
 public:
  // seed: initial weights and the observers' random streams; Adam with learning rate lr; returns
  // discounted with gamma.
  ReinforceAgent(int64_t seed, double lr, double gamma);

  // An observer's request for the action in `state` ([4] float32): samples one from the policy
  // (training mode, the observer's own dropout and sampling stream) and keeps its log-probability
  // for the next update. InvalidArgumentError for a state of another shape.
  int64_t selectAction(int64_t observer, Tensor state);
  // The reward of the observer's last action.
  void reportReward(int64_t observer, double reward);

  // The update after every observer's episode: per observer, discounted returns (gamma),
  // normalised over all observers' steps together, loss sum(-log π(a_t|s_t) · G_t), one Adam
  // step. `observers` are the ranks that ran an episode and `steps` the number of steps each
  // reported (StateError when the actions and rewards the agent recorded do not match them).
  EpisodeSummary finishEpisode(const std::vector<int64_t>& observers, const std::vector<int64_t>& steps);

  int64_t parameterCount() const { return policy_.parameterCount(); }

 private:
  struct Trajectory {
    std::vector<Tensor> logProbs;
    std::vector<double> rewards;
  };
  Generator& streamOf(int64_t observer);  // under mutex_

  std::mutex mutex_;
  uint64_t seed_;
  double gamma_;
  Policy policy_;
  nn::optim::Adam optimizer_;
  std::map<int64_t, Generator> streams_;
  std::map<int64_t, Trajectory> trajectories_;
};

class Observer : public std::enable_shared_from_this<Observer> {
 public:
  // rank: this observer's rank, its id in the agent's calls; the environment is seeded from
  // (seed, rank).
  Observer(int64_t seed, int64_t rank);

  // Runs one episode of at most maxSteps steps against `agent` (see the header comment) and
  // returns the number of steps taken (the episode's reward). The future completes when the
  // episode is over; it fails with the error of the first call that failed.
  Future<int64_t> runEpisode(RRef<ReinforceAgent> agent, int64_t maxSteps);

 private:
  struct Episode;
  void nextStep(const std::shared_ptr<Episode>& ep);

  int64_t rank_;
  CartPole env_;
  std::mutex mutex_;
  bool running_ = false;
};

WEFT_REMOTE_CLASS(ReinforceAgent, WEFT_CONSTRUCTORS((int64_t, double, double)), selectAction, reportReward,
                  parameterCount);
WEFT_REMOTE_CLASS(Observer, WEFT_CONSTRUCTORS((int64_t, int64_t)), runEpisode);

}  // namespace weft::examples::rl
