// Must compile: the control for from_vector_unsupported.cpp, with the same
// flags and every element type that has a weft DType.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

weft::Tensor makeAll() {
  weft::Tensor t = weft::fromVector(std::vector<float>{1});
  t = weft::fromVector(std::vector<double>{1});
  t = weft::fromVector(std::vector<int64_t>{1});
  t = weft::fromVector(std::vector<int32_t>{1});
  t = weft::fromVector(std::vector<uint8_t>{1});
  t = weft::fromVector(std::vector<bool>{true});
  t = weft::fromVector(std::vector<weft::BFloat16>{1.0f});
  t = weft::fromVector(std::vector<weft::Float16>{1.0f});
  return t;
}
