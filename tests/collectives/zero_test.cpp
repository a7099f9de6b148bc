// ZeroRedundancyOptimizer within one process: each rank is a thread with its own ProcessGroupGloo
// (real TCP on 127.0.0.1) and its own replica under DistributedDataParallel. The partition against
// the greedy rule worked out by hand, parameters after several steps against DDP with the plain
// optimizer (bit for bit), the optimizer state held per rank, the consolidated state dict against
// the plain optimizer's and its round trip, and ranks that wrap different parameters. The
// multiprocess test (zero_mp_test.cpp) repeats the equality on the GPT and measures the memory.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/zero.h"
#include "common/error.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "tensor/ops.h"
#include "captured_text.h"
#include "collectives/thread_ranks.h"

using namespace weft;
using namespace std::chrono_literals;
using weft::collectives::DistributedDataParallel;
using weft::collectives::ProcessGroupGloo;
using weft::collectives::ZeroRedundancyOptimizer;
using weft::testing::contains;

namespace {

using Ddp = DistributedDataParallel;
using Zero = ZeroRedundancyOptimizer;
using weft::testing::Ranks;

// 6 -> 12 -> 12 -> 3 with tanh between: matrices and biases of several sizes.
class Mlp : public nn::Module {
 public:
  explicit Mlp(uint64_t seed) : Module("Mlp") {
    Generator gen(seed);
    a_ = registerModule("a", std::make_shared<nn::Linear>(6, 12));
    b_ = registerModule("b", std::make_shared<nn::Linear>(12, 12));
    c_ = registerModule("c", std::make_shared<nn::Linear>(12, 3));
    a_->resetParameters(&gen);
    b_->resetParameters(&gen);
    c_->resetParameters(&gen);
  }
  Tensor forward(const Tensor& x) override { return c_->forward(tanh(b_->forward(tanh(a_->forward(x))))); }

 private:
  std::shared_ptr<nn::Linear> a_, b_, c_;
};

Tensor batchFor(int rank, int step) {
  Generator gen(3000 + static_cast<uint64_t>(rank) * 131 + static_cast<uint64_t>(step));
  return randn({7, 6}, {}, &gen);
}

Tensor lossOf(const Tensor& out) { return square(out).mean(); }

nn::optim::OptimizerOptions adamw() {
  return nn::optim::AdamWOptions{.lr = 0.01, .betas = {0.8, 0.95}, .eps = 1e-6, .weightDecay = 0.1};
}

// Every rank's parameters after `steps` steps of DDP training with `makeOpt`'s optimizer, each
// rank on its own data; every rank starts from Mlp(1) (DDP broadcasts rank 0's).
template <class MakeOpt, class Step>
std::vector<std::vector<Tensor>> train(int world, int steps, MakeOpt makeOpt, Step stepOf) {
  Ranks ranks(world);
  std::vector<std::vector<Tensor>> out(static_cast<size_t>(world));
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Mlp>(1 + static_cast<uint64_t>(r));
    Ddp ddp(net, ranks[r]);
    auto opt = makeOpt(*net, ranks[r]);
    for (int s = 0; s < steps; ++s) {
      opt->zeroGrad();
      lossOf(ddp.forward(batchFor(r, s))).backward();
      stepOf(*opt);
    }
    for (const Tensor& p : net->parameters()) out[static_cast<size_t>(r)].push_back(p.detach().clone());
  });
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

TEST_SUITE_BEGIN("zero");

TEST_CASE("parameters go, largest first, to the rank owning the fewest bytes, ties to the lowest rank") {
  // Sizes 10, 50, 30, 30, 5. Largest first: #1 (50) -> 0; #2 (30) -> 1; #3 (30) -> 1 (30 < 50);
  // #0 (10) -> 0 (50 < 60); #4 (5): both own 60 -> rank 0.
  Ranks two(2);
  two.onEachRank([&](int r) {
    std::vector<Tensor> params;
    for (int64_t n : {10, 50, 30, 30, 5}) params.push_back(zeros({n}).requiresGrad_());
    Zero zero(params, nn::optim::SGDOptions{.lr = 0.1}, two[r]);
    CHECK(zero.ownerOf(0) == 0);
    CHECK(zero.ownerOf(1) == 0);
    CHECK(zero.ownerOf(2) == 1);
    CHECK(zero.ownerOf(3) == 1);
    CHECK(zero.ownerOf(4) == 0);
    CHECK(zero.shard(0) == std::vector<size_t>{0, 1, 4});
    CHECK(zero.shard(1) == std::vector<size_t>{2, 3});
    CHECK(zero.localOptimizer()->params().size() == (r == 0 ? 3u : 2u));
    CHECK_THROWS_AS(zero.ownerOf(5), IndexError);
    CHECK_THROWS_AS(zero.shard(2), InvalidArgumentError);
  });
  // Three ranks, four parameters: one rank owns nothing and builds no optimizer, yet steps along.
  Ranks three(3);
  three.onEachRank([&](int r) {
    std::vector<Tensor> params;
    for (int64_t n : {4, 100, 3}) params.push_back(full({n}, 1.0).requiresGrad_());
    Zero zero(params, nn::optim::SGDOptions{.lr = 0.5}, three[r]);
    // #1 -> 0, #0 -> 1, #2 -> 2.
    CHECK(zero.shard(0) == std::vector<size_t>{1});
    CHECK(zero.shard(1) == std::vector<size_t>{0});
    CHECK(zero.shard(2) == std::vector<size_t>{2});
    for (Tensor& p : params) p.setGrad(full(p.shape(), 2.0));
    zero.step();
    for (const Tensor& p : params) CHECK(allclose(p, full(p.shape(), 0.0), 0, 0));
  });
  Ranks four(4);
  four.onEachRank([&](int r) {
    std::vector<Tensor> params;
    for (int64_t n : {8, 6}) params.push_back(full({n}, 1.0).requiresGrad_());
    Zero zero(params, nn::optim::SGDOptions{.lr = 0.25}, four[r]);
    CHECK((zero.localOptimizer() == nullptr) == (r >= 2));
    CHECK(zero.stateBytes() == 0);
    for (Tensor& p : params) p.setGrad(full(p.shape(), 2.0));
    zero.step();
    for (const Tensor& p : params) CHECK(allclose(p, full(p.shape(), 0.5), 0, 0));
  });
}

TEST_CASE("after 5 AdamW steps under DDP the parameters equal those of the plain optimizer to the bit, on 2 and "
          "3 ranks, with parameter groups") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    auto groupsOf = [](nn::Module& net) { return nn::optim::decayGroups(net.namedParameters(), adamw()); };
    auto plain = train(
        world, 5, [&](nn::Module& net, ProcessGroupGloo&) { return std::make_unique<nn::optim::AdamW>(groupsOf(net)); },
        [](nn::optim::Optimizer& o) { o.step(); });
    auto sharded = train(
        world, 5, [&](nn::Module& net, ProcessGroupGloo& pg) { return std::make_unique<Zero>(groupsOf(net), pg); },
        [](Zero& o) { o.step(); });
    auto initial = std::make_shared<Mlp>(1)->parameters();
    for (int r = 0; r < world; ++r) {
      const auto& got = sharded[static_cast<size_t>(r)];
      const auto& want = plain[static_cast<size_t>(r)];
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("rank " << r << " parameter " << i);
        CHECK(got[i].toVector<float>() == want[i].toVector<float>());
        CHECK_FALSE(allclose(got[i], initial[i], 0, 1e-4));  // it trained
      }
    }
  }
}

TEST_CASE("each rank holds the AdamW state of its shard only; the consolidated state dict equals the plain "
          "optimizer's and loads back") {
  constexpr int kWorld = 3;
  Ranks ranks(kWorld);
  std::vector<nn::StateDict> consolidated(kWorld);
  std::vector<int64_t> stateBytes(kWorld);
  std::vector<int64_t> shardNumel(kWorld);
  nn::StateDict plainState;
  std::vector<std::vector<Tensor>> afterReload(kWorld);
  std::vector<Tensor> plainAfter;
  // The plain reference on one process: the average of the ranks' gradients, computed locally.
  {
    auto net = std::make_shared<Mlp>(1);
    nn::optim::AdamW opt(net->parameters(), std::get<nn::optim::AdamWOptions>(adamw()));
    for (int s = 0; s < 4; ++s) {
      opt.zeroGrad();
      std::vector<Tensor> sum;
      for (int r = 0; r < kWorld; ++r) {
        auto twin = std::make_shared<Mlp>(1);
        twin->loadStateDict(net->stateDict());
        lossOf(twin->forward(batchFor(r, s))).backward();
        auto tp = twin->parameters();
        for (size_t i = 0; i < tp.size(); ++i) {
          if (r == 0) sum.push_back(tp[i].grad().clone());
          else sum[i] = sum[i] + tp[i].grad();
        }
      }
      auto params = net->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].setGrad(sum[i] * (1.0 / kWorld));
      opt.step();
      if (s == 2) {
        for (auto& [k, v] : opt.stateDict()) plainState[k] = v.clone();
      }
    }
    for (const Tensor& p : net->parameters()) plainAfter.push_back(p.detach().clone());
  }
  ranks.onEachRank([&](int r) {
    const auto ri = static_cast<size_t>(r);
    auto net = std::make_shared<Mlp>(1);
    Ddp ddp(net, ranks[r]);
    auto zero = std::make_unique<Zero>(net->parameters(), adamw(), ranks[r]);
    for (int s = 0; s < 3; ++s) {
      zero->zeroGrad();
      lossOf(ddp.forward(batchFor(r, s))).backward();
      zero->step();
    }
    stateBytes[ri] = zero->stateBytes();
    for (size_t i : zero->shard(r)) shardNumel[ri] += net->parameters()[i].numel();
    consolidated[ri] = zero->consolidatedStateDict(0);
    // A fresh optimizer loaded from rank 0's dict (every rank reads the same one here) continues alike.
    ranks[r].barrier().wait();
    zero = std::make_unique<Zero>(net->parameters(), adamw(), ranks[r]);
    zero->loadStateDict(consolidated[0]);
    zero->zeroGrad();
    lossOf(ddp.forward(batchFor(r, 3))).backward();
    zero->step();
    for (const Tensor& p : net->parameters()) afterReload[ri].push_back(p.detach().clone());
  });
  int64_t total = 0;
  for (int r = 0; r < kWorld; ++r) {
    // exp_avg and exp_avg_sq, float32, for the shard's elements only.
    CHECK(stateBytes[static_cast<size_t>(r)] == 8 * shardNumel[static_cast<size_t>(r)]);
    total += shardNumel[static_cast<size_t>(r)];
    if (r != 0) CHECK(consolidated[static_cast<size_t>(r)].empty());
  }
  CHECK(total == 6 * 12 + 12 + 12 * 12 + 12 + 12 * 3 + 3);
  // Same keys, same values as the plain optimizer's after 3 steps.
  const nn::StateDict& got = consolidated[0];
  REQUIRE(got.size() == plainState.size());
  for (const auto& [key, want] : plainState) {
    INFO(key);
    REQUIRE(got.count(key) == 1);
    CHECK(allclose(got.at(key).to(want.dtype()), want, 1e-5, 1e-7));
  }
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < plainAfter.size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      CHECK(allclose(afterReload[static_cast<size_t>(r)][i], plainAfter[i], 1e-5, 1e-6));
    }
  }
}

TEST_CASE("each rank's sharded state dict reloads on that rank and the next step is the same; another rank's "
          "or another group size's is refused") {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld);
  std::vector<nn::StateDict> saved(kWorld);
  std::vector<std::vector<Tensor>> continued(kWorld), reloaded(kWorld);
  std::vector<std::string> wrongRank(kWorld), wrongWorld(kWorld);
  ranks.onEachRank([&](int r) {
    const auto ri = static_cast<size_t>(r);
    auto net = std::make_shared<Mlp>(1);
    Ddp ddp(net, ranks[r]);
    auto zero = std::make_unique<Zero>(nn::optim::decayGroups(net->namedParameters(), adamw()), ranks[r]);
    auto stepOn = [&](int s) {
      zero->zeroGrad();
      lossOf(ddp.forward(batchFor(r, s))).backward();
      zero->step();
    };
    for (int s = 0; s < 3; ++s) stepOn(s);
    for (auto& [k, v] : zero->shardedStateDict()) saved[ri][k] = v.clone();
    nn::StateDict params;
    for (auto& [k, v] : net->stateDict()) params[k] = v.clone();
    stepOn(3);
    for (const Tensor& p : net->parameters()) continued[ri].push_back(p.detach().clone());
    ranks[r].barrier().wait();
    net->loadStateDict(params);
    zero = std::make_unique<Zero>(nn::optim::decayGroups(net->namedParameters(), adamw()), ranks[r]);
    wrongRank[ri] = errorOf([&] { zero->loadShardedStateDict(saved[1 - ri]); });
    nn::StateDict otherWorld = saved[ri];
    otherWorld["shard.world"] = scalarTensor(3, DType::Int64);
    wrongWorld[ri] = errorOf([&] { zero->loadShardedStateDict(otherWorld); });
    zero->loadShardedStateDict(saved[ri]);
    stepOn(3);
    for (const Tensor& p : net->parameters()) reloaded[ri].push_back(p.detach().clone());
  });
  for (int r = 0; r < kWorld; ++r) {
    const auto ri = static_cast<size_t>(r);
    CHECK(contains(wrongRank[ri], "the shard was saved by rank " + std::to_string(1 - r) + ", this is rank " +
                                      std::to_string(r)));
    CHECK(contains(wrongWorld[ri], "the shard was saved in a group of 3 ranks, this group has 2"));
    CHECK(saved[ri].count("shard.params") == 1);
    for (size_t i = 0; i < continued[ri].size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      CHECK(reloaded[ri][i].toVector<float>() == continued[ri][i].toVector<float>());
    }
  }
}

TEST_CASE("a state dict that does not fit the groups is refused naming the key") {
  Ranks ranks(2);
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Mlp>(1);
    Zero zero(net->parameters(), adamw(), ranks[r]);
    nn::StateDict dict{{"param_groups.0.params", scalarTensor(3, DType::Int64)}};
    CHECK(contains(errorOf([&] { zero.loadStateDict(dict); }), "'param_groups.0.params' is 3 but group 0 has 6"));
    nn::StateDict bad{{"state.6.step", scalarTensor(1, DType::Int64)}};
    CHECK(contains(errorOf([&] { zero.loadStateDict(bad); }), "refers to parameter 6 but the optimizer has 6"));
  });
}

TEST_CASE("ranks wrapping different parameters fail alike at construction, naming the first difference") {
  Ranks ranks(2);
  std::vector<std::string> errors(2);
  ranks.onEachRank([&](int r) {
    std::vector<Tensor> params{zeros({4, 3}).requiresGrad_(), zeros({r == 0 ? 5 : 6}).requiresGrad_()};
    errors[static_cast<size_t>(r)] = errorOf([&] { Zero zero(params, adamw(), ranks[r]); });
  });
  for (const std::string& e : errors) {
    CHECK(contains(e, "ZeroRedundancyOptimizer: the ranks wrap different parameters"));
    CHECK(contains(e, "parameter 1 has 5 elements of float32 on rank 0 but 6 elements of float32 on rank 1"));
  }
  CHECK_THROWS_AS(Zero({nn::optim::ParamGroup{{zeros({2}).requiresGrad_()}, adamw()}}, ranks[0],
                       Zero::Options{.broadcastBucketBytes = 0}),
                  InvalidArgumentError);
}

TEST_SUITE_END();
