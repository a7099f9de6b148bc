// Autocast scopes (tensor/autocast.h): which ops run in the low dtype, which in
// float32, promotion of mixed operands, float32 gradients of float32 leaves,
// nesting, per-thread state, and a backward pass that runs without autocast.
#include <thread>
#include <vector>

#include "tensor/ops.h"
#include "weft_test.h"

using namespace weft;

TEST_CASE("inside an autocast scope products run in the low dtype and float32 leaves get float32 gradients") {
  Generator g(1);
  Tensor x = randn({8, 16}, {}, &g), w = randn({4, 16}, {}, &g), b = randn({4}, {}, &g);
  for (DType low : {DType::BFloat16, DType::Float16}) {
    CAPTURE(dtypeName(low));
    Tensor wa = w.detach().requiresGrad_(), ba = b.detach().requiresGrad_();
    Tensor y;
    {
      autocast::Scope amp(low);
      CHECK(autocast::isEnabled());
      CHECK(autocast::dtype() == low);
      y = linear(x, wa, ba);
      CHECK(y.dtype() == low);
      CHECK(matmul(x, wa.t()).dtype() == low);
      CHECK(mm(x, wa.t()).dtype() == low);
      CHECK(bmm(x.unsqueeze(0), wa.t().unsqueeze(0)).dtype() == low);
      Tensor img = randn({1, 2, 5, 5}, {}, &g), ker = randn({3, 2, 3, 3}, {}, &g);
      Tensor conv = conv2d(img, ker);
      CHECK(conv.dtype() == low);
      CHECK(conv.toVector<float>() == conv2d(img.to(low), ker.to(low)).toVector<float>());
      Tensor q = randn({1, 2, 4, 8}, {}, &g);
      AttentionOutput att = scaledDotProductAttentionWithLse(q, q, q, {.causal = true});
      CHECK(att.out.dtype() == low);
      CHECK(att.lse.dtype() == low);
      CHECK(att.out.toVector<float>() ==
            scaledDotProductAttention(q.to(low), q.to(low), q.to(low), {.causal = true}).toVector<float>());
      y.to(DType::Float32).sum().backward();
    }
    CHECK_FALSE(autocast::isEnabled());
    // The same graph written with explicit casts.
    Tensor wr = w.detach().requiresGrad_(), br = b.detach().requiresGrad_();
    Tensor yr = linear(x.to(low), wr.to(low), br.to(low));
    yr.to(DType::Float32).sum().backward();
    CHECK(y.toVector<float>() == yr.toVector<float>());
    REQUIRE(wa.grad().defined());
    CHECK(wa.grad().dtype() == DType::Float32);
    CHECK(ba.grad().dtype() == DType::Float32);
    CHECK(wa.grad().toVector<float>() == wr.grad().toVector<float>());
    // Against float64: each weight's gradient is the column sum of x (in the low dtype).
    Tensor colSum = x.to(low).to(DType::Float64).sum({0});
    for (int64_t o = 0; o < 4; ++o) {
      CHECK(allclose(wa.grad().select(0, o).to(DType::Float64), colSum, 1e-2, 1e-2));
    }
    CHECK(allclose(y.to(DType::Float64), linear(x.to(DType::Float64), w.to(DType::Float64), b.to(DType::Float64)),
                   low == DType::BFloat16 ? 3e-2 : 4e-3, low == DType::BFloat16 ? 1e-1 : 1e-2));
  }
}

TEST_CASE("inside an autocast scope softmax, losses, sum and mean run in float32") {
  Generator g(2);
  Tensor logits = randn({6, 5}, {}, &g).to(DType::BFloat16);
  Tensor target = fromVector<int64_t>({0, 1, 2, 3, 4, 0});
  autocast::Scope amp(DType::BFloat16);
  CHECK(softmax(logits, 1).dtype() == DType::Float32);
  CHECK(logSoftmax(logits, 1).dtype() == DType::Float32);
  CHECK(crossEntropy(logits, target).dtype() == DType::Float32);
  CHECK(nllLoss(logSoftmax(logits, 1), target).dtype() == DType::Float32);
  CHECK(mseLoss(logits, zerosLike(logits)).dtype() == DType::Float32);
  CHECK(logits.sum().dtype() == DType::Float32);
  CHECK(logits.mean({1}).dtype() == DType::Float32);
  CHECK(layerNorm(logits, {5}).dtype() == DType::Float32);
  CHECK(layerNorm(logits, {5}).toVector<float>() == [&] {
    autocast::Scope off(DType::BFloat16, false);
    return layerNorm(logits.to(DType::Float32), {5}).toVector<float>();
  }());
  // Values: the float32 op on the bfloat16 values, not rounded to bfloat16.
  Tensor up = logits.to(DType::Float32);
  autocast::Scope off(DType::BFloat16, false);
  CHECK(crossEntropy(up, target).item<float>() ==
        [&] {
          autocast::Scope on(DType::BFloat16);
          return crossEntropy(logits, target).item<float>();
        }());
  // Ops outside the policy follow their inputs.
  CHECK(relu(logits).dtype() == DType::BFloat16);
}

TEST_CASE("inside an autocast scope mixed floating operands promote to the widest; outside they are an error") {
  Tensor f = ones({3}), h = full({3}, 2.0, {.dtype = DType::BFloat16}), q = full({3}, 0.5, {.dtype = DType::Float16});
  CHECK_THROWS_AS(add(f, h), InvalidArgumentError);
  autocast::Scope amp(DType::BFloat16);
  Tensor s = f + h;
  CHECK(s.dtype() == DType::Float32);
  CHECK(s.toVector<float>() == std::vector<float>(3, 3.0f));
  CHECK((h * q).dtype() == DType::Float32);  // bfloat16 with float16: float32, as in PyTorch
  CHECK((h * q).toVector<float>() == std::vector<float>(3, 1.0f));
  CHECK((f.to(DType::Float64) - h).dtype() == DType::Float64);
  CHECK(gt(h, f).toVector<bool>() == std::vector<bool>(3, true));
  Tensor w = where(fromVector<bool>({true, false, true}), h, f);
  CHECK(w.dtype() == DType::Float32);
  CHECK(w.toVector<float>() == std::vector<float>{2, 1, 2});
  CHECK(cat({f, h}).dtype() == DType::Float32);
  CHECK(stack({h, q}).dtype() == DType::Float32);
  // A float32 leaf added to a bfloat16 activation gets a float32 gradient.
  Tensor leaf = ones({3}).requiresGrad_();
  (leaf * h).sum().backward();
  CHECK(leaf.grad().dtype() == DType::Float32);
  CHECK(leaf.grad().toVector<float>() == std::vector<float>(3, 2.0f));
}

TEST_CASE("autocast scopes nest, can be disabled, are per thread and stay off during backward") {
  CHECK_THROWS_WITH_AS(autocast::Scope(DType::Float32), doctest::Contains("bfloat16 or float16, got float32"),
                       InvalidArgumentError);
  Tensor a = ones({2, 2}), b = ones({2, 2});
  {
    autocast::Scope outer(DType::BFloat16);
    {
      autocast::Scope inner(DType::Float16);
      CHECK(mm(a, b).dtype() == DType::Float16);
      {
        autocast::Scope off(DType::BFloat16, false);
        CHECK(mm(a, b).dtype() == DType::Float32);
      }
      CHECK(mm(a, b).dtype() == DType::Float16);
    }
    CHECK(mm(a, b).dtype() == DType::BFloat16);
    DType other = DType::Float64;
    std::thread([&] { other = mm(a, b).dtype(); }).join();
    CHECK(other == DType::Float32);

    // Backward rules run with autocast off (a hook sees it), in their forward's dtypes.
    Tensor w = ones({2, 2}).requiresGrad_();
    bool enabledInBackward = true;
    Tensor y = mm(a, w);
    y.registerHook([&](const Tensor& g) {
      enabledInBackward = autocast::isEnabled();
      CHECK(g.dtype() == DType::BFloat16);
      return Tensor();
    });
    y.to(DType::Float32).sum().backward();
    CHECK_FALSE(enabledInBackward);
    CHECK(autocast::isEnabled());
    CHECK(w.grad().dtype() == DType::Float32);
  }
  CHECK_FALSE(autocast::isEnabled());
}
