// A program for the multiprocess tests of distributed autograd
// (tests/dist_autograd/dist_autograd_mp_test.cpp): one process of a weft job, which finds its
// place through rpc::Options::fromEnv and plays the part of its rank in the job it is given. It
// prints one line per event, in a form the tests parse ("rank R <phrase> key value ...").
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=3 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 dist_autograd_worker graphs
//
// Every worker holds one parameter, a 4x4 float64 leaf drawn from a generator seeded with
// 1000 + rank, and serves functions that compute with it (tanh(x @ w) and variations). Rank 0
// rebuilds every worker's parameter from the same seeds, so it can run each distributed
// computation again locally, in one process, with plain autograd::grad, and compare.
//
// Jobs (world size in brackets):
//   graphs [3] rank 0 runs the scenarios below in sequence, each in its own Context, and prints
//              "rank 0 scenario <name> ok grads <n> maxrel <r> ... drained_ms <ms>" or
//              "rank 0 scenario <name> failed <ErrorType>: <message>". "grads" counts the
//              gradients compared with the local reference (on every worker: each reads its own
//              context's gradients through dist_autograd::gradients in the registered function
//              dist_autograd_worker.report), "maxrel" is the largest relative difference among them (each
//              must be at most 1e-6), "drained_ms" how long after the context ended every
//              worker's dist_autograd::debugCounts was empty (bounded by 5 s):
//                chain        0 -> 1 -> 2 -> 0 through nested calls, the loss on 0; released with
//                             release().get(), after which every worker is empty at once
//                diamond      one tensor sent to 1 and 2 at once, the results combined on 0
//                roots        backward({l1, l2, l3}) with roots from 1, 2 and 0
//                twice        a tensor sent to 1 twice, 1's result sent back to 1, one tensor as
//                             both arguments of one call
//                toHere       remote(1, layer, x) and two toHere() of the result
//                later        a remote object's results kept on 1 (RRef.remote), used there
//                             again and fetched after other calls
//                param        rank 0's parameter passed to 1 as an argument
//                retain       two backward passes with retainGraph, a third without (3x the
//                             gradients), then a fourth that fails ("second_error <desc>")
//                second-remote the root is 1's result itself; a second backward fails too
//                remote-error a backward rule on 1 throws; backward fails naming worker1
//                after-errors the diamond again, with fresh tensors
//              then "rank 0 scenarios failed <n> seconds <s>".
//   kill   [3] rank 0 builds two contexts that reach ranks 1 and 2; a backward pass of the first
//              stalls in a rule on rank 1, which prints "rank 1 backward stalled"; the test kills
//              rank 1 with SIGKILL. Rank 0 prints "rank 0 pending backward at_ns <steady ns>
//              <ErrorType>: <message>", then for each later use
//              "rank 0 later <what> in_us <us> <ErrorType>: <message>".
//   settled-kill [2] rank 0 runs a backward pass through rank 1; once rank 1 has answered every
//              request (the settled hook, dist_autograd.h), rank 0 prints "rank 0 settled" and
//              waits (bounded) until its layer dropped the context: the test kills rank 1 then.
//              Rank 0 prints "rank 0 backward <ErrorType>: <message>" (or "rank 0 backward ok")
//              and "rank 0 dropped <0|1>", then "rank 0 later gradients in_us <us> <ErrorType>:
//              <message>".
// Every rank that ends normally meets the others in a store barrier, waits (bounded) until its
// distributed autograd state is empty, and prints
//   "rank R counts contexts 0 sendNodes 0 pendingReleases 0"
//   "rank R shutdown graceful <0|1> missing <names|-> seconds <s>"
// Every rank first prints "rank R pid P started". Every wait is bounded. A wrong result throws:
// one line on stderr, exit status 1.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "dist_autograd/dist_autograd.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "rref/rref.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

#include "mp_worker.h"

namespace daworker {

using namespace std::chrono_literals;
using weft::Error;
using weft::Future;
using weft::RRef;
using weft::Tensor;
using weft::rpc::Agent;
using Clock = std::chrono::steady_clock;
namespace da = weft::dist_autograd;
using namespace weft::testing;  // tests/mp_worker.h: say, prefix, describe, require, waitUntil, ...

constexpr int64_t kRows = 3;
constexpr int64_t kWidth = 4;
constexpr uint64_t kWeightSeed = 1000;
constexpr int64_t kAffineSeed = 2001;
constexpr double kTolerance = 1e-6;

long long elapsedUs(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - since).count();
}

long long elapsedMs(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

bool startsWith(const std::string& s, const std::string& head) { return s.rfind(head, 0) == 0; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs `use`, which must fail; returns how it failed.
template <class F>
std::string expectFailure(const std::string& what, F&& use) {
  try {
    use();
  } catch (...) {
    return describe(std::current_exception());
  }
  throw Error(what + ": succeeded although it must fail");
}

template <class T>
T getWithin(const Future<T>& f, std::chrono::milliseconds timeout, const std::string& what) {
  if (!f.waitFor(timeout)) throw Error(what + ": not complete after " + std::to_string(timeout.count()) + " ms");
  return f.get();
}

// ---- parameters and the computations ------------------------------------------------------------

// A kWidth x kWidth float64 leaf that requires grad, the same for the same seed in every process.
Tensor makeWeight(uint64_t seed) {
  weft::Generator gen(seed);
  Tensor w = weft::randn({kWidth, kWidth}, {.dtype = weft::DType::Float64}, &gen) * 0.5;
  w.requiresGrad_();
  return w;
}

Tensor makeInput(uint64_t seed) {
  weft::Generator gen(seed);
  Tensor x = weft::randn({kRows, kWidth}, {.dtype = weft::DType::Float64}, &gen);
  x.requiresGrad_();
  return x;
}

uint64_t weightSeed(int rank) { return kWeightSeed + static_cast<uint64_t>(rank); }

Tensor layer(const Tensor& x, const Tensor& w) { return weft::tanh(weft::matmul(x, w)); }

// What the program's handlers and remote objects share. Remote objects are built by the RRef
// layer with their declared constructor's arguments only; they reach this state through gState.
struct State {
  Agent* agent = nullptr;
  int rank = 0;
  Tensor weight;  // this worker's parameter
  std::mutex mutex;
  Tensor affineWeight;  // the parameter of the last Affine built here, guarded by mutex
};
State* gState = nullptr;

// A remote object with its own parameter, built on another worker through agent.remote<Affine>.
class Affine {
 public:
  explicit Affine(int64_t seed) : weight_(makeWeight(static_cast<uint64_t>(seed))) {
    std::lock_guard<std::mutex> lock(gState->mutex);
    gState->affineWeight = weight_;
  }
  Tensor forward(Tensor x) { return layer(x, weight_); }
  // Continues the graph of a result this worker holds: h is owned here.
  Tensor forwardHeld(RRef<Tensor> h) { return weft::sigmoid(weft::matmul(*h.localValue(), weight_)); }
  int64_t width() const { return weight_.size(0); }

 private:
  Tensor weight_;
};
WEFT_REMOTE_CLASS(Affine, WEFT_CONSTRUCTORS((int64_t)), forward, forwardHeld, width);

// What one worker holds in a context, as the initiator asks for it.
struct GradReport {
  int64_t entries = 0;      // leaves with a gradient in the context on this worker
  Tensor weight;            // the gradient of the worker's parameter, or none
  Tensor affine;            // the gradient of the last Affine's parameter built here, or none
  bool dotGradSet = false;  // whether .grad() of either parameter was set (it must not be)
};
WEFT_CODEC_FIELDS(GradReport, entries, weight, affine, dotGradSet);

inline const weft::Function<Tensor(Tensor)> layerFn{"dist_autograd_worker.layer"};
inline const weft::Function<Tensor(Tensor, std::vector<int64_t>)> hopFn{"dist_autograd_worker.hop"};
inline const weft::Function<Tensor(Tensor, Tensor)> combineFn{"dist_autograd_worker.combine"};
inline const weft::Function<Tensor(Tensor)> layerSumFn{"dist_autograd_worker.layerSum"};
inline const weft::Function<Tensor(Tensor, Tensor)> useParamFn{"dist_autograd_worker.useParam"};
inline const weft::Function<Tensor(Tensor)> explodeFn{"dist_autograd_worker.explode"};
inline const weft::Function<Tensor(Tensor)> stallFn{"dist_autograd_worker.stall"};
inline const weft::Function<GradReport(int64_t)> reportFn{"dist_autograd_worker.report"};
inline const weft::Function<std::vector<uint64_t>()> countsFn{"dist_autograd_worker.counts"};

// 2x, recorded as an op whose backward rule throws.
Tensor explodingOp(const Tensor& x) {
  Tensor out;
  {
    weft::NoGradGuard noGrad;
    out = x.detach() * 2.0;
  }
  weft::recordOp("ExplodingOp", {x}, {out}, [](const std::vector<Tensor>&) -> std::vector<Tensor> {
    throw std::runtime_error("the backward of ExplodingOp exploded on purpose");
  });
  return out;
}

// 2x, recorded as an op whose backward rule announces itself and blocks for a minute.
Tensor stallingOp(const Tensor& x, int rank) {
  Tensor out;
  {
    weft::NoGradGuard noGrad;
    out = x.detach() * 2.0;
  }
  weft::recordOp("StallingOp", {x}, {out}, [rank](const std::vector<Tensor>& g) -> std::vector<Tensor> {
    say(prefix(rank) + "backward stalled");
    std::this_thread::sleep_for(60s);
    return {g[0] * 2.0};
  });
  return out;
}

std::vector<uint64_t> countsVector(const da::DebugCounts& c) { return {c.contexts, c.sendNodes, c.pendingReleases}; }

std::string countsLine(const std::vector<uint64_t>& c) {
  return "contexts " + std::to_string(c.at(0)) + " sendNodes " + std::to_string(c.at(1)) + " pendingReleases " +
         std::to_string(c.at(2));
}

bool countsEmpty(const std::vector<uint64_t>& c) { return c.at(0) == 0 && c.at(1) == 0 && c.at(2) == 0; }

void bindAll(Agent& agent, State& st) {
  auto& reg = agent.registry();
  reg.impl(layerFn, [&st](Tensor x) { return layer(x, st.weight); });
  // Computes with this worker's parameter and passes the result on along `route`; the last
  // worker's result comes back through every hop.
  reg.impl(hopFn, [&agent, &st](Tensor x, std::vector<int64_t> route) {
    Tensor y = layer(x, st.weight);
    if (route.empty()) return y;
    int next = static_cast<int>(route.front());
    route.erase(route.begin());
    return agent.call(next, hopFn, y, route);
  });
  reg.impl(combineFn, [&st](Tensor a, Tensor b) { return layer(a, st.weight) * b; });
  reg.impl(layerSumFn, [&st](Tensor x) { return weft::sum(weft::square(layer(x, st.weight))); });
  reg.impl(useParamFn, [&st](Tensor x, Tensor p) { return weft::matmul(layer(x, st.weight), p); });
  reg.impl(explodeFn, [](Tensor x) { return explodingOp(x); });
  reg.impl(stallFn, [&st](Tensor x) { return stallingOp(x, st.rank); });
  reg.impl(reportFn, [&agent, &st](int64_t contextId) {
    da::GradientMap grads = da::gradients(agent, contextId);
    GradReport r;
    r.entries = static_cast<int64_t>(grads.size());
    Tensor g = grads.get(st.weight);
    if (g.defined()) r.weight = g.clone();
    std::lock_guard<std::mutex> lock(st.mutex);
    if (st.affineWeight.defined()) {
      Tensor a = grads.get(st.affineWeight);
      if (a.defined()) r.affine = a.clone();
    }
    r.dotGradSet = st.weight.grad().defined() || (st.affineWeight.defined() && st.affineWeight.grad().defined());
    return r;
  });
  reg.impl(countsFn, [&agent]() { return countsVector(da::debugCounts(agent)); });
}

// ---- rank 0's checks ----------------------------------------------------------------------------

// Compares gradients with the local reference and keeps the largest relative difference.
class Comparison {
 public:
  void close(const std::string& what, const Tensor& got, const Tensor& want) {
    require(got.defined(), what + ": no gradient");
    require(want.defined(), what + ": no reference gradient");
    require(got.dtype() == weft::DType::Float64, what + ": the gradient is not float64");
    require(got.shape() == want.shape(), what + ": the gradient's shape differs from the reference's");
    Tensor a = got.detach().contiguous();
    Tensor b = want.detach().contiguous();
    const double* pa = a.data<double>();
    const double* pb = b.data<double>();
    double worst = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      double rel = std::abs(pa[i] - pb[i]) / std::max(std::abs(pb[i]), 1e-9);
      if (!(rel <= worst)) worst = rel;  // NaN propagates
    }
    if (!(worst <= kTolerance)) {
      std::ostringstream os;
      os << what << ": relative difference " << worst << "; distributed " << a << " local " << b;
      throw Error(os.str());
    }
    ++count_;
    maxRel_ = std::max(maxRel_, worst);
  }

  std::string summary() const {
    std::ostringstream os;
    os << "grads " << count_ << " maxrel " << maxRel_;
    return os.str();
  }

 private:
  int count_ = 0;
  double maxRel_ = 0;
};

// The parameters of workers 0..2 as rank 0 rebuilds them for the local reference.
std::vector<Tensor> referenceWeights() {
  std::vector<Tensor> w;
  for (int r = 0; r < 3; ++r) w.push_back(makeWeight(weightSeed(r)));
  return w;
}

// Asks worker `rank` for its gradients in the context and compares them; an undefined `want`
// means that worker must hold no gradient for that parameter.
void checkReport(Agent& agent, int rank, int64_t contextId, Comparison& cmp, int64_t entries, const Tensor& wantWeight,
                 const Tensor& wantAffine = Tensor()) {
  const std::string who = "worker" + std::to_string(rank);
  GradReport r = agent.call(rank, reportFn, contextId);
  require(r.entries == entries,
          who + " holds " + std::to_string(r.entries) + " gradients in the context, not " + std::to_string(entries));
  if (wantWeight.defined()) {
    cmp.close("the parameter of " + who, r.weight, wantWeight);
  } else {
    require(!r.weight.defined(), who + " holds a gradient for its unused parameter");
  }
  if (wantAffine.defined()) {
    cmp.close("the Affine parameter on " + who, r.affine, wantAffine);
  } else {
    require(!r.affine.defined(), who + " holds a gradient for an Affine parameter");
  }
  require(!r.dotGradSet, who + ": .grad() of a parameter was set");
}

void checkDotGradUntouched(const State& st, const Tensor& x) {
  require(!x.grad().defined(), "worker0: .grad() of the input was set");
  require(!st.weight.grad().defined(), "worker0: .grad() of its parameter was set");
}

// Every worker's counts: "" when all are empty, else who holds what.
std::string countsEverywhere(Agent& agent) {
  std::string left;
  for (int r = 0; r < agent.worldSize(); ++r) {
    if (!agent.isAlive(r)) continue;
    std::vector<uint64_t> c = r == agent.rank() ? countsVector(da::debugCounts(agent)) : agent.call(r, countsFn);
    if (!countsEmpty(c)) left += (left.empty() ? "" : "; ") + ("worker" + std::to_string(r) + " " + countsLine(c));
  }
  return left;
}

// After a context ended: sends the queued releases, then waits (bounded) until every worker holds
// no distributed autograd state.
std::string drainEverywhere(Agent& agent) {
  auto began = Clock::now();
  getWithin(da::flushReleasesAsync(agent), 5000ms, "flushReleasesAsync");
  std::string left;
  bool empty = waitUntil(
      [&] {
        left = countsEverywhere(agent);
        return left.empty();
      },
      5000ms, 2ms);
  require(empty, "5 s after the context ended: " + left);
  return " drained_ms " + std::to_string(elapsedMs(began));
}

// A second backward must fail, promptly, with StateError or RemoteError naming a node.
std::string checkSecondBackward(da::Context& ctx, const Tensor& root) {
  auto began = Clock::now();
  std::string error = expectFailure("a backward after one without retainGraph", [&] { ctx.backward({root}); });
  long long ms = elapsedMs(began);
  require(startsWith(error, "StateError: ") || startsWith(error, "RemoteError: "),
          "a second backward failed with " + error);
  require(contains(error, "node"), "the error of a second backward names no node: " + error);
  require(ms < 5000, "a second backward took " + std::to_string(ms) + " ms to fail");
  return " second_ms " + std::to_string(ms) + " second_error " + error;
}

// ---- the graphs ---------------------------------------------------------------------------------

// 0 -> 1 -> 2 -> 0 through nested calls (each hop computes with its own parameter), the loss on 0.
std::string chainScenario(Agent& agent, State& st) {
  std::vector<Tensor> w = referenceWeights();
  Tensor xr = makeInput(11);
  Tensor lossRef = weft::sum(weft::square(layer(layer(layer(xr, w[1]), w[2]), w[0])));
  std::vector<Tensor> want = weft::autograd::grad({lossRef}, {xr, w[0], w[1], w[2]});

  Comparison cmp;
  Tensor x = makeInput(11);
  da::Context ctx(agent);
  Tensor y = agent.call(1, hopFn, x, std::vector<int64_t>{2, 0});
  Tensor loss = weft::sum(weft::square(y));
  ctx.backward({loss});
  da::GradientMap mine = ctx.gradients();
  require(mine.size() == 2, "worker0 holds " + std::to_string(mine.size()) + " gradients, not 2 (input, parameter)");
  cmp.close("the input on worker0", mine.at(x), want[0]);
  cmp.close("the parameter of worker0 (used in a handler)", mine.at(st.weight), want[1]);
  da::GradientMap byId = da::gradients(agent, ctx.id());
  cmp.close("the input on worker0, by context id", byId.at(x), want[0]);
  checkReport(agent, 1, ctx.id(), cmp, 1, want[2]);
  checkReport(agent, 2, ctx.id(), cmp, 1, want[3]);
  checkDotGradUntouched(st, x);

  // Released explicitly: once the future completes, no worker the context reached holds it.
  getWithin(ctx.releaseAsync(), 5000ms, "release()");
  std::string left = countsEverywhere(agent);
  require(left.empty(), "after release().get(): " + left);
  std::string gone = expectFailure("gradients after release", [&] { da::gradients(agent, ctx.id()); });
  require(startsWith(gone, "NotFoundError: "), "gradients of a released context: " + gone);
  return cmp.summary() + " released_empty 1";
}

std::string diamondScenario(Agent& agent, State& st, uint64_t seed) {
  std::vector<Tensor> w = referenceWeights();
  Tensor xr = makeInput(seed);
  Tensor lossRef = weft::sum(layer(xr, w[1]) * layer(xr, w[2]));
  std::vector<Tensor> want = weft::autograd::grad({lossRef}, {xr, w[1], w[2]});

  Comparison cmp;
  Tensor x = makeInput(seed);
  {
    da::Context ctx(agent);
    Future<Tensor> left = agent.callAsync(1, layerFn, x);
    Future<Tensor> right = agent.callAsync(2, layerFn, x);
    Tensor loss = weft::sum(getWithin(left, 10000ms, "layer on worker1") * getWithin(right, 10000ms, "layer on worker2"));
    ctx.backward({loss});
    da::GradientMap mine = ctx.gradients();
    require(mine.size() == 1, "worker0 holds " + std::to_string(mine.size()) + " gradients, not 1 (the input)");
    cmp.close("the input on worker0", mine.at(x), want[0]);
    checkReport(agent, 1, ctx.id(), cmp, 1, want[1]);
    checkReport(agent, 2, ctx.id(), cmp, 1, want[2]);
    checkDotGradUntouched(st, x);
  }
  return cmp.summary() + drainEverywhere(agent);
}

std::string rootsScenario(Agent& agent, State& st) {
  std::vector<Tensor> w = referenceWeights();
  Tensor xr = makeInput(13);
  std::vector<Tensor> rootsRef = {weft::sum(layer(xr, w[1])), weft::sum(weft::square(layer(xr * 2.0, w[2]))),
                                  weft::sum(layer(xr, w[0]))};
  std::vector<Tensor> want = weft::autograd::grad(rootsRef, {xr, w[0], w[1], w[2]});

  Comparison cmp;
  Tensor x = makeInput(13);
  {
    da::Context ctx(agent);
    Tensor l1 = weft::sum(agent.call(1, layerFn, x));
    Tensor l2 = weft::sum(weft::square(agent.call(2, layerFn, x * 2.0)));
    Tensor l3 = weft::sum(layer(x, st.weight));
    ctx.backward({l1, l2, l3});
    da::GradientMap mine = ctx.gradients();
    require(mine.size() == 2, "worker0 holds " + std::to_string(mine.size()) + " gradients, not 2");
    cmp.close("the input on worker0", mine.at(x), want[0]);
    cmp.close("the parameter of worker0", mine.at(st.weight), want[1]);
    checkReport(agent, 1, ctx.id(), cmp, 1, want[2]);
    checkReport(agent, 2, ctx.id(), cmp, 1, want[3]);
    checkDotGradUntouched(st, x);
  }
  return cmp.summary() + drainEverywhere(agent);
}

// x goes to worker1 in three calls (once as both arguments of one call), and worker1's results
// go back to it twice.
std::string twiceScenario(Agent& agent, State& st) {
  std::vector<Tensor> w = referenceWeights();
  Tensor xr = makeInput(14);
  Tensor y1r = layer(xr, w[1]);
  Tensor y2r = layer(y1r + xr, w[1]);
  Tensor y3r = layer(y2r, w[1]) * y2r;
  Tensor y4r = layer(xr, w[1]) * xr;
  Tensor lossRef = weft::sum(y3r) + weft::sum(weft::square(y1r)) + weft::sum(y4r);
  std::vector<Tensor> want = weft::autograd::grad({lossRef}, {xr, w[1]});

  Comparison cmp;
  Tensor x = makeInput(14);
  {
    da::Context ctx(agent);
    Tensor y1 = agent.call(1, layerFn, x);
    Tensor y2 = agent.call(1, layerFn, y1 + x);
    Tensor y3 = agent.call(1, combineFn, y2, y2);
    Tensor y4 = agent.call(1, combineFn, x, x);
    Tensor loss = weft::sum(y3) + weft::sum(weft::square(y1)) + weft::sum(y4);
    ctx.backward({loss});
    da::GradientMap mine = ctx.gradients();
    require(mine.size() == 1, "worker0 holds " + std::to_string(mine.size()) + " gradients, not 1");
    cmp.close("the input on worker0", mine.at(x), want[0]);
    checkReport(agent, 1, ctx.id(), cmp, 1, want[1]);
    checkDotGradUntouched(st, x);
  }
  return cmp.summary() + drainEverywhere(agent);
}

std::string toHereScenario(Agent& agent, State& st) {
  std::vector<Tensor> w = referenceWeights();
  Tensor xr = makeInput(15);
  Tensor hr = layer(xr, w[1]);
  Tensor lossRef = weft::sum(hr * hr) + weft::sum(hr);
  std::vector<Tensor> want = weft::autograd::grad({lossRef}, {xr, w[1]});

  Comparison cmp;
  Tensor x = makeInput(15);
  {
    da::Context ctx(agent);
    RRef<Tensor> r = agent.remote(1, layerFn, x);
    Tensor t1 = r.toHere(10000ms);
    Tensor t2 = r.toHere(10000ms);
    Tensor loss = weft::sum(t1 * t2) + weft::sum(t1);
    ctx.backward({loss});
    da::GradientMap mine = ctx.gradients();
    require(mine.size() == 1, "worker0 holds " + std::to_string(mine.size()) + " gradients, not 1");
    cmp.close("the input on worker0", mine.at(x), want[0]);
    checkReport(agent, 1, ctx.id(), cmp, 1, want[1]);
    checkDotGradUntouched(st, x);
  }
  return cmp.summary() + drainEverywhere(agent);
}

// Results kept on worker1 by a remote object, used there again and fetched after other calls.
std::string laterScenario(Agent& agent, State& st) {
  std::vector<Tensor> w = referenceWeights();
  Tensor v = makeWeight(static_cast<uint64_t>(kAffineSeed));
  Tensor xr = makeInput(16);
  Tensor hr = layer(xr, v);
  Tensor ur = weft::sigmoid(layer(xr * 3.0, w[2]));
  Tensor tr = weft::sigmoid(weft::matmul(hr, v));
  Tensor lossRef = weft::sum(tr * ur) + weft::sum(hr);
  std::vector<Tensor> want = weft::autograd::grad({lossRef}, {xr, v, w[2]});

  Comparison cmp;
  Tensor x = makeInput(16);
  RRef<Affine> obj = agent.remote<Affine>(1, kAffineSeed);
  require(obj.rpcSync(&Affine::width) == kWidth, "Affine::width");
  {
    da::Context ctx(agent);
    RRef<Tensor> h = obj.remote(&Affine::forward, x);
    Tensor u = weft::sigmoid(agent.call(2, layerFn, x * 3.0));
    RRef<Tensor> h2 = obj.remote(&Affine::forwardHeld, h);
    Tensor t = h2.toHere(10000ms);
    Tensor t1 = h.toHere(10000ms);
    Tensor loss = weft::sum(t * u) + weft::sum(t1);
    ctx.backward({loss});
    da::GradientMap mine = ctx.gradients();
    require(mine.size() == 1, "worker0 holds " + std::to_string(mine.size()) + " gradients, not 1");
    cmp.close("the input on worker0", mine.at(x), want[0]);
    checkReport(agent, 1, ctx.id(), cmp, 1, Tensor(), want[1]);
    checkReport(agent, 2, ctx.id(), cmp, 1, want[2]);
    checkDotGradUntouched(st, x);
  }
  return cmp.summary() + drainEverywhere(agent);
}

// Worker0's parameter travels to worker1 as an argument; its gradient lands in worker0's
// context, keyed by the parameter itself.
std::string paramScenario(Agent& agent, State& st) {
  std::vector<Tensor> w = referenceWeights();
  Tensor xr = makeInput(17);
  Tensor lossRef = weft::sum(weft::square(weft::matmul(layer(xr, w[1]), w[0])));
  std::vector<Tensor> want = weft::autograd::grad({lossRef}, {xr, w[0], w[1]});

  Comparison cmp;
  Tensor x = makeInput(17);
  {
    da::Context ctx(agent);
    Tensor y = agent.call(1, useParamFn, x, st.weight);
    Tensor loss = weft::sum(weft::square(y));
    ctx.backward({loss});
    da::GradientMap mine = ctx.gradients();
    require(mine.size() == 2, "worker0 holds " + std::to_string(mine.size()) + " gradients, not 2");
    require(mine.contains(st.weight), "worker0's context holds no gradient keyed by its parameter");
    cmp.close("the input on worker0", mine.at(x), want[0]);
    cmp.close("the parameter of worker0, passed to worker1", mine.at(st.weight), want[1]);
    // worker1 holds its own parameter's gradient only: the copy it received is no leaf.
    checkReport(agent, 1, ctx.id(), cmp, 1, want[2]);
    checkDotGradUntouched(st, x);
  }
  return cmp.summary() + drainEverywhere(agent);
}

std::string retainScenario(Agent& agent, State& st) {
  std::vector<Tensor> w = referenceWeights();
  Tensor xr = makeInput(18);
  Tensor lossRef = weft::sum(weft::square(layer(layer(xr, w[1]), w[2])));
  std::vector<Tensor> want = weft::autograd::grad({lossRef}, {xr, w[1], w[2]});
  for (Tensor& g : want) g = g * 3.0;

  Comparison cmp;
  Tensor x = makeInput(18);
  std::string second;
  {
    da::Context ctx(agent);
    Tensor y = agent.call(1, hopFn, x, std::vector<int64_t>{2});
    Tensor loss = weft::sum(weft::square(y));
    ctx.backward({loss}, true);
    ctx.backward({loss}, true);
    ctx.backward({loss});
    da::GradientMap mine = ctx.gradients();
    require(mine.size() == 1, "worker0 holds " + std::to_string(mine.size()) + " gradients, not 1");
    cmp.close("the input on worker0 after three passes", mine.at(x), want[0]);
    checkReport(agent, 1, ctx.id(), cmp, 1, want[1]);
    checkReport(agent, 2, ctx.id(), cmp, 1, want[2]);
    checkDotGradUntouched(st, x);
    second = checkSecondBackward(ctx, loss);
    // The failed pass added nothing.
    cmp.close("the input on worker0 after the failed pass", ctx.gradients().at(x), want[0]);
  }
  return cmp.summary() + drainEverywhere(agent) + second;
}

// The root is worker1's result itself: the first node a second pass runs is on worker1.
std::string secondRemoteScenario(Agent& agent, State& st) {
  std::vector<Tensor> w = referenceWeights();
  Tensor xr = makeInput(19);
  Tensor lossRef = weft::sum(weft::square(layer(xr, w[1])));
  std::vector<Tensor> want = weft::autograd::grad({lossRef}, {xr, w[1]});

  Comparison cmp;
  Tensor x = makeInput(19);
  std::string second;
  {
    da::Context ctx(agent);
    Tensor loss = agent.call(1, layerSumFn, x);
    require(loss.requiresGrad() && loss.numel() == 1, "worker1's scalar result is a root requiring grad");
    ctx.backward({loss});
    cmp.close("the input on worker0", ctx.gradients().at(x), want[0]);
    checkReport(agent, 1, ctx.id(), cmp, 1, want[1]);
    checkDotGradUntouched(st, x);
    second = checkSecondBackward(ctx, loss);
  }
  return cmp.summary() + drainEverywhere(agent) + second;
}

// A backward rule on worker1 throws while worker2 takes part in the same pass.
std::string remoteErrorScenario(Agent& agent, State&) {
  Tensor x = makeInput(20);
  std::string error;
  long long ms = 0;
  {
    da::Context ctx(agent);
    Future<Tensor> left = agent.callAsync(1, explodeFn, x);
    Future<Tensor> right = agent.callAsync(2, layerFn, x);
    Tensor loss = weft::sum(getWithin(left, 10000ms, "explode on worker1")) +
                  weft::sum(weft::square(getWithin(right, 10000ms, "layer on worker2")));
    auto began = Clock::now();
    error = expectFailure("backward through a throwing rule", [&] { ctx.backward({loss}); });
    ms = elapsedMs(began);
    require(startsWith(error, "RemoteError: "), "backward through a throwing rule on worker1 failed with " + error);
    require(contains(error, "worker1"), "the error does not name worker1: " + error);
    require(contains(error, "exploded on purpose"), "the error does not carry the rule's message: " + error);
    require(ms < 5000, "backward took " + std::to_string(ms) + " ms to fail");
  }
  return "failed_ms " + std::to_string(ms) + drainEverywhere(agent) + " error " + error;
}

template <class F>
void runScenario(const std::string& name, int& failures, F&& body) {
  try {
    std::string details = body();
    say("rank 0 scenario " + name + " ok " + details);
  } catch (...) {
    ++failures;
    say("rank 0 scenario " + name + " failed " + describe(std::current_exception()));
  }
}

// Meets the other ranks in a store barrier (`survivors` of them), waits (bounded) until this
// worker holds no distributed autograd state, shuts down gracefully and reports.
void settle(Agent& agent, const std::string& barrier, int survivors) {
  agent.store().barrier(barrier, survivors, 30s);
  waitUntil([&] { return da::debugCounts(agent).empty(); }, 5000ms, 2ms);
  say(prefix(agent.rank()) + "counts " + countsLine(countsVector(da::debugCounts(agent))));
  sayShutdown(agent);
}

int graphsJob(Agent& agent, State& st) {
  require(agent.worldSize() == 3, "the graphs job needs 3 workers");
  int failures = 0;
  if (agent.rank() == 0) {
    auto began = Clock::now();
    runScenario("chain", failures, [&] { return chainScenario(agent, st); });
    runScenario("diamond", failures, [&] { return diamondScenario(agent, st, 12); });
    runScenario("roots", failures, [&] { return rootsScenario(agent, st); });
    runScenario("twice", failures, [&] { return twiceScenario(agent, st); });
    runScenario("toHere", failures, [&] { return toHereScenario(agent, st); });
    runScenario("later", failures, [&] { return laterScenario(agent, st); });
    runScenario("param", failures, [&] { return paramScenario(agent, st); });
    runScenario("retain", failures, [&] { return retainScenario(agent, st); });
    runScenario("second-remote", failures, [&] { return secondRemoteScenario(agent, st); });
    runScenario("remote-error", failures, [&] { return remoteErrorScenario(agent, st); });
    runScenario("after-errors", failures, [&] { return diamondScenario(agent, st, 21); });
    say("rank 0 scenarios failed " + std::to_string(failures) + " seconds " +
        std::to_string(std::chrono::duration<double>(Clock::now() - began).count()));
  }
  settle(agent, "da-graphs-done", agent.worldSize());
  return failures == 0 ? 0 : 1;
}

// ---- kill ---------------------------------------------------------------------------------------

// Runs `use`, which must fail now that worker1 is dead, again every millisecond while it still
// succeeds (for at most 2 s: the failure of a call can be seen a moment before the context is
// released); prints how it failed and how long after the first attempt.
template <class F>
void later(const std::string& what, F&& use) {
  auto began = Clock::now();
  for (;;) {
    try {
      use();
    } catch (...) {
      say("rank 0 later " + what + " in_us " + std::to_string(elapsedUs(began)) + " " +
          describe(std::current_exception()));
      return;
    }
    if (Clock::now() - began > 2s) throw Error(what + " after worker1 died: still succeeds 2 s later");
    std::this_thread::sleep_for(1ms);
  }
}

int killJob(Agent& agent) {
  require(agent.worldSize() == 3, "the kill job needs 3 workers");
  if (agent.rank() == 1) {
    say("rank 1 victim ready");
    std::this_thread::sleep_for(60s);
    say("rank 1 victim was not killed");
    return 6;
  }
  if (agent.rank() == 2) {
    settle(agent, "da-kill-survivors", 2);
    return 0;
  }

  // A second context, on its own thread, reaches workers 1 and 2 and waits for the kill.
  std::promise<void> builtPromise;
  std::future<void> built = builtPromise.get_future();
  std::promise<void> killedPromise;
  std::shared_future<void> killed = killedPromise.get_future().share();
  std::string secondFailure;
  bool killedTold = false;
  auto tellKilled = [&] {
    if (!killedTold) killedPromise.set_value();
    killedTold = true;
  };
  std::thread second([&] {
    try {
      Tensor x = makeInput(31);
      da::Context ctx(agent);
      Tensor loss = weft::sum(agent.call(1, layerFn, x)) + weft::sum(agent.call(2, layerFn, x));
      builtPromise.set_value();
      if (killed.wait_for(40s) != std::future_status::ready) throw Error("never told that worker1 died");
      later("backward", [&] { ctx.backward({loss}); });
      later("gradients", [&] { ctx.gradients(); });
      later("gradientsById", [&] { da::gradients(agent, ctx.id()); });
    } catch (...) {
      secondFailure = describe(std::current_exception());
    }
  });
  // However this thread leaves, the second one is let go and joined.
  struct Joiner {
    std::function<void()> release;
    std::thread& t;
    ~Joiner() {
      release();
      if (t.joinable()) t.join();
    }
  } joiner{tellKilled, second};

  require(built.wait_for(20s) == std::future_status::ready, "the second context was never built");
  {
    Tensor x = makeInput(32);
    da::Context ctx(agent);
    Tensor loss = weft::sum(agent.call(1, stallFn, x)) + weft::sum(agent.call(2, layerFn, x));
    say("rank 0 backward starting");
    std::string error = expectFailure("backward while worker1 is killed", [&] { ctx.backward({loss}); });
    say("rank 0 pending backward at_ns " + std::to_string(steadyNs(Clock::now())) + " " + error);
    tellKilled();
    later("gradientsOfPending", [&] { ctx.gradients(); });
  }
  tellKilled();
  second.join();
  require(secondFailure.empty(), "the second context: " + secondFailure);

  // Both contexts ended: nothing is left here or on worker2.
  auto began = Clock::now();
  getWithin(da::flushReleasesAsync(agent), 5000ms, "flushReleasesAsync");
  std::string left;
  bool empty = waitUntil(
      [&] {
        left = countsEverywhere(agent);
        return left.empty();
      },
      5000ms, 2ms);
  say("rank 0 survivors empty " + std::to_string(empty) + " drained_ms " + std::to_string(elapsedMs(began)) +
      (empty ? "" : " left " + left));
  say("rank 0 alive " + std::to_string(agent.isAlive(1)));
  settle(agent, "da-kill-survivors", 2);
  return 0;
}

int settledKillJob(Agent& agent) {
  require(agent.worldSize() == 2, "the settled-kill job needs 2 workers");
  if (agent.rank() == 1) {
    say("rank 1 victim ready");
    std::this_thread::sleep_for(60s);
    say("rank 1 victim was not killed");
    return 6;
  }
  Tensor x = makeInput(41);
  da::Context ctx(agent);
  Tensor loss = weft::sum(agent.call(1, layerFn, x));
  const int64_t id = ctx.id();
  bool fired = false;
  bool dropped = false;
  da::detail::setBackwardSettledHook([&](int64_t c) {
    if (c != id || fired) return;
    fired = true;
    say("rank 0 settled");
    dropped = waitUntil([&] { return da::debugCounts(agent).contexts == 0; }, 20000ms, 1ms);
  });
  std::string outcome = "ok";
  try {
    ctx.backward({loss});
  } catch (...) {
    outcome = describe(std::current_exception());
  }
  da::detail::setBackwardSettledHook({});
  say("rank 0 backward " + outcome);
  say("rank 0 dropped " + std::to_string(dropped));
  later("gradients", [&] { ctx.gradients(); });
  settle(agent, "da-settled-kill-survivors", 1);
  return 0;
}

}  // namespace daworker

int main(int argc, char** argv) {
  using namespace daworker;
  return weft::testing::workerMain("dist_autograd_worker", {"graphs", "kill", "settled-kill"}, argc, argv, [](const std::string& job) {
    weft::rpc::Options options = weft::rpc::Options::fromEnv();
    State st;
    st.rank = options.rank;
    st.weight = makeWeight(weightSeed(options.rank));
    gState = &st;
    Agent agent(options);
    st.agent = &agent;
    bindAll(agent, st);
    agent.start();
    sayStarted(agent);
    if (job == "graphs") return graphsJob(agent, st);
    return job == "kill" ? killJob(agent) : settledKillJob(agent);
  });
}
