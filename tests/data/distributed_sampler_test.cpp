// DistributedSampler and torchRandperm against values produced by PyTorch 1.13
// (tests/data/fixtures/gen_torch_fixtures.py writes the .inc files).
#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "data/sampler.h"
#include "data/torch_randperm.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::data;

namespace {

struct SamplerCase {
  int64_t n, replicas, rank;
  bool shuffle;
  int64_t seed, epoch;
  bool dropLast;
  int64_t offset, count;
};

struct RandpermCase {
  int64_t n;
  uint64_t seed;
  int64_t head[8];
  uint64_t hash;
};

#include "fixtures/distributed_sampler_cases.inc"
#include "fixtures/torch_randperm_cases.inc"

uint64_t permHash(const std::vector<int64_t>& p) {
  uint64_t h = 0;
  for (int64_t v : p) h = h * 1000003u + static_cast<uint64_t>(v);
  return h;
}

std::vector<int64_t> expectedOf(const SamplerCase& c) {
  return std::vector<int64_t>(kSamplerExpected + c.offset, kSamplerExpected + c.offset + c.count);
}

}  // namespace

TEST_CASE("torchRandperm reproduces torch.randperm for every fixture seed and size") {
  int checked = 0;
  for (const RandpermCase& c : kRandpermCases) {
    CAPTURE(c.n);
    CAPTURE(c.seed);
    std::vector<int64_t> p = torchRandperm(c.n, c.seed);
    REQUIRE(static_cast<int64_t>(p.size()) == c.n);
    for (int64_t i = 0; i < std::min<int64_t>(c.n, 8); ++i) CHECK(p[static_cast<size_t>(i)] == c.head[i]);
    CHECK(permHash(p) == c.hash);
    ++checked;
  }
  CHECK(checked == 40);
}

TEST_CASE("a TorchCpuGenerator continues its stream across randperm calls like torch.Generator") {
  // torch: g = Generator(); g.manual_seed(3); randperm(5, generator=g) twice gives
  // [1, 0, 3, 4, 2] then [0, 1, 2, 4, 3]: the second continues after the 4 draws
  // the first consumed.
  TorchCpuGenerator g(3);
  CHECK(torchRandperm(5, g) == std::vector<int64_t>{1, 0, 3, 4, 2});
  CHECK(torchRandperm(5, g) == std::vector<int64_t>{0, 1, 2, 4, 3});
  CHECK(torchRandperm(5, uint64_t{3}) == std::vector<int64_t>{1, 0, 3, 4, 2});
  std::mt19937 ref(3);
  for (int i = 0; i < 8; ++i) ref();
  TorchCpuGenerator h(3);
  for (int i = 0; i < 8; ++i) h.random();
  CHECK(h.random() == ref());
  CHECK_THROWS_AS(torchRandperm(-1, uint64_t{0}), InvalidArgumentError);
}

TEST_CASE("DistributedSampler gives every rank exactly PyTorch's indices") {
  int64_t cases = 0;
  for (const SamplerCase& c : kSamplerCases) {
    CAPTURE(c.n);
    CAPTURE(c.replicas);
    CAPTURE(c.rank);
    CAPTURE(c.shuffle);
    CAPTURE(c.seed);
    CAPTURE(c.epoch);
    CAPTURE(c.dropLast);
    DistributedSampler s(c.n, {.numReplicas = c.replicas, .rank = c.rank, .shuffle = c.shuffle, .seed = c.seed,
                               .dropLast = c.dropLast});
    s.setEpoch(c.epoch);
    CHECK(s.size() == c.count);
    CHECK(s.indices() == expectedOf(c));
    ++cases;
  }
  CHECK(cases == static_cast<int64_t>(std::size(kSamplerCases)));
  CHECK(cases > 1000);
}

TEST_CASE("one DistributedSampler walks PyTorch's epochs as setEpoch advances") {
  // Group the fixture's shuffled cases by sampler configuration; replay their
  // epochs in increasing order on a single sampler object.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>, std::map<int64_t, const SamplerCase*>> runs;
  for (const SamplerCase& c : kSamplerCases) {
    if (c.shuffle && c.seed == 0) runs[{c.n, c.replicas, c.rank, c.seed, c.dropLast}][c.epoch] = &c;
  }
  REQUIRE(!runs.empty());
  for (const auto& [key, epochs] : runs) {
    const SamplerCase& first = *epochs.begin()->second;
    DistributedSampler s(first.n, {.numReplicas = first.replicas, .rank = first.rank, .shuffle = true, .seed = 0,
                                   .dropLast = first.dropLast});
    REQUIRE(epochs.size() == 3);
    for (const auto& [epoch, c] : epochs) {
      s.setEpoch(epoch);
      CHECK(s.epoch() == epoch);
      CHECK(s.indices() == expectedOf(*c));
      CHECK(s.indices() == expectedOf(*c));  // indices() does not advance the epoch
    }
  }
}

TEST_CASE("without dropLast the ranks together cover every index, padding by wrap-around") {
  const int64_t n = 10, r = 4;
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < r; ++rank) {
    DistributedSampler s(n, {.numReplicas = r, .rank = rank, .shuffle = true, .seed = 9});
    CHECK(s.size() == 3);
    CHECK(s.totalSize() == 12);
    std::vector<int64_t> mine = s.indices();
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  CHECK(all.size() == static_cast<size_t>(n));
  // dropLast: 2 each, 8 distinct indices overall.
  std::vector<int64_t> kept;
  for (int64_t rank = 0; rank < r; ++rank) {
    DistributedSampler s(n, {.numReplicas = r, .rank = rank, .shuffle = true, .seed = 9, .dropLast = true});
    CHECK(s.size() == 2);
    std::vector<int64_t> mine = s.indices();
    kept.insert(kept.end(), mine.begin(), mine.end());
  }
  std::sort(kept.begin(), kept.end());
  CHECK(std::unique(kept.begin(), kept.end()) == kept.end());
  CHECK(kept.size() == 8);
}

TEST_CASE("DistributedSampler refuses an invalid rank or replica count") {
  CHECK_THROWS_WITH_AS(DistributedSampler(10, {.numReplicas = 2, .rank = 2}),
                       doctest::Contains("invalid rank 2, rank should be in the interval [0, 1]"), InvalidArgumentError);
  CHECK_THROWS_AS(DistributedSampler(10, {.numReplicas = 2, .rank = -1}), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(DistributedSampler(10, {.numReplicas = 0, .rank = 0}),
                       doctest::Contains("numReplicas must be at least 1"), InvalidArgumentError);
  CHECK_THROWS_AS(DistributedSampler(-1, {}), InvalidArgumentError);
}
