#include "nn/sequential.h"

namespace weft::nn {

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) { push_back(std::to_string(modules_.size()), module); }

void Sequential::push_back(const std::string& name, std::shared_ptr<Module> module) {
  registerModule(name, module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& m : modules_) y = (*m)(y);
  return y;
}

const std::shared_ptr<Module>& Sequential::at(size_t i) const {
  WEFT_ENFORCE(i < modules_.size(), IndexError, "Sequential::at: index ", i, " out of range for ", modules_.size(),
               " modules");
  return modules_[i];
}

std::shared_ptr<Sequential> makeSequential(const std::vector<std::shared_ptr<Module>>& modules) {
  return std::make_shared<Sequential>(modules);
}

}  // namespace weft::nn
