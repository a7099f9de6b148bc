// Fashion-MNIST and MNIST as in-memory TensorDatasets.
//
//   using namespace weft::data;
//   TensorDataset train = loadFashionMnist({.split = Split::Train,
//                                           .normalize = kFashionMnistNormalization});
//   train.data();     // [60000, 1, 28, 28] float32, (pixel/255 - mean) / std
//   train.targets();  // [60000] int64 in 0..9; kFashionMnistClasses names them
//
// The files are the four IDX files of the original distribution, gzip-compressed
// or not (`train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]`,
// `t10k-...`). On Debian, Fashion-MNIST comes from the package
// `dataset-fashion-mnist`, which installs them in /usr/share/datasets/fashion-mnist
// (the default root). A missing file is a NotFoundError that says so; a
// damaged one an InvalidArgumentError naming it (see data/idx.h).
#pragma once

#include <array>
#include <optional>
#include <string>

#include "data/dataset.h"

namespace weft::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { Train, Test };

// (x - mean) / std applied to pixels already scaled to [0, 1].
struct Normalization {
  double mean = 0;
  double std = 1;
};
// Mean and standard deviation of the training pixels (after / 255), the
// constants torchvision examples use.
inline constexpr Normalization kFashionMnistNormalization{0.2860, 0.3530};
inline constexpr Normalization kMnistNormalization{0.1307, 0.3081};

inline constexpr std::array<const char*, 10> kFashionMnistClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

struct MnistOptions {
  // Folder holding the IDX files; empty means kFashionMnistDir for
  // loadFashionMnist (loadMnist requires it).
  std::string root{};
  Split split = Split::Train;
  // Pixels / 255 into [0, 1] (like torchvision's ToTensor); false keeps 0..255.
  bool scale = true;
  // Applied after scaling; std must be positive.
  std::optional<Normalization> normalize{};
  // data [N, rows * cols] instead of [N, 1, rows, cols] (for an MLP).
  bool flatten = false;
};

// Loads one split of Fashion-MNIST (60000 train / 10000 test examples).
TensorDataset loadFashionMnist(const MnistOptions& options = {});
// Loads one split of MNIST or any data set in the same IDX layout from
// options.root. Labels must lie in 0..9.
TensorDataset loadMnist(const MnistOptions& options);

// The path of `stem` (e.g. "train-images-idx3-ubyte") in `root`: the .gz file
// if present, else the plain one; NotFoundError naming both when neither
// exists, with `hint` appended.
std::string findIdxFile(const std::string& root, const std::string& stem, const std::string& hint);

}  // namespace weft::data
