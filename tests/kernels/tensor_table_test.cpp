// The launch plan of the CUDA multi-tensor kernels (kernels/cuda/tensor_table.h),
// on the host: every chunk of every non-empty tensor is given to exactly one
// block, with the tensor's own pointers, size and constants, and no launch
// passes the table's limits.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "kernels/cuda/tensor_table.h"

using namespace weft::kernels::cuda;

namespace {

struct Plan {
  int launches = 0;
  // (tensor index, chunk) -> times covered
  std::map<std::pair<int, int64_t>, int> covered;
};

// Fake, distinct addresses: tensor i's operand d is (i + 1) * 16 + d.
void* fake(int i, int d) { return reinterpret_cast<void*>(static_cast<uintptr_t>((i + 1) * 16 + d)); }

Plan plan(const std::vector<int64_t>& sizes) {
  std::vector<OptimTensor> ts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    OptimTensor t;
    t.param = fake(static_cast<int>(i), 0);
    t.grad = fake(static_cast<int>(i), 1);
    for (int s = 0; s < 3; ++s) t.state[s] = fake(static_cast<int>(i), 2 + s);
    t.numel = sizes[i];
    t.scalar[0] = static_cast<double>(i);
    t.scalar[1] = -static_cast<double>(i);
    ts.push_back(t);
  }
  Plan p;
  multiTensorApply(ts, [&](const TensorTable& table, int blocks) {
    ++p.launches;
    REQUIRE(blocks >= 1);
    REQUIRE(blocks <= TensorTable::kMaxBlocks);
    for (int b = 0; b < blocks; ++b) {
      const int slot = table.blockTensor[b];
      REQUIRE(slot < TensorTable::kMaxTensors);
      const int i = static_cast<int>(reinterpret_cast<uintptr_t>(table.ptr[0][slot]) / 16) - 1;
      REQUIRE(i >= 0);
      REQUIRE(i < static_cast<int>(sizes.size()));
      for (int d = 0; d < TensorTable::kDepth; ++d) CHECK(table.ptr[d][slot] == fake(i, d));
      CHECK(table.numel[slot] == sizes[i]);
      CHECK(table.scalar[slot][0] == static_cast<double>(i));
      CHECK(table.scalar[slot][1] == -static_cast<double>(i));
      const int64_t chunk = table.blockChunk[b];
      CHECK(chunk * TensorTable::kChunk < sizes[i]);
      ++p.covered[{i, chunk}];
    }
  });
  return p;
}

void checkCovered(const Plan& p, const std::vector<int64_t>& sizes) {
  size_t expected = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t chunks = (sizes[i] + TensorTable::kChunk - 1) / TensorTable::kChunk;
    expected += static_cast<size_t>(chunks);
    for (int64_t c = 0; c < chunks; ++c) {
      auto it = p.covered.find({static_cast<int>(i), c});
      INFO("tensor " << i << " chunk " << c);
      REQUIRE(it != p.covered.end());
      CHECK(it->second == 1);
    }
  }
  CHECK(p.covered.size() == expected);
}

}  // namespace

TEST_CASE("multi-tensor plan: a few small tensors take one launch") {
  std::vector<int64_t> sizes = {7, 1, 0, 65536, 65537};
  Plan p = plan(sizes);
  CHECK(p.launches == 1);
  checkCovered(p, sizes);
}

TEST_CASE("multi-tensor plan: nothing to update launches nothing") {
  CHECK(plan({}).launches == 0);
  CHECK(plan({0, 0, 0}).launches == 0);
}

TEST_CASE("multi-tensor plan: more tensors than a table's slots take several launches") {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 75; ++i) sizes.push_back((i * 937) % 70001);
  Plan p = plan(sizes);
  CHECK(p.launches == 3);  // 74 non-empty tensors, 32 slots per launch
  checkCovered(p, sizes);
}

TEST_CASE("multi-tensor plan: a tensor's chunks continue in the next launch") {
  const int64_t k = TensorTable::kChunk;
  // 168 + 168 chunks: the second tensor straddles the 320-block boundary.
  std::vector<int64_t> sizes = {168 * k - 5, 168 * k, 5};
  Plan p = plan(sizes);
  CHECK(p.launches == 2);
  checkCovered(p, sizes);
  // One tensor of more than two launches' blocks.
  std::vector<int64_t> big = {3, 700 * k + 1, 2};
  Plan q = plan(big);
  CHECK(q.launches == 3);
  checkCovered(q, big);
}
