// Distributed autograd between agents of one process (each with its own loop, pool and TCP
// connections on 127.0.0.1): recording on calls and replies, backward through one and two hops,
// parameters passed as arguments, RRefs, retainGraph, errors and release everywhere, a peer dying
// between two steps of a pass, and the threads backward() may and may not run on. Gradients are
// compared with the same computation done locally.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "dist_autograd/dist_autograd.h"
#include "rpc/agent_group.h"
#include "rpc/uv_loop.h"
#include "rref/rref.h"
#include "captured_text.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "weft_test.h"

using namespace std::chrono_literals;
using weft::Tensor;
using weft::dist_autograd::Context;
using weft::testing::AgentGroup;
using weft::testing::eventually;

namespace datest {

inline const weft::Function<Tensor(Tensor)> scaleByW{"datest.scaleByW"};         // x * w (this worker's w)
inline const weft::Function<Tensor(Tensor, Tensor)> mulArgs{"datest.mulArgs"};   // a * b, no state
inline const weft::Function<Tensor(Tensor, int64_t)> relay{"datest.relay"};      // scaleByW on another rank, then tanh
inline const weft::Function<Tensor(Tensor)> explodeInBackward{"datest.explode"};  // identity whose backward throws
inline const weft::Function<int64_t()> contextHere{"datest.contextHere"};         // the context current in the body
// In its own context: x = [1, 2, -3] sent to rank `to` for scaleByW, backward from the sum of the
// result; returns x's gradient (w_to), which needs this worker to run the pass's send node.
inline const weft::Function<Tensor(int64_t)> backwardHere{"datest.backwardHere"};
// Once `meet` handlers (of this process's agents) have arrived here, backward of
// pendingPasses[slot] (a context and its loss).
inline const weft::Function<int64_t(int64_t, int64_t)> backwardPending{"datest.backwardPending"};
inline std::atomic<int> arrived{0};
inline std::vector<std::pair<Context*, Tensor>> pendingPasses;

// Three agents, each with its own weight w_r = (r + 2) * [0.5, -1, 1.5] (float64, a leaf).
class Job {
 public:
  explicit Job(int world = 3, std::function<void(int, weft::rpc::Options&)> configure = {})
      : group_(world, std::move(configure)) {
    for (int r = 0; r < world; ++r) {
      weights_.push_back(weft::fromVector(std::vector<double>{0.5, -1.0, 1.5}) * double(r + 2));
      weights_.back().requiresGrad_();
      weft::rpc::Agent& a = group_.agent(r);
      Tensor w = weights_.back();
      a.registry().impl(scaleByW, [w](Tensor x) { return x * w; });
      a.registry().impl(mulArgs, [](Tensor x, Tensor y) { return x * y; });
      a.registry().impl(relay, [&a](Tensor x, int64_t to) { return weft::tanh(a.call(to, scaleByW, x * 2.0)); });
      a.registry().impl(explodeInBackward, [](Tensor x) {
        Tensor out = x.detach().clone();
        weft::recordOp("Exploding", {x}, {out}, [](const std::vector<Tensor>&) -> std::vector<Tensor> {
          throw std::runtime_error("this backward explodes");
        });
        return out;
      });
      a.registry().impl(contextHere, [&a] { return weft::dist_autograd::currentContextId(a); });
      a.registry().impl(backwardHere, [&a](int64_t to) {
        Tensor x = weft::fromVector(std::vector<double>{1.0, 2.0, -3.0}).requiresGrad_();
        Context ctx(a);
        Tensor y = a.call(static_cast<int>(to), scaleByW, x);
        ctx.backward({y.sum()}, weft::dist_autograd::BackwardOptions{.timeout = 5s});
        return ctx.gradients().at(x);
      });
      a.registry().impl(backwardPending, [](int64_t slot, int64_t meet) {
        ++arrived;
        if (!eventually([meet] { return arrived.load() >= meet; }, 10s)) {
          throw weft::TimeoutError("the other handlers did not arrive");
        }
        auto& [ctx, loss] = pendingPasses.at(static_cast<size_t>(slot));
        ctx->backward({loss}, weft::dist_autograd::BackwardOptions{.timeout = 5s});
        return int64_t{1};
      });
    }
    group_.start();
  }

  weft::rpc::Agent& agent(int r) { return group_.agent(r); }
  const Tensor& w(int r) const { return weights_.at(static_cast<size_t>(r)); }
  // A copy of w_r as a fresh leaf, for the local reference computation.
  Tensor localW(int r) const { return w(r).detach().clone().requiresGrad_(); }

  // Waits until no agent holds any distributed autograd state.
  bool drained() {
    return eventually(
        [&] {
          for (int r = 0; r < group_.size(); ++r) {
            if (!weft::dist_autograd::debugCounts(agent(r)).empty()) return false;
          }
          return true;
        },
        5s);
  }

 private:
  AgentGroup group_;
  std::vector<Tensor> weights_;
};

Tensor input() { return weft::fromVector(std::vector<double>{1.0, 2.0, -3.0}).requiresGrad_(); }

}  // namespace datest

using namespace datest;

TEST_SUITE_BEGIN("dist_autograd");

TEST_CASE("a call and its reply are recorded and backward reaches both workers") {
  Job job;
  Tensor x = input();
  Tensor gx, gw1;
  int64_t id = 0;
  {
    Context ctx(job.agent(0));
    id = ctx.id();
    CHECK((static_cast<uint64_t>(id) >> 48) == 0u);
    Tensor y = job.agent(0).call(1, scaleByW, x);
    CHECK(y.requiresGrad());
    CHECK_FALSE(y.isLeaf());
    Tensor loss = (y * y).sum();
    ctx.backward({loss});
    gx = ctx.gradients().at(x);
    gw1 = weft::dist_autograd::gradients(job.agent(1), id).at(job.w(1));
    CHECK_FALSE(x.grad().defined());  // .grad untouched
    ctx.releaseAsync().get();
  }
  Tensor lx = input(), lw = job.localW(1);
  Tensor ly = lx * lw;
  (ly * ly).sum().backward();
  CHECK(weft::allclose(gx, lx.grad(), 1e-12, 0));
  CHECK(weft::allclose(gw1, lw.grad(), 1e-12, 0));
  CHECK(job.drained());
  CHECK_THROWS_AS(weft::dist_autograd::gradients(job.agent(1), id), weft::NotFoundError);
}

TEST_CASE("a reply alone is recorded when the arguments need no grad") {
  Job job;
  Tensor x = weft::fromVector(std::vector<double>{1.0, 2.0, 3.0});
  Context ctx(job.agent(0));
  Tensor y = job.agent(0).call(2, scaleByW, x);
  REQUIRE(y.requiresGrad());
  ctx.backward({y.sum()});
  CHECK(ctx.gradients().empty());
  Tensor g = weft::dist_autograd::gradients(job.agent(2), ctx.id()).at(job.w(2));
  CHECK(weft::allclose(g, x, 1e-12, 0));
}

TEST_CASE("a chain through a handler's nested call matches the local gradient") {
  Job job;
  Tensor x = input();
  Context ctx(job.agent(0));
  // 0 -> 1 (relay) -> 2 (scaleByW) -> 1 -> 0, then back through 0's own weight.
  Tensor y = job.agent(0).call(1, relay, x, int64_t{2});
  Tensor loss = (y * job.w(0)).sum();
  ctx.backward({loss});
  CHECK(weft::dist_autograd::currentContextId(job.agent(0)) == ctx.id());

  Tensor lx = input(), lw0 = job.localW(0), lw2 = job.localW(2);
  Tensor ly = weft::tanh((lx * 2.0) * lw2);
  (ly * lw0).sum().backward();
  auto g0 = ctx.gradients();
  CHECK(weft::allclose(g0.at(x), lx.grad(), 1e-12, 0));
  CHECK(weft::allclose(g0.at(job.w(0)), lw0.grad(), 1e-12, 0));
  CHECK(weft::allclose(weft::dist_autograd::gradients(job.agent(2), ctx.id()).at(job.w(2)), lw2.grad(), 1e-12, 0));
  // Worker 1 has no leaves of its own in this graph, only the context.
  CHECK(weft::dist_autograd::gradients(job.agent(1), ctx.id()).empty());
}

TEST_CASE("a parameter passed as an argument keeps its identity") {
  Job job;
  Tensor x = input();
  Context ctx(job.agent(0));
  // w_0 travels to worker 1 and back inside the product; its gradient lands on worker 0, keyed by w_0.
  Tensor y = job.agent(0).call(1, mulArgs, job.w(0), x);
  Tensor loss = (y * y * job.w(0)).sum();
  ctx.backward({loss});
  Tensor lw = job.localW(0), lx = input();
  Tensor ly = lw * lx;
  (ly * ly * lw).sum().backward();
  CHECK(weft::allclose(ctx.gradients().at(job.w(0)), lw.grad(), 1e-12, 0));
  CHECK(weft::allclose(ctx.gradients().at(x), lx.grad(), 1e-12, 0));
}

TEST_CASE("handlers run inside the caller's context") {
  Job job;
  CHECK(job.agent(0).call(1, contextHere) == 0);
  Context ctx(job.agent(0));
  CHECK(job.agent(0).call(1, contextHere) == ctx.id());
}

TEST_CASE("retainGraph allows another pass and gradients accumulate") {
  Job job;
  Tensor x = input();
  Context ctx(job.agent(0));
  Tensor loss = job.agent(0).call(1, scaleByW, x).sum();
  ctx.backward({loss}, true);
  ctx.backward({loss}, true);
  ctx.backward({loss});
  Tensor g = weft::dist_autograd::gradients(job.agent(1), ctx.id()).at(job.w(1));
  CHECK(weft::allclose(g, x.detach() * 3.0, 1e-12, 0));
  CHECK(weft::allclose(ctx.gradients().at(x), job.w(1).detach() * 3.0, 1e-12, 0));
  CHECK_THROWS_WITH_AS(ctx.backward({loss}), doctest::Contains("a second time"), weft::StateError);
}

TEST_CASE("a remote backward that throws fails backward naming the worker") {
  Job job;
  Tensor x = input();
  Context ctx(job.agent(0));
  Tensor y = job.agent(0).call(2, explodeInBackward, x);
  try {
    ctx.backward({y.sum()});
    FAIL("backward succeeded");
  } catch (const weft::RemoteError& e) {
    CHECK(std::string(e.what()).find("this backward explodes") != std::string::npos);
    CHECK(e.worker() == job.agent(2).name());
  }
}

TEST_CASE("RRef creation and toHere are recorded") {
  Job job;
  Tensor x = input();
  Context ctx(job.agent(0));
  weft::RRef<Tensor> r = job.agent(0).remote(1, scaleByW, x);  // x -> 1, kept there
  Tensor y = r.toHere();                                       // 1 -> 0
  Tensor loss = (y * y).sum();
  ctx.backward({loss});
  Tensor lx = input(), lw = job.localW(1);
  Tensor ly = lx * lw;
  (ly * ly).sum().backward();
  CHECK(weft::allclose(ctx.gradients().at(x), lx.grad(), 1e-12, 0));
  CHECK(weft::allclose(weft::dist_autograd::gradients(job.agent(1), ctx.id()).at(job.w(1)), lw.grad(), 1e-12, 0));
}

TEST_CASE("contexts do not nest and need a started agent") {
  Job job(2);
  Context ctx(job.agent(0));
  CHECK_THROWS_AS(Context(job.agent(0)), weft::StateError);
  CHECK_THROWS_AS(Context(job.agent(1)), weft::StateError);
  CHECK_THROWS_AS(ctx.backward({input()}), weft::InvalidArgumentError);  // a leaf without history is fine, a 3-vector is not
}

TEST_CASE("leaving a context releases it on every worker it reached, transitively") {
  Job job;
  {
    Context ctx(job.agent(0));
    Tensor y = job.agent(0).call(1, relay, input(), int64_t{2});  // reaches 2 through 1 only
    ctx.backward({y.sum()});
    CHECK(weft::dist_autograd::debugCounts(job.agent(2)).contexts == 1);
  }
  // Released in a batch at the latest ~50 ms later.
  CHECK(job.drained());
  {
    Context ctx(job.agent(0));
    job.agent(0).call(1, relay, input(), int64_t{2});
    ctx.releaseAsync().get();
    for (int r = 0; r < 3; ++r) CHECK(weft::dist_autograd::debugCounts(job.agent(r)).empty());
  }
}

TEST_CASE("malformed autograd fields from a peer are protocol errors, not crashes") {
  Job job(2);
  weft::rpc::Agent& a = job.agent(0);
  auto send = [&](int64_t contextId, int64_t messageId, uint32_t n, uint32_t slot) {
    return a.callWith<Tensor>(1, mulArgs.name(), mulArgs.id(), {.timeout = 5000ms},
                              [&](weft::rpc::EncodeContext& enc, weft::rpc::wire::Call::Builder call) {
                                Tensor t = weft::fromVector(std::vector<double>{1.0, 2.0}).requiresGrad_();
                                weft::rpc::encodeArguments(enc, call.initArgs(2), t, t);
                                auto info = call.initAutograd();
                                info.setContextId(contextId);
                                info.setMessageId(messageId);
                                info.setGradTensors(n);
                                // Point the second descriptor at a slot of our choosing.
                                call.getArgs()[1].getTensor().setGradSlot(slot);
                              });
  };
  const int64_t good = int64_t{1} << 48 | 7;  // rank 1's counter 7: well formed
  SUBCASE("a gradient slot out of range fails the call with a ProtocolError") {
    CHECK_THROWS_WITH_AS(send(good, good + 1, 2, 9).get(), doctest::Contains("gradient slot 9"), weft::ProtocolError);
    CHECK(a.isAlive(1));
  }
  SUBCASE("a context id naming no worker closes the connection") {
    CHECK_THROWS(send(int64_t{77} << 48 | 1, 0, 0, 0).get());
    CHECK(eventually([&] { return !a.isAlive(1); }, 5s));
  }
  SUBCASE("a message id without tensors closes the connection") {
    CHECK_THROWS(send(good, good + 1, 0, 0).get());
    CHECK(eventually([&] { return !a.isAlive(1); }, 5s));
  }
}

TEST_CASE("a context whose peer died is released with a clear error") {
  Job job(3);
  Context ctx(job.agent(0));
  Tensor y = job.agent(0).call(1, scaleByW, input());
  job.agent(1).shutdown({.graceful = false});
  CHECK(eventually([&] { return !job.agent(0).isAlive(1); }, 5s));
  CHECK_THROWS_WITH_AS(ctx.backward({y.sum()}), doctest::Contains("worker1"), weft::DisconnectedError);
  CHECK_THROWS_AS(ctx.gradients(), weft::DisconnectedError);
  CHECK(weft::dist_autograd::debugCounts(job.agent(0)).contexts == 0);
}

TEST_CASE("messages per pass are one backward request per recv node") {
  Job job(2);
  Context ctx(job.agent(0));
  auto before = weft::dist_autograd::messageCounts(job.agent(0)).backwardRequests +
                weft::dist_autograd::messageCounts(job.agent(1)).backwardRequests;
  Tensor y = job.agent(0).call(1, mulArgs, input(), input());  // one recv node on each side
  ctx.backward({y.sum()});
  auto after = weft::dist_autograd::messageCounts(job.agent(0)).backwardRequests +
               weft::dist_autograd::messageCounts(job.agent(1)).backwardRequests;
  CHECK(after - before == 2);
}

TEST_CASE("a tensor also sent in a call whose result is unused still gets its gradient") {
  Job job(2);
  Tensor x = input();
  Context ctx(job.agent(0));
  Tensor h = x * job.w(0);
  job.agent(0).call(1, scaleByW, h);  // a send node the pass never reaches
  ctx.backward({(h * h).sum()});
  Tensor lx = input(), lw = job.localW(0);
  Tensor lh = lx * lw;
  (lh * lh).sum().backward();
  CHECK(weft::allclose(ctx.gradients().at(x), lx.grad(), 1e-12, 0));
  CHECK(weft::allclose(ctx.gradients().at(job.w(0)), lw.grad(), 1e-12, 0));
}

TEST_CASE("a callback queued during backward hands its gradient to the context") {
  Job job(2);
  Tensor x = input();
  Tensor w = job.w(0);
  int id = w.gradAccumulator()->registerPreHook([&](std::vector<Tensor>& grads) {
    Tensor g = grads[0];
    grads[0] = Tensor();
    weft::autograd::queueCallback([w, g] { weft::autograd::accumulateLeafGradient(w, g * 2.0); });
  });
  Context ctx(job.agent(0));
  Tensor y = job.agent(0).call(1, scaleByW, x * w);
  ctx.backward({y.sum()});
  w.gradAccumulator()->removeHook(id);
  CHECK(weft::allclose(ctx.gradients().at(w), x.detach() * job.w(1).detach() * 2.0, 1e-12, 0));
  CHECK_FALSE(w.grad().defined());
}

namespace {

// Installs a settled hook (dist_autograd.h, detail) for one test and removes it at the end.
class SettledHook {
 public:
  explicit SettledHook(std::function<void(int64_t)> hook) {
    weft::dist_autograd::detail::setBackwardSettledHook(std::move(hook));
  }
  ~SettledHook() { weft::dist_autograd::detail::setBackwardSettledHook({}); }
  SettledHook(const SettledHook&) = delete;
  SettledHook& operator=(const SettledHook&) = delete;
};

}  // namespace

TEST_CASE("a peer dying between two steps of backward fails it with DisconnectedError naming "
          "the peer") {
  Job job(2);
  Context ctx(job.agent(0));
  Tensor y = job.agent(0).call(1, scaleByW, input());
  const int64_t id = ctx.id();
  bool fired = false;
  bool droppedHere = false;
  // Every request of the pass has been answered; worker1 now dies and worker0's loop thread
  // releases the context before the pass looks at it again.
  SettledHook hook([&](int64_t c) {
    if (c != id || fired) return;
    fired = true;
    job.agent(1).shutdown({.graceful = false});
    droppedHere = eventually([&] { return weft::dist_autograd::debugCounts(job.agent(0)).contexts == 0; }, 5s);
  });
  CHECK_THROWS_WITH_AS(ctx.backward({y.sum()}), doctest::Contains("worker1"), weft::DisconnectedError);
  CHECK(fired);
  CHECK(droppedHere);
  CHECK_THROWS_WITH_AS(ctx.gradients(), doctest::Contains("worker1"), weft::DisconnectedError);
  CHECK_THROWS_AS(ctx.backward({y.sum()}), weft::DisconnectedError);
}

TEST_CASE("backward runs in a handler of a worker with one handler thread, its pass needing "
          "that worker") {
  Job job(3, [](int, weft::rpc::Options& o) { o.numWorkerThreads = 1; });
  SUBCASE("one handler") {
    Tensor g = job.agent(0).call(1, backwardHere, int64_t{2});
    CHECK(weft::allclose(g, job.w(2).detach(), 1e-12, 0));
  }
  SUBCASE("two handlers on two workers at once, each pass needing the other's only handler thread") {
    // Context a on worker1 sent x1 to worker2, context b on worker2 sent x2 to worker1 (each
    // made on a thread of its own). Then a handler on each worker runs one of the passes: a's
    // send node on worker2 waits for the handler thread that runs b there, and the reverse.
    std::unique_ptr<Context> a, b;
    Tensor x1 = input(), x2 = input(), loss1, loss2;
    std::thread([&] {
      a = std::make_unique<Context>(job.agent(1));
      loss1 = job.agent(1).call(2, scaleByW, x1).sum();
    }).join();
    std::thread([&] {
      b = std::make_unique<Context>(job.agent(2));
      loss2 = job.agent(2).call(1, scaleByW, x2).sum();
    }).join();
    arrived = 0;
    pendingPasses = {{a.get(), loss1}, {b.get(), loss2}};
    auto on1 = job.agent(0).callAsync(1, backwardPending, int64_t{0}, int64_t{2});
    auto on2 = job.agent(0).callAsync(2, backwardPending, int64_t{1}, int64_t{2});
    CHECK(on1.get() == 1);
    CHECK(on2.get() == 1);
    pendingPasses.clear();
    CHECK(weft::allclose(a->gradients().at(x1), job.w(2).detach(), 1e-12, 0));
    CHECK(weft::allclose(b->gradients().at(x2), job.w(1).detach(), 1e-12, 0));
  }
  CHECK(job.drained());
}

TEST_CASE("backward on the agent's loop thread is a StateError, and the context stays usable") {
  Job job(2);
  Tensor x = input();
  Context ctx(job.agent(0));
  Tensor y = job.agent(0).call(1, scaleByW, x);
  CHECK_THROWS_WITH_AS(job.agent(0).loop().call([&] { ctx.backward({y.sum()}); }), doctest::Contains("loop thread"),
                       weft::StateError);
  ctx.backward({y.sum()});
  CHECK(weft::allclose(ctx.gradients().at(x), job.w(1).detach(), 1e-12, 0));
}

TEST_CASE("backward from inside a backward pass is a StateError") {
  Job job(2);
  Tensor x = input();
  Tensor w = job.w(0);
  Context ctx(job.agent(0));
  Tensor loss = job.agent(0).call(1, scaleByW, x * w).sum();
  std::string inner;
  int id = w.gradAccumulator()->registerPreHook([&](std::vector<Tensor>&) {
    try {
      ctx.backward({loss}, true);
      inner = "returned";
    } catch (const weft::StateError& e) {
      inner = e.what();
    }
  });
  ctx.backward({loss});
  w.gradAccumulator()->removeHook(id);
  CHECK(weft::testing::contains(inner, "inside a backward pass"));
  // The outer pass completed: w's gradient is x * w1.
  CHECK(weft::allclose(ctx.gradients().at(w), x.detach() * job.w(1).detach(), 1e-12, 0));
}

TEST_CASE("a second backward on a context whose pass is running is a StateError") {
  Job job(2);
  Tensor x = input();
  Context ctx(job.agent(0));
  Tensor y = job.agent(0).call(1, scaleByW, x);
  const int64_t id = ctx.id();
  std::string second;
  SettledHook hook([&](int64_t c) {
    if (c != id || !second.empty()) return;
    std::thread other([&] {
      try {
        ctx.backward({y.sum()}, true);
        second = "returned";
      } catch (const weft::StateError& e) {
        second = e.what();
      }
    });
    other.join();
  });
  ctx.backward({y.sum()}, true);
  CHECK(weft::testing::contains(second, "already running"));
  CHECK(weft::allclose(ctx.gradients().at(x), job.w(1).detach(), 1e-12, 0));
}

TEST_CASE("a local backward reaching a received tensor's recv node is a StateError") {
  Job job(2);
  Tensor x = input();
  Context ctx(job.agent(0));
  Tensor y = job.agent(0).call(1, scaleByW, x);
  CHECK_THROWS_WITH_AS(y.sum().backward(), doctest::Contains("a local backward"), weft::StateError);
  // The context is untouched: its own backward still gives x its gradient.
  ctx.backward({y.sum()});
  CHECK(weft::allclose(ctx.gradients().at(x), job.w(1).detach(), 1e-12, 0));
}

TEST_SUITE_END();
