// A program built outside weft's tree against an installed weft
// (find_package(weft), see CMakeLists.txt next to it), run by
// tests/install/install_test.cmake alone and under the installed weftrun. Each
// rank checks, against values computed here by formula:
//   tensor + autograd   the gradient of sum(w * x) is x
//   data                DistributedSampler without shuffling deals rank, rank + W, ...
//   rpc                 a registered function called on the next rank (itself when alone)
//   rref                the same function's result kept there and fetched with toHere()
//   collectives         collectives::init(agent): allReduce of [[1..4],[5..8],[9..12]] is W
//                       times it; DDP over an nn::Linear averages the ranks' gradients
// and prints "consumer rank R of W: ok", or the first mismatch and exits 1.
#include <weft/collectives/ddp.h>
#include <weft/collectives/init.h>
#include <weft/data/sampler.h>
#include <weft/nn/linear.h>
#include <weft/rpc/agent.h>
#include <weft/rpc/options.h>
#include <weft/rref/rref.h>
#include <weft/tensor/ops.h>
#include <weft/tensor/tensor.h>

// weft's own include form resolves against the installed tree too.
#include "common/error.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using namespace weft;
using namespace std::chrono_literals;

namespace {

inline const Function<Tensor(Tensor, Tensor)> addFn{"consumer.add"};

int failures = 0;

void expectClose(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  bool same = got.size() == want.size();
  for (size_t i = 0; same && i < got.size(); ++i) same = std::fabs(got[i] - want[i]) <= 1e-5f * (1 + std::fabs(want[i]));
  if (same) return;
  ++failures;
  std::printf("mismatch: %s:", what.c_str());
  for (float v : got) std::printf(" %g", v);
  std::printf("  expected:");
  for (float v : want) std::printf(" %g", v);
  std::printf("\n");
}

}  // namespace

int main() {
  try {
    rpc::Options opt = rpc::Options::fromEnv();
    const int rank = opt.rank;
    const int world = opt.worldSize;
    const int next = (rank + 1) % world;

    // tensor + autograd
    std::vector<float> xs = {1, -2, 3, 0.5f};
    Tensor x = fromVector(xs);
    Tensor w = ones({4}).requiresGrad_();
    sum(w * x).backward();
    expectClose("d sum(w * x) / dw", w.grad().toVector<float>(), xs);

    // data
    data::DistributedSampler sampler(10, {.numReplicas = world, .rank = rank, .shuffle = false});
    std::vector<float> dealt;
    for (int64_t i : sampler.indices()) dealt.push_back(static_cast<float>(i));
    std::vector<float> deal;
    for (int64_t i = 0; i < sampler.size(); ++i) deal.push_back(static_cast<float>((rank + i * world) % 10));
    expectClose("DistributedSampler indices", dealt, deal);

    // rpc and rref
    rpc::Agent agent(opt);
    agent.registry().impl(addFn, [](Tensor a, Tensor b) { return a + b; });
    agent.start();
    Tensor a = fromVector(std::vector<float>{1, 2, 3});
    Tensor b = fromVector(std::vector<float>{10, 20, static_cast<float>(rank)});
    std::vector<float> aPlusB = {11, 22, 3.0f + static_cast<float>(rank)};
    expectClose("agent.call(next, add)", agent.call(next, addFn, a, b).toVector<float>(), aPlusB);
    RRef<Tensor> kept = agent.remote(next, addFn, a, b);
    expectClose("agent.remote(next, add).toHere()", kept.toHere().toVector<float>(), aPlusB);

    // collectives: the job's process group, through the agent's store
    auto group = collectives::init(agent, {.timeout = 30s});
    std::vector<float> grid(12);
    for (int i = 0; i < 12; ++i) grid[i] = static_cast<float>(i + 1);
    Tensor t = fromVector(grid, {3, 4});
    group->allReduce(t).wait();
    std::vector<float> times(grid);
    for (float& v : times) v *= static_cast<float>(world);
    expectClose("allReduce", t.toVector<float>(), times);

    // DDP: rank r's batch is (r + 1) * base, so the averaged gradient of sum(linear(x)) is
    // the column sums of base times (W + 1) / 2 for every weight row, and the batch size
    // for every bias.
    auto linear = std::make_shared<nn::Linear>(4, 2);
    collectives::DistributedDataParallel ddp(linear, *group);
    std::vector<float> base = {1, 2, 3, 4, -1, 0, 1, 2, 0.5f, 0.25f, -2, 1};
    sum(ddp(fromVector(base, {3, 4}) * static_cast<double>(rank + 1))).backward();
    const float mean = (world + 1) / 2.0f;
    std::vector<float> dW;
    for (int row = 0; row < 2; ++row)
      for (int col = 0; col < 4; ++col) dW.push_back((base[col] + base[4 + col] + base[8 + col]) * mean);
    expectClose("DDP weight gradient", linear->weight().grad().toVector<float>(), dW);
    expectClose("DDP bias gradient", linear->bias().grad().toVector<float>(), {3, 3});

    group.reset();
    agent.shutdown();
    if (failures) return 1;
    std::printf("consumer rank %d of %d: ok\n", rank, world);
    return 0;
  } catch (const Error& e) {
    std::printf("consumer: %s\n", e.what());
    return 1;
  }
}
