// A program for the multiprocess tests of FullyShardedDataParallel (tests/collectives/fsdp_mp_test.cpp):
// one rank of a job, which finds its place through rpc::Options::fromEnv, builds a ProcessGroupGloo
// and trains a tiny GPT (vocab 64, block 16, 2 layers, 2 heads, width 32, no dropout) for 10 AdamW
// steps (one group, weight decay 0.1) on data of its own rank, twice:
//   ddp    DistributedDataParallel + nn::optim::AdamW (the reference),
//   fsdp   FullyShardedDataParallel (ZeRO-3) + nn::optim::AdamW over its shards.
// It prints "rank R numel N" (Ψ), "rank R mem fsdp held H shards P grads G state S padding D" (H:
// bytes held by tensors after the last step beyond those held before the model was built, through
// Storage::memoryStats; P, G, S: the shards', their gradients' and the optimizer state's bytes; D:
// padding elements over the units) and "rank R eq fsdp maxdiff_ppb D bitwise 0|1" (rank 0 only:
// the full state dict against DDP's parameters, in parts per billion of the largest magnitude).
//
// Scenario kill: see runKill.
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=2 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 fsdp_worker gpt
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
#include "collectives/fsdp.h"
#include "collectives/gloo/detail/group.h"
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
using weft::collectives::FullyShardedDataParallel;
using weft::collectives::ProcessGroupGloo;
using weft::testing::say;
using weft::testing::zero::adamw;
using weft::testing::zero::batch;
using weft::testing::zero::lossOf;
using weft::testing::zero::settledLiveBytes;
using weft::testing::zero::tinyGpt;

int gRank = 0;
constexpr int kSteps = 10;

void sayLine(const std::string& line) { say(weft::testing::prefix(gRank) + line); }


void runGpt(ProcessGroupGloo& pg) {
  const int me = pg.rank();
  std::vector<std::pair<std::string, Tensor>> reference;
  {
    auto net = tinyGpt();
    sayLine("numel " + std::to_string(net->numParameters()));
    DistributedDataParallel ddp(net, pg);
    weft::nn::optim::AdamW opt(net->parameters(), adamw());
    for (int s = 0; s < kSteps; ++s) {
      opt.zeroGrad();
      auto [idx, targets] = batch(me, s);
      lossOf(ddp.forward(idx), targets).backward();
      opt.step();
    }
    for (const auto& [name, p] : net->namedParameters()) reference.emplace_back(name, p.detach().clone());
  }
  const size_t before = settledLiveBytes(pg);
  auto net = tinyGpt();
  FullyShardedDataParallel fsdp(net, pg);
  weft::nn::optim::AdamW opt(fsdp.parameters(), adamw());
  for (int s = 0; s < kSteps; ++s) {
    opt.zeroGrad();
    auto [idx, targets] = batch(me, s);
    lossOf(fsdp.forward(idx), targets).backward();
    opt.step();
  }
  int64_t state = 0;
  for (const auto& st : opt.state()) {
    for (const auto& [name, b] : st.buffers) state += static_cast<int64_t>(b.nbytes());
  }
  int64_t padding = 0;
  for (const auto& u : fsdp.units()) padding += u.shardNumel * pg.size() - u.numel;
  const long long held = static_cast<long long>(settledLiveBytes(pg)) - static_cast<long long>(before);
  sayLine("mem fsdp held " + std::to_string(held) + " shards " + std::to_string(fsdp.shardBytes()) + " grads " +
          std::to_string(fsdp.gradientShardBytes()) + " state " + std::to_string(state) + " padding " +
          std::to_string(padding));
  weft::nn::StateDict full = fsdp.fullStateDict(0);
  if (me == 0) {
    double scale = 0, diff = 0;
    bool bitwise = true;
    for (const auto& [name, want] : reference) {
      auto a = full.at(name).toVector<float>();
      auto b = want.toVector<float>();
      bitwise = bitwise && a == b;
      for (size_t j = 0; j < a.size(); ++j) {
        scale = std::max(scale, std::fabs(static_cast<double>(b[j])));
        diff = std::max(diff, std::fabs(static_cast<double>(a[j]) - static_cast<double>(b[j])));
      }
    }
    sayLine("eq fsdp maxdiff_ppb " + std::to_string(static_cast<long long>(diff / scale * 1e9)) + " bitwise " +
            std::to_string(bitwise ? 1 : 0));
  }
  pg.barrier().wait();
}

// [2 ranks] Rank 1 trains one step, then dies (_exit(3)) in step 2 after its forward, before its
// backward. Rank 0 goes on and prints "failed in_ms T <ErrorType>: <message>" for the call that
// failed.
void runKill(ProcessGroupGloo& pg) {
  const int me = pg.rank();
  auto net = tinyGpt();
  FullyShardedDataParallel fsdp(net, pg);
  weft::nn::optim::AdamW opt(fsdp.parameters(), adamw());
  const auto started = std::chrono::steady_clock::now();
  try {
    for (int s = 0; s < 2; ++s) {
      opt.zeroGrad();
      auto [idx, targets] = batch(me, s);
      Tensor loss = lossOf(fsdp.forward(idx), targets);
      if (me == 1 && s == 1) ::_exit(3);
      loss.backward();
      opt.step();
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
  return weft::testing::workerMain("fsdp_worker", {"gpt", "kill"}, argc, argv, [](const std::string& scenario) {
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
        runKill(*pg);
        sayLine("done");
        return 0;  // its peer is gone: nobody to wait for
      }
    }
    // Rank 0 serves the store: it leaves once every other rank has said it is leaving.
    if (opt.rank == 0) {
      std::vector<std::string> left;
      for (int r = 1; r < opt.worldSize; ++r) left.push_back("fsdp_worker/left/" + std::to_string(r));
      store.wait(left, 20s);
    } else {
      store.set("fsdp_worker/left/" + std::to_string(opt.rank), "1");
    }
    sayLine("done");
    return 0;
  });
}
