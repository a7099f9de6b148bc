// BatchSampler against torch.utils.data.BatchSampler's batches from PyTorch
// 1.13 (tests/data/fixtures/gen_batch_sampler_cases.py writes the .inc file),
// and over weft's own RandomSampler against the sampler's order cut by hand.
#include <memory>
#include <vector>

#include "data/data.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::data;

namespace {

struct BatchCase {
  int64_t n, replicas, rank;
  bool shuffle;
  int64_t seed, epoch;
  bool samplerDropLast;
  int64_t batchSize;
  bool dropLast;
  int64_t numBatches, lenOffset, valueOffset;
};

#include "fixtures/batch_sampler_cases.inc"

std::vector<std::vector<int64_t>> expectedOf(const BatchCase& c) {
  std::vector<std::vector<int64_t>> out;
  int64_t v = c.valueOffset;
  for (int64_t b = 0; b < c.numBatches; ++b) {
    const int64_t len = kBatchLens[c.lenOffset + b];
    out.emplace_back(kBatchValues + v, kBatchValues + v + len);
    v += len;
  }
  return out;
}

std::shared_ptr<DistributedSampler> samplerOf(const BatchCase& c) {
  auto s = std::make_shared<DistributedSampler>(
      c.n, DistributedSamplerOptions{.numReplicas = c.replicas, .rank = c.rank, .shuffle = c.shuffle, .seed = c.seed,
                                     .dropLast = c.samplerDropLast});
  s->setEpoch(c.epoch);
  return s;
}

// A dataset whose example i is data [i] (int64) and target [2i].
std::shared_ptr<TensorDataset> idDataset(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n)), twice(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] = i;
    twice[static_cast<size_t>(i)] = 2 * i;
  }
  return std::make_shared<TensorDataset>(fromVector(ids, {n, 1}), fromVector(twice));
}

}  // namespace

TEST_CASE("BatchSampler over a DistributedSampler gives PyTorch's batches for every fixture case") {
  int checked = 0;
  for (const BatchCase& c : kBatchCases) {
    CAPTURE(c.n);
    CAPTURE(c.replicas);
    CAPTURE(c.rank);
    CAPTURE(c.shuffle);
    CAPTURE(c.epoch);
    CAPTURE(c.samplerDropLast);
    CAPTURE(c.batchSize);
    CAPTURE(c.dropLast);
    BatchSampler bs(samplerOf(c), c.batchSize, c.dropLast);
    CHECK(bs.size() == c.numBatches);
    CHECK(bs.batches() == expectedOf(c));
    ++checked;
  }
  CHECK(checked == static_cast<int>(std::size(kBatchCases)));
  CHECK(checked > 700);
}

TEST_CASE("a DataLoader built on a BatchSampler yields exactly its batches") {
  int checked = 0;
  for (const BatchCase& c : kBatchCases) {
    if (c.n == 0 || c.replicas != 4 || c.batchSize != 3) continue;
    CAPTURE(c.n);
    CAPTURE(c.shuffle);
    CAPTURE(c.epoch);
    CAPTURE(c.dropLast);
    DataLoader loader(idDataset(c.n), std::make_shared<BatchSampler>(samplerOf(c), c.batchSize, c.dropLast));
    CHECK(loader.numBatches() == c.numBatches);
    std::vector<std::vector<int64_t>> got;
    for (const Example& b : loader) {
      got.push_back(b.data.flatten().toVector<int64_t>());
      std::vector<int64_t> twice = got.back();
      for (int64_t& v : twice) v *= 2;
      CHECK(b.target.toVector<int64_t>() == twice);
    }
    CHECK(got == expectedOf(c));
    ++checked;
  }
  CHECK(checked == 4 * 3 * 2 * 2);
}

TEST_CASE("BatchSampler over a seeded RandomSampler cuts each epoch's permutation in order") {
  // The reference: the same sampler's order, from an identically seeded twin,
  // cut into runs of 4 by hand.
  auto sampler = std::make_shared<RandomSampler>(10, 99);
  RandomSampler twin(10, 99);
  BatchSampler keep(sampler, 4, false);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order = twin.indices();
    std::vector<std::vector<int64_t>> expect = {{order.begin(), order.begin() + 4},
                                                {order.begin() + 4, order.begin() + 8},
                                                {order.begin() + 8, order.end()}};
    CHECK(keep.batches() == expect);
  }
  auto s2 = std::make_shared<RandomSampler>(10, 99);
  RandomSampler twin2(10, 99);
  BatchSampler drop(s2, 4, true);
  CHECK(drop.size() == 2);
  std::vector<int64_t> order = twin2.indices();
  CHECK(drop.batches() == std::vector<std::vector<int64_t>>{{order.begin(), order.begin() + 4},
                                                           {order.begin() + 4, order.begin() + 8}});
}

TEST_CASE("a DistributedSampler's epoch reaches the BatchSampler built on it") {
  auto sampler = std::make_shared<DistributedSampler>(
      20, DistributedSamplerOptions{.numReplicas = 2, .rank = 0, .seed = 3});
  BatchSampler bs(sampler, 5, false);
  std::vector<std::vector<int64_t>> e0 = bs.batches();
  sampler->setEpoch(1);
  std::vector<std::vector<int64_t>> e1 = bs.batches();
  CHECK(e0 != e1);
  std::vector<int64_t> flat;
  for (const auto& b : e1) flat.insert(flat.end(), b.begin(), b.end());
  CHECK(flat == sampler->indices());
}

TEST_CASE("BatchSampler refuses a null sampler, a batch size below 1 and a sampler that miscounts") {
  CHECK_THROWS_WITH_AS(BatchSampler(nullptr, 2), doctest::Contains("null sampler"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(BatchSampler(std::make_shared<SequentialSampler>(3), 0),
                       doctest::Contains("batchSize must be at least 1, got 0"), InvalidArgumentError);
  class Miscounting : public Sampler {
   public:
    std::vector<int64_t> indices() override { return {0, 1, 2}; }
    int64_t size() const override { return 2; }
  };
  BatchSampler bs(std::make_shared<Miscounting>(), 2);
  CHECK_THROWS_WITH_AS(bs.batches(), doctest::Contains("returned 3 indices but its size() is 2"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(DataLoader(idDataset(3), std::shared_ptr<BatchSampler>()),
                       doctest::Contains("null batch sampler"), InvalidArgumentError);
}
