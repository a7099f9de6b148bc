#include <cstdio>
#include <fstream>

#include "nn/nn.h"
#include "weft_test.h"

using namespace weft;
using weft::testing::expectClose;

namespace {

// The parameter server example's network (PyTorch's MNIST example net).
class PsNet : public nn::Module {
 public:
  PsNet() : Module("PsNet") {
    conv1_ = registerModule("conv1", std::make_shared<nn::Conv2d>(1, 32, 3));
    conv2_ = registerModule("conv2", std::make_shared<nn::Conv2d>(32, 64, 3));
    dropout1_ = registerModule("dropout1", std::make_shared<nn::Dropout>(0.25));
    dropout2_ = registerModule("dropout2", std::make_shared<nn::Dropout>(0.5));
    fc1_ = registerModule("fc1", std::make_shared<nn::Linear>(9216, 128));
    fc2_ = registerModule("fc2", std::make_shared<nn::Linear>(128, 10));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu(conv1_->forward(x));
    h = maxPool2d(relu(conv2_->forward(h)), 2);
    h = dropout1_->forward(h).flatten(1);
    h = dropout2_->forward(relu(fc1_->forward(h)));
    return logSoftmax(fc2_->forward(h), 1);
  }

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::Dropout> dropout1_, dropout2_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

class TwoLayer : public nn::Module {
 public:
  TwoLayer(int64_t in = 4, int64_t hidden = 3, int64_t out = 2) : Module("TwoLayer") {
    a_ = registerModule("a", std::make_shared<nn::Linear>(in, hidden));
    b_ = registerModule("b", std::make_shared<nn::Linear>(hidden, out));
    steps_ = registerBuffer("steps", zeros({1}, {.dtype = DType::Int64}));
    registerBuffer("scratch", zeros({2}), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return b_->forward(tanh(a_->forward(x))); }
  std::shared_ptr<nn::Linear> a_, b_;
  Tensor steps_;
};

bool sameValues(const Tensor& a, const Tensor& b) { return a.toVector<double>() == b.toVector<double>(); }

}  // namespace

TEST_CASE("the parameter-server CNN has PyTorch's parameter names and 1,199,882 parameters") {
  auto net = std::make_shared<PsNet>();
  auto named = net->namedParameters();
  std::vector<std::string> names;
  int64_t total = 0;
  for (auto& [name, p] : named) {
    names.push_back(name);
    total += p.numel();
    CHECK(p.requiresGrad());
  }
  CHECK(names == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                          "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(total == 1199882);
  CHECK(net->parameters().size() == 8);
  CHECK(net->parameters(false).empty());
  CHECK(net->namedTensor("fc1.weight").shape() == Shape{128, 9216});
  CHECK_THROWS_AS(net->namedTensor("fc3.weight"), NotFoundError);

  net->eval();
  Tensor y = net->forward(randn({2, 1, 28, 28}));
  CHECK(y.shape() == Shape{2, 10});
  // log-probabilities: each row's exponentials sum to one
  for (float s : exp(y).sum({1}).toVector<float>()) CHECK(s == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("train and eval propagate to every descendant") {
  auto net = std::make_shared<PsNet>();
  auto all = net->modules();
  CHECK(all.size() == 7);
  for (auto& m : all) CHECK(m->isTraining());
  net->eval();
  for (auto& m : all) CHECK_FALSE(m->isTraining());
  net->train();
  for (auto& m : all) CHECK(m->isTraining());
  auto named = net->namedModules();
  CHECK(named[0].first.empty());
  CHECK(named[1].first == "conv1");
  CHECK(named[1].second->typeName() == "Conv2d");
}

TEST_CASE("registration rejects empty, dotted and duplicate names and non-leaf parameters") {
  nn::Module m("M");
  m.registerParameter("w", zeros({2}));
  CHECK_THROWS_WITH_AS(m.registerParameter("w", zeros({2})), doctest::Contains("'w': the name is already used"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(m.registerBuffer("w", zeros({2})), InvalidArgumentError);
  CHECK_THROWS_AS(m.registerModule("w", std::make_shared<nn::ReLU>()), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(m.registerParameter("a.b", zeros({2})), doctest::Contains("must not contain '.'"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(m.registerParameter("", zeros({2})), InvalidArgumentError);
  CHECK_THROWS_AS(m.registerParameter("u", Tensor()), InvalidArgumentError);
  Tensor leaf = ones({2}).requiresGrad_();
  CHECK_THROWS_WITH_AS(m.registerParameter("v", mul(leaf, 2.0)), doctest::Contains("not a leaf"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(m.registerModule("n", std::shared_ptr<nn::Module>()), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(m.forward(zeros({1})), doctest::Contains("M: this module has no single-tensor forward"),
                       InvalidArgumentError);
  // Registration keeps the caller's handle.
  Tensor mine = zeros({3});
  CHECK(m.registerParameter("mine", mine).sameAs(mine));
  CHECK(mine.requiresGrad());
  CHECK(m.registerParameter("frozen", zeros({1}), false).requiresGrad() == false);
}

TEST_CASE("a parameter shared by two modules is listed once but saved under both names") {
  auto seq = std::make_shared<nn::Sequential>();
  auto l1 = std::make_shared<nn::Linear>(3, 3, false);
  seq->push_back(l1);
  seq->push_back(l1);
  CHECK(seq->parameters().size() == 1);
  CHECK(seq->modules().size() == 2);
  nn::StateDict sd = seq->stateDict();
  CHECK(sd.size() == 2);
  CHECK(sd.count("0.weight"));
  CHECK(sd.count("1.weight"));
}

TEST_CASE("buffers are listed, and only persistent ones are saved") {
  auto net = std::make_shared<TwoLayer>();
  auto buffers = net->namedBuffers();
  REQUIRE(buffers.size() == 2);
  CHECK(buffers[0].first == "steps");
  CHECK(buffers[1].first == "scratch");
  nn::StateDict sd = net->stateDict();
  CHECK(sd.count("steps"));
  CHECK_FALSE(sd.count("scratch"));
  CHECK(sd.size() == 5);
}

TEST_CASE("zeroGrad zeroes gradients in place, or drops them") {
  auto net = std::make_shared<TwoLayer>();
  net->forward(ones({2, 4})).sum().backward();
  Tensor g = net->a_->weight().grad();
  REQUIRE(g.defined());
  CHECK(sum(abs(g)).item<float>() > 0);
  net->zeroGrad();
  CHECK(net->a_->weight().grad().sameAs(g));
  CHECK(sum(abs(g)).item<float>() == 0);
  net->zeroGrad(true);
  for (auto& p : net->parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("to(dtype) converts parameters in place so that held handles follow") {
  auto net = std::make_shared<TwoLayer>();
  Tensor w = net->a_->weight();
  std::vector<float> before = w.toVector<float>();
  net->forward(ones({1, 4})).sum().backward();
  net->to(DType::Float64);
  CHECK(w.dtype() == DType::Float64);
  CHECK(w.sameAs(net->a_->weight()));
  CHECK(w.grad().dtype() == DType::Float64);
  CHECK(net->steps_.dtype() == DType::Int64);  // integer buffers stay
  std::vector<double> after = w.toVector<double>();
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == static_cast<double>(before[i]));
  Tensor y = net->forward(ones({1, 4}, {.dtype = DType::Float64}));
  CHECK(y.dtype() == DType::Float64);
  y.sum().backward();
  CHECK_THROWS_AS(net->to(DType::Int64), InvalidArgumentError);
}

TEST_CASE("a state dict round trip through a file reproduces the model") {
  manualSeed(1);
  auto a = std::make_shared<TwoLayer>();
  manualSeed(2);
  auto b = std::make_shared<TwoLayer>();
  {
    NoGradGuard ng;
    a->steps_.fill_(41);
  }
  Tensor x = randn({5, 4});
  CHECK_FALSE(sameValues(a->forward(x), b->forward(x)));
  std::string path = "module_roundtrip.weft";
  a->save(path);
  Tensor heldByOptimizer = b->a_->weight();
  auto result = b->load(path);
  std::remove(path.c_str());
  CHECK(result.missingKeys.empty());
  CHECK(result.unexpectedKeys.empty());
  CHECK(sameValues(a->forward(x), b->forward(x)));
  CHECK(b->steps_.item<int64_t>() == 41);
  CHECK(heldByOptimizer.sameAs(b->a_->weight()));
  CHECK(sameValues(heldByOptimizer, a->a_->weight()));
  // The loaded values are copies, not shared with a.
  CHECK(b->a_->weight().storage() != a->a_->weight().storage());
}

TEST_CASE("loading converts dtypes, and a float64 checkpoint loads into a float32 model") {
  auto a = std::make_shared<TwoLayer>();
  a->to(DType::Float64);
  auto b = std::make_shared<TwoLayer>();
  b->loadStateDict(a->stateDict());
  CHECK(b->a_->weight().dtype() == DType::Float32);
  expectClose(b->a_->weight().to(DType::Float64), a->a_->weight(), 1e-6, 1e-7);
}

TEST_CASE("loading reports missing keys, unexpected keys and shape mismatches by name") {
  auto net = std::make_shared<TwoLayer>();
  nn::StateDict sd = net->stateDict();
  nn::StateDict missing = sd;
  missing.erase("b.bias");
  CHECK_THROWS_WITH_AS(net->loadStateDict(missing),
                       doctest::Contains("error(s) loading a state dict into TwoLayer:\n  missing key(s): [b.bias]"),
                       InvalidArgumentError);
  nn::StateDict extra = sd;
  extra["c.weight"] = zeros({1});
  CHECK_THROWS_WITH_AS(net->loadStateDict(extra), doctest::Contains("unexpected key(s): [c.weight]"),
                       InvalidArgumentError);
  nn::StateDict wrong = sd;
  wrong["a.weight"] = zeros({4, 3});
  CHECK_THROWS_WITH_AS(net->loadStateDict(wrong),
                       doctest::Contains("size mismatch for 'a.weight': the state dict has shape [4, 3], the module "
                                         "has shape [3, 4]"),
                       InvalidArgumentError);
  // Non-strict: missing and unexpected keys are returned, mismatches still fail.
  nn::StateDict partial = missing;
  partial["c.weight"] = zeros({1});
  auto r = net->loadStateDict(partial, false);
  CHECK(r.missingKeys == std::vector<std::string>{"b.bias"});
  CHECK(r.unexpectedKeys == std::vector<std::string>{"c.weight"});
  CHECK_THROWS_AS(net->loadStateDict(wrong, false), InvalidArgumentError);
  // A failed load changes nothing.
  Tensor before = net->a_->bias().clone();
  nn::StateDict bad = sd;
  bad["a.bias"] = full({3}, 7.0);
  bad["b.weight"] = zeros({9});
  CHECK_THROWS_AS(net->loadStateDict(bad), InvalidArgumentError);
  CHECK(sameValues(net->a_->bias(), before));
}

TEST_CASE("a module prints as a PyTorch-style tree") {
  auto seq = nn::makeSequential({std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(),
                                 std::make_shared<nn::Dropout>(0.25)});
  CHECK(seq->toString() ==
        "Sequential(\n"
        "  (0): Linear(in_features=4, out_features=3, bias=true)\n"
        "  (1): ReLU()\n"
        "  (2): Dropout(p=0.25)\n"
        ")");
}

TEST_CASE("apply visits children before their parent") {
  auto net = std::make_shared<TwoLayer>();
  std::vector<std::string> seen;
  net->apply([&](nn::Module& m) { seen.push_back(m.typeName()); });
  CHECK(seen == std::vector<std::string>{"Linear", "Linear", "TwoLayer"});
}

TEST_CASE("namedModules needs the module to be held by a shared_ptr") {
  TwoLayer onStack;
  CHECK_THROWS_WITH_AS(onStack.namedModules(), doctest::Contains("std::shared_ptr"), InvalidArgumentError);
  CHECK(onStack.children().size() == 2);
}

TEST_CASE("forward hooks run around forward through operator() only, in registration order, and can be removed") {
  auto seq = std::make_shared<nn::Sequential>();
  auto lin = std::make_shared<nn::Linear>(3, 2);
  seq->push_back(lin);
  std::vector<std::string> calls;
  const int pre = lin->registerForwardPreHook([&](nn::Module& m, const Tensor& x) {
    calls.push_back("pre " + m.typeName() + " " + std::to_string(x.size(1)));
  });
  const int post = lin->registerForwardHook([&](nn::Module&, const Tensor&, Tensor& out) {
    calls.push_back("post");
    out = mul(out, 2.0);  // a hook may replace the output
  });
  Tensor x = ones({1, 3});
  Tensor plain = lin->forward(x);
  CHECK(calls.empty());  // forward() itself runs no hook
  Tensor hooked = (*seq)(x);   // Sequential calls its children through operator()
  CHECK(calls == std::vector<std::string>{"pre Linear 3", "post"});
  CHECK(hooked.toVector<float>() == mul(plain, 2.0).toVector<float>());
  lin->removeForwardHook(pre);
  lin->removeForwardHook(post);
  lin->removeForwardHook(12345);  // unknown: ignored
  calls.clear();
  CHECK((*seq)(x).toVector<float>() == plain.toVector<float>());
  CHECK(calls.empty());
}
