// A program for the multiprocess tests of DistributedDataParallel (tests/collectives/ddp_mp_test.cpp):
// one rank of a job, which finds its place through rpc::Options::fromEnv, builds a ProcessGroupGloo
// and plays its rank's part in the scenario it is given, printing one line per result
// ("rank R <phrase> ..."). Differences are printed in parts per billion (integers) for the test to
// bound.
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=3 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 ddp_worker train
//
// Scenarios:
//   train     [any world size] An MLP of 6 Linear(16, 16) layers, initialised differently on every
//             rank, in DDP with buckets of one layer (1088 B: 6 buckets). First pass: the DDP gradient against
//             the average of the ranks' local gradients (each computed with a plain copy of the
//             module and allgathered): "grad_maxdiff_ppb N"; the launch order: "overlap buckets B
//             first_launch_hooks H params P first_before_last_hook 0|1 in_order 0|1 launches L
//             first_before_input_grad 0|1" (the first allreduce started before backward computed the
//             gradient of the input, its last step). Then 40 SGD
//             steps on different data per rank: "params_hash H moved 0|1". noSync: two microbatches
//             under noSync and one synced against the averaged sum: "nosync_maxdiff_ppb N
//             nosync_collectives C" (collectives started under noSync). findUnusedParameters: a
//             layer only rank 0 uses: "unused_maxdiff_ppb N unused_count U". "done" at the end.
//   rebuild   [any world size] An MLP of 4 Linear(16, 16) layers registered in the reverse order of
//             their use (backward produces the gradients of the first parameters first) with a
//             buffer scaling its output, in DDP with buckets of one layer: "rebuild before L after L
//             first_launch_hooks H then H rebuilds N" (layouts as "0,1|2,3|...", each bucket's
//             parameter indices sorted; the hooks before the first launch of the first and second
//             pass); "rebuild_grad_maxdiff_ppb N" (the second pass against the average of local
//             gradients); "buffer_after_forward S" (each rank set its scale to rank + 2, a synced
//             forward gives rank 0's); "rebuild_hash H" after 30 SGD steps on different data.
//   mismatch  [2 ranks] Group timeout 1.5 s. Rank 0 runs 3 synced passes, rank 1 only 2 (then waits
//             until rank 0 has reported). Rank 0: "failed in_ms T <ErrorType>: <message>".
//   context   [2 ranks, rpc agents] Each rank's input goes through an RPC to the other rank and back,
//             then through DDP, inside a distributed autograd context: "ctx_maxdiff_ppb N dotgrad 0|1
//             input_grad 0|1" (the averaged gradients are in ctx.gradients(), .grad is untouched,
//             the input's gradient came back through the RPC); then a synced local backward in the
//             same process: "local_after_ctx_maxdiff_ppb N".
//   checkpoint [any world size] A module of 4 Linear(16, 16) layers with tanh and dropout (the
//             default generator, reseeded identically before each forward), run as two
//             checkpointed segments, in DDP with buckets of one layer; a twin without checkpointing
//             in another DDP. "ckpt_maxdiff_ppb N" (against the average of the ranks' local plain
//             gradients), "ckpt_bitwise 0|1" (bit-identical to the plain DDP's gradients),
//             "ckpt_hooks H launches L" (DDP's hooks and bucket launches in the checkpointed pass).
// Every rank first prints "rank R pid P started".
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/gloo/detail/group.h"
#include "common/error.h"
#include "dist_autograd/dist_autograd.h"
#include "mp_worker.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rpc/function.h"
#include "rpc/registry.h"
#include "rpc/store.h"
#include "tensor/ops.h"

namespace {

using namespace std::chrono_literals;
using weft::Generator;
using weft::Tensor;
using weft::collectives::DistributedDataParallel;
using weft::collectives::ProcessGroupGloo;
using weft::testing::say;
using Clock = std::chrono::steady_clock;
using Ddp = DistributedDataParallel;

int gRank = 0;

void sayLine(const std::string& line) { say(weft::testing::prefix(gRank) + line); }

// `layers` Linear(16, 16) with tanh between; an optional extra Linear(16, 16) forward uses only
// when useExtra.
class Mlp : public weft::nn::Module {
 public:
  Mlp(int layers, uint64_t seed, bool withExtra = false) : Module("Mlp") {
    Generator gen(seed);
    for (int i = 0; i < layers; ++i) {
      std::string name = "l";
      name += std::to_string(i);
      auto l = registerModule(name, std::make_shared<weft::nn::Linear>(16, 16));
      l->resetParameters(&gen);
      layers_.push_back(l);
    }
    if (withExtra) {
      extra_ = registerModule("extra", std::make_shared<weft::nn::Linear>(16, 16));
      extra_->resetParameters(&gen);
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = layers_[i]->forward(h);
      if (i + 1 < layers_.size()) h = weft::tanh(h);
    }
    return extra_ && useExtra ? extra_->forward(h) : h;
  }
  bool useExtra = true;

 private:
  std::vector<std::shared_ptr<weft::nn::Linear>> layers_;
  std::shared_ptr<weft::nn::Linear> extra_;
};

Tensor batch(int rank, int step, int64_t rows = 8) {
  Generator gen(5000 + static_cast<uint64_t>(rank) * 1009 + static_cast<uint64_t>(step));
  return weft::randn({rows, 16}, {}, &gen);
}

Tensor lossOf(const Tensor& out) { return weft::square(out).mean(); }

// A copy of `like` (same layout, state and useExtra) with no hooks.
std::shared_ptr<Mlp> twinOf(const Mlp& like, int layers, bool withExtra) {
  auto twin = std::make_shared<Mlp>(layers, 1, withExtra);
  twin->useExtra = like.useExtra;
  weft::nn::StateDict state;
  for (auto& [k, v] : like.stateDict()) state[k] = v.clone();
  twin->loadStateDict(state);
  return twin;
}

// The parameters' gradients of `m`, flattened into one tensor (zeros where undefined).
Tensor flatGrads(const std::vector<Tensor>& params, const std::function<Tensor(const Tensor&)>& gradOf) {
  std::vector<Tensor> parts;
  for (const Tensor& p : params) {
    Tensor g = gradOf(p);
    parts.push_back(g.defined() ? g.detach().contiguous().view({-1}) : weft::zeros({p.numel()}));
  }
  return weft::cat(parts, 0);
}

// The average over the ranks of every rank's `local` (allgathered).
Tensor averageOverRanks(ProcessGroupGloo& pg, const Tensor& local) {
  std::vector<Tensor> parts(static_cast<size_t>(pg.size()));
  pg.allGather(parts, local.contiguous()).wait();
  Tensor sum = weft::zerosLike(local);
  for (const Tensor& t : parts) sum = sum + t;
  return sum * (1.0 / pg.size());
}

long long maxDiffPpb(const Tensor& a, const Tensor& b) {
  double m = weft::max(weft::abs(a - b)).item<double>();
  return std::llround(m * 1e9);
}

uint64_t paramsHash(const std::vector<Tensor>& params) {
  uint64_t h = 1469598103934665603ULL;
  for (const Tensor& p : params) {
    Tensor c = p.detach().contiguous();
    auto* bytes = static_cast<const unsigned char*>(c.rawData());
    for (size_t i = 0; i < c.nbytes(); ++i) {
      h ^= bytes[i];
      h *= 1099511628211ULL;
    }
  }
  return h;
}

std::vector<Tensor> snapshot(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.detach().clone());
  return out;
}

void runTrain(ProcessGroupGloo& pg) {
  const int me = pg.rank();
  constexpr int kLayers = 6;
  auto net = std::make_shared<Mlp>(kLayers, 100 + static_cast<uint64_t>(me));
  Ddp ddp(net, pg, {.bucketCapBytes = 1088});
  auto params = net->parameters();

  // 1. The gradient of one pass against the average of the local gradients.
  {
    auto twin = twinOf(*net, kLayers, false);
    lossOf(twin->forward(batch(me, 0))).backward();
    Tensor want = averageOverRanks(pg, flatGrads(twin->parameters(), [](const Tensor& p) { return p.grad(); }));
    // The input's gradient is the last thing backward computes: the time backward ends here.
    Tensor x = batch(me, 0).requiresGrad_();
    int64_t inputGradNs = 0;
    x.gradAccumulator()->registerPreHook([&inputGradNs](std::vector<Tensor>&) {
      inputGradNs = weft::testing::steadyNs(Clock::now());
    });
    lossOf(ddp.forward(x)).backward();
    Tensor got = flatGrads(params, [](const Tensor& p) { return p.grad(); });
    sayLine("grad_maxdiff_ppb " + std::to_string(maxDiffPpb(got, want)));
    Ddp::Stats s = ddp.stats();
    bool inOrder = true;
    for (size_t k = 0; k < s.launches.size(); ++k) inOrder = inOrder && s.launches[k].bucket == k;
    bool firstBeforeLastHook = !s.launches.empty() && !s.hookNs.empty() && s.launches[0].ns < s.hookNs.back() &&
                               s.launches[0].hooksBefore < s.hookOrder.size();
    sayLine("overlap buckets " + std::to_string(ddp.buckets().size()) + " first_launch_hooks " +
            std::to_string(s.launches.empty() ? 0 : s.launches[0].hooksBefore) + " params " +
            std::to_string(params.size()) + " first_before_last_hook " + std::to_string(firstBeforeLastHook ? 1 : 0) +
            " in_order " + std::to_string(inOrder ? 1 : 0) + " launches " + std::to_string(s.launches.size()) +
            " first_before_input_grad " + std::to_string(!s.launches.empty() && s.launches[0].ns < inputGradNs ? 1 : 0));
  }

  // 2. Many SGD steps with different data per rank.
  {
    auto before = snapshot(params);
    weft::nn::optim::SGD opt(params, {.lr = 0.05, .momentum = 0.9});
    for (int step = 1; step <= 40; ++step) {
      opt.zeroGrad();
      lossOf(ddp.forward(batch(me, step))).backward();
      opt.step();
    }
    bool moved = false;
    for (size_t i = 0; i < params.size(); ++i) moved = moved || !weft::allclose(params[i], before[i], 0, 1e-4);
    sayLine("params_hash " + std::to_string(paramsHash(params)) + " moved " + std::to_string(moved ? 1 : 0));
  }

  // 3. noSync: two microbatches accumulate locally, the third pass reduces the sum.
  {
    net->zeroGrad(true);
    auto twin = twinOf(*net, kLayers, false);
    for (int s = 0; s < 3; ++s) lossOf(twin->forward(batch(me, 100 + s))).backward();
    Tensor want = averageOverRanks(pg, flatGrads(twin->parameters(), [](const Tensor& p) { return p.grad(); }));
    int64_t startedBefore = pg.collectivesStarted();
    {
      auto scope = ddp.noSync();
      lossOf(ddp.forward(batch(me, 100))).backward();
      lossOf(ddp.forward(batch(me, 101))).backward();
    }
    int64_t underNoSync = pg.collectivesStarted() - startedBefore;
    bool gradUntouched = std::none_of(params.begin(), params.end(), [](const Tensor& p) { return p.grad().defined(); });
    lossOf(ddp.forward(batch(me, 102))).backward();
    Tensor got = flatGrads(params, [](const Tensor& p) { return p.grad(); });
    sayLine("nosync_maxdiff_ppb " + std::to_string(maxDiffPpb(got, want)) + " nosync_collectives " +
            std::to_string(underNoSync) + " grad_untouched " + std::to_string(gradUntouched ? 1 : 0));
  }

  // 4. findUnusedParameters: only rank 0 uses the extra layer.
  {
    auto unet = std::make_shared<Mlp>(2, 300 + static_cast<uint64_t>(me), true);
    unet->useExtra = me == 0;
    Ddp uddp(unet, pg, {.bucketCapBytes = 2048, .findUnusedParameters = true});
    auto twin = twinOf(*unet, 2, true);
    lossOf(twin->forward(batch(me, 200))).backward();
    Tensor want = averageOverRanks(pg, flatGrads(twin->parameters(), [](const Tensor& p) { return p.grad(); }));
    lossOf(uddp.forward(batch(me, 200))).backward();
    Tensor got = flatGrads(unet->parameters(), [](const Tensor& p) { return p.grad(); });
    sayLine("unused_maxdiff_ppb " + std::to_string(maxDiffPpb(got, want)) + " unused_count " +
            std::to_string(uddp.stats().unusedParameters));
  }
}

// `layers` Linear(16, 16) with tanh between, registered last layer first, output scaled by a buffer.
class ReversedMlp : public weft::nn::Module {
 public:
  ReversedMlp(int layers, uint64_t seed) : Module("ReversedMlp") {
    Generator gen(seed);
    layers_.resize(static_cast<size_t>(layers));
    for (int i = layers - 1; i >= 0; --i) {
      std::string name = "l";
      name += std::to_string(i);
      layers_[static_cast<size_t>(i)] = registerModule(name, std::make_shared<weft::nn::Linear>(16, 16));
      layers_[static_cast<size_t>(i)]->resetParameters(&gen);
    }
    scale_ = registerBuffer("scale", weft::full({1}, 1.0));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = layers_[i]->forward(h);
      if (i + 1 < layers_.size()) h = weft::tanh(h);
    }
    return h * scale_;
  }
  Tensor scale() const { return scale_; }

 private:
  std::vector<std::shared_ptr<weft::nn::Linear>> layers_;
  Tensor scale_;
};

// "0,1|2,3|...": each bucket's parameter indices, sorted.
std::string layoutText(const std::vector<std::vector<size_t>>& buckets) {
  std::string text;
  for (const auto& b : buckets) {
    std::vector<size_t> sorted = b;
    std::sort(sorted.begin(), sorted.end());
    if (!text.empty()) text += "|";
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (i > 0) text += ",";
      text += std::to_string(sorted[i]);
    }
  }
  return text;
}

void runRebuild(ProcessGroupGloo& pg) {
  const int me = pg.rank();
  constexpr int kLayers = 4;
  auto net = std::make_shared<ReversedMlp>(kLayers, 500 + static_cast<uint64_t>(me));
  Ddp ddp(net, pg, {.bucketCapBytes = 1088});
  auto params = net->parameters();
  const std::string before = layoutText(ddp.buckets());
  lossOf(ddp.forward(batch(me, 0))).backward();
  const size_t firstHooks = ddp.stats().launches.at(0).hooksBefore;
  const std::string after = layoutText(ddp.buckets());

  // The second pass runs on the rebuilt buckets; the buffer is rank 0's again by then.
  net->zeroGrad(true);
  net->scale().fill_(me + 2.0);
  auto twin = std::make_shared<ReversedMlp>(kLayers, 1);
  Tensor x = batch(me, 1);
  Tensor out = ddp.forward(x);
  sayLine("buffer_after_forward " + std::to_string(net->scale().item<float>()));
  lossOf(out).backward();
  weft::nn::StateDict state;
  for (auto& [k, v] : net->stateDict()) state[k] = v.clone();
  twin->loadStateDict(state);
  lossOf(twin->forward(x)).backward();
  Tensor want = averageOverRanks(pg, flatGrads(twin->parameters(), [](const Tensor& p) { return p.grad(); }));
  Tensor got = flatGrads(params, [](const Tensor& p) { return p.grad(); });
  const Ddp::Stats s = ddp.stats();
  sayLine("rebuild before " + before + " after " + after + " first_launch_hooks " + std::to_string(firstHooks) +
          " then " + std::to_string(s.launches.at(0).hooksBefore) + " rebuilds " + std::to_string(s.bucketRebuilds));
  sayLine("rebuild_grad_maxdiff_ppb " + std::to_string(maxDiffPpb(got, want)));

  weft::nn::optim::SGD opt(params, {.lr = 0.05, .momentum = 0.9});
  for (int step = 2; step < 32; ++step) {
    opt.zeroGrad();
    lossOf(ddp.forward(batch(me, step))).backward();
    opt.step();
  }
  sayLine("rebuild_hash " + std::to_string(paramsHash(params)));
}

void runMismatch(ProcessGroupGloo& pg, weft::rpc::StoreClient& store) {
  const int me = pg.rank();
  auto net = std::make_shared<Mlp>(2, 7);
  Ddp ddp(net, pg);
  const int passes = me == 0 ? 3 : 2;
  for (int i = 0; i < passes; ++i) {
    auto began = Clock::now();
    try {
      lossOf(ddp.forward(batch(me, i))).backward();
    } catch (const std::exception&) {
      long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began).count();
      sayLine("failed in_ms " + std::to_string(ms) + " " + weft::testing::describe(std::current_exception()));
      break;
    }
  }
  if (me == 0) {
    store.set("ddp_worker/mismatch/reported", "1");
  } else {
    // Stay connected until rank 0 has seen its timeout (leaving would be a DisconnectedError there).
    store.wait({"ddp_worker/mismatch/reported"}, 20s);
  }
}

// `layers` Linear(16, 16), each followed by tanh and dropout(0.2); with `segment` > 0 every
// `segment` layers run as one checkpointed function.
class DropoutMlp : public weft::nn::Module {
 public:
  DropoutMlp(int layers, uint64_t seed, int segment) : Module("DropoutMlp"), segment_(segment) {
    Generator gen(seed);
    for (int i = 0; i < layers; ++i) {
      std::string name = "l";
      name += std::to_string(i);
      auto l = registerModule(name, std::make_shared<weft::nn::Linear>(16, 16));
      l->resetParameters(&gen);
      layers_.push_back(l);
    }
  }
  Tensor forward(const Tensor& x) override {
    const int n = static_cast<int>(layers_.size());
    const int step = segment_ > 0 ? segment_ : n;
    Tensor h = x;
    for (int from = 0; from < n; from += step) {
      const int to = std::min(n, from + step);
      auto fn = [this, from, to](const Tensor& t) {
        Tensor a = t;
        for (int i = from; i < to; ++i) a = weft::dropout(weft::tanh(layers_[i]->forward(a)), 0.2, true);
        return a;
      };
      h = segment_ > 0 ? weft::checkpoint(fn, h) : fn(h);
    }
    return h;
  }

 private:
  int segment_;
  std::vector<std::shared_ptr<weft::nn::Linear>> layers_;
};

void runCheckpoint(ProcessGroupGloo& pg) {
  const int me = pg.rank();
  auto net = std::make_shared<DropoutMlp>(4, 700 + static_cast<uint64_t>(me), 2);
  Ddp ddp(net, pg, {.bucketCapBytes = 1088});
  // The plain twin starts from the checkpointed module's (broadcast) parameters.
  auto plain = std::make_shared<DropoutMlp>(4, 1, 0);
  weft::nn::StateDict state;
  for (auto& [k, v] : net->stateDict()) state[k] = v.clone();
  plain->loadStateDict(state);
  Ddp plainDdp(plain, pg, {.bucketCapBytes = 1088});
  const uint64_t seed = 900 + static_cast<uint64_t>(me);
  Tensor x = batch(me, 0).requiresGrad_();

  // Each rank's local plain gradients, averaged: the reference.
  auto local = std::make_shared<DropoutMlp>(4, 1, 0);
  local->loadStateDict(state);
  weft::manualSeed(seed);
  lossOf(local->forward(x)).backward();
  Tensor want = averageOverRanks(pg, flatGrads(local->parameters(), [](const Tensor& p) { return p.grad(); }));

  weft::manualSeed(seed);
  lossOf(plainDdp.forward(x)).backward();
  Tensor plainGot = flatGrads(plain->parameters(), [](const Tensor& p) { return p.grad(); });

  weft::manualSeed(seed);
  lossOf(ddp.forward(x)).backward();
  Tensor got = flatGrads(net->parameters(), [](const Tensor& p) { return p.grad(); });
  Ddp::Stats st = ddp.stats();
  const bool bitwise = got.toVector<float>() == plainGot.toVector<float>();
  sayLine("ckpt_maxdiff_ppb " + std::to_string(maxDiffPpb(got, want)) + " ckpt_bitwise " +
          std::to_string(bitwise ? 1 : 0));
  sayLine("ckpt_hooks " + std::to_string(st.hookOrder.size()) + " launches " + std::to_string(st.launches.size()));
}

inline const weft::Function<Tensor(Tensor)> scaleFn{"ddp_worker.scale"};

void runContext(weft::rpc::Agent& agent) {
  const int me = agent.rank();
  const int peer = 1 - me;
  auto pg = ProcessGroupGloo::create(agent.store(), me, 2, {.timeout = 20s});
  auto net = std::make_shared<Mlp>(3, 400 + static_cast<uint64_t>(me));
  Ddp ddp(net, *pg, {.bucketCapBytes = 2048});
  auto params = net->parameters();

  Tensor x = batch(me, 0).requiresGrad_();
  weft::dist_autograd::GradientMap grads;
  Tensor hValue;
  {
    weft::dist_autograd::Context ctx(agent);
    Tensor h = agent.call(peer, scaleFn, x);
    hValue = h.detach().clone();
    ctx.backward({lossOf(ddp.forward(h))});
    grads = ctx.gradients();
  }
  auto twin = twinOf(*net, 3, false);
  lossOf(twin->forward(hValue)).backward();
  Tensor want = averageOverRanks(*pg, flatGrads(twin->parameters(), [](const Tensor& p) { return p.grad(); }));
  Tensor got = flatGrads(params, [&](const Tensor& p) { return grads.get(p); });
  bool allThere = std::all_of(params.begin(), params.end(), [&](const Tensor& p) { return grads.contains(p); });
  bool dotGrad = std::any_of(params.begin(), params.end(), [](const Tensor& p) { return p.grad().defined(); });
  // x went to the peer (scaled by 3 there) and came back: its gradient is 3 * d loss / d h.
  bool inputGrad = grads.contains(x) && !x.grad().defined();
  sayLine("ctx_maxdiff_ppb " + std::to_string(allThere ? maxDiffPpb(got, want) : -1) + " dotgrad " +
          std::to_string(dotGrad ? 1 : 0) + " input_grad " + std::to_string(inputGrad ? 1 : 0));

  // The same DDP then serves a local backward.
  lossOf(ddp.forward(hValue)).backward();
  Tensor local = flatGrads(params, [](const Tensor& p) { return p.grad(); });
  sayLine("local_after_ctx_maxdiff_ppb " + std::to_string(maxDiffPpb(local, want)));
  pg->barrier().wait();
}

}  // namespace

int main(int argc, char** argv) {
  return weft::testing::workerMain("ddp_worker", {"train", "rebuild", "mismatch", "context", "checkpoint"}, argc, argv,
                                   [](const std::string& scenario) {
    weft::rpc::Options opt = weft::rpc::Options::fromEnv();
    gRank = opt.rank;
    say(weft::testing::prefix(gRank) + "pid " + std::to_string(::getpid()) + " started");
    if (scenario == "context") {
      weft::rpc::Agent agent(opt);
      agent.registry().impl(scaleFn, [](Tensor t) { return t * 3.0; });
      agent.start();
      runContext(agent);
      weft::testing::sayShutdown(agent);
      sayLine("done");
      return 0;
    }
    std::unique_ptr<weft::rpc::StoreServer> server;
    if (opt.rank == 0) server = std::make_unique<weft::rpc::StoreServer>(weft::rpc::StoreServer::configFor(opt));
    weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));
    {
      auto pg = ProcessGroupGloo::create(store, opt.rank, opt.worldSize,
                                         {.timeout = scenario == "mismatch" ? 1500ms : std::chrono::milliseconds(20s)});
      if (scenario == "train") runTrain(*pg);
      else if (scenario == "rebuild") runRebuild(*pg);
      else if (scenario == "checkpoint") runCheckpoint(*pg);
      else runMismatch(*pg, store);
    }
    // Rank 0 serves the store: it leaves once every other rank has said it is leaving.
    if (opt.rank == 0) {
      std::vector<std::string> left;
      for (int r = 1; r < opt.worldSize; ++r) left.push_back("ddp_worker/left/" + std::to_string(r));
      store.wait(left, 20s);
    } else {
      store.set("ddp_worker/left/" + std::to_string(opt.rank), "1");
    }
    sayLine("done");
    return 0;
  });
}
