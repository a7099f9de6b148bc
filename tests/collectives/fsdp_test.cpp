// FullyShardedDataParallel (ZeRO-3) within one process: each rank is a thread with its own
// ProcessGroupGloo. A tiny GPT trained with AdamW over the shards against the same GPT trained by
// one process on the ranks' batches together (the reference DDP computes), with and without
// resharding after forward, with activation checkpointing and with noSync accumulation; the
// parameters really freed between uses; the full and sharded state dicts; clipping by the
// global norm; units that differ between ranks. fsdp_mp_test.cpp repeats the training across
// processes against DDP and measures the memory through the storage accounting.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "collectives/fsdp.h"
#include "common/error.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "nn/utils.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "captured_text.h"
#include "collectives/thread_ranks.h"

using namespace weft;
using weft::collectives::FullyShardedDataParallel;
using weft::testing::contains;
using weft::testing::Ranks;

namespace {

using Fsdp = FullyShardedDataParallel;

constexpr int64_t kVocab = 64;
constexpr int64_t kT = 16;
constexpr int64_t kRows = 2;

std::shared_ptr<nn::GPT> tinyGpt(nn::CheckpointPolicy checkpoint = nn::CheckpointPolicy::none()) {
  nn::GPTConfig c;
  c.vocabSize = kVocab;
  c.blockSize = kT;
  c.layers = 3;
  c.heads = 2;
  c.width = 16;
  c.checkpoint = checkpoint;
  Generator init(11);
  return std::make_shared<nn::GPT>(c, &init);
}

std::pair<Tensor, Tensor> batch(int rank, int step) {
  Generator gen(900 + static_cast<uint64_t>(rank) * 37 + static_cast<uint64_t>(step));
  Tensor idx = randint(0, kVocab, {kRows, kT}, {.dtype = DType::Int64}, &gen);
  Tensor targets = randint(0, kVocab, {kRows, kT}, {.dtype = DType::Int64}, &gen);
  return {idx, targets};
}

nn::optim::OptimizerOptions adamw() {
  return nn::optim::AdamWOptions{.lr = 3e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .weightDecay = 0.1};
}
nn::optim::OptimizerOptions sgd() { return nn::optim::SGDOptions{.lr = 0.05, .momentum = 0.9}; }

Tensor lossOf(const Tensor& logits, const Tensor& targets) {
  return nn::functional::crossEntropy(logits.view({-1, kVocab}), targets.reshape({-1}));
}

// One process, the ranks' batches of each step (micro-batch) together: the mean over the ranks
// of their mean losses, whose gradient is the one DDP averages. `micro` micro-batches per step
// add up, as noSync accumulation does.
nn::StateDict reference(int world, int steps, int micro = 1, nn::optim::OptimizerOptions options = adamw()) {
  auto net = tinyGpt();
  nn::optim::Optimizer opt(net->parameters(), options);
  for (int s = 0; s < steps; ++s) {
    opt.zeroGrad();
    for (int m = 0; m < micro; ++m) {
      std::vector<Tensor> xs, ys;
      for (int r = 0; r < world; ++r) {
        auto [x, y] = batch(r, s * micro + m);
        xs.push_back(x);
        ys.push_back(y);
      }
      lossOf(net->forward(cat(xs, 0)), cat(ys, 0)).backward();
    }
    opt.step();
  }
  nn::StateDict out;
  for (auto& [k, v] : net->stateDict()) out.emplace(k, v.clone());
  return out;
}

// The largest difference over the entries, relative to the largest magnitude of `want`.
double relDiff(const nn::StateDict& got, const nn::StateDict& want) {
  REQUIRE(got.size() == want.size());
  double scale = 0, diff = 0;
  for (const auto& [k, w] : want) {
    REQUIRE(got.count(k) == 1);
    const Tensor& g = got.at(k);
    REQUIRE(g.shape() == w.shape());
    scale = std::max(scale, max(abs(w)).item<double>());
    diff = std::max(diff, max(abs(sub(g, w))).item<double>());
  }
  return diff / scale;
}

struct Run {
  bool reshard = true;
  nn::CheckpointPolicy checkpoint = nn::CheckpointPolicy::none();
  int micro = 1;
  nn::optim::OptimizerOptions optimizer = adamw();
};

// Trains under FSDP on `world` thread ranks; returns rank 0's full state dict.
nn::StateDict trainFsdp(int world, int steps, Run run) {
  Ranks ranks(world);
  nn::StateDict out;
  ranks.onEachRank([&](int r) {
    auto net = tinyGpt(run.checkpoint);
    Fsdp fsdp(net, ranks[r], {.reshardAfterForward = run.reshard});
    nn::optim::Optimizer opt(fsdp.parameters(), run.optimizer);
    for (int s = 0; s < steps; ++s) {
      opt.zeroGrad();
      for (int m = 0; m < run.micro; ++m) {
        auto [x, y] = batch(r, s * run.micro + m);
        if (m + 1 < run.micro) {
          auto guard = fsdp.noSync();
          lossOf(fsdp.forward(x), y).backward();
        } else {
          lossOf(fsdp.forward(x), y).backward();
        }
        for (const auto& u : fsdp.units()) CHECK_FALSE(u.gathered);  // freed after backward
      }
      opt.step();
    }
    nn::StateDict full = fsdp.fullStateDict(0);
    if (r == 0) {
      out = full;
    } else {
      CHECK(full.empty());
    }
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

TEST_SUITE_BEGIN("fsdp");

TEST_CASE("fsdp units: each TransformerBlock of the GPT, the root the rest, padded flat shards") {
  Ranks ranks(3);
  ranks.onEachRank([&](int r) {
    auto net = tinyGpt();
    const int64_t psi = net->numParameters();
    std::vector<Tensor> before = net->parameters();
    Fsdp fsdp(net, ranks[r]);
    auto units = fsdp.units();
    REQUIRE(units.size() == 4);
    CHECK(units[0].name == "");
    CHECK(units[0].params == std::vector<std::string>{"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"});
    CHECK(units[1].name == "h.0");
    CHECK(units[3].name == "h.2");
    CHECK(units[1].params.front() == "h.0.ln_1.weight");
    int64_t total = 0;
    REQUIRE(fsdp.parameters().size() == 4);
    for (size_t k = 0; k < units.size(); ++k) {
      total += units[k].numel;
      CHECK(units[k].shardNumel == (units[k].numel + 2) / 3);
      CHECK(fsdp.parameters()[k].numel() == units[k].shardNumel);
      CHECK(fsdp.parameters()[k].requiresGrad());
      CHECK_FALSE(units[k].gathered);
    }
    CHECK(total == psi);
    // The module's parameters keep their identity, and are not readable while freed.
    std::vector<Tensor> after = net->parameters();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) CHECK(after[i].sameAs(before[i]));
    CHECK(contains(errorOf([&] { (void)net->wte()->weight().sum(); }), "released storage"));
    CHECK(fsdp.gatheredBytes() == 0);
  });
}

TEST_CASE("fsdp trains the GPT as one process does on the ranks' batches together, resharding or not") {
  const int steps = 10;
  for (int world : {2, 3}) {
    const nn::StateDict want = reference(world, steps);
    for (bool reshard : {true, false}) {
      INFO("world " << world << " reshardAfterForward " << reshard);
      const nn::StateDict got = trainFsdp(world, steps, {.reshard = reshard});
      // One process sums the batch in another order than the ranks' mean of means: float32
      // rounding of the gradients, which Adam's per-element scaling can amplify to 1e-5 of lr-sized
      // steps over ten steps.
      CHECK(relDiff(got, want) < 2e-5);
    }
  }
}

TEST_CASE("fsdp works with activation checkpointing and with noSync gradient accumulation") {
  const int steps = 4;
  const nn::StateDict want = reference(2, steps);
  const nn::StateDict plain = trainFsdp(2, steps, {});
  CHECK(relDiff(plain, want) < 2e-5);
  for (auto policy : {nn::CheckpointPolicy::everyBlock(), nn::CheckpointPolicy::every(2)}) {
    const nn::StateDict ck = trainFsdp(2, steps, {.checkpoint = policy});
    // Recomputation repeats the same ops on the same values: the gradients are bit-identical.
    CHECK(relDiff(ck, plain) == 0.0);
  }
  // Accumulation, with SGD: Adam would amplify the rounding differences of near-zero gradient
  // elements (the sum over micro-batches and ranks is taken in another order) to lr-sized steps.
  const nn::StateDict accumulated = trainFsdp(2, steps, {.micro = 2, .optimizer = sgd()});
  CHECK(relDiff(accumulated, reference(2, steps, 2, sgd())) < 1e-5);
  CHECK(relDiff(accumulated, reference(2, steps, 1, sgd())) > 1e-3);  // the second micro-batches count
  // Both at once.
  const nn::StateDict both =
      trainFsdp(2, steps, {.checkpoint = nn::CheckpointPolicy::everyBlock(), .micro = 2, .optimizer = sgd()});
  CHECK(relDiff(both, accumulated) == 0.0);
}

TEST_CASE("fsdp state dicts: the full one loads into a plain GPT, the sharded one into a fresh wrapper") {
  Ranks ranks(2);
  ranks.onEachRank([&](int r) {
    auto net = tinyGpt();
    Fsdp fsdp(net, ranks[r]);
    nn::optim::Optimizer opt(fsdp.parameters(), adamw());
    for (int s = 0; s < 2; ++s) {
      opt.zeroGrad();
      auto [x, y] = batch(r, s);
      lossOf(fsdp.forward(x), y).backward();
      opt.step();
    }
    auto [x, y] = batch(r, 7);
    Tensor logits;
    {
      NoGradGuard ng;
      logits = fsdp.forward(x);
    }
    nn::StateDict full = fsdp.fullStateDict(r);  // each rank in turn: both get it
    (void)fsdp.fullStateDict(1 - r);
    auto plain = tinyGpt();
    CHECK(full.size() == plain->stateDict().size());
    plain->loadStateDict(full);
    {
      NoGradGuard ng;
      CHECK(plain->forward(x).toVector<float>() == logits.toVector<float>());
    }
    nn::StateDict sharded = fsdp.shardedStateDict();
    auto again = tinyGpt();
    Fsdp other(again, ranks[r]);
    other.loadShardedStateDict(sharded);
    for (size_t k = 0; k < fsdp.parameters().size(); ++k) {
      CHECK(other.parameters()[k].toVector<float>() == fsdp.parameters()[k].toVector<float>());
    }
    {
      NoGradGuard ng;
      CHECK(other.forward(x).toVector<float>() == logits.toVector<float>());
    }
    // A full dict into the shards.
    auto third = tinyGpt();
    Fsdp fromFull(third, ranks[r]);
    fromFull.loadFullStateDict(full);
    for (size_t k = 0; k < fsdp.parameters().size(); ++k) {
      CHECK(fromFull.parameters()[k].toVector<float>() == fsdp.parameters()[k].toVector<float>());
    }
    // Bad dicts name the problem and change nothing.
    nn::StateDict wrongRank = sharded;
    wrongRank["shard.rank"] = scalarTensor(1 - r, DType::Int64);
    CHECK(contains(errorOf([&] { other.loadShardedStateDict(wrongRank); }), "saved by rank"));
    nn::StateDict shortShard = sharded;
    shortShard["shard.1"] = zeros({3});
    CHECK(contains(errorOf([&] { other.loadShardedStateDict(shortShard); }), "'shard.1' holds 3 elements"));
    nn::StateDict missing = full;
    missing.erase("h.1.mlp.c_fc.weight");
    CHECK(contains(errorOf([&] { fromFull.loadFullStateDict(missing); }), "no 'h.1.mlp.c_fc.weight'"));
  });
}

TEST_CASE("fsdp clipGradNorm_ clips by the norm of the whole averaged gradient") {
  const int world = 3;
  // The averaged gradient, from one process over the ranks' batches together.
  auto net = tinyGpt();
  std::vector<Tensor> xs, ys;
  for (int r = 0; r < world; ++r) {
    auto [x, y] = batch(r, 0);
    xs.push_back(x);
    ys.push_back(y);
  }
  lossOf(net->forward(cat(xs, 0)), cat(ys, 0)).backward();
  double want = 0;
  for (const Tensor& p : net->parameters()) want += sum(square(p.grad().to(DType::Float64))).item<double>();
  want = std::sqrt(want);
  Ranks ranks(world);
  ranks.onEachRank([&](int r) {
    auto model = tinyGpt();
    Fsdp fsdp(model, ranks[r]);
    auto [x, y] = batch(r, 0);
    lossOf(fsdp.forward(x), y).backward();
    const double norm = fsdp.clipGradNorm_(want / 4);
    CHECK(norm == doctest::Approx(want).epsilon(1e-5));
    double mine = 0;
    for (const Tensor& s : fsdp.parameters()) mine += sum(square(s.grad().to(DType::Float64))).item<double>();
    Tensor total = scalarTensor(mine, DType::Float64).reshape({1});
    ranks[r].allReduce(total).wait();
    CHECK(std::sqrt(total.item<double>()) == doctest::Approx(want / 4).epsilon(1e-5));
  });
}

TEST_CASE("fsdp: ranks that wrap different units get an error naming the difference") {
  Ranks ranks(2);
  std::vector<std::string> errors(2);
  ranks.onEachRank([&](int r) {
    auto net = tinyGpt();
    Fsdp::Options options;
    if (r == 1) options.units = {net->blocks()[0], net->blocks()[1]};  // block 2 left to the root
    errors[static_cast<size_t>(r)] = errorOf([&] { Fsdp fsdp(net, ranks[r], options); });
  });
  for (const std::string& e : errors) {
    CHECK(contains(e, "FullyShardedDataParallel: the ranks wrap different parameters"));
  }
  Ranks one(1);
  auto net = tinyGpt();
  CHECK(contains(errorOf([&] { Fsdp f(net, one[0], {.units = {net->blocks()[0], net->blocks()[0]}}); }),
                 "units must not share parameters"));
  auto stranger = tinyGpt();
  CHECK(contains(errorOf([&] { Fsdp f(net, one[0], {.units = {stranger->blocks()[0]}}); }),
                 "is not a submodule"));
}

TEST_CASE("fsdp frees each block's parameters after its forward: the storage accounting shows it") {
  Ranks one(1);
  auto [x, y] = batch(0, 0);
  // Bytes held after the forward (the graph alive) beyond those held before it, with and without
  // resharding: the same activations, so the difference is what resharding freed although
  // autograd saved the parameters.
  std::vector<int64_t> held;
  int64_t blockBytes = 0;
  for (bool reshard : {false, true}) {
    auto net = tinyGpt();
    Fsdp fsdp(net, one[0], {.reshardAfterForward = reshard});
    const auto units = fsdp.units();
    blockBytes = 0;
    for (size_t k = 1; k < units.size(); ++k) blockBytes += units[k].shardNumel * 4;
    std::vector<bool> seen;
    const int id = net->blocks()[2]->registerForwardPreHook([&](nn::Module&, const Tensor&) {
      for (const auto& u : fsdp.units()) seen.push_back(u.gathered);
    });
    const size_t before = Storage::memoryStats().liveBytes;
    Tensor loss = lossOf(fsdp.forward(x), y);
    held.push_back(static_cast<int64_t>(Storage::memoryStats().liveBytes) - static_cast<int64_t>(before));
    net->blocks()[2]->removeForwardHook(id);
    // Hooks run in registration order: FSDP's gather of block 2 came before this one.
    CHECK(seen == std::vector<bool>{true, !reshard, !reshard, true});
    CHECK(fsdp.gatheredBytes() == (reshard ? units[0].shardNumel * 4 : (units[0].shardNumel * 4 + blockBytes)));
    loss.backward();
    for (const auto& u : fsdp.units()) CHECK_FALSE(u.gathered);
    CHECK(fsdp.gatheredBytes() == 0);
  }
  CHECK(blockBytes > 0);
  CHECK(held[0] - held[1] == blockBytes);
}

TEST_CASE("fsdp over any module: given submodules are units, and one unit when none is given") {
  // 5 -> 7 -> 3 with tanh between, on 4 ranks: 42 and 66 elements are padded to 44 and 68.
  auto make = [] {
    Generator gen(3);
    auto a = std::make_shared<nn::Linear>(5, 7);
    auto b = std::make_shared<nn::Linear>(7, 3);
    a->resetParameters(&gen);
    b->resetParameters(&gen);
    auto seq = std::make_shared<nn::Sequential>();
    seq->push_back(a);
    seq->push_back(std::make_shared<nn::Tanh>());
    seq->push_back(b);
    return seq;
  };
  auto input = [](int r, int s) {
    Generator gen(50 + static_cast<uint64_t>(r) * 7 + static_cast<uint64_t>(s));
    return randn({4, 5}, {}, &gen);
  };
  const int world = 4, steps = 5;
  // One process on the ranks' inputs together: the mean of the ranks' mean losses.
  auto plain = make();
  nn::optim::Optimizer ref(plain->parameters(), sgd());
  for (int s = 0; s < steps; ++s) {
    ref.zeroGrad();
    std::vector<Tensor> xs;
    for (int r = 0; r < world; ++r) xs.push_back(input(r, s));
    square(plain->forward(cat(xs, 0))).mean().backward();
    ref.step();
  }
  for (bool given : {true, false}) {
    INFO("units given " << given);
    Ranks ranks(world);
    ranks.onEachRank([&](int r) {
      auto seq = make();
      Fsdp::Options options;
      if (given) options.units = {seq->children()[0], seq->children()[2]};
      Fsdp fsdp(seq, ranks[r], options);
      const auto units = fsdp.units();
      if (given) {
        REQUIRE(units.size() == 2);  // the root holds nothing of its own: dropped
        CHECK(units[0].name == "0");
        CHECK(units[0].numel == 5 * 7 + 7);
        CHECK(units[0].shardNumel == 11);
        CHECK(units[1].name == "2");
        CHECK(units[1].shardNumel == 6);  // 24 elements: 7 · 3 + 3
      } else {
        REQUIRE(units.size() == 1);
        CHECK(units[0].numel == 5 * 7 + 7 + 7 * 3 + 3);
        CHECK(units[0].shardNumel == 17);
      }
      nn::optim::Optimizer opt(fsdp.parameters(), sgd());
      for (int s = 0; s < steps; ++s) {
        opt.zeroGrad();
        square(fsdp.forward(input(r, s))).mean().backward();
        opt.step();
      }
      nn::StateDict full = fsdp.fullStateDict(0);
      if (r == 0) {
        nn::StateDict want;
        for (auto& [k, v] : plain->stateDict()) want.emplace(k, v.clone());
        CHECK(relDiff(full, want) < 1e-6);
      }
    });
  }
}

TEST_CASE("fsdp prefetches the next unit of the previous forward while the current one computes") {
  Ranks one(1);
  auto net = tinyGpt();
  Fsdp fsdp(net, one[0]);
  const auto units = fsdp.units();
  std::vector<int64_t> bytesAtBlock0;
  const int id = net->blocks()[0]->registerForwardPreHook(
      [&](nn::Module&, const Tensor&) { bytesAtBlock0.push_back(fsdp.gatheredBytes()); });
  for (int s = 0; s < 2; ++s) {
    auto [x, y] = batch(0, s);
    lossOf(fsdp.forward(x), y).backward();
  }
  net->blocks()[0]->removeForwardHook(id);
  // The first forward knows no order yet: the root and block 0. The second one gathers block 1
  // ahead of time, as soon as block 0 is in.
  const int64_t root = units[0].shardNumel * 4, block = units[1].shardNumel * 4;
  CHECK(bytesAtBlock0 == std::vector<int64_t>{root + block, root + 2 * block});
  CHECK(fsdp.gatheredBytes() == 0);
}

TEST_CASE("fsdp mixed precision: bfloat16 or float16 compute parameters over float32 shards track float32") {
  const int world = 2, steps = 10;
  // Each rank's losses under a policy; the gathered bytes of the last forward's root unit.
  auto losses = [&](Fsdp::Options::MixedPrecision mp, int64_t* rootBytes) {
    Ranks ranks(world);
    std::vector<double> out(steps);
    ranks.onEachRank([&](int r) {
      auto net = tinyGpt();
      Fsdp fsdp(net, ranks[r], {.mixedPrecision = mp});
      nn::optim::Optimizer opt(fsdp.parameters(), adamw());
      for (int s = 0; s < steps; ++s) {
        opt.zeroGrad();
        auto [x, y] = batch(r, s);
        Tensor logits = fsdp.forward(x);
        CHECK(net->wte()->weight().dtype() == mp.param);
        if (r == 0 && rootBytes != nullptr) *rootBytes = fsdp.gatheredBytes();
        Tensor loss = lossOf(logits.to(DType::Float32), y);
        loss.backward();
        for (const Tensor& sh : fsdp.parameters()) CHECK(sh.grad().dtype() == DType::Float32);
        opt.step();
        Tensor l = loss.detach().reshape({1});
        ranks[r].allReduce(l, collectives::ReduceOp::Avg).wait();
        if (r == 0) out[static_cast<size_t>(s)] = l.item<double>();
      }
      for (const Tensor& sh : fsdp.parameters()) CHECK(sh.dtype() == DType::Float32);
    });
    return out;
  };
  int64_t f32Root = 0, bf16Root = 0, f16Root = 0;
  const std::vector<double> f32 = losses({}, &f32Root);
  const std::vector<double> bf16 = losses({.param = DType::BFloat16}, &bf16Root);
  const std::vector<double> f16 = losses({.param = DType::Float16, .reduce = DType::Float16}, &f16Root);
  // Half the bytes gathered.
  CHECK(bf16Root * 2 == f32Root);
  CHECK(f16Root * 2 == f32Root);
  double worstBf16 = 0, worstF16 = 0;
  bool differs = false;
  for (int s = 0; s < steps; ++s) {
    worstBf16 = std::max(worstBf16, std::abs(bf16[static_cast<size_t>(s)] - f32[static_cast<size_t>(s)]));
    worstF16 = std::max(worstF16, std::abs(f16[static_cast<size_t>(s)] - f32[static_cast<size_t>(s)]));
    differs = differs || bf16[static_cast<size_t>(s)] != f32[static_cast<size_t>(s)];
  }
  MESSAGE("loss " << f32.front() << " -> " << f32.back() << "; largest difference bf16 " << worstBf16 << ", f16 "
                  << worstF16);
  CHECK(differs);               // the products really ran in low precision
  CHECK(worstBf16 < 0.02);      // the tolerance of tests/nn/amp_gpt_test.cpp's first steps
  CHECK(worstF16 < 0.02);
  Ranks one(1);
  auto net = tinyGpt();
  CHECK(contains(errorOf([&] { Fsdp f(net, one[0], {.mixedPrecision = {.reduce = DType::BFloat16}}); }),
                 "must be float32 or float16"));
}

TEST_SUITE_END();
