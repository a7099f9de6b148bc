// The check every process of a Fashion-MNIST example makes before joining its job: the four IDX
// files are there, so that a missing one stops the job at once, with the same message on every
// rank.
//
//   app::checkFashionMnistFiles(flags.dataDir);  // throws Error naming the file and the remedy
//
// Header-only; it needs data/data.h.
#pragma once

#include <string>

#include "data/data.h"

namespace weft::examples::app {

inline void checkFashionMnistFiles(const std::string& dir) {
  const std::string hint =
      "Fashion-MNIST comes from the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist, "
      "or scripts/setup.sh); or pass --data-dir DIR with the four IDX files";
  for (const char* stem : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"}) {
    data::findIdxFile(dir, stem, hint);
  }
}

}  // namespace weft::examples::app
