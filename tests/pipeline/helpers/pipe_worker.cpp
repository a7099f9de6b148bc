// A program for the multiprocess tests of Pipe (tests/pipeline/pipe_mp_test.cpp): rank 0 is the
// controller, ranks 1..S host the S stages of an MLP (7 layers, 4 Linear with tanh between, cut by
// parameter count). Every rank declares the stage builder "mlp" before its agent starts.
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=3 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 pipe_worker train 3
//
// Scenario train M: the controller runs 3 steps, each on a new batch of 4M - 1 rows (the last
// micro-batch smaller): inside a distributed autograd context, pipe.forward, MSE loss, backward, a
// DistributedOptimizer (SGD, lr 0.05) step; beside it a twin of the whole MLP takes the same steps
// locally. It prints "step K loss_diff_ppb N param_maxdiff_ppb P" (P: every stage parameter,
// fetched after the step, against the twin's). Every rank then waits until no RRef, context or
// optimizer state is left ("state_empty 0|1 counts ..."), shuts down gracefully ("shutdown
// graceful 1 ...") and prints "done".
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "mp_worker.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "pipeline/pipe.h"
#include "pipeline/stage.h"
#include "rpc/agent.h"
#include "rpc/store.h"
#include "tensor/ops.h"

namespace {

using namespace std::chrono_literals;
using weft::Generator;
using weft::RRef;
using weft::Tensor;
using weft::rpc::Agent;
using weft::testing::prefix;
using weft::testing::say;
namespace nn = weft::nn;
namespace pipeline = weft::pipeline;

std::shared_ptr<nn::Sequential> mlp() {
  Generator g(21);
  std::vector<std::shared_ptr<nn::Module>> layers;
  const int64_t widths[] = {12, 24, 16, 16, 4};
  for (int i = 0; i < 4; ++i) {
    auto l = std::make_shared<nn::Linear>(widths[i], widths[i + 1]);
    l->resetParameters(&g);
    layers.push_back(l);
    if (i < 3) layers.push_back(std::make_shared<nn::Tanh>());
  }
  return nn::makeSequential(layers);
}

long long ppb(double v) { return std::llround(v * 1e9); }

bool stateEmpty(Agent& agent) {
  return weft::rref::debugCounts(agent).empty() && weft::dist_autograd::debugCounts(agent).empty() &&
         weft::dist_optim::debugCounts(agent).empty();
}

void settle(Agent& agent) {
  agent.store().barrier("pipe-dropped", agent.worldSize(), 30s);
  weft::testing::waitUntil([&] { return stateEmpty(agent); }, 15s);
  say(prefix(agent) + "state_empty " + std::to_string(stateEmpty(agent) ? 1 : 0) + " counts " +
      weft::rref::debugCounts(agent).toString() + " | " + weft::dist_autograd::debugCounts(agent).toString() +
      " | " + weft::dist_optim::debugCounts(agent).toString());
  weft::testing::sayShutdown(agent);
}

void runController(Agent& agent, int m) {
  std::vector<std::string> workers;
  for (int r = 1; r < agent.worldSize(); ++r) workers.push_back("worker" + std::to_string(r));
  {
    pipeline::Pipe pipe(agent, "mlp", workers, m);
    std::vector<RRef<Tensor>> params = pipe.remoteParameters();
    weft::dist_optim::DistributedOptimizer opt(agent, nn::optim::SGDOptions{.lr = 0.05}, params);
    auto twin = mlp();
    nn::optim::SGD twinOpt(twin->parameters(), {.lr = 0.05});
    const auto twinParams = twin->parameters();
    weft::testing::require(twinParams.size() == params.size(), "as many remote parameters as the model has");
    for (int step = 0; step < 3; ++step) {
      Generator g(300 + static_cast<uint64_t>(step));
      const int64_t rows = 4 * m - 1;
      Tensor x = weft::randn({rows, 12}, {}, &g), y = weft::randn({rows, 4}, {}, &g);
      double got = 0;
      {
        weft::dist_autograd::Context ctx(agent);
        Tensor loss = weft::mseLoss(pipe.forward(x), y);
        ctx.backward({loss});
        opt.step(ctx);
        got = loss.item<double>();
      }
      twinOpt.zeroGrad();
      Tensor want = weft::mseLoss(twin->forward(x), y);
      want.backward();
      twinOpt.step();
      double worst = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        worst = std::max(worst, weft::max(weft::abs(params[i].toHere() - twinParams[i].detach())).item<double>());
      }
      say(prefix(agent) + "step " + std::to_string(step) + " loss_diff_ppb " +
          std::to_string(ppb(std::fabs(got - want.item<double>()))) + " param_maxdiff_ppb " +
          std::to_string(ppb(worst)));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  pipeline::declareStageBuilder("mlp", [](int64_t stage, int64_t stages) -> std::shared_ptr<nn::Module> {
    auto net = mlp();
    return pipeline::splitSequential(*net, pipeline::cutsByParameterCount(*net, static_cast<int>(stages)))
        [static_cast<size_t>(stage)];
  });
  return weft::testing::workerMain("pipe_worker", {"train"}, argc, argv, [argc, argv](const std::string&) {
    WEFT_ENFORCE(argc == 3, weft::InvalidArgumentError, "usage: pipe_worker train MICROBATCHES");
    Agent agent(weft::rpc::Options::fromEnv());
    agent.start();
    weft::testing::sayStarted(agent);
    if (agent.rank() == 0) runController(agent, std::atoi(argv[2]));
    settle(agent);
    say(prefix(agent) + "done");
    return 0;
  });
}
