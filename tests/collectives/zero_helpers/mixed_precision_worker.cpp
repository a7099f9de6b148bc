// A program for the multiprocess tests of mixed-precision data parallelism
// (tests/collectives/mixed_precision_mp_test.cpp): one rank of a job, which finds its place through
// rpc::Options::fromEnv, builds a ProcessGroupGloo and trains the tiny GPT of tiny_gpt_job.h for
// 10 AdamW steps (one group, weight decay 0.1) on data of its own rank, five times:
//   f32    DistributedDataParallel + nn::optim::AdamW in float32 (the reference),
//   ddp    the module in bfloat16, DDP reducing in float32 + nn::optim::MasterWeightOptimizer,
//   zero1  the module in bfloat16, DDP reducing in float32 + ZeroRedundancyOptimizer with masters,
//   zero2  the module in bfloat16, ShardedDataParallel reducing in float32 with masters,
//   zero3  FullyShardedDataParallel with bfloat16 parameters, reducing in float32,
// each forward under autocast::Scope(BFloat16) (FSDP opens its own); and, as a control, once more
// as ddp but with nn::optim::AdamW stepping the bfloat16 parameters themselves (no masters): bf16.
// "rank R numel N" gives Ψ. For each mixed-precision method it prints
//   rank R mem <method> held H params P grads G masters M state S buffers B padding D
// (H: bytes held by tensors after the last step beyond those held before the model was built,
// through Storage::memoryStats; P, G, M, S: the bytes of the 16-bit parameters, of the gradients
// the method keeps, of the float32 masters and of the optimizer state; B: the module's buffers;
// D: padding elements), and
//   rank R num <method> loss_ppm L update_ppm U worst_ppm W
// (also for bf16; L: the largest relative difference of this rank's loss from the float32 run's,
// in parts per million; U: ‖Δ − Δ_f32‖ / ‖Δ_f32‖ in parts per million, Δ the change of every
// parameter over the 10 steps, the float32 masters for ddp and zero3, the bfloat16 parameters
// for zero1 and zero2; W: the largest of the same ratio taken parameter by parameter), and for
// zero1 and zero2
//   rank R eq <method> maxdiff_ppb D bitwise 0|1
// (their final bfloat16 parameters against ddp's, in parts per billion of the largest magnitude).
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=2 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 mixed_precision_worker gpt
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/fsdp.h"
#include "collectives/gloo/detail/group.h"
#include "collectives/sharded_ddp.h"
#include "collectives/zero.h"
#include "collectives/zero_helpers/tiny_gpt_job.h"
#include "mp_worker.h"
#include "nn/master_weights.h"
#include "nn/optim.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

namespace {

using namespace std::chrono_literals;
using weft::DType;
using weft::Tensor;
using weft::collectives::DistributedDataParallel;
using weft::collectives::FullyShardedDataParallel;
using weft::collectives::ProcessGroupGloo;
using weft::collectives::ShardedDataParallel;
using weft::collectives::ZeroRedundancyOptimizer;
using weft::testing::say;
using weft::testing::zero::adamw;
using weft::testing::zero::batch;
using weft::testing::zero::lossOf;
using weft::testing::zero::settledLiveBytes;
using weft::testing::zero::tinyGpt;

int gRank = 0;
constexpr int kSteps = 10;

void sayLine(const std::string& line) { say(weft::testing::prefix(gRank) + line); }

// Every parameter, in module order, as float32 copies.
using Snapshot = std::vector<Tensor>;

Snapshot float32Copies(const std::vector<Tensor>& params) {
  Snapshot out;
  for (const Tensor& p : params) out.push_back(p.detach().to(DType::Float32).clone());
  return out;
}

// What one training run leaves: each step's loss and the final parameters (float32 copies).
struct Trained {
  std::vector<double> losses;
  Snapshot params;
};

// Trains kSteps steps, each forward and loss under autocast::Scope(BFloat16) when `amp`.
Trained train(int rank, bool amp, const std::function<Tensor(const Tensor&)>& forward,
              const std::function<void()>& zeroGrad, const std::function<void()>& step) {
  Trained t;
  for (int s = 0; s < kSteps; ++s) {
    zeroGrad();
    auto [idx, targets] = batch(rank, s);
    Tensor loss;
    {
      weft::autocast::Scope scope(DType::BFloat16, amp);
      loss = lossOf(forward(idx), targets);
    }
    t.losses.push_back(loss.item<double>());
    loss.backward();
    step();
  }
  return t;
}

int64_t bytesOf(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (const Tensor& t : ts) {
    if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}

std::vector<Tensor> gradsOf(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.grad());
  return out;
}

void reportMemory(ProcessGroupGloo& pg, const std::string& method, size_t before, int64_t params, int64_t grads,
                  int64_t masters, int64_t state, int64_t buffers, int64_t padding) {
  const long long held = static_cast<long long>(settledLiveBytes(pg)) - static_cast<long long>(before);
  sayLine("mem " + method + " held " + std::to_string(held) + " params " + std::to_string(params) + " grads " +
          std::to_string(grads) + " masters " + std::to_string(masters) + " state " + std::to_string(state) +
          " buffers " + std::to_string(buffers) + " padding " + std::to_string(padding));
}

// "num <method> loss_ppm L update_ppm U" against the float32 run.
void reportNumerics(const std::string& method, const Trained& got, const Trained& ref, const Snapshot& initial) {
  double loss = 0;
  for (size_t s = 0; s < got.losses.size(); ++s) {
    loss = std::max(loss, std::fabs(got.losses[s] - ref.losses[s]) / std::fabs(ref.losses[s]));
  }
  double diff2 = 0, ref2 = 0, worst = 0;
  for (size_t i = 0; i < initial.size(); ++i) {
    auto a = got.params[i].toVector<float>();
    auto b = ref.params[i].toVector<float>();
    auto o = initial[i].toVector<float>();
    double tensorDiff2 = 0, tensorRef2 = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      const double dRef = static_cast<double>(b[j]) - o[j];
      const double d = static_cast<double>(a[j]) - o[j];
      tensorDiff2 += (d - dRef) * (d - dRef);
      tensorRef2 += dRef * dRef;
    }
    diff2 += tensorDiff2;
    ref2 += tensorRef2;
    if (tensorRef2 > 0) worst = std::max(worst, std::sqrt(tensorDiff2 / tensorRef2));
  }
  sayLine("num " + method + " loss_ppm " + std::to_string(static_cast<long long>(loss * 1e6)) + " update_ppm " +
          std::to_string(static_cast<long long>(std::sqrt(diff2 / ref2) * 1e6)) + " worst_ppm " +
          std::to_string(static_cast<long long>(worst * 1e6)));
}

void reportEqual(const std::string& method, const Snapshot& got, const Snapshot& want) {
  double scale = 0, diff = 0;
  bool bitwise = true;
  for (size_t i = 0; i < got.size(); ++i) {
    auto a = got[i].toVector<float>();
    auto b = want[i].toVector<float>();
    bitwise = bitwise && a == b;
    for (size_t j = 0; j < a.size(); ++j) {
      scale = std::max(scale, std::fabs(static_cast<double>(b[j])));
      diff = std::max(diff, std::fabs(static_cast<double>(a[j]) - static_cast<double>(b[j])));
    }
  }
  sayLine("eq " + method + " maxdiff_ppb " + std::to_string(static_cast<long long>(diff / scale * 1e9)) +
          " bitwise " + std::to_string(bitwise ? 1 : 0));
}

void runGpt(ProcessGroupGloo& pg) {
  const int me = pg.rank();
  const Snapshot initial = float32Copies(tinyGpt()->parameters());
  sayLine("numel " + std::to_string(tinyGpt()->numParameters()));
  const DistributedDataParallel::Options reduceF32{.reduceDtype = DType::Float32};

  Trained f32;
  {
    auto net = tinyGpt();
    DistributedDataParallel ddp(net, pg);
    weft::nn::optim::AdamW opt(net->parameters(), adamw());
    f32 = train(
        me, false, [&ddp](const Tensor& x) { return ddp.forward(x); }, [&opt] { opt.zeroGrad(); },
        [&opt] { opt.step(); });
    f32.params = float32Copies(net->parameters());
  }

  Snapshot ddpParams;  // the bfloat16 parameters after DDP + MasterWeightOptimizer
  {
    const size_t before = settledLiveBytes(pg);
    auto net = tinyGpt();
    net->to(DType::BFloat16);
    DistributedDataParallel ddp(net, pg, reduceF32);
    weft::nn::optim::MasterWeightOptimizer opt(net->parameters(), adamw());
    Trained t = train(
        me, true, [&ddp](const Tensor& x) { return ddp.forward(x); }, [&opt] { opt.zeroGrad(); },
        [&opt] { opt.step(); });
    reportMemory(pg, "ddp", before, bytesOf(net->parameters()), bytesOf(gradsOf(net->parameters())),
                 opt.masterBytes(), opt.stateBytes(), bytesOf(net->buffers()), 0);
    t.params = float32Copies(opt.masters());
    reportNumerics("ddp", t, f32, initial);
    ddpParams = float32Copies(net->parameters());
  }
  {
    // The control: AdamW stepping the bfloat16 parameters themselves, with no masters.
    auto net = tinyGpt();
    net->to(DType::BFloat16);
    DistributedDataParallel ddp(net, pg, reduceF32);
    weft::nn::optim::AdamW opt(net->parameters(), adamw());
    Trained t = train(
        me, true, [&ddp](const Tensor& x) { return ddp.forward(x); }, [&opt] { opt.zeroGrad(); },
        [&opt] { opt.step(); });
    t.params = float32Copies(net->parameters());
    reportNumerics("bf16", t, f32, initial);
  }
  {
    const size_t before = settledLiveBytes(pg);
    auto net = tinyGpt();
    net->to(DType::BFloat16);
    DistributedDataParallel ddp(net, pg, reduceF32);
    ZeroRedundancyOptimizer opt({weft::nn::optim::ParamGroup{net->parameters(), adamw()}}, pg,
                                ZeroRedundancyOptimizer::Options{.masterWeights = true});
    Trained t = train(
        me, true, [&ddp](const Tensor& x) { return ddp.forward(x); }, [&opt] { opt.zeroGrad(); },
        [&opt] { opt.step(); });
    reportMemory(pg, "zero1", before, bytesOf(net->parameters()), bytesOf(gradsOf(net->parameters())),
                 opt.masterBytes(), opt.stateBytes(), bytesOf(net->buffers()), 0);
    t.params = float32Copies(net->parameters());
    reportNumerics("zero1", t, f32, initial);
    reportEqual("zero1", t.params, ddpParams);
  }
  {
    const size_t before = settledLiveBytes(pg);
    auto net = tinyGpt();
    net->to(DType::BFloat16);
    ShardedDataParallel sdp(net, {weft::nn::optim::ParamGroup{net->parameters(), adamw()}}, pg,
                            ShardedDataParallel::Options{.reduceDtype = DType::Float32, .masterWeights = true});
    Trained t = train(
        me, true, [&sdp](const Tensor& x) { return sdp.forward(x); }, [&sdp] { sdp.zeroGrad(); },
        [&sdp] { sdp.step(); });
    int64_t padding = 0;  // each bucket is padded to a multiple of N elements
    for (const auto& bucket : sdp.buckets()) {
      int64_t numel = 0;
      for (size_t i : bucket) numel += sdp.params()[i].numel();
      padding += (numel + pg.size() - 1) / pg.size() * pg.size() - numel;
    }
    reportMemory(pg, "zero2", before, bytesOf(net->parameters()), sdp.gradientShardBytes(), sdp.masterBytes(),
                 sdp.stateBytes(), bytesOf(net->buffers()), padding);
    t.params = float32Copies(net->parameters());
    reportNumerics("zero2", t, f32, initial);
    reportEqual("zero2", t.params, ddpParams);
  }
  {
    const size_t before = settledLiveBytes(pg);
    auto net = tinyGpt();
    FullyShardedDataParallel fsdp(
        net, pg,
        FullyShardedDataParallel::Options{.mixedPrecision = {.param = DType::BFloat16, .reduce = DType::Float32}});
    weft::nn::optim::AdamW opt(fsdp.parameters(), adamw());
    Trained t = train(
        me, true, [&fsdp](const Tensor& x) { return fsdp.forward(x); }, [&opt] { opt.zeroGrad(); },
        [&opt] { opt.step(); });
    int64_t state = 0;
    for (const auto& st : opt.state()) {
      for (const auto& [name, b] : st.buffers) state += static_cast<int64_t>(b.nbytes());
    }
    int64_t padding = 0;
    for (const auto& u : fsdp.units()) padding += u.shardNumel * pg.size() - u.numel;
    // The shards are the float32 masters; the module's parameters hold no bytes between uses.
    reportMemory(pg, "zero3", before, 0, fsdp.gradientShardBytes(), fsdp.shardBytes(), state,
                 bytesOf(net->buffers()), padding);
    weft::nn::StateDict full;  // every rank its own, in turn
    for (int r = 0; r < pg.size(); ++r) {
      weft::nn::StateDict one = fsdp.fullStateDict(r);
      if (r == me) full = std::move(one);
    }
    for (const auto& [name, p] : net->namedParameters()) t.params.push_back(full.at(name).to(DType::Float32));
    reportNumerics("zero3", t, f32, initial);
  }
  pg.barrier().wait();
}

}  // namespace

int main(int argc, char** argv) {
  return weft::testing::workerMain("mixed_precision_worker", {"gpt"}, argc, argv, [](const std::string&) {
    weft::rpc::Options opt = weft::rpc::Options::fromEnv();
    gRank = opt.rank;
    say(weft::testing::prefix(gRank) + "pid " + std::to_string(::getpid()) + " started");
    std::unique_ptr<weft::rpc::StoreServer> server;
    if (opt.rank == 0) server = std::make_unique<weft::rpc::StoreServer>(weft::rpc::StoreServer::configFor(opt));
    weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));
    {
      auto pg = ProcessGroupGloo::create(store, opt.rank, opt.worldSize, {.timeout = std::chrono::milliseconds(20s)});
      runGpt(*pg);
    }
    // Rank 0 serves the store: it leaves once every other rank has said it is leaving.
    if (opt.rank == 0) {
      std::vector<std::string> left;
      for (int r = 1; r < opt.worldSize; ++r) left.push_back("mixed_precision_worker/left/" + std::to_string(r));
      store.wait(left, 20s);
    } else {
      store.set("mixed_precision_worker/left/" + std::to_string(opt.rank), "1");
    }
    sayLine("done");
    return 0;
  });
}
