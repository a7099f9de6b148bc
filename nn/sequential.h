// Sequential: an ordered chain of single-tensor modules, as
// torch.nn.Sequential. forward(x) feeds x through each in turn (an empty
// chain returns x).
//
//   auto net = nn::makeSequential({
//       std::make_shared<nn::Conv2d>(1, 32, 3), std::make_shared<nn::ReLU>(),
//       std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(21632, 10)});
//   Tensor y = net->forward(x);
//   auto conv = net->at<nn::Conv2d>(0);        // typed access
//   net->namedParameters();                     // "0.weight", "0.bias", "3.weight", ...
//
// Children are named by position ("0", "1", ...) unless added with a name.
// Every element must implement forward(const Tensor&) (see nn/module.h).
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"

namespace weft::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);

  // Appends under the next position's name, or under `name`.
  void push_back(std::shared_ptr<Module> module);
  void push_back(const std::string& name, std::shared_ptr<Module> module);

  Tensor forward(const Tensor& x) override;

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  // IndexError when i >= size().
  const std::shared_ptr<Module>& at(size_t i) const;
  // As at(i), cast to M; InvalidArgumentError naming both types on mismatch.
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>(at(i));
    WEFT_ENFORCE(m != nullptr, InvalidArgumentError, "Sequential::at: element ", i, " is a ", at(i)->typeName(),
                 ", not the requested type");
    return m;
  }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

std::shared_ptr<Sequential> makeSequential(const std::vector<std::shared_ptr<Module>>& modules);

}  // namespace weft::nn
