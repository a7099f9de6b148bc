#include "data/mnist.h"

#include <filesystem>

#include "common/error.h"
#include "data/idx.h"
#include "kernels/cpu/loops.h"

namespace weft::data {
namespace {

constexpr const char* kFashionHint =
    "Fashion-MNIST is provided by the Debian package dataset-fashion-mnist "
    "(apt-get install dataset-fashion-mnist, or run scripts/setup.sh), which installs it in "
    "/usr/share/datasets/fashion-mnist; or set MnistOptions::root to a folder holding the IDX files";

constexpr const char* kMnistHint = "MnistOptions::root must hold the MNIST IDX files "
                                   "(train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-... ; .gz or plain)";

TensorDataset loadIdxPair(const std::string& root, const MnistOptions& o, const char* what, const std::string& hint) {
  const std::string prefix = o.split == Split::Train ? "train" : "t10k";
  const std::string imagesPath = findIdxFile(root, prefix + "-images-idx3-ubyte", hint);
  const std::string labelsPath = findIdxFile(root, prefix + "-labels-idx1-ubyte", hint);
  Tensor images = readIdxImages(imagesPath, o.scale);
  Tensor labels = readIdxLabels(labelsPath);
  const int64_t n = images.size(0);
  WEFT_ENFORCE(labels.size(0) == n, InvalidArgumentError, what, ": ", imagesPath, " holds ", n, " images but ",
               labelsPath, " holds ", labels.size(0), " labels");
  const int64_t* lab = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    WEFT_ENFORCE(lab[i] >= 0 && lab[i] <= 9, InvalidArgumentError, what, ": ", labelsPath, ": label ", lab[i],
                 " of example ", i, " is outside 0..9");
  }
  if (o.normalize) {
    const double sd = o.normalize->std;
    WEFT_ENFORCE(sd > 0, InvalidArgumentError, what, ": normalization std must be positive, got ", sd);
    // In float, as torchvision's Normalize computes on float32 tensors.
    const float mean = static_cast<float>(o.normalize->mean);
    const float stdev = static_cast<float>(sd);
    float* x = images.data<float>();
    kernels::cpu::parallelFor(images.numel(), kernels::cpu::kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) x[i] = (x[i] - mean) / stdev;
    });
  }
  const int64_t rows = images.size(1), cols = images.size(2);
  images = o.flatten ? images.view({n, rows * cols}) : images.view({n, 1, rows, cols});
  return TensorDataset(images, labels);
}

}  // namespace

std::string findIdxFile(const std::string& root, const std::string& stem, const std::string& hint) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(root) / (stem + ".gz");
  const fs::path plain = fs::path(root) / stem;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(plain, ec)) return plain.string();
  const bool rootExists = fs::is_directory(root, ec);
  throw NotFoundError(detail::concat("data file not found: neither ", gz.string(), " nor ", plain.string(),
                                     " exists", rootExists ? "" : " (the folder itself is missing)", ". ", hint));
}

TensorDataset loadFashionMnist(const MnistOptions& options) {
  const std::string root = options.root.empty() ? std::string(kFashionMnistDir) : options.root;
  return loadIdxPair(root, options, "loadFashionMnist", kFashionHint);
}

TensorDataset loadMnist(const MnistOptions& options) {
  WEFT_ENFORCE(!options.root.empty(), InvalidArgumentError, "loadMnist: MnistOptions::root is empty; ", kMnistHint);
  return loadIdxPair(options.root, options, "loadMnist", kMnistHint);
}

}  // namespace weft::data
