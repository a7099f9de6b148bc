// DistributedOptimizer between agents of one process (each with its own loop, pool and TCP
// connections on 127.0.0.1): every optimizer kind against a local twin (same weights, same inputs,
// local backward, nn::optim::Optimizer of the same kind) for three steps, parameters owned by two
// workers and by the trainer itself, parameters without a gradient skipped with their state,
// two trainers stepping the same parameters at once, the options codec, and every error a user
// can meet.
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <type_traits>
#include <utility>
#include <variant>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "rpc/agent_util.h"
#include "rref/remote_module.h"
#include "tensor/autograd.h"
#include "text_util.h"
#include "weft_test.h"

using namespace std::chrono_literals;
using weft::RemoteModule;
using weft::RRef;
using weft::Tensor;
using weft::dist_autograd::Context;
using weft::dist_optim::DistributedOptimizer;
using weft::rpc::Agent;
using weft::testing::AgentGroup;
using weft::testing::contains;
using weft::testing::eventually;
namespace nn = weft::nn;
namespace optim = weft::nn::optim;

namespace dotest {

// A tensor owned by the callee, handed out as a reference (the callee's own handle is dropped on
// return; the caller's keeps the value alive).
inline const weft::Function<RRef<Tensor>(Tensor)> ownTensor{"dist_optim_test.ownTensor"};
// Sets the owner's tensor to `value` in place.
inline const weft::Function<void(RRef<Tensor>, double)> fillOnOwner{"dist_optim_test.fillOnOwner"};
// The options as the callee decoded them, sent back.
inline const weft::Function<optim::OptimizerOptions(optim::OptimizerOptions)> echoOptions{
    "dist_optim_test.echoOptions"};
// Keeps a module and parameter handles on the callee, for a second trainer of the test to use.
inline const weft::Function<void(RemoteModule<nn::Linear>, std::vector<RRef<Tensor>>)> stash{
    "dist_optim_test.stash"};

}  // namespace dotest

using namespace dotest;

namespace {

// Ranks 0, 1, 2 named "trainer", "ps1", "ps2" (or "trainer2" where a test wants two trainers).
struct Job {
  AgentGroup g;
  explicit Job(std::vector<std::string> names = {"trainer", "ps1", "ps2"})
      : g(static_cast<int>(names.size()), [names](int r, weft::rpc::Options& o) { o.name = names[r]; }) {
    for (int r = 0; r < g.size(); ++r) {
      Agent& a = g.agent(r);
      a.registry().impl(ownTensor, [&a](Tensor t) { return weft::makeRRef(a, t); });
      a.registry().impl(fillOnOwner, [](RRef<Tensor> p, double value) {
        weft::NoGradGuard ng;
        p.localValue()->fill_(value);
      });
      a.registry().impl(echoOptions, [](optim::OptimizerOptions o) { return o; });
      a.registry().impl(stash, [this, r](RemoteModule<nn::Linear> m, std::vector<RRef<Tensor>> p) {
        std::lock_guard<std::mutex> lock(mutex);
        stashed[static_cast<size_t>(r)] = {std::move(m), std::move(p)};
      });
    }
    g.start();
  }
  Agent& trainer() { return g.agent(0); }

  struct Stashed {
    RemoteModule<nn::Linear> module;
    std::vector<RRef<Tensor>> params;
  };
  Stashed takeStashed(int rank) {
    std::lock_guard<std::mutex> lock(mutex);
    return std::exchange(stashed[static_cast<size_t>(rank)], {});
  }
  std::mutex mutex;
  std::vector<Stashed> stashed = std::vector<Stashed>(3);

  bool optimEmpty() {
    for (int r = 0; r < g.size(); ++r) {
      if (!weft::dist_optim::debugCounts(g.agent(r)).empty()) return false;
    }
    return true;
  }
  std::string counts() {
    std::string s;
    for (int r = 0; r < g.size(); ++r) {
      s += g.agent(r).name() + ": " + weft::dist_optim::debugCounts(g.agent(r)).toString() + ", rref " +
           weft::rref::debugCounts(g.agent(r)).toString() + "\n";
    }
    return s;
  }
};

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<Tensor> fetchAll(const std::vector<RRef<Tensor>>& refs) {
  std::vector<Tensor> out;
  for (const auto& r : refs) out.push_back(r.toHere());
  return out;
}

// Bit-for-bit equality of two float tensors of one shape.
bool sameValues(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.contiguous().toVector<float>() == b.contiguous().toVector<float>();
}

// A local Linear holding copies of (weight, bias).
std::shared_ptr<nn::Linear> localLinear(const Tensor& weight, const Tensor& bias) {
  auto fc = std::make_shared<nn::Linear>(weight.size(1), weight.size(0));
  fc->loadStateDict({{"weight", weight.clone()}, {"bias", bias.clone()}});
  return fc;
}

// |a - b| <= 1e-6 * |b| + 1e-7 element-wise, with both tensors in the message on failure.
void checkClose(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.shape() == expected.shape());
  INFO("actual:   " << actual << "\nexpected: " << expected);
  CHECK(weft::allclose(actual, expected, 1e-6, 1e-7));
}

struct Kind {
  const char* label;
  optim::OptimizerOptions options;
};

std::vector<Kind> everyKind() {
  return {
      {"SGD", optim::SGDOptions{.lr = 0.1}},
      {"SGD momentum nesterov weight decay",
       optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.0, .weightDecay = 0.01, .nesterov = true}},
      {"SGD momentum dampening maximize",
       optim::SGDOptions{.lr = 0.05, .momentum = 0.5, .dampening = 0.3, .maximize = true}},
      {"Adam weight decay", optim::AdamOptions{.lr = 0.01, .betas = {0.8, 0.99}, .weightDecay = 0.001}},
      {"AdamW", optim::AdamWOptions{.lr = 0.01}},
      {"AdamW amsgrad", optim::AdamWOptions{.lr = 0.02, .weightDecay = 0.05, .amsgrad = true}},
      {"Adam amsgrad", optim::AdamOptions{.lr = 0.02, .amsgrad = true}},
      {"Adagrad", optim::AdagradOptions{.lr = 0.1, .lrDecay = 0.01, .weightDecay = 0.01, .initialAccumulatorValue = 0.1}},
      {"RMSprop", optim::RMSpropOptions{.lr = 0.01}},
      {"RMSprop centered momentum weight decay",
       optim::RMSpropOptions{.lr = 0.01, .alpha = 0.9, .weightDecay = 0.01, .momentum = 0.9, .centered = true}},
  };
}

}  // namespace

TEST_CASE("distributed optimizer: every kind updates parameters on two owners exactly as a local optimizer does "
          "for three steps") {
  Job job;
  Agent& trainer = job.trainer();
  weft::Generator gen(2024);
  for (const Kind& kind : everyKind()) {
    CAPTURE(kind.label);
    // The previous kind's owner-side optimizers are gone.
    REQUIRE_MESSAGE(eventually([&] { return job.optimEmpty(); }, 5s), job.counts());
    // tanh(x W1ᵀ + b1) on the trainer between a Linear on ps1 and a Linear on ps2.
    RemoteModule<nn::Linear> fc1(trainer, "ps1/cpu", int64_t{4}, int64_t{5});
    RemoteModule<nn::Linear> fc2(trainer, "ps2/cpu", int64_t{5}, int64_t{3});
    std::vector<RRef<Tensor>> p1 = fc1.remoteParameters();
    std::vector<RRef<Tensor>> p2 = fc2.remoteParameters();
    std::vector<Tensor> w1 = fetchAll(p1);
    std::vector<Tensor> w2 = fetchAll(p2);
    auto l1 = localLinear(w1[0], w1[1]);
    auto l2 = localLinear(w2[0], w2[1]);

    std::vector<RRef<Tensor>> params = p1;
    params.insert(params.end(), p2.begin(), p2.end());
    DistributedOptimizer opt(trainer, kind.options, params);
    CHECK(std::string(opt.name()) == optim::optimizerName(kind.options));
    CHECK(opt.ownerRanks() == std::vector<int>{1, 2});
    CHECK(opt.parameters().size() == 4);
    CHECK(weft::dist_optim::debugCounts(job.g.agent(1)).toString() == "ownerOptimizers 1 parameterLocks 2");
    CHECK(weft::dist_optim::debugCounts(job.g.agent(2)).toString() == "ownerOptimizers 1 parameterLocks 2");

    std::vector<Tensor> localParams = l1->parameters();
    for (const Tensor& p : l2->parameters()) localParams.push_back(p);
    optim::Optimizer local(localParams, kind.options);

    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      Tensor x = weft::randn({6, 4}, {}, &gen);
      Tensor target = weft::randn({6, 3}, {}, &gen);
      {
        Context ctx(trainer);
        Tensor y = fc2.forward(weft::tanh(fc1.forward(x)));
        Tensor loss = weft::mseLoss(y, target);
        ctx.backward({loss});
        opt.step(ctx);
      }
      local.zeroGrad();
      weft::mseLoss(l2->forward(weft::tanh(l1->forward(x))), target).backward();
      local.step();

      std::vector<Tensor> remote = fetchAll(params);
      for (size_t i = 0; i < remote.size(); ++i) {
        CAPTURE(i);
        checkClose(remote[i], localParams[i]);
      }
    }
    // The parameters moved (the comparison above is between two updated models).
    CHECK_FALSE(weft::allclose(p1[0].toHere(), w1[0], 1e-4, 1e-6));
    CHECK_FALSE(weft::allclose(p2[0].toHere(), w2[0], 1e-4, 1e-6));
  }
  // Each optimizer's owner-side state went with it.
  CHECK_MESSAGE(eventually([&] { return job.optimEmpty(); }, 5s), job.counts());
}

TEST_CASE("distributed optimizer: a parameter without a gradient in the context is skipped and keeps its state") {
  Job job;
  Agent& trainer = job.trainer();
  RemoteModule<nn::Linear> a(trainer, "ps1/cpu", int64_t{3}, int64_t{2});
  RemoteModule<nn::Linear> b(trainer, "ps1/cpu", int64_t{3}, int64_t{2});
  std::vector<RRef<Tensor>> pa = a.remoteParameters();
  std::vector<RRef<Tensor>> pb = b.remoteParameters();
  std::vector<Tensor> wa = fetchAll(pa);
  std::vector<Tensor> wb = fetchAll(pb);
  optim::AdamOptions adam{.lr = 0.05};
  std::vector<RRef<Tensor>> params = pa;
  params.insert(params.end(), pb.begin(), pb.end());
  DistributedOptimizer opt(trainer, adam, params);
  CHECK(opt.ownerRanks() == std::vector<int>{1});

  Tensor x = weft::fromVector<float>({0.5f, -1.0f, 2.0f, 1.5f, 0.25f, -0.75f}, {2, 3});
  auto la = localLinear(wa[0], wa[1]);
  auto lb = localLinear(wb[0], wb[1]);
  optim::Adam localA(la->parameters(), adam);
  optim::Adam localB(lb->parameters(), adam);

  // Two steps through `a` only: `b` is untouched, bit for bit.
  for (int step = 0; step < 2; ++step) {
    Context ctx(trainer);
    ctx.backward({a.forward(x).sum()});
    opt.step(ctx);
    localA.zeroGrad();
    la->forward(x).sum().backward();
    localA.step();
  }
  checkClose(pa[0].toHere(), la->weight());
  checkClose(pa[1].toHere(), la->bias());
  CHECK(sameValues(pb[0].toHere(), wb[0]));
  CHECK(sameValues(pb[1].toHere(), wb[1]));

  // Then one step through `b`: its first Adam update (step count 1, fresh moments), not a third.
  {
    Context ctx(trainer);
    ctx.backward({b.forward(x).sum()});
    opt.step(ctx);
  }
  lb->forward(x).sum().backward();
  localB.step();
  checkClose(pb[0].toHere(), lb->weight());
  checkClose(pb[1].toHere(), lb->bias());
  checkClose(pa[0].toHere(), la->weight());  // and `a` did not move
}

TEST_CASE("distributed optimizer: parameters owned by the trainer itself are updated in place") {
  Job job;
  Agent& trainer = job.trainer();
  Tensor w = weft::fromVector<float>({1.0f, 2.0f, 3.0f});
  w.requiresGrad_();
  RRef<Tensor> mine = weft::makeRRef(trainer, w);
  RemoteModule<nn::Linear> fc(trainer, "ps1/cpu", int64_t{3}, int64_t{1});
  std::vector<RRef<Tensor>> params = fc.remoteParameters();
  params.push_back(mine);
  DistributedOptimizer opt(trainer, optim::SGDOptions{.lr = 0.25}, params);
  CHECK(opt.ownerRanks() == std::vector<int>{0, 1});
  Tensor before = params[0].toHere();
  {
    Context ctx(trainer);
    Tensor c = weft::fromVector<float>({4.0f, -2.0f, 0.5f});
    // loss = fc(w)ᵀ·1 + w·c: w's gradient is W1ᵀ + c, computed here; fc's weight gets w.
    Tensor loss = fc.forward(w.unsqueeze(0)).sum() + (w * c).sum();
    ctx.backward({loss});
    CHECK(w.grad().defined() == false);  // gradients go to the context, not .grad
    opt.step(ctx);
  }
  // w -= 0.25 * (W1 + c), W1 as it was before the step; fc.weight -= 0.25 * [1, 2, 3].
  Tensor expectedW = weft::fromVector<float>({1.0f, 2.0f, 3.0f}) -
                     (before.reshape({3}) + weft::fromVector<float>({4.0f, -2.0f, 0.5f})) * 0.25;
  checkClose(w.detach(), expectedW);  // the trainer's own tensor, updated in place
  checkClose(params[0].toHere(), before - weft::fromVector<float>({1.0f, 2.0f, 3.0f}, {1, 3}) * 0.25);
}

TEST_CASE("distributed optimizer: two trainers stepping the same parameters at once lose no update") {
  Job job({"trainer", "ps1", "trainer2"});
  // Large enough that an update takes a while, so that the two trainers' steps overlap.
  constexpr int64_t kIn = 512;
  constexpr int64_t kOut = 512;
  RemoteModule<nn::Linear> fc(job.g.agent(0), "ps1/cpu", kIn, kOut);
  std::vector<RRef<Tensor>> params = fc.remoteParameters();
  // Dyadic values throughout, so that every partial sum is exact and the result does not depend on
  // the order of the updates: only a lost or torn update changes it.
  for (const auto& p : params) job.g.agent(0).sync(1, fillOnOwner, p, 0.5);
  job.g.agent(0).sync(2, stash, fc, params);
  Job::Stashed second = job.takeStashed(2);
  REQUIRE(second.params.size() == 2);

  // loss = sum(x Wᵀ + b): dW[j] = column sums of x, db[j] = rows of x, whatever W is.
  constexpr int kSteps = 40;
  const optim::SGDOptions sgd{.lr = 1.0 / 64};
  auto train = [&](Agent& agent, const RemoteModule<nn::Linear>& m, const std::vector<RRef<Tensor>>& p, Tensor x) {
    DistributedOptimizer opt(agent, sgd, p);
    for (int i = 0; i < kSteps; ++i) {
      Context ctx(agent);
      ctx.backward({m.forward(x).sum()});
      opt.step(ctx);
    }
  };
  // Trainer 0: two rows of 1/(2 kIn): dW = 1/kIn, db = 2. Trainer 2: one row of 1/kIn: dW = 1/kIn, db = 1.
  const double row = 1.0 / kIn;
  auto first = std::async(std::launch::async, [&] { train(job.g.agent(0), fc, params, weft::full({2, kIn}, row / 2)); });
  auto other = std::async(std::launch::async,
                          [&] { train(job.g.agent(2), second.module, second.params, weft::full({1, kIn}, row)); });
  first.get();
  other.get();
  // W = 0.5 - 40 (2 / kIn) / 64, b = 0.5 - 40 (2 + 1) / 64
  CHECK(sameValues(params[0].toHere(), weft::full({kOut, kIn}, 0.5 - kSteps * (2.0 / kIn) / 64)));
  CHECK(sameValues(params[1].toHere(), weft::full({kOut}, 0.5 - kSteps * 3.0 / 64)));
  CHECK_MESSAGE(eventually([&] { return job.optimEmpty(); }, 5s), job.counts());
}

TEST_CASE("distributed optimizer: options of every kind cross the wire unchanged") {
  Job job;
  for (const Kind& kind : everyKind()) {
    CAPTURE(kind.label);
    optim::OptimizerOptions back = job.trainer().sync(1, echoOptions, kind.options);
    REQUIRE(back.index() == kind.options.index());
    std::visit(
        [&](const auto& sent) {
          using O = std::decay_t<decltype(sent)>;
          const O& got = std::get<O>(back);
          CHECK(got.lr == sent.lr);
          CHECK(got.weightDecay == sent.weightDecay);
          CHECK(got.maximize == sent.maximize);
          if constexpr (std::is_same_v<O, optim::SGDOptions>) {
            CHECK(got.momentum == sent.momentum);
            CHECK(got.dampening == sent.dampening);
            CHECK(got.nesterov == sent.nesterov);
          } else if constexpr (std::is_same_v<O, optim::AdamOptions> || std::is_same_v<O, optim::AdamWOptions>) {
            CHECK(got.betas == sent.betas);
            CHECK(got.eps == sent.eps);
            CHECK(got.amsgrad == sent.amsgrad);
          } else if constexpr (std::is_same_v<O, optim::AdagradOptions>) {
            CHECK(got.lrDecay == sent.lrDecay);
            CHECK(got.initialAccumulatorValue == sent.initialAccumulatorValue);
            CHECK(got.eps == sent.eps);
          } else {
            CHECK(got.alpha == sent.alpha);
            CHECK(got.eps == sent.eps);
            CHECK(got.momentum == sent.momentum);
            CHECK(got.centered == sent.centered);
          }
        },
        kind.options);
  }
}

TEST_CASE("distributed optimizer: bad arguments are refused before any call") {
  Job job;
  Agent& trainer = job.trainer();
  RemoteModule<nn::Linear> fc(trainer, "ps1/cpu", int64_t{2}, int64_t{2});
  std::vector<RRef<Tensor>> params = fc.remoteParameters();
  const uint64_t callsBefore = trainer.stats().callsSent;

  // Invalid options: PyTorch's rules, with the optimizer and the value named.
  std::string lrUnset = errorOf([&] { DistributedOptimizer(trainer, optim::SGDOptions{}, params); });
  CHECK(contains(lrUnset, "SGD"));
  CHECK_THROWS_AS(DistributedOptimizer(trainer, optim::SGDOptions{}, params), weft::InvalidArgumentError);
  CHECK_THROWS_AS(DistributedOptimizer(trainer, optim::AdamOptions{.betas = {1.0, 0.999}}, params),
                  weft::InvalidArgumentError);
  CHECK_THROWS_AS(DistributedOptimizer(trainer, optim::SGDOptions{.lr = 0.1, .nesterov = true}, params),
                  weft::InvalidArgumentError);
  CHECK_THROWS_AS(DistributedOptimizer(trainer, optim::RMSpropOptions{.lr = -1.0}, params),
                  weft::InvalidArgumentError);
  // An empty list, an empty handle, the same handle twice.
  CHECK_THROWS_WITH_AS(DistributedOptimizer(trainer, optim::AdamOptions{}, {}),
                       doctest::Contains("empty parameter list"), weft::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(DistributedOptimizer(trainer, optim::AdamOptions{}, {params[0], RRef<Tensor>()}),
                       doctest::Contains("parameter 1 is an empty RRef"), weft::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(DistributedOptimizer(trainer, optim::AdamOptions{}, {params[0], params[1], params[0]}),
                       doctest::Contains("is the same reference as parameter 0"), weft::InvalidArgumentError);
  // A handle of another agent of this process.
  RRef<Tensor> foreign = job.g.agent(2).sync(1, ownTensor, weft::ones({2}));
  CHECK_THROWS_WITH_AS(DistributedOptimizer(trainer, optim::AdamOptions{}, {params[0], foreign}),
                       doctest::Contains("another agent"), weft::InvalidArgumentError);
  CHECK(trainer.stats().callsSent == callsBefore);
  CHECK(job.optimEmpty());
}

TEST_CASE("distributed optimizer: an owner refusing its parameters fails the constructor with its name") {
  Job job;
  Agent& trainer = job.trainer();
  RemoteModule<nn::Linear> fc(trainer, "ps1/cpu", int64_t{2}, int64_t{2});
  // Two references to the same tensor (two calls of remoteParameters) pass the trainer's checks.
  std::vector<RRef<Tensor>> once = fc.remoteParameters();
  std::vector<RRef<Tensor>> twice = fc.remoteParameters();
  std::string same = errorOf([&] { DistributedOptimizer(trainer, optim::SGDOptions{.lr = 0.1}, {once[0], twice[0]}); });
  CHECK(contains(same, "is the same tensor as parameter 0"));
  CHECK(contains(same, "ps1"));
  CHECK_THROWS_AS(DistributedOptimizer(trainer, optim::SGDOptions{.lr = 0.1}, {once[0], twice[0]}),
                  weft::InvalidArgumentError);
  // An integer tensor on ps2, next to valid parameters on ps1: the refusal comes from ps2.
  RRef<Tensor> ints = trainer.sync(2, ownTensor, weft::arange(int64_t{4}));
  std::string integer = errorOf([&] { DistributedOptimizer(trainer, optim::SGDOptions{.lr = 0.1}, {once[0], ints}); });
  CHECK(contains(integer, "non-floating dtype"));
  CHECK(contains(integer, "ps2"));
  CHECK_MESSAGE(eventually([&] { return job.optimEmpty(); }, 5s), job.counts());
}

TEST_CASE("distributed optimizer: a step in a context an owner does not know fails with NotFoundError naming it "
          "after every owner answered") {
  Job job;
  Agent& trainer = job.trainer();
  RemoteModule<nn::Linear> fc1(trainer, "ps1/cpu", int64_t{2}, int64_t{2});
  RemoteModule<nn::Linear> fc2(trainer, "ps2/cpu", int64_t{2}, int64_t{2});
  std::vector<RRef<Tensor>> params = fc1.remoteParameters();
  for (const auto& p : fc2.remoteParameters()) params.push_back(p);
  DistributedOptimizer opt(trainer, optim::SGDOptions{.lr = 0.5}, params);
  Tensor x = weft::ones({1, 2});

  // A context only ps1 took part in. Stepped on the thread where it is current, the step call
  // itself brings the context to ps2, which has no gradient in it and updates nothing. Stepped
  // from another thread, ps1 updates its parameters and ps2 has never heard of the context.
  trainer.sync(1, fillOnOwner, params[0], 0.25);
  const Tensor untouched = params[2].toHere();
  {
    Context ctx(trainer);
    ctx.backward({fc1.forward(x).sum()});
    CHECK_NOTHROW(opt.step(ctx));
    CHECK(sameValues(params[2].toHere(), untouched));
    CHECK(sameValues(params[0].toHere(), weft::full({2, 2}, -0.25)));
  }
  {
    Context ctx(trainer);
    ctx.backward({fc1.forward(x).sum()});
    const int64_t id = ctx.id();
    std::string why = std::async(std::launch::async, [&] { return errorOf([&] { opt.stepAsync(id).get(); }); }).get();
    CHECK(contains(why, "ps2"));
    CHECK(contains(why, std::to_string(id)));
    CHECK_THROWS_AS(std::async(std::launch::async, [&] { opt.stepAsync(id).get(); }).get(), weft::NotFoundError);
  }
  // ps1 applied all three steps: W = 0.25 - 3 * 0.5 * 1.
  CHECK(sameValues(params[0].toHere(), weft::full({2, 2}, -1.25)));

  // A context released everywhere, and an id no worker ever made.
  int64_t released = 0;
  {
    Context ctx(trainer);
    ctx.backward({fc2.forward(fc1.forward(x)).sum()});
    released = ctx.id();
    ctx.release().get();
  }
  std::string gone = errorOf([&] { opt.stepAsync(released).get(); });
  CHECK(contains(gone, "ps1"));  // the lowest-ranked owner's error is raised
  CHECK(contains(gone, "knows no distributed autograd context " + std::to_string(released)));
  CHECK_THROWS_AS(opt.stepAsync(released).get(), weft::NotFoundError);
  CHECK_THROWS_AS(opt.stepAsync((int64_t{2} << 48) | 123456).get(), weft::NotFoundError);
}

TEST_CASE("distributed optimizer: a step whose owner shut down fails with DisconnectedError naming it") {
  Job job;
  Agent& trainer = job.trainer();
  RemoteModule<nn::Linear> fc1(trainer, "ps1/cpu", int64_t{2}, int64_t{2});
  RemoteModule<nn::Linear> fc2(trainer, "ps2/cpu", int64_t{2}, int64_t{2});
  std::vector<RRef<Tensor>> params = fc1.remoteParameters();
  std::vector<RRef<Tensor>> p2 = fc2.remoteParameters();
  params.insert(params.end(), p2.begin(), p2.end());
  DistributedOptimizer opt(trainer, optim::SGDOptions{.lr = 0.5}, params);
  {
    Context ctx(trainer);
    ctx.backward({fc2.forward(fc1.forward(weft::ones({1, 2}))).sum()});
    job.g.agent(1).shutdown({.graceful = false});
    REQUIRE(eventually([&] { return !trainer.isAlive(1); }, 5s));
    auto t0 = std::chrono::steady_clock::now();
    std::string why = errorOf([&] { opt.step(ctx); });
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    CHECK(contains(why, "ps1"));
    CHECK_THROWS_AS(opt.step(ctx), weft::DisconnectedError);
  }
}
