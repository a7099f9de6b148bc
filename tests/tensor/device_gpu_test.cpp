// GPU tests: each skips (exit 77, reported by CTest as skipped) without a CUDA
// device.
#include "weft_test.h"

using namespace weft;

TEST_CASE("a tensor copied to a CUDA device and back keeps its values") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor x = arange(1000, {.dtype = DType::Float32}).view({10, 100});
  Tensor d = x.to(Device::cuda(0));
  CHECK(d.device() == Device::cuda(0));
  CHECK(d.to(Device::cpu()).toVector<float>() == x.toVector<float>());
}

TEST_CASE("a non-contiguous view is made contiguous before it moves to the device") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor x = arange(6, {.dtype = DType::Float64}).view({2, 3}).t();
  Tensor back = x.to(Device::cuda(0)).to(Device::cpu());
  CHECK(back.toVector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("gradients flow back across a device copy") {
  WEFT_SKIP_WITHOUT_CUDA();
  Tensor x = ones({3}).requiresGrad_();
  Tensor y = x.to(Device::cuda(0)).to(Device::cpu());
  mul(y, 2.0).sum().backward();
  CHECK(x.grad().toVector<float>() == std::vector<float>{2, 2, 2});
}
