#include <cstdio>

#include "nn/nn.h"
#include "weft_test.h"

using namespace weft;

TEST_CASE("a module moved to CUDA keeps its handles and saves and loads through the host") {
  WEFT_SKIP_WITHOUT_CUDA();
  auto net = nn::makeSequential({std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::Linear>(3, 2)});
  auto lin = net->at<nn::Linear>(0);
  Tensor w = lin->weight();
  std::vector<float> before = w.toVector<float>();
  net->to(Device::cuda(0));
  CHECK(w.device() == Device::cuda(0));
  CHECK(w.sameAs(lin->weight()));
  CHECK(w.toVector<float>() == before);

  std::string path = "module_gpu_roundtrip.weft";
  net->save(path);
  nn::StateDict onHost = nn::loadStateDictFile(path);
  CHECK(onHost.at("0.weight").device().isCpu());
  CHECK(onHost.at("0.weight").toVector<float>() == before);

  auto other = nn::makeSequential({std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::Linear>(3, 2)});
  other->to(Device::cuda(0));
  other->load(path);
  std::remove(path.c_str());
  CHECK(other->at<nn::Linear>(0)->weight().device() == Device::cuda(0));
  CHECK(other->at<nn::Linear>(0)->weight().toVector<float>() == before);

  net->to(Device::cpu());
  CHECK(w.device().isCpu());
  CHECK(w.toVector<float>() == before);
}
