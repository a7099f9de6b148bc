// Mixed precision in the data-parallel wrappers within one process (each rank a thread with its
// own ProcessGroupGloo): DDP's reduceDtype against the averaged gradients computed by hand in the
// same dtypes, ZeRO-1's and ZeRO-2's float32 masters against DDP + nn::optim::MasterWeightOptimizer,
// the bytes the masters take, the state dicts (masters included: a reload resumes to the bit), and
// bad options.
// mixed_precision_mp_test.cpp trains the GPT across processes and measures the memory.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/sharded_ddp.h"
#include "collectives/thread_ranks.h"
#include "collectives/zero.h"
#include "common/error.h"
#include "nn/linear.h"
#include "nn/master_weights.h"
#include "nn/optim.h"
#include "nn/utils.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"

using namespace weft;
using weft::collectives::DistributedDataParallel;
using weft::collectives::ShardedDataParallel;
using weft::collectives::ZeroRedundancyOptimizer;
using weft::testing::Ranks;

namespace {

// 5 -> 9 -> 7 -> 2 with tanh between, in bfloat16.
class Net : public nn::Module {
 public:
  Net() : Module("Net") {
    Generator gen(5);
    a_ = registerModule("a", std::make_shared<nn::Linear>(5, 9));
    b_ = registerModule("b", std::make_shared<nn::Linear>(9, 7));
    c_ = registerModule("c", std::make_shared<nn::Linear>(7, 2));
    for (auto& l : {a_, b_, c_}) l->resetParameters(&gen);
    to(DType::BFloat16);
  }
  Tensor forward(const Tensor& x) override { return c_->forward(tanh(b_->forward(tanh(a_->forward(x))))); }

 private:
  std::shared_ptr<nn::Linear> a_, b_, c_;
};

Tensor batchFor(int rank, int step) {
  Generator gen(300 + static_cast<uint64_t>(rank) * 31 + static_cast<uint64_t>(step));
  return randn({6, 5}, {}, &gen);
}

// The loss of a forward under autocast::Scope(BFloat16): the products in bfloat16, the mean in float32.
template <class Forward>
Tensor lossOf(Forward&& forward, const Tensor& x) {
  autocast::Scope amp(DType::BFloat16);
  return square(forward(x)).mean();
}

nn::optim::AdamWOptions adamw() { return {.lr = 0.02, .betas = {0.85, 0.97}, .eps = 1e-6, .weightDecay = 0.05}; }

std::vector<std::vector<float>> valuesOf(const std::vector<Tensor>& ts) {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : ts) out.push_back(t.to(DType::Float32).toVector<float>());
  return out;
}

// The parameters of 5 AdamW steps under DDP (reduceDtype float32) + MasterWeightOptimizer, and
// the 2-norm of the first pass's averaged gradients, summed in float64.
struct Reference {
  std::vector<std::vector<float>> params;
  double firstNorm = 0;
};

Reference ddpWithMasters(Ranks& ranks) {
  Reference out;
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>();
    DistributedDataParallel ddp(net, ranks[r], {.reduceDtype = DType::Float32});
    nn::optim::MasterWeightOptimizer opt(net->parameters(), adamw());
    for (int s = 0; s < 5; ++s) {
      opt.zeroGrad();
      lossOf([&ddp](const Tensor& x) { return ddp.forward(x); }, batchFor(r, s)).backward();
      if (s == 0 && r == 0) {
        double sum = 0;
        for (const Tensor& p : net->parameters()) {
          for (float g : p.grad().to(DType::Float32).toVector<float>()) sum += static_cast<double>(g) * g;
        }
        out.firstNorm = std::sqrt(sum);
      }
      opt.step();
    }
    if (r == 0) out.params = valuesOf(net->parameters());
  });
  return out;
}

}  // namespace

TEST_SUITE_BEGIN("mixed_precision");

TEST_CASE("DDP with reduceDtype float16 hands bfloat16 parameters the ranks' average computed in float16, noSync "
          "passes included, rounded to bfloat16") {
  Ranks ranks(2);
  // Each rank's gradients without DDP: passes 0 and 1 added up in bfloat16 (as noSync keeps them), pass 2 alone.
  std::vector<std::vector<Tensor>> accumulated(2), last(2);
  for (int r = 0; r < 2; ++r) {
    auto net = std::make_shared<Net>();
    for (int s = 0; s < 2; ++s) lossOf([&net](const Tensor& x) { return net->forward(x); }, batchFor(r, s)).backward();
    for (const Tensor& p : net->parameters()) accumulated[static_cast<size_t>(r)].push_back(p.grad().clone());
    nn::zeroGrads(net->parameters(), true);
    lossOf([&net](const Tensor& x) { return net->forward(x); }, batchFor(r, 2)).backward();
    for (const Tensor& p : net->parameters()) last[static_cast<size_t>(r)].push_back(p.grad().clone());
  }
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>();
    DistributedDataParallel ddp(net, ranks[r], {.reduceDtype = DType::Float16});
    {
      auto scope = ddp.noSync();
      for (int s = 0; s < 2; ++s) lossOf([&ddp](const Tensor& x) { return ddp.forward(x); }, batchFor(r, s)).backward();
    }
    lossOf([&ddp](const Tensor& x) { return ddp.forward(x); }, batchFor(r, 2)).backward();
    const std::vector<Tensor> params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("rank " << r << " parameter " << i);
      // A rank's slot: its last gradient in float16 plus what noSync kept, in float16.
      auto slot = [&](size_t rank) {
        return add(last[rank][i].to(DType::Float16), accumulated[rank][i].to(DType::Float16));
      };
      Tensor want = mul(add(slot(0), slot(1)), scalarTensor(0.5, DType::Float16)).to(DType::BFloat16);
      REQUIRE(params[i].grad().defined());
      CHECK(params[i].grad().dtype() == DType::BFloat16);
      CHECK(valuesOf({params[i].grad()}) == valuesOf({want}));
    }
  });
}

TEST_CASE("DDP and ShardedDataParallel refuse a reduceDtype other than float32, float16 or float64") {
  Ranks ranks(1);
  for (DType bad : {DType::BFloat16, DType::Int64}) {
    auto net = std::make_shared<Net>();
    CHECK_THROWS_WITH_AS(DistributedDataParallel(net, ranks[0], {.reduceDtype = bad}),
                         doctest::Contains("Options::reduceDtype must be float32, float16 or float64"),
                         InvalidArgumentError);
    CHECK_THROWS_WITH_AS(
        ShardedDataParallel(net, {nn::optim::ParamGroup{net->parameters(), adamw()}}, ranks[0], {.reduceDtype = bad}),
        doctest::Contains("Options::reduceDtype must be float32, float16 or float64"), InvalidArgumentError);
  }
}

TEST_CASE("DDP and ShardedDataParallel refuse bfloat16 parameters on gloo without a reduceDtype, naming the "
          "parameter, at construction") {
  Ranks ranks(1);
  auto net = std::make_shared<Net>();
  CHECK_THROWS_WITH_AS(DistributedDataParallel(net, ranks[0]),
                       doctest::Contains("DistributedDataParallel: parameter 'a.weight' is bfloat16 and the gloo "
                                         "backend sums no bfloat16: set Options::reduceDtype"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(ShardedDataParallel(net, {nn::optim::ParamGroup{net->parameters(), adamw()}}, ranks[0]),
                       doctest::Contains("ShardedDataParallel: parameter 'a.weight' is bfloat16 and the gloo backend "
                                         "sums no bfloat16"),
                       InvalidArgumentError);
}

TEST_CASE("ZeroRedundancyOptimizer with masterWeights steps bfloat16 parameters as MasterWeightOptimizer does, to the "
          "bit, holding float32 masters of its own parameters only") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    Ranks ranks(world);
    const auto want = ddpWithMasters(ranks);
    ranks.onEachRank([&](int r) {
      auto net = std::make_shared<Net>();
      DistributedDataParallel ddp(net, ranks[r], {.reduceDtype = DType::Float32});
      ZeroRedundancyOptimizer opt({nn::optim::ParamGroup{net->parameters(), adamw()}}, ranks[r],
                                  {.masterWeights = true});
      int64_t owned = 0;
      for (size_t i : opt.shard(r)) owned += opt.params()[i].numel();
      CHECK(opt.masterBytes() == 4 * owned);
      for (int s = 0; s < 5; ++s) {
        opt.zeroGrad();
        lossOf([&ddp](const Tensor& x) { return ddp.forward(x); }, batchFor(r, s)).backward();
        opt.step();
      }
      CHECK(opt.stateBytes() == 2 * opt.masterBytes());
      for (const Tensor& p : net->parameters()) CHECK(p.dtype() == DType::BFloat16);
      CHECK(valuesOf(net->parameters()) == want.params);
      nn::StateDict full = opt.consolidatedStateDict(0);
      if (r == 0) CHECK(full.at("state.0.exp_avg").dtype() == DType::Float32);
    });
  }
}

TEST_CASE("ZeroRedundancyOptimizer's state dicts with masterWeights hold the masters: reloaded over the rounded "
          "parameters, training resumes to the bit") {
  Ranks ranks(2);
  ranks.onEachRank([&](int r) {
    auto make = [&](std::shared_ptr<Net>& net, std::unique_ptr<DistributedDataParallel>& ddp,
                    std::unique_ptr<ZeroRedundancyOptimizer>& opt) {
      net = std::make_shared<Net>();
      ddp = std::make_unique<DistributedDataParallel>(net, ranks[r],
                                                      DistributedDataParallel::Options{.reduceDtype = DType::Float32});
      opt = std::make_unique<ZeroRedundancyOptimizer>(
          std::vector{nn::optim::ParamGroup{net->parameters(), adamw()}}, ranks[r],
          ZeroRedundancyOptimizer::Options{.masterWeights = true});
    };
    auto train = [&](DistributedDataParallel& ddp, ZeroRedundancyOptimizer& opt, int from, int to) {
      for (int s = from; s < to; ++s) {
        opt.zeroGrad();
        lossOf([&ddp](const Tensor& x) { return ddp.forward(x); }, batchFor(r, s)).backward();
        opt.step();
      }
    };
    std::shared_ptr<Net> net, net2, net3;
    std::unique_ptr<DistributedDataParallel> ddp, ddp2, ddp3;
    std::unique_ptr<ZeroRedundancyOptimizer> opt, opt2, opt3;
    make(net, ddp, opt);
    train(*ddp, *opt, 0, 3);
    nn::StateDict full;  // every rank its own copy of the whole dict, in turn
    for (int to = 0; to < 2; ++to) {
      nn::StateDict one = opt->consolidatedStateDict(to);
      if (to == r) full = std::move(one);
    }
    for (size_t i = 0; i < opt->params().size(); ++i) {
      REQUIRE(full.count("master." + std::to_string(i)) == 1);
      CHECK(full.at("master." + std::to_string(i)).dtype() == DType::Float32);
    }
    const nn::StateDict sharded = opt->shardedStateDict();
    // Reloaded into fresh wrappers whose module holds the trained bfloat16 values (a module state dict's).
    make(net2, ddp2, opt2);
    make(net3, ddp3, opt3);
    for (auto* other : {&net2, &net3}) {
      const std::vector<Tensor> trained = net->parameters();
      std::vector<Tensor> params = (*other)->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(trained[i]);
    }
    opt2->loadStateDict(full);
    opt3->loadShardedStateDict(sharded);
    train(*ddp, *opt, 3, 5);
    train(*ddp2, *opt2, 3, 5);
    train(*ddp3, *opt3, 3, 5);
    CHECK(valuesOf(net2->parameters()) == valuesOf(net->parameters()));
    CHECK(valuesOf(net3->parameters()) == valuesOf(net->parameters()));

    nn::StateDict bad = full;
    bad["master.0"] = zeros({3});
    if (opt->ownerOf(0) == r) {
      CHECK_THROWS_WITH_AS(opt2->loadStateDict(bad), doctest::Contains("'master.0' has shape [3]"),
                           InvalidArgumentError);
    }
    bad = full;
    bad["master.99"] = zeros({3});
    CHECK_THROWS_WITH_AS(opt2->loadStateDict(bad), doctest::Contains("key 'master.99' refers to parameter 99"),
                         InvalidArgumentError);
  });
}

TEST_CASE("ShardedDataParallel with masterWeights and reduceDtype float32 steps as DDP + MasterWeightOptimizer, to "
          "the bit on 2 ranks; bfloat16 gradient slices with DDP's norm, float32 masters and state, from which a "
          "reload resumes to the bit") {
  Ranks ranks(2);
  const auto want = ddpWithMasters(ranks);
  ranks.onEachRank([&](int r) {
    auto net = std::make_shared<Net>();
    const ShardedDataParallel::Options options{.bucketCapBytes = 80, .reduceDtype = DType::Float32,
                                               .masterWeights = true};
    ShardedDataParallel sdp(net, {nn::optim::ParamGroup{net->parameters(), adamw()}}, ranks[r], options);
    int64_t owned = 0;
    for (size_t i = 0; i < sdp.params().size(); ++i) {
      for (const auto& slice : sdp.gradientSlices(i)) {
        CHECK_FALSE(slice.grad.defined());  // no pass yet
      }
    }
    for (int s = 0; s < 5; ++s) {
      sdp.zeroGrad();
      lossOf([&sdp](const Tensor& x) { return sdp.forward(x); }, batchFor(r, s)).backward();
      if (s == 0) {
        for (size_t i = 0; i < sdp.params().size(); ++i) {
          for (const auto& slice : sdp.gradientSlices(i)) {
            CHECK(slice.grad.dtype() == DType::BFloat16);
            owned += slice.grad.numel();
          }
        }
        // The norm of the bfloat16 shards, summed in float32: DDP's to float32 rounding.
        CHECK(sdp.clipGradNorm_(1e9) == doctest::Approx(want.firstNorm).epsilon(1e-5));
      }
      sdp.step();
    }
    CHECK(sdp.masterBytes() == 4 * owned);
    CHECK(sdp.stateBytes() == 2 * sdp.masterBytes());
    CHECK(valuesOf(net->parameters()) == want.params);

    // The consolidated state is the masters' float32 state; reloaded, each slice's state is the same bits.
    nn::StateDict full = sdp.consolidatedStateDict(0);
    nn::StateDict full1 = sdp.consolidatedStateDict(1);
    const nn::StateDict& mine = r == 0 ? full : full1;
    CHECK(mine.at("state.0.exp_avg_sq").dtype() == DType::Float32);
    CHECK(mine.at("master.0").dtype() == DType::Float32);
    // Reloaded into wrappers whose module holds the trained bfloat16 values (a module state dict's),
    // one from the consolidated dict, one from this rank's sharded dict.
    auto trainedCopy = [&net]() {
      auto other = std::make_shared<Net>();
      const std::vector<Tensor> trained = net->parameters();
      std::vector<Tensor> params = other->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(trained[i]);
      return other;
    };
    auto other = trainedCopy();
    ShardedDataParallel reloaded(other, {nn::optim::ParamGroup{other->parameters(), adamw()}}, ranks[r], options);
    reloaded.loadStateDict(mine);
    auto third = trainedCopy();
    ShardedDataParallel resharded(third, {nn::optim::ParamGroup{third->parameters(), adamw()}}, ranks[r], options);
    resharded.loadShardedStateDict(sdp.shardedStateDict());
    nn::StateDict a = sdp.shardedStateDict();
    nn::StateDict b = reloaded.shardedStateDict();
    REQUIRE(a.size() == b.size());
    for (const auto& [key, value] : a) {
      INFO(key);
      CHECK(b.at(key).dtype() == value.dtype());
      CHECK(valuesOf({b.at(key)}) == valuesOf({value}));
    }
    // Training resumes to the bit from either.
    for (int s = 5; s < 7; ++s) {
      for (ShardedDataParallel* w : {&sdp, &reloaded, &resharded}) {
        w->zeroGrad();
        lossOf([w](const Tensor& x) { return w->forward(x); }, batchFor(r, s)).backward();
        w->step();
      }
    }
    CHECK(valuesOf(other->parameters()) == valuesOf(net->parameters()));
    CHECK(valuesOf(third->parameters()) == valuesOf(net->parameters()));
  });
}

TEST_SUITE_END();
