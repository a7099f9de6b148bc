#include "reinforce.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "examples/common/seed.h"

#include "returns.h"

namespace weft::examples::rl {

uint64_t streamSeed(uint64_t seed, uint64_t stream) { return app::splitmix64(seed ^ (stream * 0xd1b54a32d192ed03ULL)); }

// ---- Policy ------------------------------------------------------------------------

Policy::Policy(uint64_t seed) {
  auto fc1 = std::make_shared<nn::Linear>(4, 128);
  auto fc2 = std::make_shared<nn::Linear>(128, 2);
  Generator init(seed);
  fc1->resetParameters(&init);
  fc2->resetParameters(&init);
  dropout_ = std::make_shared<nn::Dropout>(0.6);
  net_ = nn::makeSequential({fc1, dropout_, std::make_shared<nn::ReLU>(), fc2, std::make_shared<nn::Softmax>(1)});
}

Tensor Policy::forward(const Tensor& states, Generator& gen) {
  dropout_->setGenerator(&gen);
  Tensor probs = net_->forward(states);
  dropout_->setGenerator(nullptr);
  return probs;
}

int64_t Policy::parameterCount() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

// ---- ReinforceAgent --------------------------------------------------------------

ReinforceAgent::ReinforceAgent(int64_t seed, double lr, double gamma)
    : seed_(static_cast<uint64_t>(seed)),
      gamma_(gamma),
      policy_(streamSeed(static_cast<uint64_t>(seed), 0)),
      optimizer_(policy_.parameters(), nn::optim::AdamOptions{.lr = lr}) {
  WEFT_ENFORCE(lr > 0, InvalidArgumentError, "ReinforceAgent: the learning rate must be positive, got ", lr);
  WEFT_ENFORCE(gamma > 0 && gamma <= 1, InvalidArgumentError, "ReinforceAgent: gamma must lie in (0, 1], got ", gamma);
}

Generator& ReinforceAgent::streamOf(int64_t observer) {
  auto it = streams_.find(observer);
  if (it == streams_.end()) {
    // Stream 0 is the initialisation; observer r (r >= 1) samples from stream 2r.
    it = streams_.emplace(observer, Generator(streamSeed(seed_, 2 * static_cast<uint64_t>(observer)))).first;
  }
  return it->second;
}

int64_t ReinforceAgent::selectAction(int64_t observer, Tensor state) {
  WEFT_ENFORCE(state.dim() == 1 && state.size(0) == 4, InvalidArgumentError,
               "ReinforceAgent::selectAction: observer ", observer, " sent a state of shape ", shapeString(state.shape()),
               ", expected [4]");
  std::lock_guard<std::mutex> lock(mutex_);
  Generator& gen = streamOf(observer);
  Tensor probs = policy_.forward(state.to(DType::Float32).unsqueeze(0), gen).select(0, 0);
  const double p1 = probs.select(0, 1).item<float>();
  const int64_t action = gen.nextDouble() < p1 ? 1 : 0;
  Trajectory& t = trajectories_[observer];
  WEFT_ENFORCE(t.logProbs.size() == t.rewards.size(), StateError, "ReinforceAgent::selectAction: observer ", observer,
               " asked for an action before reporting the reward of its last one");
  t.logProbs.push_back(log(probs.select(0, action)));
  return action;
}

void ReinforceAgent::reportReward(int64_t observer, double reward) {
  std::lock_guard<std::mutex> lock(mutex_);
  Trajectory& t = trajectories_[observer];
  WEFT_ENFORCE(t.rewards.size() + 1 == t.logProbs.size(), StateError, "ReinforceAgent::reportReward: observer ",
               observer, " reported a reward without an action");
  t.rewards.push_back(reward);
}

EpisodeSummary ReinforceAgent::finishEpisode(const std::vector<int64_t>& observers, const std::vector<int64_t>& steps) {
  WEFT_ENFORCE(!observers.empty() && observers.size() == steps.size(), InvalidArgumentError,
               "ReinforceAgent::finishEpisode: one step count per observer expected");
  std::lock_guard<std::mutex> lock(mutex_);
  EpisodeSummary summary;
  std::vector<double> all;  // every observer's discounted returns, in rank order
  for (size_t i = 0; i < observers.size(); ++i) {
    auto it = trajectories_.find(observers[i]);
    const size_t recorded = it == trajectories_.end() ? 0 : it->second.rewards.size();
    WEFT_ENFORCE(recorded == static_cast<size_t>(steps[i]) && recorded > 0 && it->second.logProbs.size() == recorded,
                 StateError, "ReinforceAgent::finishEpisode: observer ", observers[i], " ran ", steps[i],
                 " steps but the agent recorded ", recorded, " rewards");
    const Trajectory& t = it->second;
    double total = 0;
    for (double r : t.rewards) total += r;
    summary.rewards.push_back(total);
    summary.steps += steps[i];
    std::vector<double> g = discountedReturns(t.rewards, gamma_);
    all.insert(all.end(), g.begin(), g.end());
  }
  WEFT_ENFORCE(trajectories_.size() == observers.size(), StateError,
               "ReinforceAgent::finishEpisode: actions were requested by ", trajectories_.size(),
               " observers, but ", observers.size(), " ran an episode");
  summary.minReward = *std::min_element(summary.rewards.begin(), summary.rewards.end());

  // Normalised over every step of every observer, as one batch.
  normalizeInPlace(all, kReturnEps);
  // One backward per observer, in rank order: the sum of their gradients is the gradient of the
  // whole loss, and each pass sees only its observer's graph, so the order in which gradients
  // reach the parameters does not depend on how the observers' calls interleaved.
  optimizer_.zeroGrad();
  size_t offset = 0;
  for (size_t i = 0; i < observers.size(); ++i) {
    const Trajectory& t = trajectories_.at(observers[i]);
    std::vector<float> weights(t.rewards.size());
    for (size_t k = 0; k < weights.size(); ++k) weights[k] = static_cast<float>(-all[offset + k]);
    offset += weights.size();
    Tensor loss = sum(mul(stack(t.logProbs), fromVector(weights)));
    loss.backward();
    summary.loss += loss.item<float>();
  }
  trajectories_.clear();
  optimizer_.step();
  return summary;
}

// ---- Observer ----------------------------------------------------------------------

struct Observer::Episode {
  RRef<ReinforceAgent> agent;
  int64_t maxSteps = 0;
  CartPole::Step last;
  Promise<int64_t> done;
};

Observer::Observer(int64_t seed, int64_t rank)
    : rank_(rank), env_(streamSeed(static_cast<uint64_t>(seed), 2 * static_cast<uint64_t>(rank) + 1)) {}

Future<int64_t> Observer::runEpisode(RRef<ReinforceAgent> agent, int64_t maxSteps) {
  WEFT_ENFORCE(maxSteps >= 1, InvalidArgumentError, "Observer::runEpisode: maxSteps must be at least 1, got ",
               maxSteps);
  WEFT_ENFORCE(agent.valid(), InvalidArgumentError, "Observer::runEpisode: the agent's reference is empty");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_ENFORCE(!running_, StateError, "Observer::runEpisode: observer ", rank_, " is already running an episode");
    running_ = true;
  }
  auto ep = std::make_shared<Episode>();
  ep->agent = std::move(agent);
  ep->maxSteps = maxSteps;
  ep->last.state = env_.reset();
  Future<int64_t> result = ep->done.getFuture();
  nextStep(ep);
  return result;
}

// One step: ask for the action, step the environment, report the reward; then the next step or
// the end of the episode. Runs on the thread that completed the previous step's reply (the loop
// thread); nothing here blocks.
void Observer::nextStep(const std::shared_ptr<Episode>& ep) {
  const CartPole::State& s = ep->last.state;
  Tensor obs = fromVector(std::vector<float>{static_cast<float>(s[0]), static_cast<float>(s[1]),
                                             static_cast<float>(s[2]), static_cast<float>(s[3])});
  auto self = shared_from_this();
  ep->agent.rpcAsync(&ReinforceAgent::selectAction, rank_, obs)
      .then([self, ep](int64_t action) {
        ep->last = self->env_.step(action);
        return ep->agent.rpcAsync(&ReinforceAgent::reportReward, self->rank_, ep->last.reward);
      })
      .onComplete([self, ep](const Future<void>& f) {
        const bool over = f.hasError() || ep->last.done() || self->env_.steps() >= ep->maxSteps;
        if (!over) {
          self->nextStep(ep);
          return;
        }
        {
          std::lock_guard<std::mutex> lock(self->mutex_);
          self->running_ = false;
        }
        if (f.hasError()) {
          ep->done.setError(f.exception());
        } else {
          ep->done.setValue(self->env_.steps());
        }
      });
}

}  // namespace weft::examples::rl
