// A program for the multiprocess tests of the distributed optimizer
// (tests/dist_optim/distributed_optimizer_mp_test.cpp): one process of a weft job, which finds its
// place through rpc::Options::fromEnv (name included: WEFT_WORKER_NAME) and plays the part of its
// rank. Rank 0 is the parameter server "ps": it owns a Linear(kWidth, kOut) whose parameters it
// sets to 0.5 and hands out as RRefs (psParameters), and serves its forward (psForward). The other
// ranks are trainers. It prints one line per event, in a form the tests parse
// ("rank R <phrase> key value ...").
//
//   WEFT_RANK=1 WEFT_WORLD_SIZE=3 WEFT_WORKER_NAME=trainer1 ... dist_optim_worker concurrent
//
// Scenarios (world size in brackets):
//   concurrent [3] both trainers build a DistributedOptimizer (SGD, lr 1/64) over the server's
//                  parameters, meet at a store barrier, then each runs kSteps iterations of
//                  forward on "ps", loss = sum of the output, backward, step, at the same time.
//                  The loss is linear, so each trainer's gradient is the same at every step
//                  (trainer r feeds r rows of 1/r: dW = 1 and db = r), and every value is
//                  dyadic, so the final parameters do not depend on the order of the updates:
//                  W = 0.5 - kSteps * 2 / 64 and b = 0.5 - kSteps * 3 / 64 exactly, unless an
//                  update was lost or torn. Trainers print "rank R trained steps N seconds S";
//                  the server prints "rank 0 weight_wrong N bias_wrong N weight V bias V".
//   kill       [2] trainer 1 trains one step (Adam), then runs forward and backward in a second
//                  context and prints "rank 1 ready to step"; the test kills the server with
//                  SIGKILL; once the trainer sees it dead, it steps and prints "rank 1 step failed
//                  in_ms T <ErrorType>: <message>" (or "rank 1 step succeeded"), shuts down and
//                  prints "rank 1 shutdown missing <name|->".
//   idle_host  [3] rank 1 ("worker1") only hosts objects: it starts, sets the store key
//                  "idle-host-in-shutdown" and calls shutdown() at once, as a PyTorch program does
//                  for such a worker. Ranks 0 and 2 wait for that key (and 300 ms more), then each
//                  builds a RemoteModule<Linear(8, 4)> on worker1 and a DistributedOptimizer (SGD,
//                  momentum) over its parameters, and trains kIdleSteps steps of an MSE loss with
//                  distributed autograd, kIdlePause apart (longer in all than the job's shutdown
//                  timeout). Each replays the same steps on a local Linear from the same initial
//                  parameters and prints "rank R trained steps N seconds S loss_first L loss_last L
//                  max_loss_diff D max_param_diff D". Every rank then shuts down (printing the
//                  shutdown line below) and prints "rank R state_empty_at_close <0|1>".
// Every scenario but kill and idle_host then waits at a store barrier until every handle is dropped, waits
// (bounded) until this worker's RRef, distributed autograd and optimizer state is empty, and prints
//   "rank R state_empty <0|1> counts <rref counts> | <dist_autograd counts> | <dist_optim counts>"
//   "rank R shutdown graceful 1 missing - seconds S"
// Every rank first prints "rank R pid P started". Every wait is bounded. A wrong result throws:
// one line on stderr, exit status 1.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "rref/remote_module.h"
#include "rref/rref.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

#include "mp_worker.h"

namespace dooworker {

using namespace std::chrono_literals;
using weft::Error;
using weft::RRef;
using weft::Tensor;
using weft::rpc::Agent;
using Clock = std::chrono::steady_clock;
using namespace weft::testing;  // tests/mp_worker.h: say, prefix, describe, require, waitUntil, ...

constexpr int64_t kWidth = 1024;
constexpr int64_t kOut = 1024;
constexpr int kSteps = 100;
constexpr double kLr = 1.0 / 64;

inline const weft::Function<std::vector<RRef<Tensor>>()> psParameters{"dist_optim_worker.psParameters"};
inline const weft::Function<Tensor(Tensor)> psForward{"dist_optim_worker.psForward"};

// The parameter server's module, built before the agent starts.
struct Server {
  std::shared_ptr<weft::nn::Linear> fc;
};

void bind(Agent& agent, Server& server) {
  if (agent.rank() != 0) return;
  server.fc = std::make_shared<weft::nn::Linear>(kWidth, kOut);
  {
    weft::NoGradGuard ng;
    for (Tensor& p : server.fc->parameters()) p.fill_(0.5);
  }
  agent.registry().impl(psParameters, [&agent, &server] {
    std::vector<RRef<Tensor>> out;
    for (const Tensor& p : server.fc->parameters()) out.push_back(weft::makeRRef(agent, p));
    return out;
  });
  agent.registry().impl(psForward, [&server](Tensor x) { return server.fc->forward(x); });
}

bool stateEmpty(Agent& agent) {
  return weft::rref::debugCounts(agent).empty() && weft::dist_autograd::debugCounts(agent).empty() &&
         weft::dist_optim::debugCounts(agent).empty();
}

void settle(Agent& agent) {
  agent.store().barrier("dist-optim-dropped", agent.worldSize(), 30s);
  waitUntil([&] { return stateEmpty(agent); }, 15s);
  say(prefix(agent) + "state_empty " + std::to_string(stateEmpty(agent) ? 1 : 0) + " counts " +
      weft::rref::debugCounts(agent).toString() + " | " +
      weft::dist_autograd::debugCounts(agent).toString() + " | " + weft::dist_optim::debugCounts(agent).toString());
  sayShutdown(agent);
}

// ---- concurrent --------------------------------------------------------------------------------

int concurrentScenario(Agent& agent, Server& server) {
  agent.start();
  if (agent.rank() == 0) {
    agent.store().barrier("dist-optim-trained", agent.worldSize(), 60s);
    const Tensor& w = server.fc->weight();
    const Tensor& b = server.fc->bias();
    const float wantW = static_cast<float>(0.5 - kSteps * 2 * kLr);
    const float wantB = static_cast<float>(0.5 - kSteps * 3 * kLr);
    int64_t wrongW = 0;
    int64_t wrongB = 0;
    for (float v : w.contiguous().toVector<float>()) wrongW += v != wantW ? 1 : 0;
    for (float v : b.contiguous().toVector<float>()) wrongB += v != wantB ? 1 : 0;
    say(prefix(agent) + "weight_wrong " + std::to_string(wrongW) + " bias_wrong " + std::to_string(wrongB) +
        " weight " + std::to_string(w.contiguous().toVector<float>()[0]) + " bias " +
        std::to_string(b.contiguous().toVector<float>()[0]));
  } else {
    {
      std::vector<RRef<Tensor>> params = agent.sync("ps", psParameters);
      weft::dist_optim::DistributedOptimizer opt(agent, weft::nn::optim::SGDOptions{.lr = kLr}, params);
      // Trainer r: r rows of 1/r, so dW = 1 and db = r at every step.
      const int64_t rows = agent.rank();
      Tensor x = weft::full({rows, kWidth}, 1.0 / static_cast<double>(rows));
      agent.store().barrier("dist-optim-ready", agent.worldSize() - 1, 30s);
      auto began = Clock::now();
      for (int i = 0; i < kSteps; ++i) {
        weft::dist_autograd::Context ctx(agent);
        Tensor y = agent.sync("ps", psForward, x);
        ctx.backward({y.sum()});
        opt.step(ctx);
      }
      say(prefix(agent) + "trained steps " + std::to_string(kSteps) + " seconds " +
          std::to_string(std::chrono::duration<double>(Clock::now() - began).count()));
    }
    agent.store().barrier("dist-optim-trained", agent.worldSize(), 60s);
  }
  settle(agent);
  return 0;
}

// ---- kill ----------------------------------------------------------------------------------------

int killScenario(Agent& agent, Server&) {
  agent.start();
  if (agent.rank() == 0) {
    say(prefix(agent) + "serving");
    std::this_thread::sleep_for(60s);  // killed by the test long before
    return 1;
  }
  {
    std::vector<RRef<Tensor>> params = agent.sync("ps", psParameters);
    weft::dist_optim::DistributedOptimizer opt(agent, weft::nn::optim::AdamOptions{.lr = 1e-3}, params);
    Tensor x = weft::ones({1, kWidth});
    {
      weft::dist_autograd::Context ctx(agent);
      ctx.backward({agent.sync("ps", psForward, x).sum()});
      opt.step(ctx);
    }
    weft::dist_autograd::Context ctx(agent);
    ctx.backward({agent.sync("ps", psForward, x).sum()});
    say(prefix(agent) + "ready to step");
    require(waitUntil([&] { return !agent.isAlive("ps"); }, 20s), "the server is still alive after 20 s");
    auto began = Clock::now();
    try {
      opt.step(ctx);
      say(prefix(agent) + "step succeeded");
    } catch (...) {
      say(prefix(agent) + "step failed in_ms " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began).count()) + " " +
          describe(std::current_exception()));
    }
  }
  weft::rpc::ShutdownReport report = agent.shutdown();
  say(prefix(agent) + "shutdown missing " + (report.missing.empty() ? "-" : report.missing.front()));
  return 0;
}

// ---- idle_host -----------------------------------------------------------------------------------

constexpr int kIdleSteps = 6;
constexpr auto kIdlePause = 500ms;

int idleHostScenario(Agent& agent) {
  agent.start();
  if (agent.rank() == 1) {
    agent.store().set("idle-host-in-shutdown", "1");
    sayShutdown(agent);
  } else {
    agent.store().wait({"idle-host-in-shutdown"}, 30s);
    std::this_thread::sleep_for(300ms);  // worker1 is in its shutdown by now
    const weft::nn::optim::SGDOptions options{.lr = 0.05, .momentum = 0.9};
    weft::Generator gen(100 + static_cast<uint64_t>(agent.rank()));
    const Tensor x = weft::randn({5, 8}, {}, &gen);
    const Tensor target = weft::randn({5, 4}, {}, &gen);
    std::vector<float> losses;
    std::vector<Tensor> initial;
    std::vector<Tensor> trained;
    auto began = Clock::now();
    {
      weft::RemoteModule<weft::nn::Linear> fc(agent, "worker1/cpu", 8, 4);
      std::vector<RRef<Tensor>> params = fc.remoteParameters();
      for (auto& p : params) initial.push_back(p.toHere());
      weft::dist_optim::DistributedOptimizer opt(agent, options, params);
      for (int i = 0; i < kIdleSteps; ++i) {
        weft::dist_autograd::Context ctx(agent);
        Tensor loss = weft::mseLoss(fc.forward(x), target);
        losses.push_back(loss.item<float>());
        ctx.backward({loss});
        opt.step(ctx);
        std::this_thread::sleep_for(kIdlePause);
      }
      for (auto& p : params) trained.push_back(p.toHere());
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
    // The same steps on this process alone.
    weft::nn::Linear local(8, 4);
    {
      weft::NoGradGuard ng;
      auto ps = local.parameters();
      require(ps.size() == initial.size(), "the local Linear has as many parameters as the remote one");
      for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(initial[i]);
    }
    weft::nn::optim::SGD opt(local.parameters(), options);
    double lossDiff = 0;
    for (int i = 0; i < kIdleSteps; ++i) {
      opt.zeroGrad();
      Tensor loss = weft::mseLoss(local.forward(x), target);
      lossDiff = std::max(lossDiff, std::abs(static_cast<double>(loss.item<float>() - losses[static_cast<size_t>(i)])));
      loss.backward();
      opt.step();
    }
    double paramDiff = 0;
    auto ps = local.parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      paramDiff = std::max(paramDiff, static_cast<double>(weft::max(weft::abs(ps[i] - trained[i])).item<float>()));
    }
    say(prefix(agent) + "trained steps " + std::to_string(kIdleSteps) + " seconds " + std::to_string(seconds) +
        " loss_first " + std::to_string(losses.front()) + " loss_last " + std::to_string(losses.back()) +
        " max_loss_diff " + std::to_string(lossDiff) + " max_param_diff " + std::to_string(paramDiff));
    sayShutdown(agent);
  }
  say(prefix(agent) + "state_empty_at_close " + (stateEmpty(agent) ? "1" : "0") + " counts " +
      weft::rref::debugCounts(agent).toString() + " | " + weft::dist_autograd::debugCounts(agent).toString() +
      " | " + weft::dist_optim::debugCounts(agent).toString());
  return 0;
}

}  // namespace dooworker

int main(int argc, char** argv) {
  using namespace dooworker;
  return weft::testing::workerMain(
      "dist_optim_worker", {"concurrent", "kill", "idle_host"}, argc, argv, [](const std::string& scenario) {
        Agent agent(weft::rpc::Options::fromEnv());
        Server server;
        if (scenario != "idle_host") bind(agent, server);
        sayStarted(agent);
        if (scenario == "idle_host") return idleHostScenario(agent);
        return scenario == "concurrent" ? concurrentScenario(agent, server) : killScenario(agent, server);
      });
}
