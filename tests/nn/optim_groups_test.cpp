// Parameter groups: AdamW over nanoGPT's decay / no-decay split against PyTorch 1.13
// (fixtures/gen_optim_groups_fixture.py), learning rates set for all groups or one, the state
// dict carrying the groups, and the errors.
#include <string>
#include <utility>
#include <vector>

#include "fixtures/optim_groups_fixture.h"
#include "nn/optim.h"
#include "nn/serialize.h"
#include "weft_test.h"

using namespace weft;
namespace optim = weft::nn::optim;
namespace gx = weft::testing::optim_groups_fixture;

namespace {

std::vector<std::pair<std::string, Tensor>> namedParams() {
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t i = 0; i < gx::kNames.size(); ++i) {
    named.emplace_back(gx::kNames[i], fromVector(gx::kInitialParams[i], gx::kShapes[i]).requiresGrad_());
  }
  return named;
}

void feed(const std::vector<std::pair<std::string, Tensor>>& named, int step) {
  for (size_t i = 0; i < named.size(); ++i) named[i].second.setGrad(fromVector(gx::kGrads[step][i], gx::kShapes[i]));
}

optim::AdamWOptions baseOptions() {
  return {.lr = gx::kLr, .betas = {gx::kBeta1, gx::kBeta2}, .weightDecay = gx::kWeightDecay};
}

// The fixture's schedule: every group at 0.02 before step 2 (0-based), group 1 at 0.001 before step 3.
void scheduleAt(optim::Optimizer& opt, int step) {
  if (step == 2) opt.setLr(0.02);
  if (step == 3) opt.setLr(1, 0.001);
}

}  // namespace

TEST_SUITE_BEGIN("optim");

TEST_CASE("decayGroups puts matrices in the decayed group and vectors in the other, skipping frozen ones") {
  auto named = namedParams();
  Tensor frozen = zeros({2, 2});
  named.emplace_back("frozen.weight", frozen);
  auto groups = optim::decayGroups(named, baseOptions());
  REQUIRE(groups.size() == 2);
  REQUIRE(groups[0].params.size() == 2);
  REQUIRE(groups[1].params.size() == 2);
  CHECK(groups[0].params[0].sameAs(named[0].second));  // wte.weight
  CHECK(groups[0].params[1].sameAs(named[1].second));  // h.0.attn.weight
  CHECK(groups[1].params[0].sameAs(named[2].second));  // h.0.attn.bias
  CHECK(groups[1].params[1].sameAs(named[3].second));  // ln_f.weight
  CHECK(std::get<optim::AdamWOptions>(groups[0].options).weightDecay == gx::kWeightDecay);
  CHECK(std::get<optim::AdamWOptions>(groups[1].options).weightDecay == 0.0);
  CHECK(std::get<optim::AdamWOptions>(groups[1].options).lr == gx::kLr);
  // SGD's L2 penalty is split the same way.
  auto sgd = optim::decayGroups(named, optim::SGDOptions{.lr = 0.1, .weightDecay = 0.5});
  CHECK(std::get<optim::SGDOptions>(sgd[1].options).weightDecay == 0.0);
  CHECK(std::get<optim::SGDOptions>(sgd[0].options).weightDecay == 0.5);
}

TEST_CASE("AdamW over a decay and a no-decay group follows PyTorch's trajectory, per-group lr changes included") {
  auto named = namedParams();
  optim::AdamW opt(optim::decayGroups(named, baseOptions()));
  // Parameters are indexed over the groups in order: the same order as kNames here.
  REQUIRE(opt.params().size() == named.size());
  for (int k = 0; k < gx::kSteps; ++k) {
    scheduleAt(opt, k);
    feed(named, k);
    opt.step();
    for (size_t i = 0; i < named.size(); ++i) {
      INFO("step " << k << " " << gx::kNames[i]);
      weft::testing::expectClose(named[i].second, fromVector(gx::kParamsAfter[k][i], gx::kShapes[i]), 1e-12, 1e-14);
    }
  }
  CHECK(opt.lr(0) == gx::kFinalLrs[0]);
  CHECK(opt.lr(1) == gx::kFinalLrs[1]);
  CHECK(opt.lr() == gx::kFinalLrs[0]);

  // One group for everything decays the vectors too: the split matters.
  auto single = namedParams();
  std::vector<Tensor> all;
  for (auto& [n, p] : single) all.push_back(p);
  optim::AdamW plain(all, baseOptions());
  for (int k = 0; k < gx::kSteps; ++k) {
    scheduleAt(plain, k);  // one group: setLr(1, ...) is out of range
    feed(single, k);
    plain.step();
    if (k == 2) break;
  }
  CHECK_FALSE(allclose(single[2].second, fromVector(gx::kParamsAfter[2][2], gx::kShapes[2]), 1e-12, 1e-14));
}

TEST_CASE("setLr sets every group or one; group indices are checked") {
  auto named = namedParams();
  optim::AdamW opt(optim::decayGroups(named, baseOptions()));
  opt.setLr(0.5);
  CHECK(opt.lr(0) == 0.5);
  CHECK(opt.lr(1) == 0.5);
  opt.setLr(1, 0.25);
  CHECK(opt.lr(0) == 0.5);
  CHECK(opt.lr(1) == 0.25);
  CHECK(std::get<optim::AdamWOptions>(opt.groups()[1].options).weightDecay == 0.0);
  CHECK_THROWS_WITH_AS(opt.setLr(2, 0.1), doctest::Contains("AdamW.setLr: group 2 out of range (the optimizer has 2)"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(opt.setLr(-1.0), InvalidArgumentError);
  CHECK(opt.lr(0) == 0.5);  // a rejected setLr changes no group
  opt.setOptions(1, optim::AdamWOptions{.lr = 0.3, .weightDecay = 0.0});
  CHECK(opt.lr(1) == 0.3);
  CHECK_THROWS_AS(opt.setOptions(1, optim::AdamOptions{}), InvalidArgumentError);
}

TEST_CASE("group errors: mixed kinds, shared parameters, no parameters at all") {
  Tensor a = zeros({2, 2}).requiresGrad_();
  Tensor b = zeros({2}).requiresGrad_();
  CHECK_THROWS_WITH_AS(optim::Optimizer({{{a}, optim::AdamWOptions{}}, {{b}, optim::SGDOptions{.lr = 0.1}}}),
                       doctest::Contains("AdamW: group 1 has SGD options"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::AdamW({{{a}, optim::AdamOptions{}}}), doctest::Contains("AdamW: group 0 has Adam options"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::AdamW({{{a}, optim::AdamWOptions{}}, {{a}, optim::AdamWOptions{}}}),
                       doctest::Contains("same tensor"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(optim::AdamW({{{}, optim::AdamWOptions{}}, {{}, optim::AdamWOptions{}}}),
                       doctest::Contains("empty parameter list"), InvalidArgumentError);
  // One empty group is fine (a model without vectors).
  optim::AdamW ok({{{a}, optim::AdamWOptions{}}, {{}, optim::AdamWOptions{.weightDecay = 0}}});
  a.setGrad(onesLike(a));
  ok.step();
  CHECK(ok.state()[0].step == 1);
}

TEST_CASE("the state dict carries the groups: a resumed optimizer continues PyTorch's trajectory") {
  auto named = namedParams();
  optim::AdamW opt(optim::decayGroups(named, baseOptions()));
  for (int k = 0; k < 4; ++k) {
    scheduleAt(opt, k);
    feed(named, k);
    opt.step();
  }
  std::string path = "optim_groups_roundtrip.weft";
  nn::saveStateDict(opt.stateDict(), path);
  nn::StateDict sd = nn::loadStateDictFile(path);
  std::remove(path.c_str());
  CHECK(sd.at("param_groups.1.lr").item<double>() == 0.001);
  CHECK(sd.at("param_groups.0.params").item<int64_t>() == 2);

  // Fresh parameters at step 4's values, a fresh optimizer at the base lr: the dict restores
  // the moments, the steps and each group's lr.
  std::vector<std::pair<std::string, Tensor>> resumedNamed;
  for (size_t i = 0; i < named.size(); ++i) {
    resumedNamed.emplace_back(named[i].first, named[i].second.detach().clone().requiresGrad_());
  }
  optim::AdamW resumed(optim::decayGroups(resumedNamed, baseOptions()));
  resumed.loadStateDict(sd);
  CHECK(resumed.lr(0) == 0.02);
  CHECK(resumed.lr(1) == 0.001);
  feed(resumedNamed, 4);
  resumed.step();
  for (size_t i = 0; i < named.size(); ++i) {
    INFO(gx::kNames[i]);
    weft::testing::expectClose(resumedNamed[i].second, fromVector(gx::kParamsAfter[4][i], gx::kShapes[i]), 1e-12,
                               1e-14);
  }

  // Groups of other sizes are refused before anything changes.
  std::vector<Tensor> all;
  for (auto& [n, p] : resumedNamed) all.push_back(p);
  optim::AdamW other({{{all[0]}, baseOptions()}, {{all[1], all[2], all[3]}, baseOptions()}});
  CHECK_THROWS_WITH_AS(other.loadStateDict(sd), doctest::Contains("group 0 held 2 parameters, this optimizer's has 1"),
                       InvalidArgumentError);
  CHECK(other.state()[0].step == 0);
  CHECK(other.lr(1) == gx::kLr);
  optim::AdamW one(all, baseOptions());
  CHECK_THROWS_WITH_AS(one.loadStateDict(sd), doctest::Contains("refers to group 1 but the optimizer has 1"),
                       InvalidArgumentError);
}
