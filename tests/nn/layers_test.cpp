#include "nn/nn.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;

TEST_CASE("Linear computes x·Wᵀ + b over any leading dimensions") {
  nn::Linear fc(3, 2);
  Tensor x = randn({4, 5, 3});
  Tensor y = fc.forward(x);
  CHECK(y.shape() == Shape{4, 5, 2});
  Tensor ref = add(matmul(x, fc.weight().t()), fc.bias());
  expectClose(y, ref, 1e-5, 1e-6);
  nn::Linear noBias(3, 2, false);
  CHECK_FALSE(noBias.bias().defined());
  CHECK(noBias.parameters().size() == 1);
  expectClose(noBias.forward(x), matmul(x, noBias.weight().t()), 1e-5, 1e-6);
  CHECK_THROWS_WITH_AS(fc.forward(randn({4, 5})), doctest::Contains("Linear(3 -> 2): expected input [*, 3], got shape [4, 5]"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(nn::Linear(0, 2), InvalidArgumentError);
}

TEST_CASE("Linear's gradients reach its parameters") {
  nn::Linear fc(3, 2);
  fc.forward(ones({4, 3})).sum().backward();
  // d/dW of sum(x·Wᵀ + b) with x = 1: every entry is the batch size.
  CHECK(fc.weight().grad().toVector<float>() == std::vector<float>(6, 4.0f));
  CHECK(fc.bias().grad().toVector<float>() == std::vector<float>{4, 4});
}

TEST_CASE("Conv2d and MaxPool2d wrap their ops with the module's parameters") {
  nn::Conv2d conv(2, 3, {3, 2}, {2, 1}, {1, 0});
  Tensor x = randn({2, 2, 7, 6});
  Tensor y = conv.forward(x);
  CHECK(y.shape() == Shape{2, 3, 4, 5});
  expectClose(y, conv2d(x, conv.weight(), conv.bias(), {2, 1}, {1, 0}), 1e-5, 1e-6);
  CHECK(conv.weight().shape() == Shape{3, 2, 3, 2});
  nn::MaxPool2d pool(2);
  CHECK(pool.stride() == 2);
  expectClose(pool.forward(y), maxPool2d(y, 2, 2), 0, 0);
  CHECK_THROWS_WITH_AS(conv.forward(randn({2, 3, 7, 6})), doctest::Contains("expected input [N, 2, H, W]"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(nn::Conv2d(1, 1, 0), InvalidArgumentError);
  CHECK_THROWS_AS(nn::Conv2d(1, 1, 3, 0), InvalidArgumentError);
  CHECK_THROWS_AS(nn::MaxPool2d(2, 2, 2), InvalidArgumentError);
  CHECK(conv.toString() == "Conv2d(2, 3, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0))");
}

TEST_CASE("Embedding looks rows up for indices of any shape") {
  nn::Embedding emb(10, 4);
  Tensor idx = fromVector<int64_t>({1, 3, 3, 9, 0, 2}, {2, 3});
  Tensor y = emb.forward(idx);
  CHECK(y.shape() == Shape{2, 3, 4});
  CHECK(y.select(0, 1).select(0, 0).toVector<float>() == emb.weight().select(0, 9).toVector<float>());
  CHECK_THROWS_AS(emb.forward(fromVector<int64_t>({10})), IndexError);

  Tensor table = arange(6, {.dtype = DType::Float64}).view({3, 2});
  auto frozen = nn::Embedding::fromPretrained(table);
  CHECK_FALSE(frozen->weight().requiresGrad());
  CHECK(frozen->weight().dtype() == DType::Float64);
  CHECK(frozen->forward(fromVector<int64_t>({2})).toVector<double>() == std::vector<double>{4, 5});
  CHECK(frozen->weight().storage() != table.storage());
  CHECK(nn::Embedding::fromPretrained(table, false)->weight().requiresGrad());
}

TEST_CASE("EmbeddingBag reduces each bag by sum, mean or max") {
  Tensor table = fromVector<float>({1, 10, 2, 20, 3, 30, 4, 40}, {4, 2});
  Tensor indices = fromVector<int64_t>({0, 1, 3, 2});
  Tensor offsets = fromVector<int64_t>({0, 2, 2});  // bags {0,1}, {}, {3,2}
  auto bagWith = [&](EmbeddingBagMode mode) {
    auto bag = std::make_shared<nn::EmbeddingBag>(4, 2, mode);
    bag->loadStateDict({{"weight", table}});
    return bag;
  };
  CHECK(bagWith(EmbeddingBagMode::Sum)->forward(indices, offsets).toVector<float>() ==
        std::vector<float>{3, 30, 0, 0, 7, 70});
  CHECK(bagWith(EmbeddingBagMode::Mean)->forward(indices, offsets).toVector<float>() ==
        std::vector<float>{1.5f, 15, 0, 0, 3.5f, 35});
  CHECK(bagWith(EmbeddingBagMode::Max)->forward(indices, offsets).toVector<float>() ==
        std::vector<float>{2, 20, 0, 0, 4, 40});
  // 2-D indices: one bag per row, no offsets.
  auto mean = bagWith(EmbeddingBagMode::Mean);
  CHECK(mean->forward(fromVector<int64_t>({0, 1, 2, 3}, {2, 2})).toVector<float>() ==
        std::vector<float>{1.5f, 15, 3.5f, 35});
  CHECK_THROWS_WITH_AS(mean->forward(indices), doctest::Contains("pass offsets for 1-D indices"),
                       InvalidArgumentError);
  Tensor w = fromVector<float>({1, 2, 0.5f, 1});
  CHECK(bagWith(EmbeddingBagMode::Sum)->forward(indices, offsets, w).toVector<float>() ==
        std::vector<float>{5, 50, 0, 0, 5, 50});
  CHECK(mean->toString() == "EmbeddingBag(4, 2, mode=mean)");
}

TEST_CASE("activation layers apply their op") {
  Tensor x = fromVector<float>({-2, -0.5f, 0, 1.5f});
  CHECK(nn::ReLU().forward(x).toVector<float>() == relu(x).toVector<float>());
  CHECK(nn::Tanh().forward(x).toVector<float>() == tanh(x).toVector<float>());
  CHECK(nn::Sigmoid().forward(x).toVector<float>() == sigmoid(x).toVector<float>());
  CHECK(nn::GELU().forward(x).toVector<float>() == gelu(x).toVector<float>());
  CHECK(nn::Identity().forward(x).sameAs(x));
  Tensor m = randn({3, 5});
  expectClose(nn::LogSoftmax(1).forward(m), logSoftmax(m, 1), 0, 0);
  expectClose(nn::Softmax(0).forward(m), softmax(m, 0), 0, 0);
  CHECK(nn::LogSoftmax(-1).toString() == "LogSoftmax(dim=-1)");
}

TEST_CASE("Dropout drops in training, scales survivors, and is the identity in eval") {
  nn::Dropout drop(0.25);
  Generator g(9);
  drop.setGenerator(&g);
  Tensor x = ones({20000});
  std::vector<float> y = drop.forward(x).toVector<float>();
  int64_t zeros = 0;
  for (float v : y) {
    if (v == 0) {
      ++zeros;
    } else {
      CHECK(v == doctest::Approx(1 / 0.75));
    }
  }
  CHECK(zeros > 4700);
  CHECK(zeros < 5300);
  drop.eval();
  CHECK(drop.forward(x).toVector<float>() == x.toVector<float>());
  CHECK_THROWS_AS(nn::Dropout(1.5), InvalidArgumentError);
}

TEST_CASE("Flatten keeps the batch dimension by default") {
  Tensor x = randn({2, 3, 4, 5});
  CHECK(nn::Flatten().forward(x).shape() == Shape{2, 60});
  CHECK(nn::Flatten(0).forward(x).shape() == Shape{120});
  CHECK(nn::Flatten(1, 2).forward(x).shape() == Shape{2, 12, 5});
}

TEST_CASE("Sequential chains its modules in order and names them by position") {
  auto seq = nn::makeSequential({std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(12, 5),
                                 std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(5, 2),
                                 std::make_shared<nn::LogSoftmax>(1)});
  Tensor x = randn({3, 3, 4});
  auto l1 = seq->at<nn::Linear>(1);
  auto l2 = seq->at<nn::Linear>(3);
  Tensor ref = logSoftmax(l2->forward(relu(l1->forward(x.flatten(1)))), 1);
  expectClose(seq->forward(x), ref, 0, 0);
  CHECK(seq->size() == 5);
  std::vector<std::string> names;
  for (auto& [name, p] : seq->namedParameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"1.weight", "1.bias", "3.weight", "3.bias"});
  CHECK_THROWS_WITH_AS(seq->at<nn::Conv2d>(1), doctest::Contains("element 1 is a Linear"), InvalidArgumentError);
  CHECK_THROWS_AS(seq->at(5), IndexError);
  seq->push_back("head", std::make_shared<nn::Identity>());
  CHECK(seq->namedChildren().back().first == "head");
  nn::Sequential empty;
  CHECK(empty.forward(x).sameAs(x));
}

TEST_CASE("a module without a single-tensor forward fails clearly inside a Sequential") {
  auto seq = nn::makeSequential({std::make_shared<nn::Module>("Custom")});
  CHECK_THROWS_WITH_AS(seq->forward(zeros({1})), doctest::Contains("Custom: this module has no single-tensor forward"),
                       InvalidArgumentError);
}
