// Mesh and the tensor-parallel layers within one process: ranks on threads, each with its own
// store client and ProcessGroupGloo over 127.0.0.1. The meshes every rank rejects alike (sizes,
// names), the accessors' errors, the layers' size checks and the vocabulary-parallel loss against
// crossEntropy of the whole logits.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "collectives/gloo/detail/group.h"
#include "collectives/mesh.h"
#include "collectives/sequence_parallel_gpt.h"
#include "collectives/tensor_parallel.h"
#include "collectives/tensor_parallel_gpt.h"
#include "common/error.h"
#include "rpc/store.h"
#include "tensor/ops.h"
#include "captured_text.h"

using namespace weft;
using namespace weft::collectives;
using namespace std::chrono_literals;
using weft::testing::contains;

namespace {

// A store and `world` groups, one per rank; run() calls fn on every rank at once, on threads.
class Ranks {
 public:
  explicit Ranks(int world) {
    server_ = std::make_unique<rpc::StoreServer>(rpc::StoreServer::Config{});
    for (int r = 0; r < world; ++r) {
      rpc::StoreClient::Config cc;
      cc.port = server_->port();
      cc.timeout = 10s;
      clients_.push_back(std::make_unique<rpc::StoreClient>(cc));
    }
    std::vector<std::future<std::unique_ptr<ProcessGroupGloo>>> made;
    for (int r = 0; r < world; ++r) {
      made.push_back(std::async(std::launch::async, [this, r, world] {
        return ProcessGroupGloo::create(*clients_[static_cast<size_t>(r)], r, world, {.timeout = 10s});
      }));
    }
    for (auto& f : made) groups_.push_back(f.get());
  }
  // fn(rank's group) on every rank concurrently; returns what each threw ("" when nothing).
  std::vector<std::string> run(const std::function<void(ProcessGroup&)>& fn) {
    std::vector<std::future<std::string>> done;
    for (auto& g : groups_) {
      ProcessGroup* pg = g.get();
      done.push_back(std::async(std::launch::async, [pg, &fn]() -> std::string {
        try {
          fn(*pg);
        } catch (const InvalidArgumentError& e) {
          return std::string("InvalidArgumentError: ") + e.what();
        } catch (const std::exception& e) {
          return std::string("other: ") + e.what();
        }
        return "";
      }));
    }
    std::vector<std::string> out;
    for (auto& f : done) out.push_back(f.get());
    return out;
  }

 private:
  std::unique_ptr<rpc::StoreServer> server_;
  std::vector<std::unique_ptr<rpc::StoreClient>> clients_;  // outlive the groups
  std::vector<std::unique_ptr<ProcessGroupGloo>> groups_;
};

void checkAll(const std::vector<std::string>& errors, const std::string& want) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(contains(errors[r], want));
  }
}

// Every rank returned without throwing.
void checkNone(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

}  // namespace

TEST_SUITE_BEGIN("mesh");

TEST_CASE("a mesh every rank passes alike but that does not fit the world fails on every rank, naming it") {
  Ranks ranks(2);
  checkAll(ranks.run([](ProcessGroup& w) { Mesh m(w, {{"dp", 3}}); }),
           "InvalidArgumentError: Mesh {dp: 3}: the sizes multiply past the world size 2");
  checkAll(ranks.run([](ProcessGroup& w) { Mesh m(w, {{"dp", 1}}); }),
           "InvalidArgumentError: Mesh {dp: 1}: the sizes multiply to 1, but the world has 2 ranks");
  checkAll(ranks.run([](ProcessGroup& w) { Mesh m(w, {{"x", 1}, {"x", 2}}); }),
           "InvalidArgumentError: Mesh {x: 1, x: 2}: dimension 'x' appears twice");
  checkAll(ranks.run([](ProcessGroup& w) { Mesh m(w, {{"dp", 0}, {"tp", 2}}); }),
           "InvalidArgumentError: Mesh {dp: 0, tp: 2}: dimension 'dp' must have a size of at least 1, got 0");
  checkAll(ranks.run([](ProcessGroup& w) { Mesh m(w, {}); }),
           "InvalidArgumentError: Mesh: at least one dimension is needed");
  checkAll(ranks.run([](ProcessGroup& w) { Mesh m(w, {{"", 2}}); }),
           "InvalidArgumentError: Mesh {: 2}: a dimension has an empty name");
  // The world stays usable: a good mesh afterwards.
  checkNone(ranks.run([](ProcessGroup& w) { Mesh m(w, {{"tp", 2}}); }));
}

TEST_CASE("a mesh's accessors name an unknown dimension and out-of-range coordinates") {
  Ranks ranks(2);
  std::vector<std::string> errors = ranks.run([](ProcessGroup& w) {
    Mesh m(w, {{"dp", 1}, {"tp", 2}});
    REQUIRE(m.coordinate("tp") == w.rank());
    REQUIRE(m.rankAt({0, 1}) == 1);
    REQUIRE(m.has("dp"));
    REQUIRE_FALSE(m.has("pp"));
    CHECK_THROWS_WITH_AS(m.size("pp"), "Mesh {dp: 1, tp: 2}: no dimension named 'pp'", NotFoundError);
    CHECK_THROWS_WITH_AS(m.rankAt({0}), "Mesh {dp: 1, tp: 2}: rankAt takes 2 coordinates, got 1",
                         InvalidArgumentError);
    CHECK_THROWS_WITH_AS(m.rankAt({0, 2}), "Mesh {dp: 1, tp: 2}: coordinate 2 along 'tp' is outside [0, 2)",
                         IndexError);
  });
  checkNone(errors);
}

TEST_CASE("tensor-parallel linear layers refuse sizes the group does not divide, naming the size and T") {
  Ranks ranks(2);
  std::vector<std::string> errors = ranks.run([](ProcessGroup& w) {
    auto tp = std::make_shared<TpGroup>(w);
    CHECK_THROWS_WITH_AS(ColumnParallelLinear(tp, 4, 3),
                         "ColumnParallelLinear: out / parts (3) must be divisible by the tensor-parallel size 2",
                         InvalidArgumentError);
    CHECK_THROWS_WITH_AS(RowParallelLinear(tp, 5, 4),
                         "RowParallelLinear: in (5) must be divisible by the tensor-parallel size 2",
                         InvalidArgumentError);
    CHECK_THROWS_WITH_AS(VocabParallelEmbedding(tp, 0, 4), "VocabParallelEmbedding: vocab must be positive, got 0",
                         InvalidArgumentError);
    ColumnParallelLinear fc(tp, 4, 6, true, 3);
    CHECK_THROWS_WITH_AS(fc.shard("weight", zeros({6, 5})),
                         "ColumnParallelLinear: the whole layer's weight must have shape [6, 4], got [6, 5]",
                         InvalidArgumentError);
    CHECK_THROWS_AS(fc.shard("scale", zeros({6})), NotFoundError);
  });
  checkNone(errors);
}

TEST_CASE("a vocabulary of 7 on 2 ranks is padded to 8: the embedding pads and unpads its table, looks up "
          "every id as nn's, and the cross-entropy masks the padding column") {
  Generator g(5);
  const Tensor table = randn({7, 3}, {.dtype = DType::Float64}, &g);
  const Tensor ids = fromVector(std::vector<int64_t>{6, 0, 3, 4, 6, 2}, {2, 3});
  const Tensor whole = randn({5, 7}, {.dtype = DType::Float64}, &g);
  const Tensor targets = fromVector(std::vector<int64_t>{6, 2, -100, 4, 0}, {5});
  Tensor w = whole.clone().requiresGrad_();
  Tensor want = crossEntropy(w, targets);
  want.backward();
  Ranks ranks(2);
  std::vector<std::string> errors = ranks.run([&](ProcessGroup& pg) {
    auto tp = std::make_shared<TpGroup>(pg);
    VocabParallelEmbedding emb(tp, 7, 3);
    emb.to(DType::Float64);
    CHECK(emb.weight().size(0) == 4);
    CHECK(emb.paddedVocabSize() == 8);
    CHECK(emb.vocabStart() == 4 * pg.rank());
    CHECK(emb.localVocab() == (pg.rank() == 0 ? 4 : 3));
    emb.loadFull(table);
    if (pg.rank() == 1) CHECK(max(abs(emb.weight().narrow(0, 3, 1))).item<double>() == 0.0);  // the padding row
    std::vector<Tensor> shards;
    pg.allGather(shards, emb.weight().detach().contiguous()).wait();
    CHECK(max(abs(emb.unshard("weight", shards) - table)).item<double>() == 0.0);
    CHECK(max(abs(emb.forward(ids) - embedding(table, ids))).item<double>() < 1e-15);
    // This rank's columns of the logits, the padding column (rank 1's last) a large value.
    Tensor mine = pg.rank() == 0 ? whole.narrow(1, 0, 4).contiguous()
                                 : cat({whole.narrow(1, 4, 3), full({5, 1}, 50.0, {.dtype = DType::Float64})}, 1);
    mine.requiresGrad_();
    Tensor got = vocabParallelCrossEntropy(*tp, mine, targets, 4 * pg.rank(), Reduction::Mean, 7);
    got.backward();
    CHECK(std::abs(got.item<double>() - want.item<double>()) < 1e-12);
    const int64_t real = pg.rank() == 0 ? 4 : 3;
    CHECK(max(abs(mine.grad().narrow(1, 0, real) - w.grad().narrow(1, 4 * pg.rank(), real))).item<double>() < 1e-12);
    if (pg.rank() == 1) CHECK(max(abs(mine.grad().narrow(1, 3, 1))).item<double>() == 0.0);
    CHECK_THROWS_WITH_AS(vocabParallelCrossEntropy(*tp, mine, targets, 4 * pg.rank(), Reduction::Mean, 9),
                         "vocabParallelCrossEntropy: a vocabulary of 9 does not split into 2 slices of 4 columns "
                         "(padded to 8)",
                         InvalidArgumentError);
  });
  checkNone(errors);
}

TEST_CASE("the vocabulary-parallel cross-entropy on 2 ranks equals crossEntropy of the whole logits, "
          "mean and sum, in value and gradient") {
  Generator g(3);
  const Tensor whole = randn({5, 8}, {.dtype = DType::Float64}, &g);
  const Tensor targets = fromVector(std::vector<int64_t>{1, 7, -100, 4, 0}, {5});
  for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
    Tensor w = whole.clone().requiresGrad_();
    Tensor want = crossEntropy(w, targets, r);
    want.backward();
    Ranks ranks(2);
    std::vector<std::string> errors = ranks.run([&](ProcessGroup& pg) {
      TpGroup tp(pg);
      Tensor mine = whole.narrow(1, 4 * pg.rank(), 4).contiguous().requiresGrad_();
      Tensor got = vocabParallelCrossEntropy(tp, mine, targets, 4 * pg.rank(), r);
      got.backward();
      CHECK(std::abs(got.item<double>() - want.item<double>()) < 1e-12);
      CHECK(max(abs(mine.grad() - w.grad().narrow(1, 4 * pg.rank(), 4))).item<double>() < 1e-12);
      CHECK(tp.traffic().forwardAllReduces == 3);
      CHECK(tp.traffic().forwardBytes == 3 * 5 * 8);
    });
    checkNone(errors);
  }
}

TEST_CASE("sequence-parallel models take dropout in every mode, and refuse a mode without its group") {
  Ranks ranks(2);
  std::vector<std::string> errors = ranks.run([](ProcessGroup& w) {
    SpGroup sp(w);
    auto tp = std::make_shared<TpGroup>(w);
    nn::GPTConfig cfg{.vocabSize = 8, .blockSize = 8, .layers = 1, .heads = 2, .width = 8, .dropout = 0.1};
    CHECK_NOTHROW(SequenceParallelGPT(cfg, {.mode = SpMode::Ring, .ring = &sp}));
    CHECK_NOTHROW(SequenceParallelGPT(cfg, {.mode = SpMode::Ulysses, .ulysses = &sp}));
    CHECK_NOTHROW(TensorParallelGPT(tp, cfg, SpOptions{.mode = SpMode::Ring, .ring = &sp}));
    CHECK_THROWS_WITH_AS(ParallelCausalSelfAttention(tp, cfg, SpOptions{.mode = SpMode::Ulysses, .ulysses = &sp}),
                         "ParallelCausalSelfAttention: heads (1) must be divisible by the Ulysses size 2",
                         InvalidArgumentError);
    cfg.dropout = 0.0;
    CHECK_THROWS_WITH_AS(SequenceParallelGPT(cfg, {.mode = SpMode::Ring}),
                         "SequenceParallelGPT: this mode needs SpOptions::ring, the ring group", InvalidArgumentError);
    cfg.heads = 1;
    CHECK_THROWS_WITH_AS(SequenceParallelGPT(cfg, {.mode = SpMode::Ulysses, .ulysses = &sp}),
                         "SequenceParallelGPT: heads (1) must be divisible by the Ulysses size 2",
                         InvalidArgumentError);
  });
  checkNone(errors);
}
