// A program for the multiprocess tests of the pipeline executor (tests/pipeline/pipeline_mp_test.cpp):
// one stage of a pipeline, rank R of the job (rpc::Options::fromEnv, a Gloo group through
// collectives::init). Every rank builds the whole model from the same seed, keeps its stage
// (cut by parameter count) and runs pipelined steps; beside it a twin of the whole model takes the
// same steps in this one process on the whole batch, the reference. Differences are printed in
// parts per billion (integers) for the test to bound; every line starts with "rank R ".
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=2 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 pipeline_worker mlp 1f1b 3
//
// Scenarios (argv: scenario schedule microbatches; schedule gpipe, 1f1b, gpipe-ckpt: GPipe with
// activation checkpointing, or interleaved: interleaved 1F1B with 2 chunks per stage, the model cut
// into 2P pieces, stage s holding pieces s and P + s):
//   mlp   A Sequential of 7 layers (4 Linear with Tanh between), MSE loss, SGD with momentum.
//   gpt   The tiny GPT (3 blocks: 5 layers, 6 blocks under the interleaved schedule; wte tied
//         between the first and the last stage), its cross-entropy loss, SGD with momentum.
//   For each of 3 steps (each on a new batch): "step K grad_maxdiff_ppb N loss_diff_ppb L peak A
//   params P" (N: this stage's gradients against the twin's, after the tied exchange; L: the
//   pipelined loss against the twin's, on the last stage, -1 elsewhere; A: the stage's peak
//   live micro-batches; P: its parameter count; then the trace's counts "forwards F backwards B
//   receives R sends S transfers T accounted 0|1 ordered 0|1" (accounted: 1 when the step's
//   compute, wait and transfer times are each non-negative and add up to no more than the step;
//   ordered: 1 when no event overlaps the next), "act_bytes B", the step's activation memory, and
//   "group_bytes G", what the stage sent through the process group during the step), then both
//   optimizers step; at the end
//   "final param_maxdiff_ppb N" (this stage's parameters against the twin's).
//   mlpdp, gptdp  As mlp and gpt on 4 ranks as 2 replicas of a 2-stage pipeline (dp x pp): replica d
//         (ranks 2d, 2d + 1) trains on rows [d·2M, (d+1)·2M) of the twin's batch of 4M rows, the
//         gradients averaged over the stage's replicas; the same lines, against the twin.
//   gpttp  The tiny GPT (3 blocks, 6 under the interleaved schedule) on 4 ranks as a 2-stage
//         pipeline of tensor-parallel stages: the mesh {pp: 2, tp: 2} (rank 2s + t is tp rank t of
//         stage s), a collectives::TensorParallelGPT loaded from the twin's weights cut by
//         pipeline::gptLayers, its vocabulary-parallel loss (lossOfLogits), wte tied between the
//         ends; the same lines, this rank's gradients and parameters against its shards of the
//         twin's (TensorParallelGPT::shard).
//   die   3 stages of the mlp, group timeout 4 s. Stage 1 exits (status 3) at its first forward of
//         the second step; the others print "failed in_ms T <ErrorType>: <message>" (T from the
//         start of that step), then "again StateError: <message>" from a third step.
// PIPELINE_WORKER_RING_BYTES=N in the environment sets ExecutorOptions::sharedMemoryBytes (mlp,
// gpt, mlpdp, gptdp). "done" at the end of a clean run.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "collectives/init.h"
#include "collectives/mesh.h"
#include "collectives/tensor_parallel_gpt.h"
#include "common/error.h"
#include "mp_worker.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "pipeline/executor.h"
#include "pipeline/stage.h"
#include "tensor/ops.h"

namespace {

using namespace std::chrono_literals;
using weft::DType;
using weft::Generator;
using weft::Tensor;
using weft::testing::say;
namespace nn = weft::nn;
namespace pipeline = weft::pipeline;
using Clock = std::chrono::steady_clock;

int gRank = 0;

void sayLine(const std::string& line) { say(weft::testing::prefix(gRank) + line); }

long long ppb(double v) { return std::llround(v * 1e9); }

std::shared_ptr<nn::Sequential> mlp() {
  Generator g(11);
  std::vector<std::shared_ptr<nn::Module>> layers;
  const int64_t widths[] = {12, 24, 16, 16, 4};
  for (int i = 0; i < 4; ++i) {
    auto l = std::make_shared<nn::Linear>(widths[i], widths[i + 1]);
    l->resetParameters(&g);
    layers.push_back(l);
    if (i < 3) layers.push_back(std::make_shared<nn::Tanh>());
  }
  return nn::makeSequential(layers);
}

nn::GPTConfig gptConfig(int blocks) {
  return {.vocabSize = 32, .blockSize = 8, .layers = blocks, .heads = 2, .width = 16};
}

std::shared_ptr<nn::GPT> gpt(int blocks) {
  Generator g(12);
  return std::make_shared<nn::GPT>(gptConfig(blocks), &g);
}

// Forwards to `inner`; the process exits with status 3 at forward call number `dieAt` (from 1).
class DyingStage : public nn::Module {
 public:
  DyingStage(std::shared_ptr<nn::Module> inner, int dieAt) : Module("DyingStage"), dieAt_(dieAt) {
    inner_ = registerModule("inner", std::move(inner));
  }
  Tensor forward(const Tensor& x) override {
    if (++calls_ == dieAt_) {
      sayLine("dying");
      std::_Exit(3);
    }
    return inner_->forward(x);
  }

 private:
  std::shared_ptr<nn::Module> inner_;
  int dieAt_;
  int calls_ = 0;
};

struct Batch {
  Tensor x, y;
};

Batch mlpBatch(int step, int rows) {
  Generator g(900 + static_cast<uint64_t>(step));
  return {weft::randn({rows, 12}, {}, &g), weft::randn({rows, 4}, {}, &g)};
}

Batch gptBatch(int step, int rows) {
  Generator g(700 + static_cast<uint64_t>(step));
  auto o = weft::TensorOptions{.dtype = DType::Int64};
  return {weft::randint(0, 32, {rows, 8}, o, &g), weft::randint(0, 32, {rows, 8}, o, &g)};
}

double maxDiff(const Tensor& a, const Tensor& b) { return weft::max(weft::abs(a - b)).item<double>(); }

// This stage's parameters of `model` with their names in `model`.
std::vector<std::pair<std::string, Tensor>> stageParameters(const nn::Module& model, const nn::Module& stage) {
  std::vector<std::pair<std::string, Tensor>> out;
  auto mine = stage.parameters();
  for (auto& [name, p] : model.namedParameters()) {
    for (const Tensor& q : mine)
      if (q.sameAs(p)) out.emplace_back(name, p);
  }
  return out;
}

pipeline::Schedule scheduleOf(const std::string& name, int stages, int m) {
  if (name == "gpipe" || name == "gpipe-ckpt") return pipeline::gpipe(stages, m);
  if (name == "1f1b") return pipeline::oneFOneB(stages, m);
  if (name == "interleaved") return pipeline::interleavedOneFOneB(stages, 2, m);
  throw weft::InvalidArgumentError("pipeline_worker: unknown schedule '" + name + "'");
}

// The "step K ..." line of one pipelined step against the twin's (the trace: one event per
// forward, backward and receive, in order, none overlapping the next).
void reportStep(int step, const pipeline::PipelineExecutor& pipe, const Tensor& got, const Tensor& want,
                double gradDiff, int64_t count, int64_t groupBytes = -1) {
  long long lossDiff = got.defined() ? ppb(std::fabs(got.item<double>() - want.item<double>())) : -1;
  const auto& st = pipe.lastStats();
  const auto& events = st.events;
  // The step's parts, each non-negative, add up to no more than the step.
  const int accounted = st.computeSeconds >= 0 && st.waitSeconds >= 0 && st.transferSeconds >= 0 &&
                        st.computeSeconds + st.waitSeconds + st.transferSeconds <= st.stepSeconds;
  int forwards = 0, backwards = 0, receives = 0, sends = 0, ordered = 1;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto k = events[i].kind;
    forwards += k == pipeline::ActionKind::Forward;
    backwards += k == pipeline::ActionKind::Backward;
    receives += k == pipeline::ActionKind::RecvActivation || k == pipeline::ActionKind::RecvGrad;
    sends += k == pipeline::ActionKind::SendActivation || k == pipeline::ActionKind::SendGrad;
    if (events[i].endUs < events[i].startUs || (i > 0 && events[i].startUs < events[i - 1].endUs)) ordered = 0;
  }
  sayLine("step " + std::to_string(step) + " grad_maxdiff_ppb " + std::to_string(ppb(gradDiff)) + " loss_diff_ppb " +
          std::to_string(lossDiff) + " peak " + std::to_string(pipe.lastStats().peakActivations) + " params " +
          std::to_string(count) + " forwards " + std::to_string(forwards) + " backwards " +
          std::to_string(backwards) + " receives " + std::to_string(receives) + " sends " + std::to_string(sends) +
          " transfers " + std::to_string(st.transfers) + " accounted " + std::to_string(accounted) + " ordered " +
          std::to_string(ordered) + " act_bytes " + std::to_string(pipe.lastStats().activationBytes) +
          " group_bytes " + std::to_string(groupBytes));
}

void runTraining(weft::collectives::ProcessGroup& world, bool isGpt, const std::string& scheduleName, int m,
                 int replicas) {
  // Replica d is ranks d*P .. d*P + P - 1; the stage s ranks of every replica form its data-parallel group.
  const int stages = world.size() / replicas;
  std::unique_ptr<weft::collectives::ProcessGroup> pipeGroup, dpGroup;
  if (replicas > 1) {
    for (int d = 0; d < replicas; ++d) {
      std::vector<int> ranks;
      for (int s = 0; s < stages; ++s) ranks.push_back(d * stages + s);
      if (auto g = world.newGroup(ranks)) pipeGroup = std::move(g);
    }
    for (int s = 0; s < stages; ++s) {
      std::vector<int> ranks;
      for (int d = 0; d < replicas; ++d) ranks.push_back(d * stages + s);
      if (auto g = world.newGroup(ranks)) dpGroup = std::move(g);
    }
  }
  weft::collectives::ProcessGroup& pg = replicas > 1 ? *pipeGroup : world;
  const int replica = world.rank() / stages;
  const int stage = pg.rank();
  // The model this process splits and its twin, the single-process reference.
  std::shared_ptr<nn::Module> model, twin;
  std::shared_ptr<nn::Sequential> layers;
  std::vector<pipeline::TiedParameter> tied;
  pipeline::LossFn lossFn;
  std::function<Tensor(const Batch&)> twinLoss;
  const int chunks = scheduleName == "interleaved" ? 2 : 1;
  if (isGpt) {
    const int blocks = chunks > 1 ? 6 : 3;
    auto g = gpt(blocks);
    auto t = gpt(blocks);
    model = g;
    twin = t;
    layers = pipeline::gptLayers(g);
    tied = pipeline::gptTiedParameters(*g, stage, stages);
    lossFn = [](const Tensor& logits, const Tensor& y) {
      return weft::crossEntropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    };
    twinLoss = [t](const Batch& b) { return t->loss(b.x, b.y); };
  } else {
    layers = mlp();
    auto t = mlp();
    model = layers;
    twin = t;
    lossFn = [](const Tensor& out, const Tensor& y) { return weft::mseLoss(out, y); };
    twinLoss = [t](const Batch& b) { return weft::mseLoss(t->forward(b.x), b.y); };
  }
  // Model stage c·P + s is this stage's chunk c.
  auto pieces = pipeline::splitSequential(*layers, pipeline::cutsByParameterCount(*layers, stages * chunks));
  std::vector<std::shared_ptr<nn::Module>> mineChunks;
  auto mine = std::make_shared<nn::Sequential>();  // every chunk's layers, for their parameters
  for (int c = 0; c < chunks; ++c) {
    const auto& piece = pieces[static_cast<size_t>(c * stages + stage)];
    mineChunks.push_back(piece);
    for (size_t i = 0; i < piece->size(); ++i) mine->push_back(piece->at(i));
  }
  pipeline::ExecutorOptions options{
      .tied = tied, .dataParallel = dpGroup.get(), .checkpoint = scheduleName == "gpipe-ckpt"};
  if (const char* bytes = std::getenv("PIPELINE_WORKER_RING_BYTES")) options.sharedMemoryBytes = std::stoull(bytes);
  pipeline::PipelineExecutor pipe(pg, mineChunks, scheduleOf(scheduleName, stages, m), lossFn, options);
  const auto named = stageParameters(*model, *mine);
  int64_t count = 0;
  for (auto& np : named) count += np.second.numel();
  // The tied wte is the stage's own parameter and also listed once: one optimizer over the stage.
  nn::optim::SGD opt(mine->parameters(), {.lr = 0.05, .momentum = 0.9});
  nn::optim::SGD twinOpt(twin->parameters(), {.lr = 0.05, .momentum = 0.9});
  const int rows = 2 * m;  // per replica; the twin takes all replicas' rows at once
  for (int step = 0; step < 3; ++step) {
    Batch b = isGpt ? gptBatch(step, rows * replicas) : mlpBatch(step, rows * replicas);
    twinOpt.zeroGrad();
    Tensor want = twinLoss(b);
    want.backward();
    opt.zeroGrad();
    pg.resetTrafficStats();
    Tensor got = pipe.step(b.x.narrow(0, replica * rows, rows), b.y.narrow(0, replica * rows, rows));
    const int64_t groupBytes = pg.trafficStats().bytesSent;
    double worst = 0.0;
    for (auto& [name, p] : named) worst = std::max(worst, maxDiff(p.grad(), twin->namedTensor(name).grad()));
    reportStep(step, pipe, got, want, worst, count, groupBytes);
    opt.step();
    twinOpt.step();
  }
  double worst = 0.0;
  for (auto& [name, p] : named) worst = std::max(worst, maxDiff(p.detach(), twin->namedTensor(name).detach()));
  sayLine("final param_maxdiff_ppb " + std::to_string(ppb(worst)));
}

void runTensorParallel(weft::collectives::ProcessGroup& world, const std::string& scheduleName, int m) {
  namespace collectives = weft::collectives;
  collectives::Mesh mesh(world, {{"pp", 2}, {"tp", 2}});
  collectives::ProcessGroup& pg = mesh.group("pp");
  const int stages = pg.size(), stage = pg.rank();
  const int chunks = scheduleName == "interleaved" ? 2 : 1;
  const int blocks = chunks > 1 ? 6 : 3;
  auto twin = gpt(blocks);
  auto model = std::make_shared<collectives::TensorParallelGPT>(
      std::make_shared<collectives::TpGroup>(mesh.group("tp")), gptConfig(blocks));
  model->loadFrom(*twin);
  auto layers = pipeline::gptLayers(model);
  auto pieces = pipeline::splitSequential(*layers, pipeline::cutsByParameterCount(*layers, stages * chunks));
  std::vector<std::shared_ptr<nn::Module>> mineChunks;
  auto mine = std::make_shared<nn::Sequential>();
  for (int c = 0; c < chunks; ++c) {
    const auto& piece = pieces[static_cast<size_t>(c * stages + stage)];
    mineChunks.push_back(piece);
    for (size_t i = 0; i < piece->size(); ++i) mine->push_back(piece->at(i));
  }
  pipeline::PipelineExecutor pipe(
      pg, mineChunks, scheduleOf(scheduleName, stages, m),
      [model](const Tensor& logits, const Tensor& y) { return model->lossOfLogits(logits, y); },
      {.tied = pipeline::gptTiedParameters(*model, stage, stages), .checkpoint = scheduleName == "gpipe-ckpt"});
  const auto named = stageParameters(*model, *mine);
  int64_t count = 0;
  for (auto& np : named) count += np.second.numel();
  nn::optim::SGD opt(mine->parameters(), {.lr = 0.05, .momentum = 0.9});
  nn::optim::SGD twinOpt(twin->parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    Batch b = gptBatch(step, 2 * m);
    twinOpt.zeroGrad();
    Tensor want = twin->loss(b.x, b.y);
    want.backward();
    opt.zeroGrad();
    Tensor got = pipe.step(b.x, b.y);
    double worst = 0.0;
    for (auto& [name, p] : named) {
      worst = std::max(worst, maxDiff(p.grad(), model->shard(name, twin->namedTensor(name).grad())));
    }
    reportStep(step, pipe, got, want, worst, count);
    opt.step();
    twinOpt.step();
  }
  double worst = 0.0;
  for (auto& [name, p] : named) {
    worst = std::max(worst, maxDiff(p.detach(), model->shard(name, twin->namedTensor(name).detach())));
  }
  sayLine("final param_maxdiff_ppb " + std::to_string(ppb(worst)));
}

void runDie(weft::collectives::ProcessGroup& pg) {
  const int stage = pg.rank(), stages = pg.size();
  constexpr int kM = 4;
  auto layers = mlp();
  auto cuts = pipeline::cutsByParameterCount(*layers, stages);
  std::shared_ptr<nn::Module> mine = pipeline::splitSequential(*layers, cuts)[static_cast<size_t>(stage)];
  if (stage == 1) mine = std::make_shared<DyingStage>(mine, kM + 1);
  pipeline::PipelineExecutor pipe(pg, mine, pipeline::oneFOneB(stages, kM),
                                  [](const Tensor& out, const Tensor& y) { return weft::mseLoss(out, y); });
  Batch b = mlpBatch(0, 2 * kM);
  pipe.step(b.x, b.y);
  sayLine("first step done");
  const auto t0 = Clock::now();
  try {
    pipe.step(b.x, b.y);
    sayLine("second step done");
  } catch (const weft::Error& e) {
    const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    std::string type = dynamic_cast<const weft::DisconnectedError*>(&e) ? "DisconnectedError"
                       : dynamic_cast<const weft::TimeoutError*>(&e)    ? "TimeoutError"
                       : dynamic_cast<const weft::StateError*>(&e)      ? "StateError"
                                                                         : "Error";
    sayLine("failed in_ms " + std::to_string(ms) + " " + type + ": " + e.what());
    try {
      pipe.step(b.x, b.y);
    } catch (const weft::StateError& again) {
      sayLine(std::string("again StateError: ") + again.what());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return weft::testing::workerMain("pipeline_worker", {"mlp", "gpt", "mlpdp", "gptdp", "gpttp", "die"}, argc, argv,
                                   [argc, argv](const std::string& scenario) {
    weft::rpc::Options opt = weft::rpc::Options::fromEnv();
    gRank = opt.rank;
    say(weft::testing::prefix(gRank) + "pid " + std::to_string(::getpid()) + " started");
    {
      auto pg = weft::collectives::init(opt, {.timeout = scenario == "die" ? std::chrono::milliseconds(4s)
                                                                           : std::chrono::milliseconds(20s)});
      if (scenario == "die") {
        runDie(*pg);
      } else if (scenario == "gpttp") {
        WEFT_ENFORCE(argc == 4, weft::InvalidArgumentError, "usage: pipeline_worker gpttp gpipe|1f1b MICROBATCHES");
        runTensorParallel(*pg, argv[2], std::atoi(argv[3]));
      } else {
        WEFT_ENFORCE(argc == 4, weft::InvalidArgumentError, "usage: pipeline_worker ", scenario,
                     " gpipe|1f1b MICROBATCHES");
        const bool dp = scenario == "mlpdp" || scenario == "gptdp";
        runTraining(*pg, scenario == "gpt" || scenario == "gptdp", argv[2], std::atoi(argv[3]), dp ? 2 : 1);
      }
    }
    sayLine("done");
    return 0;
  });
}
