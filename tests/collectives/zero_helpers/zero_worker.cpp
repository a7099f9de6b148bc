// A program for the multiprocess tests of the ZeRO wrappers (tests/collectives/zero_mp_test.cpp): one
// rank of a job, which finds its place through rpc::Options::fromEnv, builds a ProcessGroupGloo
// and trains a tiny GPT (vocab 64, block 16, 2 layers, 2 heads, width 32, no dropout) for 5 AdamW
// steps with nanoGPT's decay groups, on data of its own rank, three times:
//   ddp     DistributedDataParallel + nn::optim::AdamW (the reference),
//   zero1   DistributedDataParallel + ZeroRedundancyOptimizer,
//   zero2   ShardedDataParallel.
// For each it prints "rank R mem <method> held H state S grads G" (H: bytes held by tensors after
// the last step beyond those held before the wrapper and optimizer were built, through
// Storage::memoryStats; S: optimizer state bytes; G: gradient bytes the method keeps), and for
// zero1 and zero2 "rank R eq <method> maxdiff_ppb D bitwise 0|1" (final parameters against the
// reference's, in parts per billion of the largest magnitude); for zero2 also "rank R grad1 zero2
// maxdiff_ppb D bitwise 0|1" (its gradient slices after the first pass against DDP's averaged
// gradients, in parts per billion of the largest gradient). "rank R numel N" gives Ψ.
//
// Scenarios kill1 and kill2: see runKill.
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=2 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 zero_worker gpt
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/gloo/detail/group.h"
#include "collectives/sharded_ddp.h"
#include "collectives/zero.h"
#include "mp_worker.h"
#include "collectives/zero_helpers/tiny_gpt_job.h"
#include "nn/functional.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

namespace {

using namespace std::chrono_literals;
using weft::Generator;
using weft::Tensor;
using weft::collectives::DistributedDataParallel;
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
constexpr int kSteps = 5;

void sayLine(const std::string& line) { say(weft::testing::prefix(gRank) + line); }


std::vector<Tensor> snapshot(const weft::nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

void report(ProcessGroupGloo& pg, const std::string& method, size_t before, int64_t state, int64_t grads) {
  sayLine("mem " + method + " held " + std::to_string(static_cast<long long>(settledLiveBytes(pg)) -
                                                      static_cast<long long>(before)) +
          " state " + std::to_string(state) + " grads " + std::to_string(grads));
}

void compare(const std::string& method, const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  double scale = 0;
  double diff = 0;
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

// This rank's gradient slices after the first pass against DDP's: "grad1 zero2 maxdiff_ppb D
// bitwise 0|1" (in parts per billion of the largest gradient magnitude).
void compareFirstGradients(const ShardedDataParallel& sdp, const weft::nn::Module& net,
                           const std::vector<Tensor>& want) {
  const std::vector<Tensor> moduleParams = net.parameters();
  double scale = 0;
  double diff = 0;
  bool bitwise = true;
  for (const Tensor& g : want) scale = std::max(scale, weft::max(weft::abs(g)).item<double>());
  for (size_t i = 0; i < sdp.params().size(); ++i) {
    size_t j = 0;
    while (!moduleParams[j].sameAs(sdp.params()[i])) ++j;
    for (const auto& slice : sdp.gradientSlices(i)) {
      auto a = slice.grad.toVector<float>();
      auto b = want[j].view({-1}).narrow(0, slice.start, slice.grad.numel()).contiguous().toVector<float>();
      bitwise = bitwise && a == b;
      for (size_t k = 0; k < a.size(); ++k) {
        diff = std::max(diff, std::fabs(static_cast<double>(a[k]) - static_cast<double>(b[k])));
      }
    }
  }
  sayLine("grad1 zero2 maxdiff_ppb " + std::to_string(static_cast<long long>(diff / scale * 1e9)) + " bitwise " +
          std::to_string(bitwise ? 1 : 0));
}

void runGpt(ProcessGroupGloo& pg) {
  const int me = pg.rank();
  std::vector<Tensor> reference;
  std::vector<Tensor> firstGrads;  // DDP's averaged gradients of the first pass, module order
  {
    auto net = tinyGpt();
    sayLine("numel " + std::to_string(net->numParameters()));
    // Allocated before the count starts: what DDP holds is measured, not this copy.
    for (const Tensor& p : net->parameters()) firstGrads.push_back(weft::zeros(p.shape()));
    const size_t before = settledLiveBytes(pg);
    DistributedDataParallel ddp(net, pg);
    weft::nn::optim::AdamW opt(weft::nn::optim::decayGroups(net->namedParameters(), adamw()));
    for (int s = 0; s < kSteps; ++s) {
      opt.zeroGrad();
      auto [idx, targets] = batch(me, s);
      lossOf(ddp.forward(idx), targets).backward();
      if (s == 0) {
        const std::vector<Tensor> params = net->parameters();
        for (size_t i = 0; i < params.size(); ++i) firstGrads[i].copy_(params[i].grad());
      }
      opt.step();
    }
    int64_t state = 0;
    for (const auto& st : opt.state()) {
      for (const auto& [name, b] : st.buffers) state += static_cast<int64_t>(b.nbytes());
    }
    int64_t grads = 0;
    for (const Tensor& p : net->parameters()) grads += static_cast<int64_t>(p.grad().nbytes());
    report(pg, "ddp", before, state, grads);
    reference = snapshot(*net);
  }
  {
    auto net = tinyGpt();
    const size_t before = settledLiveBytes(pg);
    DistributedDataParallel ddp(net, pg);
    ZeroRedundancyOptimizer opt(weft::nn::optim::decayGroups(net->namedParameters(), adamw()), pg);
    for (int s = 0; s < kSteps; ++s) {
      opt.zeroGrad();
      auto [idx, targets] = batch(me, s);
      lossOf(ddp.forward(idx), targets).backward();
      opt.step();
    }
    int64_t grads = 0;
    for (const Tensor& p : net->parameters()) grads += static_cast<int64_t>(p.grad().nbytes());
    report(pg, "zero1", before, opt.stateBytes(), grads);
    compare("zero1", snapshot(*net), reference);
  }
  {
    auto net = tinyGpt();
    const size_t before = settledLiveBytes(pg);
    ShardedDataParallel sdp(net, weft::nn::optim::decayGroups(net->namedParameters(), adamw()), pg);
    for (int s = 0; s < kSteps; ++s) {
      sdp.zeroGrad();
      auto [idx, targets] = batch(me, s);
      lossOf(sdp.forward(idx), targets).backward();
      if (s == 0) compareFirstGradients(sdp, *net, firstGrads);
      sdp.step();
    }
    report(pg, "zero2", before, sdp.stateBytes(), sdp.gradientShardBytes());
    compare("zero2", snapshot(*net), reference);
  }
  pg.barrier().wait();
}

// [2 ranks] Rank 1 trains one step, then dies (_exit(3)) in step 2: with "zero1" after its backward,
// before ZeroRedundancyOptimizer::step; with "zero2" after its forward, before backward. Rank 0 goes
// on and prints "failed in_ms T <ErrorType>: <message>" for the call that failed.
void runKill(ProcessGroupGloo& pg, bool stage2) {
  const int me = pg.rank();
  auto net = tinyGpt();
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ZeroRedundancyOptimizer> zero;
  std::unique_ptr<ShardedDataParallel> sdp;
  auto groups = weft::nn::optim::decayGroups(net->namedParameters(), adamw());
  if (stage2) {
    sdp = std::make_unique<ShardedDataParallel>(net, groups, pg);
  } else {
    ddp = std::make_unique<DistributedDataParallel>(net, pg);
    zero = std::make_unique<ZeroRedundancyOptimizer>(groups, pg);
  }
  const auto started = std::chrono::steady_clock::now();
  try {
    for (int s = 0; s < 2; ++s) {
      auto [idx, targets] = batch(me, s);
      Tensor logits = stage2 ? sdp->forward(idx) : ddp->forward(idx);
      Tensor loss = lossOf(logits, targets);
      if (me == 1 && s == 1 && stage2) ::_exit(3);
      loss.backward();
      if (me == 1 && s == 1 && !stage2) ::_exit(3);
      if (stage2) {
        sdp->step();
      } else {
        zero->step();
      }
    }
    sayLine("finished");
  } catch (const std::exception&) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
    sayLine("failed in_ms " + std::to_string(ms) + " " + weft::testing::describe(std::current_exception()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  return weft::testing::workerMain("zero_worker", {"gpt", "kill1", "kill2"}, argc, argv, [](const std::string& scenario) {
    weft::rpc::Options opt = weft::rpc::Options::fromEnv();
    gRank = opt.rank;
    say(weft::testing::prefix(gRank) + "pid " + std::to_string(::getpid()) + " started");
    std::unique_ptr<weft::rpc::StoreServer> server;
    if (opt.rank == 0) server = std::make_unique<weft::rpc::StoreServer>(weft::rpc::StoreServer::configFor(opt));
    weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));
    {
      auto pg = ProcessGroupGloo::create(store, opt.rank, opt.worldSize, {.timeout = std::chrono::milliseconds(20s)});
      if (scenario == "gpt") {
        runGpt(*pg);
      } else {
        runKill(*pg, scenario == "kill2");
        sayLine("done");
        return 0;  // its peer is gone: nobody to wait for
      }
    }
    // Rank 0 serves the store: it leaves once every other rank has said it is leaving.
    if (opt.rank == 0) {
      std::vector<std::string> left;
      for (int r = 1; r < opt.worldSize; ++r) left.push_back("zero_worker/left/" + std::to_string(r));
      store.wait(left, 20s);
    } else {
      store.set("zero_worker/left/" + std::to_string(opt.rank), "1");
    }
    sayLine("done");
    return 0;
  });
}
