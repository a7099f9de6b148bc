// Activation checkpointing inside distributed autograd contexts: a checkpointed function on the
// worker that calls backward and one inside a handler on another worker (recomputed when the
// backward request arrives there) put their parameters' gradients into the context on each
// worker, never into .grad, bit-identical to the same job run without checkpointing.
#include <chrono>
#include <memory>
#include <vector>

#include "dist_autograd/dist_autograd.h"
#include "rpc/agent_util.h"
#include "tensor/checkpoint.h"
#include "tensor/ops.h"
#include "text_util.h"
#include "weft_test.h"

using namespace std::chrono_literals;
using weft::Tensor;
using weft::dist_autograd::Context;

namespace dackpt {

// x -> dropout(tanh(x * w_r), 0.5) with worker r's generator, checkpointed when asked.
inline const weft::Function<Tensor(Tensor, bool)> block{"dackpt.block"};

struct Worker {
  Tensor w;
  std::unique_ptr<weft::Generator> gen;
};

std::function<Tensor(const Tensor&)> blockFn(const Worker& k) {
  Tensor w = k.w;
  weft::Generator* g = k.gen.get();
  return [w, g](const Tensor& t) { return weft::dropout(weft::tanh(t * w), 0.5, true, g); };
}

Tensor runBlock(const Worker& k, const Tensor& x, bool ckpt) {
  return ckpt ? weft::checkpoint(blockFn(k), x, weft::CheckpointOptions{.generators = {k.gen.get()}})
              : blockFn(k)(x);
}

}  // namespace dackpt

using namespace dackpt;

TEST_SUITE_BEGIN("dist_autograd");

TEST_CASE("checkpointed functions on the caller and in a handler give their parameters' gradients to the "
          "context, as without checkpointing") {
  std::vector<Worker> workers(2);
  for (int r = 0; r < 2; ++r) {
    workers[r].w = (weft::fromVector(std::vector<double>{0.5, -1.0, 1.5, 0.25, -0.75, 2.0}) * double(r + 1))
                       .requiresGrad_();
    workers[r].gen = std::make_unique<weft::Generator>(100 + r);
  }
  weft::testing::AgentGroup group(2);
  for (int r = 0; r < 2; ++r) {
    const Worker& k = workers[r];
    group.agent(r).registry().impl(block, [&k](Tensor x, bool ckpt) { return runBlock(k, x, ckpt); });
  }
  group.start();
  weft::rpc::Agent& a0 = group.agent(0);

  struct Result {
    std::vector<double> x, w0, w1, loss;
  };
  auto run = [&](bool ckpt) {
    for (int r = 0; r < 2; ++r) workers[r].gen->seed(7 + r);
    Tensor x = weft::fromVector(std::vector<double>{1.0, 2.0, -3.0, 0.5, -0.5, 1.5}).requiresGrad_();
    Result res;
    Context ctx(a0);
    Tensor h = runBlock(workers[0], x * 2.0, ckpt);
    Tensor z = a0.sync(1, block, h, ckpt);
    Tensor loss = (z * z).sum() + h.sum();
    ctx.backward({loss}, weft::dist_autograd::BackwardOptions{.timeout = 10s});
    weft::dist_autograd::GradientMap here = ctx.gradients();
    weft::dist_autograd::GradientMap there = weft::dist_autograd::gradients(group.agent(1), ctx.id());
    res.x = here.at(x).toVector<double>();
    res.w0 = here.at(workers[0].w).toVector<double>();
    res.w1 = there.at(workers[1].w).toVector<double>();
    res.loss = loss.detach().toVector<double>();
    return res;
  };
  Result plain = run(false);
  Result ckpt = run(true);
  CHECK(plain.loss == ckpt.loss);
  CHECK(plain.x == ckpt.x);
  CHECK(plain.w0 == ckpt.w0);
  CHECK(plain.w1 == ckpt.w1);
  // Dropout at 0.5 zeroes some of w1's entries and not others: the masks were replayed.
  int zeros = 0;
  for (double v : ckpt.w1) zeros += v == 0.0;
  CHECK(zeros > 0);
  CHECK(zeros < 6);
  CHECK_FALSE(workers[0].w.grad().defined());
  CHECK_FALSE(workers[1].w.grad().defined());
  CHECK(weft::testing::eventually(
      [&] {
        return weft::dist_autograd::debugCounts(group.agent(0)).empty() &&
               weft::dist_autograd::debugCounts(group.agent(1)).empty();
      },
      5s));
}
