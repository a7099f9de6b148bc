// DistributedDataParallel within one process: each rank is a thread with its own ProcessGroupGloo
// (real TCP on 127.0.0.1), its own replica and its own backward passes (autograd runs on the
// calling thread). Options and module checks, the bucket layout and its rebuild in rank 0's
// gradient order after the first pass, the broadcast at construction and of buffers at each synced
// forward, averaged gradients, noSync accumulation, parameters without a gradient (an error, or
// zeros with findUnusedParameters), the launch order of buckets, and a rank running one pass more
// than the others. The multiprocess test (ddp_mp_test.cpp) repeats the essentials across processes.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <set>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/gloo/detail/group.h"
#include "common/error.h"
#include "nn/linear.h"
#include "rpc/store.h"
#include "tensor/ops.h"
#include "tensor/ops_shape.h"
#include "captured_text.h"

using namespace weft;
using namespace std::chrono_literals;
using weft::collectives::DistributedDataParallel;
using weft::collectives::ProcessGroupGloo;
using weft::testing::contains;

namespace {

using Ddp = DistributedDataParallel;

// A store and `world` groups, one per rank, built concurrently (the constructor is collective).
class DdpRanks {
 public:
  explicit DdpRanks(int world, std::chrono::milliseconds timeout = 10s) {
    server_ = std::make_unique<rpc::StoreServer>(rpc::StoreServer::Config{});
    for (int r = 0; r < world; ++r) {
      rpc::StoreClient::Config cc;
      cc.port = server_->port();
      cc.timeout = 10s;
      clients_.push_back(std::make_unique<rpc::StoreClient>(cc));
    }
    std::vector<std::future<std::unique_ptr<ProcessGroupGloo>>> made;
    for (int r = 0; r < world; ++r) {
      made.push_back(std::async(std::launch::async, [this, r, world, timeout] {
        return ProcessGroupGloo::create(*clients_[static_cast<size_t>(r)], r, world, {.timeout = timeout});
      }));
    }
    for (auto& f : made) groups_.push_back(f.get());
  }
  ProcessGroupGloo& operator[](int r) { return *groups_.at(static_cast<size_t>(r)); }
  int size() const { return static_cast<int>(groups_.size()); }

  // Runs fn(rank) on one thread per rank and waits for all; rethrows the first failure.
  void onEachRank(const std::function<void(int)>& fn) {
    std::vector<std::future<void>> running;
    for (int r = 0; r < size(); ++r) running.push_back(std::async(std::launch::async, [&fn, r] { fn(r); }));
    for (auto& f : running) f.get();
  }

 private:
  std::unique_ptr<rpc::StoreServer> server_;
  std::vector<std::unique_ptr<rpc::StoreClient>> clients_;  // outlive the groups
  std::vector<std::unique_ptr<ProcessGroupGloo>> groups_;
};

// 4 -> 8 -> 3, with an optional 3 -> 3 layer that forward uses only when useExtra, and a buffer.
class Net : public nn::Module {
 public:
  explicit Net(uint64_t seed, bool withExtra = false) : Module("Net") {
    Generator gen(seed);
    fc1_ = registerModule("fc1", std::make_shared<nn::Linear>(4, 8));
    fc2_ = registerModule("fc2", std::make_shared<nn::Linear>(8, 3));
    fc1_->resetParameters(&gen);
    fc2_->resetParameters(&gen);
    if (withExtra) {
      extra_ = registerModule("extra", std::make_shared<nn::Linear>(3, 3));
      extra_->resetParameters(&gen);
    }
    registerBuffer("marker", fromVector<float>({static_cast<float>(seed), 2.0f}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = fc2_->forward(tanh(fc1_->forward(x)));
    return extra_ && useExtra ? extra_->forward(h) : h;
  }
  bool useExtra = true;
  bool hasExtra() const { return extra_ != nullptr; }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_, extra_;
};

// fc1 (4 -> 8) and fc2 (8 -> 3) registered in the opposite order of their use: backward produces
// fc2's gradients first, which are parameters 0 and 1, not the last ones. Its output is scaled by
// a buffer.
class Swapped : public nn::Module {
 public:
  explicit Swapped(uint64_t seed) : Module("Swapped") {
    Generator gen(seed);
    fc2_ = registerModule("fc2", std::make_shared<nn::Linear>(8, 3));
    fc1_ = registerModule("fc1", std::make_shared<nn::Linear>(4, 8));
    fc2_->resetParameters(&gen);
    fc1_->resetParameters(&gen);
    scale_ = registerBuffer("scale", full({1}, 1.0));
  }
  Tensor forward(const Tensor& x) override { return fc2_->forward(tanh(fc1_->forward(x))) * scale_; }
  Tensor scale() const { return scale_; }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
  Tensor scale_;
};

// Two inputs: towerA(a) + towerB(b) (4 -> 3 and 2 -> 3). The pair form returns both towers' outputs
// and leaves towerB out when useB is false.
class TwoTower : public nn::Module {
 public:
  explicit TwoTower(uint64_t seed) : Module("TwoTower") {
    Generator gen(seed);
    a_ = registerModule("towerA", std::make_shared<nn::Linear>(4, 3));
    b_ = registerModule("towerB", std::make_shared<nn::Linear>(2, 3));
    a_->resetParameters(&gen);
    b_->resetParameters(&gen);
  }
  Tensor forward(const Tensor& a, const Tensor& b) { return a_->forward(a) + tanh(b_->forward(b)); }
  std::pair<Tensor, Tensor> forward(const Tensor& a, const Tensor& b, bool useB) {
    return {a_->forward(a), useB ? tanh(b_->forward(b)) : Tensor()};
  }

 private:
  std::shared_ptr<nn::Linear> a_, b_;
};

std::pair<Tensor, Tensor> twoInputsFor(int rank) {
  Generator gen(500 + static_cast<uint64_t>(rank));
  Tensor a = randn({3, 4}, {}, &gen);
  return {a, randn({3, 2}, {}, &gen)};
}

Tensor batchFor(int rank, int step) {
  Generator gen(1000 + static_cast<uint64_t>(rank) * 97 + static_cast<uint64_t>(step));
  return randn({5, 4}, {}, &gen);
}

Tensor lossOf(const Tensor& out) { return square(out).mean(); }

// The gradients of lossOf(net(x)) for a fresh copy of `like` (its state and useExtra), in
// parameters() order (undefined for a parameter the forward does not use).
std::vector<Tensor> localGradients(const Net& like, const Tensor& x) {
  auto twin = std::make_shared<Net>(1, like.hasExtra());
  twin->useExtra = like.useExtra;
  nn::StateDict state;
  for (auto& [k, v] : like.stateDict()) state[k] = v.clone();
  twin->loadStateDict(state);
  lossOf(twin->forward(x)).backward();
  std::vector<Tensor> out;
  for (const Tensor& p : twin->parameters()) out.push_back(p.grad());
  return out;
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE_BEGIN("ddp");

TEST_CASE("bad options and modules without trainable parameters are refused") {
  DdpRanks ranks(1);
  auto net = std::make_shared<Net>(1);
  CHECK_THROWS_AS(Ddp(net, ranks[0], {.bucketCapBytes = 0}), InvalidArgumentError);
  CHECK(contains(errorOf([&] { Ddp(net, ranks[0], {.bucketCapBytes = -5}); }), "bucketCapBytes must be > 0"));
  CHECK_THROWS_AS(Ddp(nullptr, ranks[0]), InvalidArgumentError);
  for (Tensor p : net->parameters()) p.requiresGrad_(false);
  CHECK(contains(errorOf([&] { Ddp(net, ranks[0]); }), "has no parameter that requires grad"));
}

TEST_CASE("buckets hold parameters in reverse order up to the cap, split by dtype") {
  DdpRanks ranks(1);
  auto net = std::make_shared<Net>(1);
  // fc1.weight 128 B, fc1.bias 32 B, fc2.weight 96 B, fc2.bias 12 B.
  Ddp all(net, ranks[0]);
  CHECK(all.buckets() == std::vector<std::vector<size_t>>{{3, 2, 1, 0}});
  CHECK(all.parameterNames() == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  auto net2 = std::make_shared<Net>(1);
  Ddp capped(net2, ranks[0], {.bucketCapBytes = 130});
  CHECK(capped.buckets() == std::vector<std::vector<size_t>>{{3, 2}, {1}, {0}});
  // A parameter larger than the cap has a bucket of its own.
  auto net3 = std::make_shared<Net>(1);
  Ddp tiny(net3, ranks[0], {.bucketCapBytes = 4});
  CHECK(tiny.buckets() == std::vector<std::vector<size_t>>{{3}, {2}, {1}, {0}});

  auto mixed = std::make_shared<nn::Module>("Mixed");
  mixed->registerParameter("a", zeros({2}));
  mixed->registerParameter("b", zeros({2}, {.dtype = DType::Float64}));
  mixed->registerParameter("c", zeros({2}, {.dtype = DType::Float64}));
  mixed->registerParameter("frozen", zeros({2}), /*requiresGrad=*/false);
  mixed->registerParameter("d", zeros({2}));
  Ddp split(mixed, ranks[0]);
  CHECK(split.buckets() == std::vector<std::vector<size_t>>{{3}, {2, 1}, {0}});
  CHECK(split.parameters().size() == 4);
}

TEST_CASE("construction copies rank 0's parameters and buffers to every rank") {
  DdpRanks ranks(3);
  std::vector<std::shared_ptr<Net>> nets;
  for (int r = 0; r < 3; ++r) nets.push_back(std::make_shared<Net>(10 + static_cast<uint64_t>(r)));
  nn::StateDict want;
  for (auto& [k, v] : nets[0]->stateDict()) want[k] = v.clone();
  CHECK_FALSE(allclose(nets[1]->parameters()[0], want["fc1.weight"]));
  std::vector<std::unique_ptr<Ddp>> ddps(3);
  ranks.onEachRank([&](int r) { ddps[static_cast<size_t>(r)] = std::make_unique<Ddp>(nets[static_cast<size_t>(r)], ranks[r]); });
  for (int r = 0; r < 3; ++r) {
    for (auto& [k, v] : nets[static_cast<size_t>(r)]->stateDict()) {
      INFO("rank " << r << " " << k);
      CHECK(v.toVector<float>() == want[k].toVector<float>());
    }
  }
}

TEST_CASE("backward leaves in .grad the average of the ranks' gradients, added to what .grad held") {
  DdpRanks ranks(2);
  std::vector<std::shared_ptr<Net>> nets = {std::make_shared<Net>(1), std::make_shared<Net>(2)};
  std::vector<std::unique_ptr<Ddp>> ddps(2);
  ranks.onEachRank([&](int r) {
    auto& ddp = ddps[static_cast<size_t>(r)];
    ddp = std::make_unique<Ddp>(nets[static_cast<size_t>(r)], ranks[r], Ddp::Options{.bucketCapBytes = 100});
    lossOf(ddp->forward(batchFor(r, 0))).backward();
  });
  auto g0 = localGradients(*nets[0], batchFor(0, 0));
  auto g1 = localGradients(*nets[0], batchFor(1, 0));
  for (int r = 0; r < 2; ++r) {
    auto params = nets[static_cast<size_t>(r)]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      REQUIRE(params[i].grad().defined());
      CHECK(allclose(params[i].grad(), (g0[i] + g1[i]) * 0.5, 0, 1e-6));
      CHECK_FALSE(allclose(params[i].grad(), g0[i], 0, 1e-6));
    }
    CHECK(ddps[static_cast<size_t>(r)]->stats().syncedPasses == 1);
  }
  // Bit-identical on both ranks.
  for (size_t i = 0; i < g0.size(); ++i) {
    CHECK(nets[0]->parameters()[i].grad().toVector<float>() == nets[1]->parameters()[i].grad().toVector<float>());
  }
  // A second pass without zeroing adds, as without DDP.
  ranks.onEachRank([&](int r) { lossOf(ddps[static_cast<size_t>(r)]->forward(batchFor(r, 0))).backward(); });
  auto params = nets[0]->parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(allclose(params[i].grad(), g0[i] + g1[i], 0, 2e-6));
}

TEST_CASE("on a group of one, the gradient is the local one") {
  DdpRanks ranks(1);
  auto net = std::make_shared<Net>(3);
  Ddp ddp(net, ranks[0]);
  lossOf(ddp(batchFor(0, 1))).backward();
  auto want = localGradients(*net, batchFor(0, 1));
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(params[i].grad().toVector<float>() == want[i].toVector<float>());
}

TEST_CASE("passes under noSync accumulate without communication and the next synced pass reduces the sum") {
  DdpRanks ranks(2);
  std::vector<std::shared_ptr<Net>> nets = {std::make_shared<Net>(1), std::make_shared<Net>(2)};
  std::vector<std::unique_ptr<Ddp>> ddps(2);
  std::vector<int64_t> startedBefore(2), startedAfter(2);
  ranks.onEachRank([&](int r) {
    auto& ddp = ddps[static_cast<size_t>(r)];
    ddp = std::make_unique<Ddp>(nets[static_cast<size_t>(r)], ranks[r]);
    startedBefore[static_cast<size_t>(r)] = ranks[r].collectivesStarted();
    {
      auto scope = ddp->noSync();
      CHECK_FALSE(ddp->syncEnabled());
      lossOf(ddp->forward(batchFor(r, 0))).backward();
      lossOf(ddp->forward(batchFor(r, 1))).backward();
      startedAfter[static_cast<size_t>(r)] = ranks[r].collectivesStarted();
    }
    CHECK(ddp->syncEnabled());
  });
  for (int r = 0; r < 2; ++r) {
    auto& ddp = *ddps[static_cast<size_t>(r)];
    // Nothing went over the group and nothing reached .grad.
    CHECK(startedAfter[static_cast<size_t>(r)] == startedBefore[static_cast<size_t>(r)]);
    for (const Tensor& p : nets[static_cast<size_t>(r)]->parameters()) CHECK_FALSE(p.grad().defined());
    CHECK(ddp.pendingGradient(0).defined());
    CHECK(ddp.stats().syncedPasses == 0);
  }
  CHECK_THROWS_AS(ddps[0]->pendingGradient(4), IndexError);
  ranks.onEachRank([&](int r) { lossOf(ddps[static_cast<size_t>(r)]->forward(batchFor(r, 2))).backward(); });
  std::vector<Tensor> sum;
  for (int r = 0; r < 2; ++r) {
    for (int s = 0; s < 3; ++s) {
      auto g = localGradients(*nets[0], batchFor(r, s));
      if (sum.empty()) {
        sum = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i) sum[i] = sum[i] + g[i];
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    auto params = nets[static_cast<size_t>(r)]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      CHECK(allclose(params[i].grad(), sum[i] * 0.5, 0, 1e-6));
      CHECK_FALSE(ddps[static_cast<size_t>(r)]->pendingGradient(i).defined());
    }
  }
}

TEST_CASE("a parameter without a gradient fails the pass naming it unless findUnusedParameters") {
  DdpRanks ranks(2);
  std::vector<std::shared_ptr<Net>> nets = {std::make_shared<Net>(1, true), std::make_shared<Net>(2, true)};
  for (auto& n : nets) n->useExtra = false;
  std::vector<std::unique_ptr<Ddp>> ddps(2);
  std::vector<std::string> errors(2);
  ranks.onEachRank([&](int r) {
    auto& ddp = ddps[static_cast<size_t>(r)];
    ddp = std::make_unique<Ddp>(nets[static_cast<size_t>(r)], ranks[r]);
    errors[static_cast<size_t>(r)] = errorOf([&] { lossOf(ddp->forward(batchFor(r, 0))).backward(); });
  });
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    INFO(e);
    CHECK(contains(e, "DistributedDataParallel: synced backward pass #1: 2 of 6 parameters received no gradient"));
    CHECK(contains(e, "'extra.weight', 'extra.bias'"));
    CHECK(contains(e, "findUnusedParameters"));
    for (const Tensor& p : nets[static_cast<size_t>(r)]->parameters()) CHECK_FALSE(p.grad().defined());
  }
}

TEST_CASE("findUnusedParameters reduces zeros for a parameter one rank did not use") {
  DdpRanks ranks(2);
  for (bool throughDdpForward : {true, false}) {
    CAPTURE(throughDdpForward);
    std::vector<std::shared_ptr<Net>> nets = {std::make_shared<Net>(1, true), std::make_shared<Net>(2, true)};
    nets[0]->useExtra = false;  // rank 0 leaves extra.* unused; rank 1 uses them
    std::vector<std::unique_ptr<Ddp>> ddps(2);
    ranks.onEachRank([&](int r) {
      auto& ddp = ddps[static_cast<size_t>(r)];
      ddp = std::make_unique<Ddp>(nets[static_cast<size_t>(r)], ranks[r],
                                  Ddp::Options{.bucketCapBytes = 40, .findUnusedParameters = true});
      Tensor x = batchFor(r, 0);
      Tensor out = throughDdpForward ? ddp->forward(x) : nets[static_cast<size_t>(r)]->forward(x);
      lossOf(out).backward();
    });
    auto g0 = localGradients(*nets[0], batchFor(0, 0));  // extra unused: fc gradients only
    auto g1 = localGradients(*nets[1], batchFor(1, 0));
    auto names = ddps[0]->parameterNames();
    for (int r = 0; r < 2; ++r) {
      auto params = nets[static_cast<size_t>(r)]->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        INFO("rank " << r << " " << names[i]);
        Tensor want = i < 4 ? (g0[i] + g1[i]) * 0.5 : g1[i] * 0.5;
        CHECK(allclose(params[i].grad(), want, 0, 1e-6));
      }
    }
    CHECK(ddps[0]->stats().unusedParameters == 2);
    CHECK(ddps[1]->stats().unusedParameters == 0);
  }
}

TEST_CASE("the first bucket is launched before backward reaches the first layer, buckets in order") {
  DdpRanks ranks(2);
  std::vector<std::shared_ptr<Net>> nets = {std::make_shared<Net>(1), std::make_shared<Net>(2)};
  std::vector<std::unique_ptr<Ddp>> ddps(2);
  std::vector<int64_t> inputGradNs(2);
  ranks.onEachRank([&](int r) {
    auto& ddp = ddps[static_cast<size_t>(r)];
    ddp = std::make_unique<Ddp>(nets[static_cast<size_t>(r)], ranks[r], Ddp::Options{.bucketCapBytes = 130});
    // The input's gradient is the last thing backward computes (after fc1's).
    Tensor x = batchFor(r, 0).requiresGrad_();
    x.gradAccumulator()->registerPreHook([&inputGradNs, r](std::vector<Tensor>&) {
      inputGradNs[static_cast<size_t>(r)] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now().time_since_epoch())
                                                .count();
    });
    lossOf(ddp->forward(x)).backward();
  });
  for (int r = 0; r < 2; ++r) {
    Ddp::Stats s = ddps[static_cast<size_t>(r)]->stats();
    // Launched while backward still had fc1 and the input to go.
    CHECK(s.launches.at(0).ns < inputGradNs[static_cast<size_t>(r)]);
    REQUIRE(s.launches.size() == 3);
    for (size_t k = 0; k < 3; ++k) CHECK(s.launches[k].bucket == k);
    // Backward produces fc2's gradients first: bucket 0 = {fc2.bias, fc2.weight} fills after 2 hooks.
    CHECK(s.hookOrder.size() == 4);
    CHECK(s.launches[0].hooksBefore == 2);
    CHECK(s.launches[0].ns <= s.hookNs.back());
    CHECK(s.launches[2].hooksBefore == 4);
  }
}

TEST_CASE("a rank running one synced pass more than the others fails with the group's timeout, not a hang") {
  for (bool broadcastBuffers : {false, true}) {
    CAPTURE(broadcastBuffers);
    DdpRanks ranks(2, 1000ms);
    std::vector<std::shared_ptr<Net>> nets = {std::make_shared<Net>(1), std::make_shared<Net>(2)};
    std::vector<std::unique_ptr<Ddp>> ddps(2);
    std::string error;
    ranks.onEachRank([&](int r) {
      auto& ddp = ddps[static_cast<size_t>(r)];
      ddp = std::make_unique<Ddp>(nets[static_cast<size_t>(r)], ranks[r],
                                  Ddp::Options{.broadcastBuffers = broadcastBuffers});
      lossOf(ddp->forward(batchFor(r, 0))).backward();
      if (r == 0) {
        auto began = std::chrono::steady_clock::now();
        try {
          lossOf(ddp->forward(batchFor(r, 1))).backward();
        } catch (const TimeoutError& e) {
          error = e.what();
        }
        CHECK(std::chrono::steady_clock::now() - began < 8s);
      }
    });
    INFO(error);
    CHECK(contains(error, "ranks [1] had not started it when last heard"));
    if (broadcastBuffers) {
      // Collectives: #0 construction, #1 the buffers before the first forward, #2 its bucket, #3 the
      // bucket rebuild, #4 the buffers before the second forward.
      CHECK(contains(error, "DistributedDataParallel: broadcasting the buffers from rank 0 before forward failed"));
      CHECK(contains(error, "broadcast #4 on group 'default'"));
    } else {
      CHECK(contains(error, "DistributedDataParallel: synced backward pass #2: the allreduce of bucket 0 (of 1) failed"));
      CHECK(contains(error, "allReduce #3 on group 'default'"));
    }
  }
}

TEST_CASE("after the first synced pass the buckets follow the order gradients arrived on rank 0, on every "
          "rank, and later passes launch their first bucket sooner") {
  DdpRanks ranks(2);
  std::vector<std::shared_ptr<Swapped>> nets = {std::make_shared<Swapped>(1), std::make_shared<Swapped>(2)};
  std::vector<std::unique_ptr<Ddp>> ddps(2);
  // fc2.weight 96 B, fc2.bias 12 B, fc1.weight 128 B, fc1.bias 32 B; a cap of 130 B.
  const std::vector<std::vector<size_t>> reverse = {{3}, {2}, {1, 0}};
  std::vector<Ddp::Stats> first(2), second(2);
  std::vector<std::vector<std::vector<size_t>>> before(2), after(2);
  ranks.onEachRank([&](int r) {
    const size_t i = static_cast<size_t>(r);
    ddps[i] = std::make_unique<Ddp>(nets[i], ranks[r], Ddp::Options{.bucketCapBytes = 130});
    before[i] = ddps[i]->buckets();
    lossOf(ddps[i]->forward(batchFor(r, 0))).backward();
    first[i] = ddps[i]->stats();
    after[i] = ddps[i]->buckets();
    nets[i]->zeroGrad(true);
    lossOf(ddps[i]->forward(batchFor(r, 1))).backward();
    second[i] = ddps[i]->stats();
  });
  // The rebuilt layout: rank 0's arrival order, cut at the cap.
  const std::vector<size_t>& arrived = first[0].hookOrder;
  REQUIRE(arrived.size() == 4);
  CHECK(std::set<size_t>(arrived.begin(), arrived.begin() + 2) == std::set<size_t>{0, 1});  // fc2 first
  std::vector<std::vector<size_t>> want;
  int64_t bytes = 0;
  const int64_t sizes[] = {96, 12, 128, 32};
  for (size_t k : arrived) {
    if (want.empty() || bytes + sizes[k] > 130) {
      want.emplace_back();
      bytes = 0;
    }
    want.back().push_back(k);
    bytes += sizes[k];
  }
  for (int r = 0; r < 2; ++r) {
    const size_t i = static_cast<size_t>(r);
    INFO("rank " << r);
    CHECK(before[i] == reverse);
    CHECK(after[i] == want);
    CHECK(first[i].bucketRebuilds == 1);
    CHECK(second[i].bucketRebuilds == 1);  // once only
    CHECK(ddps[i]->buckets() == want);
    // Before: the first bucket (fc1.bias) waited for backward to reach fc1; after: fc2's two gradients.
    CHECK(first[i].launches.at(0).hooksBefore >= 3);
    CHECK(second[i].launches.at(0).hooksBefore == 2);
    CHECK(second[i].launches.size() == want.size());
  }
  // The second pass's gradients are the average of the ranks' own, the same bits on both.
  auto twin = std::make_shared<Swapped>(9);
  nn::StateDict state;
  for (auto& [k, v] : nets[0]->stateDict()) state[k] = v.clone();
  std::vector<std::vector<Tensor>> local(2);
  for (int r = 0; r < 2; ++r) {
    twin->loadStateDict(state);
    twin->zeroGrad(true);
    lossOf(twin->forward(batchFor(r, 1))).backward();
    for (const Tensor& p : twin->parameters()) local[static_cast<size_t>(r)].push_back(p.grad().clone());
  }
  for (size_t k = 0; k < 4; ++k) {
    INFO("parameter " << k);
    Tensor g0 = nets[0]->parameters()[k].grad();
    CHECK(allclose(g0, (local[0][k] + local[1][k]) * 0.5, 0, 1e-6));
    CHECK(g0.toVector<float>() == nets[1]->parameters()[k].grad().toVector<float>());
  }
}

TEST_CASE("with rebuildBuckets off the buckets keep reverse parameter order") {
  DdpRanks ranks(2);
  std::vector<std::shared_ptr<Swapped>> nets = {std::make_shared<Swapped>(1), std::make_shared<Swapped>(2)};
  std::vector<std::unique_ptr<Ddp>> ddps(2);
  std::vector<int64_t> byPasses(2);
  ranks.onEachRank([&](int r) {
    const size_t i = static_cast<size_t>(r);
    ddps[i] = std::make_unique<Ddp>(nets[i], ranks[r],
                                    Ddp::Options{.bucketCapBytes = 130, .rebuildBuckets = false, .broadcastBuffers = false});
    const int64_t constructed = ranks[r].collectivesStarted();
    for (int step = 0; step < 2; ++step) lossOf(ddps[i]->forward(batchFor(r, step))).backward();
    byPasses[i] = ranks[r].collectivesStarted() - constructed;
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(ddps[static_cast<size_t>(r)]->buckets() == std::vector<std::vector<size_t>>{{3}, {2}, {1, 0}});
    CHECK(ddps[static_cast<size_t>(r)]->stats().bucketRebuilds == 0);
    CHECK(byPasses[static_cast<size_t>(r)] == 2 * 3);  // 3 buckets per pass, nothing else
  }
}

TEST_CASE("each synced forward gives every rank rank 0's buffers, while noSync, grad-disabled forwards and "
          "broadcastBuffers off leave each rank its own") {
  DdpRanks ranks(3);
  auto scales = [](const std::vector<std::shared_ptr<Swapped>>& nets) {
    std::vector<float> out;
    for (const auto& n : nets) out.push_back(n->scale().item<float>());
    return out;
  };
  // Each rank sets its own scale, then runs one forward of the kind given.
  auto run = [&](std::vector<std::unique_ptr<Ddp>>& ddps, std::vector<std::shared_ptr<Swapped>>& nets,
                 const std::function<void(Ddp&, int)>& forward) {
    ranks.onEachRank([&](int r) {
      const size_t i = static_cast<size_t>(r);
      nets[i]->scale().fill_(10.0 * (r + 1));
      forward(*ddps[i], r);
    });
  };
  for (bool on : {true, false}) {
    CAPTURE(on);
    std::vector<std::shared_ptr<Swapped>> nets;
    for (int r = 0; r < 3; ++r) nets.push_back(std::make_shared<Swapped>(static_cast<uint64_t>(r) + 1));
    std::vector<std::unique_ptr<Ddp>> ddps(3);
    std::vector<Tensor> outs(3);
    ranks.onEachRank([&](int r) {
      ddps[static_cast<size_t>(r)] =
          std::make_unique<Ddp>(nets[static_cast<size_t>(r)], ranks[r], Ddp::Options{.broadcastBuffers = on});
    });
    // A synced forward (the default mode, grad enabled).
    run(ddps, nets, [&](Ddp& ddp, int r) {
      outs[static_cast<size_t>(r)] = ddp.forward(batchFor(0, 0));
      lossOf(outs[static_cast<size_t>(r)]).backward();
    });
    if (on) {
      CHECK(scales(nets) == std::vector<float>{10, 10, 10});
      // The forward used rank 0's scale: the same input gives the same output on every rank.
      CHECK(outs[1].toVector<float>() == outs[0].toVector<float>());
      CHECK(outs[2].toVector<float>() == outs[0].toVector<float>());
    } else {
      CHECK(scales(nets) == std::vector<float>{10, 20, 30});
      CHECK(outs[1].toVector<float>() != outs[0].toVector<float>());
    }
    // Under noSync, and with grad mode off, no rank waits for the others: each keeps its own.
    run(ddps, nets, [&](Ddp& ddp, int r) {
      auto scope = ddp.noSync();
      ddp.forward(batchFor(r, 1));
    });
    CHECK(scales(nets) == std::vector<float>{10, 20, 30});
    run(ddps, nets, [&](Ddp& ddp, int r) {
      NoGradGuard noGrad;
      if (r != 1) ddp.forward(batchFor(r, 2));  // ranks may even evaluate different numbers of batches
    });
    CHECK(scales(nets) == std::vector<float>{10, 20, 30});
  }
}

TEST_CASE("a forward with two inputs gives every rank the gradient of one process over the whole batch") {
  DdpRanks ranks(2);
  std::vector<std::shared_ptr<TwoTower>> nets = {std::make_shared<TwoTower>(1), std::make_shared<TwoTower>(2)};
  ranks.onEachRank([&](int r) {
    Ddp ddp(nets[static_cast<size_t>(r)], ranks[r], Ddp::Options{.bucketCapBytes = 40});
    auto [a, b] = twoInputsFor(r);
    lossOf(ddp.forward<TwoTower>(a, b)).backward();
  });
  // The reference: one process, rank 0's initial parameters, both ranks' rows in one batch (equal
  // halves, so the mean loss over the whole batch is the average of the ranks' mean losses).
  auto single = std::make_shared<TwoTower>(1);
  auto [a0, b0] = twoInputsFor(0);
  auto [a1, b1] = twoInputsFor(1);
  lossOf(single->forward(cat({a0, a1}), cat({b0, b1}))).backward();
  auto want = single->parameters();
  for (int r = 0; r < 2; ++r) {
    auto params = nets[static_cast<size_t>(r)]->parameters();
    REQUIRE(params.size() == want.size());
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      CHECK(allclose(params[i].grad(), want[i].grad(), 1e-5, 1e-6));
    }
  }
}

TEST_CASE("findUnusedParameters looks through every tensor of a multi-input forward's pair result") {
  DdpRanks ranks(2);
  std::vector<std::shared_ptr<TwoTower>> nets = {std::make_shared<TwoTower>(1), std::make_shared<TwoTower>(2)};
  ranks.onEachRank([&](int r) {
    Ddp ddp(nets[static_cast<size_t>(r)], ranks[r], Ddp::Options{.bucketCapBytes = 40, .findUnusedParameters = true});
    auto [a, b] = twoInputsFor(r);
    auto [outA, outB] = ddp.forward<TwoTower>(a, b, /*useB=*/r == 1);  // rank 0 leaves towerB unused
    Tensor loss = lossOf(outA);
    if (outB.defined()) loss = loss + lossOf(outB);
    loss.backward();
  });
  // Per rank, one process: towerA gets both ranks' gradients, towerB rank 1's only.
  std::vector<std::vector<Tensor>> local;
  for (int r = 0; r < 2; ++r) {
    auto twin = std::make_shared<TwoTower>(1);
    auto [a, b] = twoInputsFor(r);
    auto [outA, outB] = twin->forward(a, b, r == 1);
    Tensor loss = lossOf(outA);
    if (outB.defined()) loss = loss + lossOf(outB);
    loss.backward();
    std::vector<Tensor> g;
    for (const Tensor& p : twin->parameters()) g.push_back(p.grad().defined() ? p.grad() : zerosLike(p));
    local.push_back(g);
  }
  for (int r = 0; r < 2; ++r) {
    auto params = nets[static_cast<size_t>(r)]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      CHECK(allclose(params[i].grad(), (local[0][i] + local[1][i]) * 0.5, 1e-5, 1e-6));
    }
  }
}

TEST_CASE("a multi-input forward naming another module type is an InvalidArgumentError") {
  DdpRanks ranks(1);
  Ddp ddp(std::make_shared<Net>(3), ranks[0]);
  Tensor a = zeros({1, 4}), b = zeros({1, 2});
  CHECK_THROWS_WITH_AS(ddp.forward<TwoTower>(a, b), doctest::Contains("the module (Net) is not of the type named by M"),
                       InvalidArgumentError);
}

TEST_SUITE_END();
