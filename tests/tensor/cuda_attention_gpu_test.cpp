// scaledDotProductAttention and mergeAttention on cuda:0 against the same ops
// on the CPU (tests/cuda_compare.h), outputs and the gradients of q, k and v:
// causal or not, sequence lengths 1/17/129/300, head dimensions 16/64/128,
// several batch-heads, lse, offsets, dropout (the generator seeded alike on
// both devices drops the same elements), non-contiguous inputs, float64,
// float32 and bfloat16.
#include <vector>

#include "cuda_compare.h"
#include "tensor/generator.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::compareWithCpu;
using weft::testing::randomTensor;

namespace {

struct Case {
  int64_t B, H, Sq, Sk, D;
  bool causal = false;
  int64_t queryOffset = 0, keyOffset = 0;
  double dropout = 0.0;
};

std::string describe(const Case& c) {
  return "B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " Sq " + std::to_string(c.Sq) + " Sk " +
         std::to_string(c.Sk) + " D " + std::to_string(c.D) + (c.causal ? " causal" : "") + " offsets " +
         std::to_string(c.queryOffset) + "/" + std::to_string(c.keyOffset) + " dropout " +
         std::to_string(c.dropout);
}

// q, k and v are made as [B, S, H, D] and transposed inside the op, so the
// op reads non-contiguous views.
void compareCase(const Case& c, DType dt, bool lseToo) {
  std::vector<Tensor> in{randomTensor({c.B, c.Sq, c.H, c.D}, dt, 1), randomTensor({c.B, c.Sk, c.H, c.D}, dt, 2),
                         randomTensor({c.B, c.Sk, c.H, c.D}, dt, 3)};
  auto run = [c](const std::vector<Tensor>& x) {
    Generator gen(99);  // the same seed on both devices
    return scaledDotProductAttentionWithLse(x[0].transpose(1, 2), x[1].transpose(1, 2), x[2].transpose(1, 2),
                                            {.causal = c.causal,
                                             .queryOffset = c.queryOffset,
                                             .keyOffset = c.keyOffset,
                                             .dropout = c.dropout,
                                             .generator = &gen});
  };
  compareWithCpu("attention out, " + describe(c), in, [run](const std::vector<Tensor>& x) { return run(x).out; });
  if (lseToo) {
    compareWithCpu("attention lse, " + describe(c), in, [run](const std::vector<Tensor>& x) { return run(x).lse; });
  }
}

std::vector<Case> cases() {
  return {
      {1, 1, 1, 1, 16},
      {2, 3, 17, 17, 16, true},
      {1, 2, 129, 129, 64},
      {1, 2, 129, 129, 64, true},
      {2, 2, 300, 300, 128, true},
      {1, 3, 17, 300, 64},
      {1, 2, 129, 300, 128, true, 171, 0},
      {2, 2, 129, 17, 64, false, 0, 0, 0.25},
      {1, 2, 300, 129, 16, true, 40, 10, 0.4},
  };
}

}  // namespace

TEST_CASE("CUDA attention matches the CPU in float64: out, lse and gradients") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (const Case& c : cases()) compareCase(c, DType::Float64, true);
}

TEST_CASE("CUDA attention matches the CPU in float32") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (const Case& c : cases()) compareCase(c, DType::Float32, true);
}

TEST_CASE("CUDA attention matches the CPU in bfloat16 (computed in float32)") {
  WEFT_SKIP_WITHOUT_CUDA();
  compareCase({2, 2, 129, 129, 64, true}, DType::BFloat16, false);
  compareCase({1, 2, 17, 300, 128, false, 0, 0, 0.2}, DType::BFloat16, false);
}

TEST_CASE("CUDA attention: rows that see no key give out 0 and no gradient, as on the CPU") {
  WEFT_SKIP_WITHOUT_CUDA();
  // The first 30 queries are before every key.
  compareCase({1, 2, 60, 40, 64, true, 0, 30}, DType::Float64, false);
  compareCase({1, 2, 5, 0, 16}, DType::Float64, false);
}

TEST_CASE("CUDA attention with dropout equals the CPU's for the same seed and differs for another") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor q = randomTensor({1, 2, 33, 32}, DType::Float64, 5).to(Device::cuda(0));
  auto run = [&](uint64_t seed) {
    Generator gen(seed);
    return scaledDotProductAttention(q, q, q, {.dropout = 0.5, .generator = &gen}).to(Device::cpu());
  };
  Generator cpuGen(7);
  Tensor cpu = scaledDotProductAttention(q.to(Device::cpu()), q.to(Device::cpu()), q.to(Device::cpu()),
                                         {.dropout = 0.5, .generator = &cpuGen});
  CHECK(allclose(run(7), cpu, 1e-10, 1e-12));
  CHECK_FALSE(allclose(run(8), cpu, 1e-3, 1e-3));
}

TEST_CASE("CUDA mergeAttention matches the CPU, values and gradients of all four tensors") {
  WEFT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::Float64, DType::Float32}) {
    std::vector<Tensor> in{randomTensor({2, 3, 17, 64}, dt, 1), randomTensor({2, 3, 17}, dt, 2, -3, 3),
                           randomTensor({2, 3, 17, 64}, dt, 3), randomTensor({2, 3, 17}, dt, 4, -3, 3)};
    compareWithCpu("merged out", in, [](const std::vector<Tensor>& x) {
      AttentionOutput m = mergeAttention({x[0], x[1]}, {x[2], x[3]});
      return m.out + m.lse.unsqueeze(-1);
    });
  }
}

TEST_CASE("CUDA attention over the halves of the keys, merged, equals attention over all keys") {
  WEFT_SKIP_WITHOUT_CUDA();
  const Device cuda = Device::cuda(0);
  Tensor q = randomTensor({1, 2, 40, 64}, DType::Float64, 1).to(cuda);
  Tensor k = randomTensor({1, 2, 70, 64}, DType::Float64, 2).to(cuda);
  Tensor v = randomTensor({1, 2, 70, 64}, DType::Float64, 3).to(cuda);
  AttentionOutput all = scaledDotProductAttentionWithLse(q, k, v, {.causal = true, .queryOffset = 30});
  AttentionOutput a = scaledDotProductAttentionWithLse(q, k.narrow(2, 0, 35), v.narrow(2, 0, 35),
                                                       {.causal = true, .queryOffset = 30});
  AttentionOutput b = scaledDotProductAttentionWithLse(q, k.narrow(2, 35, 35), v.narrow(2, 35, 35),
                                                       {.causal = true, .queryOffset = 30, .keyOffset = 35});
  AttentionOutput m = mergeAttention(a, b);
  CHECK(m.out.device() == cuda);
  CHECK(allclose(m.out.to(Device::cpu()), all.out.to(Device::cpu()), 1e-10, 1e-12));
  CHECK(allclose(m.lse.to(Device::cpu()), all.lse.to(Device::cpu()), 1e-10, 1e-12));
}
