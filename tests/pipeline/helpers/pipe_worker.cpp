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
//
// Scenario die M: 2 stages; the first stage's process exits (status 3) at its forward of the
// second step's first micro-batch ("rank 1 dying"). The controller prints "failed in_ms T
// <ErrorType>: <message>" (T from the start of that step); the surviving stage waits for it in
// the store, then every survivor shuts down and prints "done".
#include <unistd.h>

#include <atomic>
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

// Forwards to `inner`; the process exits with status 3 at forward call number `dieAt` (from 1).
class DyingStage : public nn::Module {
 public:
  DyingStage(std::shared_ptr<nn::Module> inner, int dieAt) : Module("DyingStage"), dieAt_(dieAt) {
    inner_ = registerModule("inner", std::move(inner));
  }
  Tensor forward(const Tensor& x) override {
    if (++calls_ == dieAt_) {
      say("rank 1 dying");
      std::_Exit(3);
    }
    return inner_->forward(x);
  }

 private:
  std::shared_ptr<nn::Module> inner_;
  int dieAt_;
  std::atomic<int> calls_{0};
};

void runDyingController(Agent& agent, int m) {
  pipeline::Pipe pipe(agent, "mlp-dying", {"worker1", "worker2"}, m);
  std::vector<RRef<Tensor>> params = pipe.remoteParameters();
  weft::dist_optim::DistributedOptimizer opt(agent, nn::optim::SGDOptions{.lr = 0.05}, params);
  Generator g(5);
  Tensor x = weft::randn({4 * m, 12}, {}, &g), y = weft::randn({4 * m, 4}, {}, &g);
  for (int step = 0; step < 2; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      weft::dist_autograd::Context ctx(agent);
      Tensor loss = weft::mseLoss(pipe.forward(x), y);
      ctx.backward({loss});
      opt.step(ctx);
      say(prefix(agent) + "step " + std::to_string(step) + " done");
    } catch (const weft::Error& e) {
      const long long ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
      std::string type = dynamic_cast<const weft::DisconnectedError*>(&e) ? "DisconnectedError"
                         : dynamic_cast<const weft::TimeoutError*>(&e)    ? "TimeoutError"
                         : dynamic_cast<const weft::RemoteError*>(&e)     ? "RemoteError"
                                                                           : "Error";
      say(prefix(agent) + "failed in_ms " + std::to_string(ms) + " " + type + ": " + e.what());
      return;
    }
  }
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
  pipeline::declareStageBuilder("mlp-dying", [argc, argv](int64_t stage, int64_t stages) -> std::shared_ptr<nn::Module> {
    auto net = mlp();
    auto mine = pipeline::splitSequential(*net, pipeline::cutsByParameterCount(*net, static_cast<int>(stages)))
        [static_cast<size_t>(stage)];
    if (stage != 0) return mine;
    // The first forward of the second step.
    return std::make_shared<DyingStage>(mine, argc == 3 ? std::atoi(argv[2]) + 1 : 2);
  });
  return weft::testing::workerMain("pipe_worker", {"train", "die"}, argc, argv, [argc, argv](const std::string& scenario) {
    WEFT_ENFORCE(argc == 3, weft::InvalidArgumentError, "usage: pipe_worker train|die MICROBATCHES");
    Agent agent(weft::rpc::Options::fromEnv());
    agent.start();
    weft::testing::sayStarted(agent);
    if (scenario == "die") {
      // The stages wait for the controller's verdict before leaving, so that only the dying stage
      // goes away while the controller runs.
      if (agent.rank() == 0) {
        runDyingController(agent, std::atoi(argv[2]));
        agent.store().set("pipe-die/controller-done", "1");
      } else if (agent.rank() == 2) {
        agent.store().wait({"pipe-die/controller-done"}, 30s);
      }
      weft::testing::sayShutdown(agent);
      say(prefix(agent) + "done");
      return 0;
    }
    if (agent.rank() == 0) runController(agent, std::atoi(argv[2]));
    settle(agent);
    say(prefix(agent) + "done");
    return 0;
  });
}
