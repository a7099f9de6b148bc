#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/mnist.h"
#include "weft_test.h"

using namespace weft;
using namespace weft::data;
namespace fs = std::filesystem;

namespace {

// doctest::Contains for a std::string built at run time.
doctest::Contains has(const std::string& s) { return doctest::Contains(doctest::String(s.c_str())); }

// The real training split, loaded once for the cases that only read it.
const TensorDataset& fashionTrain() {
  static const TensorDataset ds = loadFashionMnist({.split = Split::Train});
  return ds;
}

struct Stats {
  double sum = 0, min = 0, max = 0, mean = 0, std = 0;
};

// Plain double-precision statistics of a float32 tensor's elements.
Stats statsOf(const Tensor& t) {
  const Tensor c = t.contiguous();
  const float* p = c.data<float>();
  const int64_t n = c.numel();
  Stats s{0, p[0], p[0], 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    s.sum += p[i];
    s.min = std::min<double>(s.min, p[i]);
    s.max = std::max<double>(s.max, p[i]);
  }
  s.mean = s.sum / static_cast<double>(n);
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) sq += (p[i] - s.mean) * (p[i] - s.mean);
  s.std = std::sqrt(sq / static_cast<double>(n));
  return s;
}

}  // namespace

TEST_CASE("Fashion-MNIST train has 60000 28x28 images and its known first labels") {
  const TensorDataset& train = fashionTrain();
  CHECK(train.size() == 60000);
  CHECK(train.data().shape() == Shape{60000, 1, 28, 28});
  CHECK(train.data().dtype() == DType::Float32);
  CHECK(train.targets().shape() == Shape{60000});
  CHECK(train.targets().dtype() == DType::Int64);
  std::vector<int64_t> labels = train.targets().toVector<int64_t>();
  CHECK(std::vector<int64_t>(labels.begin(), labels.begin() + 10) ==
        std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  // Every class has exactly 6000 examples.
  std::vector<int64_t> counts(10, 0);
  for (int64_t l : labels) ++counts[static_cast<size_t>(l)];
  CHECK(counts == std::vector<int64_t>(10, 6000));
  // The first image's raw pixel sum (76247 / 255), and its values lie in [0, 1].
  CHECK(statsOf(train.get(0).data).sum * 255.0 == doctest::Approx(76247).epsilon(1e-6));
  const Stats all = statsOf(train.data());
  CHECK(all.max == 1.0);
  CHECK(all.min == 0.0);
  CHECK(std::string(kFashionMnistClasses[9]) == "Ankle boot");
}

TEST_CASE("Fashion-MNIST's training pixels have the mean and std of kFashionMnistNormalization") {
  const Stats s = statsOf(fashionTrain().data());
  CHECK(s.mean == doctest::Approx(kFashionMnistNormalization.mean).epsilon(1e-3));
  CHECK(s.std == doctest::Approx(kFashionMnistNormalization.std).epsilon(1e-3));
}

TEST_CASE("Fashion-MNIST test split loads flattened and normalised") {
  TensorDataset test = loadFashionMnist({.split = Split::Test, .normalize = kFashionMnistNormalization, .flatten = true});
  CHECK(test.size() == 10000);
  CHECK(test.data().shape() == Shape{10000, 784});
  CHECK(test.targets().toVector<int64_t>()[0] == 9);
  std::vector<int64_t> first(10);
  for (int64_t i = 0; i < 10; ++i) first[static_cast<size_t>(i)] = test.get(i).target.item<int64_t>();
  CHECK(first == std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  // (p / 255 - mean) / std for the smallest pixel value 0.
  const float zero = (0.0f - 0.2860f) / 0.3530f;
  const Stats s = statsOf(test.data());
  CHECK(s.min == doctest::Approx(zero));
  // Test pixels: mean 0.2868493 and std 0.3524442 after / 255.
  CHECK(s.mean == doctest::Approx((0.2868493 - 0.2860) / 0.3530).epsilon(1e-3));
  CHECK(s.std == doctest::Approx(0.3524442 / 0.3530).epsilon(1e-3));
  TensorDataset raw = loadFashionMnist({.split = Split::Test, .scale = false});
  CHECK(statsOf(raw.data()).max == 255.0);
  CHECK(statsOf(raw.get(0).data).sum == 33456.0);
}

TEST_CASE("a missing data folder names the Debian package that provides Fashion-MNIST") {
  const std::string root = (fs::temp_directory_path() / ("weft_no_such_dir_" + std::to_string(::getpid()))).string();
  CHECK_THROWS_WITH_AS(loadFashionMnist({.root = root}), has("dataset-fashion-mnist"), NotFoundError);
  CHECK_THROWS_WITH_AS(loadFashionMnist({.root = root}), has("/usr/share/datasets/fashion-mnist"),
                       NotFoundError);
  CHECK_THROWS_WITH_AS(loadFashionMnist({.root = root}),
                       has(root + "/train-images-idx3-ubyte.gz"), NotFoundError);
  CHECK_THROWS_AS(loadMnist({}), InvalidArgumentError);
}

TEST_CASE("labels outside 0..9 and mismatched counts are refused") {
  const fs::path dir = fs::temp_directory_path() / ("weft_mnist_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const char* name, std::vector<uint8_t> bytes) {
    std::ofstream f(dir / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  };
  // Two 1x2 images; three labels, one of them 12.
  write("t10k-images-idx3-ubyte", {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2, 10, 20, 30, 40});
  write("t10k-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0, 3, 1, 12, 3});
  CHECK_THROWS_WITH_AS(loadMnist({.root = dir.string(), .split = Split::Test}),
                       has("holds 2 images but"), InvalidArgumentError);
  write("t10k-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0, 2, 1, 12});
  CHECK_THROWS_WITH_AS(loadMnist({.root = dir.string(), .split = Split::Test}),
                       has("label 12 of example 1 is outside 0..9"), InvalidArgumentError);
  write("t10k-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0, 2, 1, 7});
  TensorDataset ok = loadMnist({.root = dir.string(), .split = Split::Test, .normalize = Normalization{0.5, 0.25}});
  CHECK(ok.data().shape() == Shape{2, 1, 1, 2});
  CHECK(ok.get(1).data.flatten().toVector<float>() ==
        std::vector<float>{(30.0f / 255.0f - 0.5f) / 0.25f, (40.0f / 255.0f - 0.5f) / 0.25f});
  CHECK_THROWS_WITH_AS(loadMnist({.root = dir.string(), .split = Split::Test, .normalize = Normalization{0.5, 0}}),
                       has("std must be positive"), InvalidArgumentError);
  fs::remove_all(dir);
}
