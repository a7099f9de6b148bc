// RemoteModule<M> between agents of one process (each with its own loop, pool and TCP connections
// on 127.0.0.1): forward against a local module with the same weights, parameter RRefs that are
// the live parameters, train/eval, a RemoteModule passed to a third worker, placement errors, and
// reference counting down to empty tables.
#include <chrono>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "rpc/agent_group.h"
#include "rref/remote_module.h"
#include "tensor/autograd.h"
#include "weft_test.h"
#include "captured_text.h"

using namespace std::chrono_literals;
using weft::EmbeddingBagMode;
using weft::RemoteModule;
using weft::RRef;
using weft::Tensor;
using weft::rpc::Agent;
using weft::testing::AgentGroup;
using weft::testing::eventually;
namespace nn = weft::nn;

namespace rmodtest {

// A user module: Linear then Dropout, declared for remote use in this file.
class Tower : public nn::Module {
 public:
  Tower(int64_t width, double p) : Module("Tower") {
    fc_ = registerModule("fc", std::make_shared<nn::Linear>(width, width));
    drop_ = registerModule("drop", std::make_shared<nn::Dropout>(p));
  }
  Tensor forward(const Tensor& x) override { return drop_->forward(fc_->forward(x)); }

 private:
  std::shared_ptr<nn::Linear> fc_;
  std::shared_ptr<nn::Dropout> drop_;
};
WEFT_REMOTE_MODULE(Tower, Tower, WEFT_CONSTRUCTORS((int64_t, double)));

inline const weft::Function<Tensor(RemoteModule<nn::EmbeddingBag>, Tensor, Tensor)> bagForward{"rmod_test.bagForward"};
inline const weft::Function<std::vector<RRef<Tensor>>(RemoteModule<nn::EmbeddingBag>)> bagParams{
    "rmod_test.bagParams"};
inline const weft::Function<void(RRef<Tensor>)> zeroOnOwner{"rmod_test.zeroOnOwner"};

}  // namespace rmodtest

using namespace rmodtest;

using weft::testing::contains;

namespace {

// Ranks 0, 1, 2 named "master", "ps", "trainer".
struct Job {
  AgentGroup g{3, [](int r, weft::rpc::Options& o) { o.name = std::vector<std::string>{"master", "ps", "trainer"}[r]; }};
  Job() {
    for (int r = 0; r < g.size(); ++r) {
      g.agent(r).registry().impl(bagForward, [](RemoteModule<nn::EmbeddingBag> m, Tensor indices, Tensor offsets) {
        return m.forward(indices, offsets);
      });
      g.agent(r).registry().impl(bagParams, [](RemoteModule<nn::EmbeddingBag> m) { return m.remoteParameters(); });
      g.agent(r).registry().impl(zeroOnOwner, [](RRef<Tensor> p) {
        weft::NoGradGuard ng;
        p.localValue()->zero_();
      });
    }
    g.start();
  }
  Agent& master() { return g.agent(0); }
  Agent& trainer() { return g.agent(2); }

  bool allEmpty() {
    for (int r = 0; r < g.size(); ++r) {
      if (!weft::rref::debugCounts(g.agent(r)).empty()) return false;
    }
    return true;
  }
  std::string counts() {
    std::string s;
    for (int r = 0; r < g.size(); ++r) {
      s += "rank " + std::to_string(r) + ": " + weft::rref::debugCounts(g.agent(r)).toString() + "\n";
    }
    return s;
  }
  // Every table empty once the handles are gone, and again after a graceful shutdown.
  void checkCleanShutdown() {
    CHECK_MESSAGE(eventually([&] { return allEmpty(); }, 5s), counts());
    auto reports = g.shutdownAll();
    for (auto& r : reports) CHECK(r.clean());
    CHECK_MESSAGE(allEmpty(), counts());
  }
};

// A local EmbeddingBag holding a copy of `weight`.
std::shared_ptr<nn::EmbeddingBag> localBag(const Tensor& weight, EmbeddingBagMode mode) {
  auto bag = std::make_shared<nn::EmbeddingBag>(weight.shape()[0], weight.shape()[1], mode);
  bag->loadStateDict({{"weight", weight}});
  return bag;
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}


int64_t zerosIn(const Tensor& t) {
  int64_t n = 0;
  for (float v : t.contiguous().toVector<float>()) n += v == 0.0f ? 1 : 0;
  return n;
}

float absSum(const Tensor& t) { return weft::abs(t).sum().item<float>(); }

}  // namespace

TEST_CASE("remote module: forward and forwardAsync equal a local EmbeddingBag with the same weights") {
  Job job;
  {
    RemoteModule<nn::EmbeddingBag> emb(job.master(), "ps/cpu", 100, 16, EmbeddingBagMode::Sum);
    CHECK(emb.placement() == "ps/cpu");
    CHECK(emb.workerName() == "ps");
    Tensor indices = weft::fromVector<int64_t>({3, 7, 7, 99, 0, 42, 5, 18, 61});
    Tensor offsets = weft::fromVector<int64_t>({0, 2, 2, 6});  // bag 1 is empty
    weft::Future<Tensor> pending = emb.forwardAsync(indices, offsets);  // queued until the module exists
    Tensor remote = emb.forward(indices, offsets);

    std::vector<RRef<Tensor>> params = emb.remoteParameters();
    REQUIRE(params.size() == 1);
    Tensor weight = params[0].toHere();
    CHECK(weight.shape() == weft::Shape{100, 16});
    auto local = localBag(weight, EmbeddingBagMode::Sum);
    Tensor expected = local->forward(indices, offsets);
    CHECK(remote.shape() == weft::Shape{4, 16});
    CHECK(weft::allclose(remote, expected, 0, 0));
    CHECK(weft::allclose(pending.get(), expected, 0, 0));
    // Bag 1 is empty: zeros.
    CHECK(absSum(remote.select(0, 1)) == 0.0f);

    // The one- and three-tensor forwards: 2-D indices, and per-sample weights.
    Tensor twoD = weft::fromVector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
    CHECK(weft::allclose(emb.forward(twoD), local->forward(twoD), 0, 0));
    Tensor psw = weft::fromVector<float>({0.5f, -1.f, 2.f, 1.f, 0.f, 3.f, 1.f, 1.f, 0.25f});
    CHECK(weft::allclose(emb.forwardAsync(indices, offsets, psw).get(), local->forward(indices, offsets, psw), 0, 0));
    // An undefined tensor travels as such: the 2-D form with no offsets.
    CHECK(weft::allclose(emb.forward(twoD, Tensor()), local->forward(twoD, Tensor()), 0, 0));
  }
  job.checkCleanShutdown();
}

TEST_CASE("remote module: parameter RRefs are owned by the module's worker and are the live parameters") {
  Job job;
  {
    RemoteModule<nn::Linear> fc(job.master(), "ps/cpu", 16, 8);
    std::vector<RRef<Tensor>> params = fc.remoteParameters();
    REQUIRE(params.size() == 2);
    CHECK(params[0].toHere().shape() == weft::Shape{8, 16});
    CHECK(params[1].toHere().shape() == weft::Shape{8});
    for (auto& p : params) {
      CHECK(p.ownerName() == "ps");
      CHECK_FALSE(p.isOwner());
    }
    CHECK(RemoteModule<nn::Linear>(job.master(), "ps/cpu", 16, 8, false).remoteParameters().size() == 1);

    // Zeroing the parameters in place on the owner, through the RRefs, changes what forward computes.
    Tensor x = weft::randn({4, 16});
    CHECK(absSum(fc.forward(x)) > 0.0f);
    for (auto& p : params) job.master().call("ps", zeroOnOwner, p);
    CHECK(absSum(fc.forward(x)) == 0.0f);
    CHECK(absSum(params[0].toHere()) == 0.0f);
  }
  job.checkCleanShutdown();
}

TEST_CASE("remote module: train and eval reach the owner's module") {
  Job job;
  {
    RemoteModule<Tower> tower(job.master(), "ps/cpu", 64, 0.5);
    CHECK(tower.isTraining());
    Tensor x = weft::randn({16, 64});
    // Training: Dropout zeroes about half of 1,024 outputs. Evaluation: the Linear alone.
    Tensor trained = tower.forward(x);
    CHECK(zerosIn(trained) > 256);
    tower.eval();
    CHECK_FALSE(tower.isTraining());
    std::vector<RRef<Tensor>> params = tower.remoteParameters();
    REQUIRE(params.size() == 2);
    auto fc = std::make_shared<nn::Linear>(64, 64);
    fc->loadStateDict({{"weight", params[0].toHere()}, {"bias", params[1].toHere()}});
    CHECK(weft::allclose(tower.forward(x), fc->forward(x), 0, 0));
    tower.train();
    CHECK(tower.isTraining());
    CHECK(zerosIn(tower.forward(x)) > 256);
  }
  job.checkCleanShutdown();
}

TEST_CASE("remote module: a RemoteModule passed to another worker is the same module there") {
  Job job;
  {
    RemoteModule<nn::EmbeddingBag> emb(job.master(), "ps/cpu", 100, 16, EmbeddingBagMode::Sum);
    Tensor indices = weft::randint(0, 100, {30});
    Tensor offsets = weft::fromVector<int64_t>({0, 4, 9, 20});
    Tensor here = emb.forward(indices, offsets);
    Tensor there = job.master().call("trainer", bagForward, emb, indices, offsets);
    CHECK(weft::allclose(here, there, 0, 0));
    // The trainer's parameter RRefs come back to the master, still owned by "ps".
    std::vector<RRef<Tensor>> params = job.master().call("trainer", bagParams, emb);
    REQUIRE(params.size() == 1);
    CHECK(params[0].ownerName() == "ps");
    CHECK(weft::allclose(params[0].toHere(), emb.remoteParameters()[0].toHere(), 0, 0));
    // The owner itself receives it too.
    CHECK(weft::allclose(job.master().call("ps", bagForward, emb, indices, offsets), here, 0, 0));
  }
  job.checkCleanShutdown();
}

TEST_CASE("remote module: forwards in flight from two workers at once all return the right bags") {
  Job job;
  {
    RemoteModule<nn::EmbeddingBag> emb(job.master(), "ps/cpu", 100, 16, EmbeddingBagMode::Mean);
    auto local = localBag(emb.remoteParameters()[0].toHere(), EmbeddingBagMode::Mean);
    std::vector<Tensor> inputs;
    std::vector<weft::Future<Tensor>> pending;
    for (int i = 0; i < 64; ++i) {
      inputs.push_back(weft::randint(0, 100, {8, 5}));
      pending.push_back(emb.forwardAsync(inputs.back()));
      pending.push_back(job.master().callAsync("trainer", bagForward, emb, inputs.back(), Tensor()));
    }
    for (size_t i = 0; i < pending.size(); ++i) {
      CHECK(weft::allclose(pending[i].get(), local->forward(inputs[i / 2]), 0, 0));
    }
  }
  job.checkCleanShutdown();
}

TEST_CASE("remote module: malformed and CUDA placements are refused, naming the placement") {
  Job job;
  for (std::string bad : {"ps", "/cpu", "ps/", "ps/gpu", "ps/cuda", "ps/cuda:", "ps/cuda:x", "ps/cpu/0", "ps/cuda:-1"}) {
    CAPTURE(bad);
    std::string msg = errorOf([&] { RemoteModule<nn::Linear>(job.master(), bad, 4, 4); });
    CHECK(contains(msg, "malformed placement \"" + bad + "\""));
    CHECK_THROWS_AS(RemoteModule<nn::Linear>(job.master(), bad, 4, 4), weft::InvalidArgumentError);
  }
  CHECK_THROWS_AS(RemoteModule<nn::Linear>(job.master(), "ps/cuda:0", 4, 4), weft::InvalidArgumentError);
  std::string cuda = errorOf([&] { RemoteModule<nn::Linear>(job.master(), "ps/cuda:1", 4, 4); });
  CHECK(contains(cuda, "\"ps/cuda:1\""));
  CHECK(contains(cuda, "CUDA placement of remote modules is not supported yet"));
  CHECK_THROWS(RemoteModule<nn::Linear>(job.master(), "nobody/cpu", 4, 4));
  job.checkCleanShutdown();
}

TEST_CASE("remote module: a wrong tensor count and a failed constructor surface as the owner's errors") {
  Job job;
  {
    RemoteModule<nn::Linear> fc(job.master(), "ps/cpu", 4, 4);
    using Host = weft::rref::ModuleHost<nn::Linear>;
    std::vector<Tensor> two{weft::ones({1, 4}), weft::ones({1, 4})};
    std::string msg = errorOf([&] { fc.moduleRRef().rpcSync(&Host::forward, two); });
    CHECK(contains(msg, "RemoteModule(Linear)::forward: takes 1 tensors, got 2"));
    CHECK_THROWS_AS(fc.moduleRRef().rpcSync(&Host::forward, two), weft::InvalidArgumentError);
    CHECK_THROWS_AS(fc.moduleRRef().rpcSync(&Host::forward, std::vector<Tensor>{}), weft::InvalidArgumentError);
    CHECK_THROWS_AS(fc.moduleRRef().rpcSync(&Host::parameter, int64_t{2}), weft::InvalidArgumentError);
    // The module's own shape check, on the owner.
    CHECK_THROWS_AS(fc.forward(weft::ones({1, 5})), weft::InvalidArgumentError);

    using BagHost = weft::rref::ModuleHost<nn::EmbeddingBag>;
    RemoteModule<nn::EmbeddingBag> emb(job.trainer(), "ps/cpu", 10, 4);
    std::vector<Tensor> four(4, weft::ones({1}));
    CHECK(contains(errorOf([&] { emb.moduleRRef().rpcSync(&BagHost::forward, four); }),
                   "takes 1 or 2 or 3 tensors, got 4"));

    RemoteModule<nn::EmbeddingBag> broken(job.master(), "ps/cpu", 0, 16);  // returns at once
    std::string built = errorOf([&] { broken.forward(weft::ones({2, 2}, {.dtype = weft::DType::Int64})); });
    CHECK(contains(built, "RemoteModule<EmbeddingBag> constructor"));
    CHECK_THROWS(broken.remoteParameters());
  }
  job.checkCleanShutdown();
}

TEST_CASE("remote module: an empty handle cannot be used or sent") {
  Job job;
  RemoteModule<nn::EmbeddingBag> empty;
  CHECK_FALSE(empty.valid());
  CHECK_THROWS_AS(empty.forward(weft::ones({1, 1})), weft::InvalidArgumentError);
  CHECK_THROWS_AS(job.master().call("trainer", bagParams, empty), weft::InvalidArgumentError);
  CHECK(weft::rpc::Codec<RemoteModule<nn::EmbeddingBag>>::typeName() == "RemoteModule<EmbeddingBag>");
  job.checkCleanShutdown();
}
