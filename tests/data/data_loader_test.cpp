#include <algorithm>
#include <memory>
#include <numeric>
#include <set>

#include "data/data.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::data;

namespace {

// 10 examples: data row i is [i, 100 + i, 200 + i] (float32), target 10 * i.
std::shared_ptr<TensorDataset> rowsDataset(int64_t n = 10) {
  std::vector<float> d;
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) {
    d.insert(d.end(), {float(i), float(100 + i), float(200 + i)});
    t.push_back(10 * i);
  }
  return std::make_shared<TensorDataset>(fromVector(d, {n, 3}), fromVector(t));
}

// The example ids of a batch, read back from the data's first column.
std::vector<int64_t> idsOf(const Example& batch) {
  std::vector<float> v = batch.data.contiguous().toVector<float>();
  std::vector<int64_t> ids;
  for (size_t r = 0; r < v.size(); r += 3) ids.push_back(static_cast<int64_t>(v[r]));
  return ids;
}

std::vector<std::vector<int64_t>> epochIds(DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (const Example& b : loader) out.push_back(idsOf(b));
  return out;
}

// A dataset that only implements get(), to exercise Dataset's default batching.
class SquaresDataset : public Dataset {
 public:
  explicit SquaresDataset(int64_t n, int64_t oddShapeAt = -1) : n_(n), oddShapeAt_(oddShapeAt) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    WEFT_ENFORCE(i >= 0 && i < n_, IndexError, "SquaresDataset: index ", i);
    const int64_t width = i == oddShapeAt_ ? 3 : 2;
    Tensor x = full({width}, static_cast<double>(i * i), {.dtype = DType::Float64});
    return {x, scalarTensor(static_cast<double>(i), DType::Int64)};
  }

 private:
  int64_t n_;
  int64_t oddShapeAt_;
};

}  // namespace

TEST_CASE("batches stack rows in order with a smaller last batch") {
  DataLoader loader(rowsDataset(), {.batchSize = 4});
  CHECK(loader.numBatches() == 3);
  std::vector<Example> batches;
  for (const Example& b : loader) batches.push_back(b);
  REQUIRE(batches.size() == 3);
  CHECK(batches[0].data.shape() == Shape{4, 3});
  CHECK(batches[0].target.shape() == Shape{4});
  CHECK(batches[2].data.shape() == Shape{2, 3});
  CHECK(batches[1].data.toVector<float>() ==
        std::vector<float>{4, 104, 204, 5, 105, 205, 6, 106, 206, 7, 107, 207});
  CHECK(batches[2].target.toVector<int64_t>() == std::vector<int64_t>{80, 90});
}

TEST_CASE("dropLast drops only an incomplete final batch") {
  DataLoader dropped(rowsDataset(), {.batchSize = 4, .dropLast = true});
  CHECK(dropped.numBatches() == 2);
  CHECK(epochIds(dropped) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  DataLoader even(rowsDataset(), {.batchSize = 5, .dropLast = true});
  CHECK(even.numBatches() == 2);
  CHECK(epochIds(even).size() == 2);
  DataLoader tooBig(rowsDataset(), {.batchSize = 11, .dropLast = true});
  CHECK(tooBig.numBatches() == 0);
  CHECK(epochIds(tooBig).empty());
}

TEST_CASE("shuffled epochs are permutations, differ from each other and repeat with the same seed") {
  auto ds = rowsDataset(50);
  DataLoader a(ds, {.batchSize = 8, .shuffle = true, .seed = 5});
  DataLoader b(ds, {.batchSize = 8, .shuffle = true, .seed = 5});
  DataLoader c(ds, {.batchSize = 8, .shuffle = true, .seed = 6});
  std::vector<std::vector<int64_t>> a1 = epochIds(a), a2 = epochIds(a);
  CHECK(a1 == epochIds(b));
  CHECK(a2 == epochIds(b));
  CHECK(a1 != a2);
  CHECK(a1 != epochIds(c));
  std::vector<int64_t> flat;
  for (auto& batch : a1) flat.insert(flat.end(), batch.begin(), batch.end());
  CHECK(flat.size() == 50);
  std::vector<int64_t> sorted = flat;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expected(50);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(sorted == expected);
  CHECK(flat != expected);
}

TEST_CASE("targets travel with their rows when shuffled") {
  DataLoader loader(rowsDataset(30), {.batchSize = 7, .shuffle = true, .seed = 1});
  for (const Example& b : loader) {
    std::vector<int64_t> ids = idsOf(b);
    std::vector<int64_t> targets = b.target.toVector<int64_t>();
    REQUIRE(ids.size() == targets.size());
    for (size_t i = 0; i < ids.size(); ++i) CHECK(targets[i] == 10 * ids[i]);
  }
}

TEST_CASE("random permutations from a weft Generator are uniform over positions") {
  Generator g(11);
  // Where element 0 lands over many permutations of 4: each slot about 1/4.
  std::vector<int> where(4, 0);
  for (int k = 0; k < 4000; ++k) {
    std::vector<int64_t> p = randomPermutation(4, g);
    ++where[static_cast<size_t>(std::find(p.begin(), p.end(), 0) - p.begin())];
  }
  for (int c : where) CHECK(c == doctest::Approx(1000).epsilon(0.1));
}

TEST_CASE("the loader refuses bad options") {
  auto ds = rowsDataset();
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.batchSize = 0}), doctest::Contains("batchSize must be at least 1, got 0"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(DataLoader(ds, {.batchSize = 2, .shuffle = true}, std::make_shared<SequentialSampler>(10)),
                       doctest::Contains("shuffle cannot be combined with a sampler"), InvalidArgumentError);
  CHECK_THROWS_AS(DataLoader(nullptr), InvalidArgumentError);
}

TEST_CASE("a sampler decides which examples a loader visits") {
  auto ds = rowsDataset(10);
  auto sampler = std::make_shared<DistributedSampler>(
      ds->size(), DistributedSamplerOptions{.numReplicas = 3, .rank = 1, .shuffle = false});
  DataLoader loader(ds, {.batchSize = 2}, sampler);
  CHECK(loader.numExamples() == 4);
  CHECK(loader.numBatches() == 2);
  // Padded to 12 by wrapping: rank 1 takes positions 1, 4, 7, 10 -> 1, 4, 7, 0.
  CHECK(epochIds(loader) == std::vector<std::vector<int64_t>>{{1, 4}, {7, 0}});
}

TEST_CASE("a sampler index outside the dataset is an IndexError, not a stray read") {
  class BadSampler : public Sampler {
   public:
    std::vector<int64_t> indices() override { return {0, 10}; }
    int64_t size() const override { return 2; }
  };
  DataLoader loader(rowsDataset(10), {.batchSize = 2}, std::make_shared<BadSampler>());
  auto it = loader.begin();
  CHECK_THROWS_WITH_AS(*it, doctest::Contains("index 10 out of range for 10 examples"), IndexError);
}

TEST_CASE("a dataset with only get() is batched by copying each example") {
  auto ds = std::make_shared<SquaresDataset>(5);
  DataLoader loader(ds, {.batchSize = 3});
  std::vector<Example> batches;
  for (const Example& b : loader) batches.push_back(b);
  REQUIRE(batches.size() == 2);
  CHECK(batches[0].data.shape() == Shape{3, 2});
  CHECK(batches[0].data.toVector<double>() == std::vector<double>{0, 0, 1, 1, 4, 4});
  CHECK(batches[1].target.toVector<int64_t>() == std::vector<int64_t>{3, 4});

  SquaresDataset odd(5, 2);
  std::vector<int64_t> idx{0, 1, 2};
  CHECK_THROWS_WITH_AS(odd.getBatch(idx), doctest::Contains("example 2 has data of shape [3]"),
                       InvalidArgumentError);
}

TEST_CASE("TensorDataset checks its tensors and indices") {
  CHECK_THROWS_WITH_AS(TensorDataset(zeros({4, 2}), zeros({3})), doctest::Contains("disagree on the number of examples"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(TensorDataset(scalarTensor(1.0)), InvalidArgumentError);
  TensorDataset ds(arange(6, {.dtype = DType::Float32}).view({3, 2}).t().contiguous().t());
  CHECK(ds.size() == 3);
  CHECK_FALSE(ds.targets().defined());
  CHECK(ds.get(2).data.toVector<float>() == std::vector<float>{4, 5});
  CHECK_THROWS_AS(ds.get(3), IndexError);
  CHECK_THROWS_AS(ds.get(-1), IndexError);
  std::vector<int64_t> idx{2, 0, 2};
  Example b = ds.getBatch(idx);
  CHECK(b.data.toVector<float>() == std::vector<float>{4, 5, 0, 1, 4, 5});
  CHECK_FALSE(b.target.defined());
  std::vector<int64_t> bad{1, -1};
  CHECK_THROWS_WITH_AS(ds.getBatch(bad), doctest::Contains("index -1 out of range for 3 examples"), IndexError);
}

TEST_CASE("large shuffled batches gather exactly the rows their targets name") {
  // Batches of 2048 rows of 1024 floats (8 MiB).
  const int64_t n = 4096, w = 1024;
  Tensor data = arange(static_cast<double>(n * w), 0.0, -1.0, {.dtype = DType::Float32}).view({n, w});
  auto ds = std::make_shared<TensorDataset>(data, arange(n));
  DataLoader loader(ds, {.batchSize = 2048, .shuffle = true, .seed = 3});
  std::set<int64_t> seen;
  int64_t wrong = 0;
  for (const Example& b : loader) {
    std::vector<float> v = b.data.toVector<float>();
    std::vector<int64_t> t = b.target.toVector<int64_t>();
    for (size_t r = 0; r < t.size(); ++r) {
      seen.insert(t[r]);
      // Row i holds n*w - i*w, n*w - i*w - 1, ...
      for (int64_t k = 0; k < w; ++k) wrong += v[r * w + k] != static_cast<float>(n * w - t[r] * w - k);
    }
  }
  CHECK(wrong == 0);
  CHECK(seen.size() == static_cast<size_t>(n));
}
