// ShardedDataParallel (ZeRO-2) within one process: each rank is a thread with its own
// ProcessGroupGloo. Gradient shards against DDP's averaged gradients, reduce-scatters launched
// during backward, parameters after several AdamW steps against DDP with the plain optimizer,
// the bytes held per rank against the shard sizes, a parameter without a gradient and ranks that
// wrap different parameters. zero_mp_test.cpp repeats the equality on the GPT across processes and
// measures the memory through the storage accounting.
#include <doctest/doctest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/sharded_ddp.h"
#include "common/error.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "nn/utils.h"
#include "tensor/ops.h"
#include "captured_text.h"
#include "collectives/thread_ranks.h"

using namespace weft;
using weft::collectives::DistributedDataParallel;
using weft::collectives::ShardedDataParallel;
using weft::testing::contains;
using weft::testing::Ranks;

namespace {

using Sdp = ShardedDataParallel;

// 5 -> 9 -> 7 -> 2 with tanh between, and a Linear(2, 2) that forward uses only when useExtra.
class Net : public nn::Module {
 public:
  explicit Net(uint64_t seed) : Module("Net") {
    Generator gen(seed);
    a_ = registerModule("a", std::make_shared<nn::Linear>(5, 9));
    b_ = registerModule("b", std::make_shared<nn::Linear>(9, 7));
    c_ = registerModule("c", std::make_shared<nn::Linear>(7, 2));
    extra_ = registerModule("extra", std::make_shared<nn::Linear>(2, 2));
    for (auto& l : {a_, b_, c_, extra_}) l->resetParameters(&gen);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = c_->forward(tanh(b_->forward(tanh(a_->forward(x)))));
    return useExtra ? extra_->forward(h) : h;
  }
  bool useExtra = true;

 private:
  std::shared_ptr<nn::Linear> a_, b_, c_, extra_;
};

constexpr int64_t kParams = 5 * 9 + 9 + 9 * 7 + 7 + 7 * 2 + 2 + 2 * 2 + 2;

Tensor batchFor(int rank, int step) {
  Generator gen(7000 + static_cast<uint64_t>(rank) * 71 + static_cast<uint64_t>(step));
  return randn({6, 5}, {}, &gen);
}

Tensor lossOf(const Tensor& out) { return square(out).mean(); }

nn::optim::OptimizerOptions adamw() {
  return nn::optim::AdamWOptions{.lr = 0.02, .betas = {0.85, 0.97}, .eps = 1e-6, .weightDecay = 0.05};
}

// Buckets of 160 bytes: several buckets, parameters split between ranks.
constexpr int64_t kCap = 160;

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE_BEGIN("sharded_ddp");

TEST_CASE("each rank keeps its slices of DDP's averaged gradients, reduced during backward; .grad stays empty") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    Ranks ranks(world);
    std::vector<std::vector<Tensor>> ddpGrads(static_cast<size_t>(world));
    ranks.onEachRank([&](int r) {
      auto net = std::make_shared<Net>(1 + static_cast<uint64_t>(r));
      DistributedDataParallel ddp(net, ranks[r]);
      lossOf(ddp.forward(batchFor(r, 0))).backward();
      for (const Tensor& p : net->parameters()) ddpGrads[static_cast<size_t>(r)].push_back(p.grad().clone());
    });
    std::vector<int64_t> owned(static_cast<size_t>(world));
    ranks.onEachRank([&](int r) {
      const auto ri = static_cast<size_t>(r);
      auto net = std::make_shared<Net>(1 + static_cast<uint64_t>(r));
      Sdp sdp(net, nn::optim::decayGroups(net->namedParameters(), adamw()), ranks[r], {.bucketCapBytes = kCap});
      lossOf(sdp.forward(batchFor(r, 0))).backward();
      // decayGroups: the matrices a, b, c, extra first, then the biases.
      const std::vector<size_t> moduleIndex = {0, 2, 4, 6, 1, 3, 5, 7};
      for (size_t i = 0; i < sdp.params().size(); ++i) {
        INFO("rank " << r << " parameter " << i);
        CHECK_FALSE(sdp.params()[i].grad().defined());
        Tensor want = ddpGrads[0][moduleIndex[i]].view({-1});
        for (const auto& slice : sdp.gradientSlices(i)) {
          REQUIRE(slice.grad.defined());
          owned[ri] += slice.grad.numel();
          Tensor ref = want.narrow(0, slice.start, slice.grad.numel());
          CHECK(allclose(slice.grad, ref, 0, 1e-7));
          if (world == 2) CHECK(slice.grad.toVector<float>() == ref.toVector<float>());
        }
      }
      // Reverse module order across the groups, cut at 160 B: extra.bias, extra.weight, c.bias,
      // c.weight, b.bias (116 B) | b.weight (252 B) | a.bias | a.weight.
      CHECK(sdp.buckets() == std::vector<std::vector<size_t>>{{7, 3, 6, 2, 5}, {1}, {4}, {0}});
      auto stats = sdp.stats();
      CHECK(stats.hooks == 8);
      REQUIRE(stats.launchHooks.size() == sdp.buckets().size());
      CHECK(sdp.buckets().size() >= 3);
      CHECK(stats.launchHooks.front() < stats.hooks);  // the first bucket went out during backward
      CHECK(sdp.gradientShardBytes() == 4 * [&] {
        int64_t chunks = 0;
        for (const auto& b : sdp.buckets()) {
          int64_t n = 0;
          for (size_t k : b) n += sdp.params()[k].numel();
          chunks += (n + world - 1) / world;
        }
        return chunks;
      }());
    });
    int64_t total = 0;
    for (int64_t n : owned) total += n;
    CHECK(total == kParams);  // every element owned by exactly one rank
  }
}

TEST_CASE("after 5 AdamW steps the parameters equal DDP's with the plain optimizer, on 2 and 3 ranks; the state "
          "is held for the shard only") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    std::vector<std::vector<Tensor>> plain(static_cast<size_t>(world)), sharded(static_cast<size_t>(world));
    std::vector<int64_t> stateBytes(static_cast<size_t>(world));
    {
      Ranks ranks(world);
      ranks.onEachRank([&](int r) {
        auto net = std::make_shared<Net>(1 + static_cast<uint64_t>(r));
        DistributedDataParallel ddp(net, ranks[r]);
        nn::optim::AdamW opt(nn::optim::decayGroups(net->namedParameters(), adamw()));
        for (int s = 0; s < 5; ++s) {
          opt.zeroGrad();
          lossOf(ddp.forward(batchFor(r, s))).backward();
          opt.step();
        }
        for (const Tensor& p : net->parameters()) plain[static_cast<size_t>(r)].push_back(p.detach().clone());
      });
    }
    {
      Ranks ranks(world);
      ranks.onEachRank([&](int r) {
        auto net = std::make_shared<Net>(1 + static_cast<uint64_t>(r));
        Sdp sdp(net, nn::optim::decayGroups(net->namedParameters(), adamw()), ranks[r], {.bucketCapBytes = kCap});
        for (int s = 0; s < 5; ++s) {
          sdp.zeroGrad();
          lossOf(sdp.forward(batchFor(r, s))).backward();
          sdp.step();
        }
        stateBytes[static_cast<size_t>(r)] = sdp.stateBytes();
        for (const Tensor& p : net->parameters()) sharded[static_cast<size_t>(r)].push_back(p.detach().clone());
      });
    }
    auto initial = std::make_shared<Net>(1)->parameters();
    int64_t total = 0;
    for (int r = 0; r < world; ++r) {
      total += stateBytes[static_cast<size_t>(r)];
      for (size_t i = 0; i < initial.size(); ++i) {
        INFO("rank " << r << " parameter " << i);
        const Tensor& got = sharded[static_cast<size_t>(r)][i];
        const Tensor& want = plain[static_cast<size_t>(r)][i];
        CHECK(allclose(got, want, 0, 1e-6));
        if (world == 2) CHECK(got.toVector<float>() == want.toVector<float>());
        CHECK(got.toVector<float>() == sharded[0][i].toVector<float>());  // replicas agree
        CHECK_FALSE(allclose(got, initial[i], 0, 1e-4));                  // it trained
      }
    }
    CHECK(total == 8 * kParams);  // exp_avg and exp_avg_sq of every element, once over the ranks
  }
}

TEST_CASE("setLr changes every group's learning rate for the next steps, as the plain optimizer's does") {
  constexpr int world = 2;
  const std::vector<double> lrs = {0.02, 0.005, 0.05};
  std::vector<std::vector<Tensor>> plain(world), sharded(world);
  {
    Ranks ranks(world);
    ranks.onEachRank([&](int r) {
      auto net = std::make_shared<Net>(1 + static_cast<uint64_t>(r));
      DistributedDataParallel ddp(net, ranks[r]);
      nn::optim::AdamW opt(nn::optim::decayGroups(net->namedParameters(), adamw()));
      for (size_t s = 0; s < lrs.size(); ++s) {
        opt.setLr(lrs[s]);
        opt.zeroGrad();
        lossOf(ddp.forward(batchFor(r, static_cast<int>(s)))).backward();
        opt.step();
      }
      for (const Tensor& p : net->parameters()) plain[static_cast<size_t>(r)].push_back(p.detach().clone());
    });
  }
  std::vector<double> seen(world);
  {
    Ranks ranks(world);
    ranks.onEachRank([&](int r) {
      auto net = std::make_shared<Net>(1 + static_cast<uint64_t>(r));
      Sdp sdp(net, nn::optim::decayGroups(net->namedParameters(), adamw()), ranks[r], {.bucketCapBytes = kCap});
      for (size_t s = 0; s < lrs.size(); ++s) {
        sdp.setLr(lrs[s]);
        sdp.zeroGrad();
        lossOf(sdp.forward(batchFor(r, static_cast<int>(s)))).backward();
        sdp.step();
      }
      seen[static_cast<size_t>(r)] = sdp.lr(1);
      for (const Tensor& p : net->parameters()) sharded[static_cast<size_t>(r)].push_back(p.detach().clone());
    });
  }
  for (int r = 0; r < world; ++r) {
    CHECK(seen[static_cast<size_t>(r)] == lrs.back());
    for (size_t i = 0; i < plain[0].size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      CHECK(allclose(sharded[static_cast<size_t>(r)][i], plain[static_cast<size_t>(r)][i], 0, 1e-6));
    }
  }
  auto net = std::make_shared<Net>(1);
  Ranks one(1);
  one.onEachRank([&](int r) {
    Sdp sdp(net, nn::optim::decayGroups(net->namedParameters(), adamw()), one[r]);
    sdp.setLr(0, 0.5);
    CHECK(sdp.lr(0) == 0.5);
    CHECK(sdp.lr(1) == 0.02);
    CHECK(contains(errorOf([&] { sdp.setLr(2, 0.1); }), "ShardedDataParallel::setLr: group 2 out of range for 2 groups"));
    CHECK(contains(errorOf([&] { (void)sdp.lr(5); }), "ShardedDataParallel::lr: group 5 out of range"));
  });
}

TEST_CASE("passes without zeroGrad between them add up in the gradient shard, as DDP's do in .grad") {
  Ranks ranks(3);
  std::vector<Tensor> ddpGrads;
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>(1);
    DistributedDataParallel ddp(net, ranks[r]);
    lossOf(ddp.forward(batchFor(r, 0))).backward();
    lossOf(ddp.forward(batchFor(r, 1))).backward();
    if (r == 0) {
      for (const Tensor& p : net->parameters()) ddpGrads.push_back(p.grad().clone());
    }
  });
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>(1);
    Sdp sdp(net, {nn::optim::ParamGroup{net->parameters(), adamw()}}, ranks[r], {.bucketCapBytes = kCap});
    lossOf(sdp.forward(batchFor(r, 0))).backward();
    lossOf(sdp.forward(batchFor(r, 1))).backward();
    CHECK(sdp.stats().syncedPasses == 2);
    for (size_t i = 0; i < sdp.params().size(); ++i) {
      for (const auto& slice : sdp.gradientSlices(i)) {
        INFO("rank " << r << " parameter " << i);
        CHECK(allclose(slice.grad, ddpGrads[i].view({-1}).narrow(0, slice.start, slice.grad.numel()), 0, 1e-7));
      }
    }
  });
}

TEST_CASE("passes under noSync accumulate without communication and the next synced pass reduces the sum, as "
          "DDP's noSync") {
  Ranks ranks(2);
  std::vector<Tensor> ddpGrads;
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>(1);
    DistributedDataParallel ddp(net, ranks[r]);
    {
      auto scope = ddp.noSync();
      lossOf(ddp.forward(batchFor(r, 0))).backward();
      lossOf(ddp.forward(batchFor(r, 1))).backward();
    }
    lossOf(ddp.forward(batchFor(r, 2))).backward();
    if (r == 0) {
      for (const Tensor& p : net->parameters()) ddpGrads.push_back(p.grad().clone());
    }
  });
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>(1);
    Sdp sdp(net, {nn::optim::ParamGroup{net->parameters(), adamw()}}, ranks[r], {.bucketCapBytes = kCap});
    {
      auto scope = sdp.noSync();
      lossOf(sdp.forward(batchFor(r, 0))).backward();
      lossOf(sdp.forward(batchFor(r, 1))).backward();
      CHECK(sdp.stats().syncedPasses == 0);  // no reduce-scatter was launched
      CHECK(sdp.pendingGradient(0).defined());
      CHECK(sdp.gradientShardBytes() == 0);
    }
    lossOf(sdp.forward(batchFor(r, 2))).backward();
    CHECK(sdp.stats().syncedPasses == 1);
    CHECK_FALSE(sdp.pendingGradient(0).defined());
    for (size_t i = 0; i < sdp.params().size(); ++i) {
      CHECK_FALSE(sdp.params()[i].grad().defined());
      for (const auto& slice : sdp.gradientSlices(i)) {
        INFO("rank " << r << " parameter " << i);
        Tensor want = ddpGrads[i].view({-1}).narrow(0, slice.start, slice.grad.numel());
        CHECK(slice.grad.toVector<float>() == want.toVector<float>());
      }
    }
    CHECK_THROWS_AS(sdp.pendingGradient(8), IndexError);
  });
}

TEST_CASE("clipGradNorm_ over the shards gives DDP's total norm and clipped gradients, for the 2-norm and the "
          "largest element") {
  for (int world : {2, 3}) {
    for (double normType : {2.0, std::numeric_limits<double>::infinity()}) {
      INFO("world " << world << " normType " << normType);
      Ranks ranks(world);
      std::vector<double> ddpTotal(static_cast<size_t>(world)), sdpTotal(static_cast<size_t>(world));
      std::vector<std::vector<Tensor>> clipped(static_cast<size_t>(world));
      ranks.onEachRank([&](int r) {
        auto net = std::make_shared<Net>(1);
        DistributedDataParallel ddp(net, ranks[r]);
        lossOf(ddp.forward(batchFor(r, 0))).backward();
        ddpTotal[static_cast<size_t>(r)] = nn::clipGradNorm_(net->parameters(), 0.05, normType);
        for (const Tensor& p : net->parameters()) clipped[static_cast<size_t>(r)].push_back(p.grad().clone());
      });
      ranks.onEachRank([&](int r) {
        auto net = std::make_shared<Net>(1);
        Sdp sdp(net, {nn::optim::ParamGroup{net->parameters(), adamw()}}, ranks[r], {.bucketCapBytes = kCap});
        lossOf(sdp.forward(batchFor(r, 0))).backward();
        sdpTotal[static_cast<size_t>(r)] = sdp.clipGradNorm_(0.05, normType);
        for (size_t i = 0; i < sdp.params().size(); ++i) {
          for (const auto& slice : sdp.gradientSlices(i)) {
            INFO("rank " << r << " parameter " << i);
            Tensor want = clipped[0][i].view({-1}).narrow(0, slice.start, slice.grad.numel());
            CHECK(allclose(slice.grad, want, 1e-5, 1e-9));
          }
        }
      });
      for (int r = 0; r < world; ++r) {
        CHECK(ddpTotal[static_cast<size_t>(r)] > 0.05);  // it clipped
        CHECK(sdpTotal[static_cast<size_t>(r)] == doctest::Approx(ddpTotal[0]).epsilon(1e-5));
        CHECK(sdpTotal[static_cast<size_t>(r)] == sdpTotal[0]);
      }
    }
  }
}

TEST_CASE("the consolidated state dict equals the plain optimizer's under DDP, and a fresh ShardedDataParallel "
          "loaded from it continues exactly as the one that saved it") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    nn::StateDict plain;
    {
      Ranks ranks(world);
      ranks.onEachRank([&](int r) {
        auto net = std::make_shared<Net>(1);
        DistributedDataParallel ddp(net, ranks[r]);
        nn::optim::AdamW opt(nn::optim::decayGroups(net->namedParameters(), adamw()));
        for (int s = 0; s < 3; ++s) {
          opt.zeroGrad();
          lossOf(ddp.forward(batchFor(r, s))).backward();
          opt.step();
        }
        if (r == 0) plain = opt.stateDict();
      });
    }
    Ranks ranks(world);
    std::vector<nn::StateDict> saved(static_cast<size_t>(world));
    std::vector<std::vector<Tensor>> continued(static_cast<size_t>(world)), reloaded(static_cast<size_t>(world));
    auto fourthStep = [&](Sdp& sdp, int r) {
      sdp.zeroGrad();
      lossOf(sdp.forward(batchFor(r, 3))).backward();
      sdp.step();
    };
    ranks.onEachRank([&](int r) {
      const auto ri = static_cast<size_t>(r);
      auto net = std::make_shared<Net>(1);
      auto sdp = std::make_unique<Sdp>(net, nn::optim::decayGroups(net->namedParameters(), adamw()), ranks[r],
                                       Sdp::Options{.bucketCapBytes = kCap});
      for (int s = 0; s < 3; ++s) {
        sdp->zeroGrad();
        lossOf(sdp->forward(batchFor(r, s))).backward();
        sdp->step();
      }
      saved[ri] = sdp->consolidatedStateDict(0);
      nn::StateDict params;
      for (auto& [k, v] : net->stateDict()) params[k] = v.clone();
      fourthStep(*sdp, r);
      for (const Tensor& p : net->parameters()) continued[ri].push_back(p.detach().clone());
      // Back to the saved parameters, a new wrapper, the saved state (rank 0's dict on every rank).
      ranks[r].barrier().wait();
      sdp.reset();
      net->loadStateDict(params);
      sdp = std::make_unique<Sdp>(net, nn::optim::decayGroups(net->namedParameters(), adamw()), ranks[r],
                                  Sdp::Options{.bucketCapBytes = kCap});
      sdp->loadStateDict(saved[0]);
      fourthStep(*sdp, r);
      for (const Tensor& p : net->parameters()) reloaded[ri].push_back(p.detach().clone());
    });
    for (int r = 1; r < world; ++r) CHECK(saved[static_cast<size_t>(r)].empty());
    REQUIRE(saved[0].size() == plain.size());
    for (const auto& [key, want] : plain) {
      INFO(key);
      REQUIRE(saved[0].count(key) == 1);
      const Tensor& got = saved[0].at(key);
      CHECK(got.shape() == want.shape());
      if (key.find(".step") != std::string::npos || key.find("param_groups") != std::string::npos) {
        CHECK(got.item<double>() == want.item<double>());
      } else if (world == 2) {
        CHECK(got.toVector<float>() == want.toVector<float>());
      } else {
        CHECK(allclose(got, want, 1e-4, 1e-9));
      }
    }
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < continued[0].size(); ++i) {
        INFO("rank " << r << " parameter " << i);
        CHECK(reloaded[static_cast<size_t>(r)][i].toVector<float>() ==
              continued[static_cast<size_t>(r)][i].toVector<float>());
      }
    }
  }
}

TEST_CASE("each rank's sharded state dict reloads into a fresh wrapper on that rank, which continues exactly; "
          "another rank's is refused") {
  constexpr int kWorld = 3;
  Ranks ranks(kWorld);
  std::vector<int64_t> savedElements(kWorld);
  std::vector<std::string> wrongRank(kWorld);
  std::vector<std::vector<Tensor>> continued(kWorld), reloaded(kWorld);
  std::vector<nn::StateDict> saved(kWorld);
  ranks.onEachRank([&](int r) {
    const auto ri = static_cast<size_t>(r);
    auto net = std::make_shared<Net>(1);
    auto make = [&] {
      return std::make_unique<Sdp>(net, nn::optim::decayGroups(net->namedParameters(), adamw()), ranks[r],
                                   Sdp::Options{.bucketCapBytes = kCap});
    };
    auto sdp = make();
    auto stepOn = [&](Sdp& w, int s) {
      w.zeroGrad();
      lossOf(w.forward(batchFor(r, s))).backward();
      w.step();
    };
    for (int s = 0; s < 3; ++s) stepOn(*sdp, s);
    for (auto& [k, v] : sdp->shardedStateDict()) {
      saved[ri][k] = v.clone();  // the live state changes with the next step
      if (k.find(".exp_avg_sq") != std::string::npos) savedElements[ri] += v.numel();
    }
    nn::StateDict params;
    for (auto& [k, v] : net->stateDict()) params[k] = v.clone();
    stepOn(*sdp, 3);
    for (const Tensor& p : net->parameters()) continued[ri].push_back(p.detach().clone());
    ranks[r].barrier().wait();
    sdp.reset();
    net->loadStateDict(params);
    sdp = make();
    wrongRank[ri] = errorOf([&] { sdp->loadShardedStateDict(saved[static_cast<size_t>((r + 1) % kWorld)]); });
    sdp->loadShardedStateDict(saved[ri]);
    stepOn(*sdp, 3);
    for (const Tensor& p : net->parameters()) reloaded[ri].push_back(p.detach().clone());
  });
  int64_t total = 0;
  for (int r = 0; r < kWorld; ++r) {
    const auto ri = static_cast<size_t>(r);
    total += savedElements[ri];
    CHECK(contains(wrongRank[ri], "ShardedDataParallel::loadShardedStateDict: the shard was saved by rank " +
                                      std::to_string((r + 1) % kWorld) + ", this is rank " + std::to_string(r)));
    for (size_t i = 0; i < continued[ri].size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      CHECK(reloaded[ri][i].toVector<float>() == continued[ri][i].toVector<float>());
    }
  }
  CHECK(total == kParams);  // the shards together hold every element's state once
}

TEST_CASE("a parameter without a gradient fails the pass naming it; ranks wrapping different parameters fail "
          "alike") {
  Ranks ranks(2);
  std::vector<std::string> errors(2);
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>(1);
    Sdp sdp(net, adamw(), ranks[r]);
    net->useExtra = false;
    errors[static_cast<size_t>(r)] = errorOf([&] { lossOf(sdp.forward(batchFor(r, 0))).backward(); });
  });
  for (const std::string& e : errors) {
    CHECK(contains(e, "ShardedDataParallel: backward pass #1: 2 of 8 parameters received no gradient"));
    CHECK(contains(e, "'extra.weight', 'extra.bias'"));
  }
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>(1);
    auto params = net->parameters();
    if (r == 1) params.pop_back();
    errors[static_cast<size_t>(r)] =
        errorOf([&] { Sdp sdp(net, {nn::optim::ParamGroup{params, adamw()}}, ranks[r]); });
  });
  for (const std::string& e : errors) {
    CHECK(contains(e, "ShardedDataParallel: the ranks wrap different parameters"));
    CHECK(contains(e, "group 0 has 8 parameters on rank 0 and 7 on rank 1"));
  }
  CHECK(contains(errorOf([&] {
                   auto net = std::make_shared<Net>(1);
                   Sdp sdp(net, {nn::optim::ParamGroup{{zeros({3}).requiresGrad_()}, adamw()}}, ranks[0]);
                 }),
                 "is not a parameter of module Net"));
}

TEST_SUITE_END();
