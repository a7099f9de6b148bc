// parallel_layouts: the GPT of nn/transformer.h trained one step at a time under each parallel
// layout that collectives/ builds, on the processes weftrun starts (4 expected), side by side:
// step time and tokens/s, the peak memory a step adds on one rank, and the bytes communicated per
// step as counted (TpGroup, SpGroup and the DDP gradients) against the formula of the layout.
// Every layout processes the same global batch (4 sequences of --seq tokens); the unsplit
// baseline runs on rank 0 alone while the others wait.
//
//   weftrun -n 4 build/bench/parallel_layouts [--seq S] [--iters N] [--width C] [--layers L]
//   weftrun -n 4 build/bench/parallel_layouts --memory 1024,2048,4096
//
// --memory: for each sequence length, the peak memory of one step of one sequence on one rank
// unsplit, and per rank under Ulysses and ring (zig-zag) over every process, with the ratio
// unsplit / per rank (goal: about the number of processes).
//
// Memory is Storage::memoryStats's peak during the step less what was live before it (CPU
// tensors of this process: activations, gradients and temporaries). Communication is the payload
// of the collectives started (an allreduce ring sends 2·(n−1)/n of it per rank, an all-to-all
// (n−1)/n), per rank, forward and backward together.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/median_time.h"
#include "collectives/ddp.h"
#include "collectives/init.h"
#include "collectives/mesh.h"
#include "collectives/sequence_parallel_gpt.h"
#include "collectives/tensor_parallel_gpt.h"
#include "nn/transformer.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

namespace {

using namespace weft;
using namespace weft::collectives;

struct Config {
  int64_t seq = 256;
  int iters = 3;
  int64_t width = 64;
  int64_t layers = 2;
  std::vector<int64_t> memory;
};

constexpr int64_t kSequences = 4;
constexpr int64_t kVocab = 256;
constexpr int64_t kHeads = 8;

nn::GPTConfig gptConfig(const Config& c, int64_t block) {
  return nn::GPTConfig{.vocabSize = kVocab, .blockSize = block, .layers = c.layers, .heads = kHeads,
                       .width = c.width};
}

struct Row {
  std::string layout;
  double seconds = 0;
  double tokensPerSecond = 0;
  double peakMiB = 0;
  long long bytes = 0;
  long long theory = 0;
};

// The median step time of `step` over `iters` runs (none: 0) and the peak memory it adds, on this
// rank.
std::pair<double, double> measure(int iters, const std::function<void()>& step) {
  step();  // warm-up, and the first-pass allocations
  Storage::resetPeakBytes();
  const size_t before = Storage::memoryStats().liveBytes;
  step();
  const double peak = static_cast<double>(Storage::memoryStats().peakBytes - before) / (1024.0 * 1024.0);
  const double seconds = iters > 0 ? bench::medianSeconds(0, iters, step) : 0.0;
  return {seconds, peak};
}

int64_t paramBytes(nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += static_cast<int64_t>(p.nbytes());
  return n;
}

Tensor tokens(int64_t rows, int64_t seq, uint64_t seed) {
  Generator g(seed);
  return randint(0, kVocab, {rows, seq}, {.dtype = DType::Int64}, &g);
}

void printRow(const Row& r) {
  std::printf("%-22s %9.3f %11.0f %12.2f %14lld %14lld\n", r.layout.c_str(), r.seconds, r.tokensPerSecond, r.peakMiB,
              r.bytes, r.theory);
}

void runLayouts(ProcessGroup& world, const Config& c) {
  const int64_t s = c.seq, e = 4, bsc1 = s * c.width * e;  // one sequence's activations, bytes
  const double globalTokens = static_cast<double>(kSequences * s);
  const nn::GPTConfig cfg = gptConfig(c, s);
  Tensor idx = tokens(kSequences, s, 1), targets = tokens(kSequences, s, 2);
  std::vector<Row> rows;
  auto addRow = [&](Row r) {
    // The slowest rank's time, the largest rank's peak.
    Tensor t = fromVector(std::vector<double>{r.seconds, r.peakMiB}, {2});
    world.allReduce(t, ReduceOp::Max).wait();
    std::vector<double> v = t.toVector<double>();
    r.seconds = v[0];
    r.peakMiB = v[1];
    r.tokensPerSecond = globalTokens / r.seconds;
    rows.push_back(r);
  };

  {  // unsplit, rank 0 alone
    Row r{"unsplit (1 process)"};
    if (world.rank() == 0) {
      Generator g(7);
      nn::GPT model(cfg, &g);
      auto [sec, peak] = measure(c.iters, [&] {
        model.zeroGrad();
        model.loss(idx, targets).backward();
      });
      r.seconds = sec;
      r.peakMiB = peak;
    }
    addRow(r);
  }
  const int n = world.size();
  {  // dp over every process
    Mesh mesh(world, {{"dp", n}});
    Generator g(7);
    auto model = std::make_shared<nn::GPT>(cfg, &g);
    DistributedDataParallel ddp(model, mesh.group("dp"));
    const int64_t mine = kSequences / n, d = mesh.coordinate("dp");
    Tensor x = idx.narrow(0, d * mine, mine).contiguous(), y = targets.narrow(0, d * mine, mine).contiguous();
    auto [sec, peak] = measure(c.iters, [&] {
      model->zeroGrad();
      crossEntropy(ddp.forward(x).view({-1, kVocab}), y.reshape({-1})).backward();
    });
    addRow({"dp" + std::to_string(n), sec, 0, peak, paramBytes(*model), paramBytes(*model)});
  }
  auto tpRow = [&](const std::string& name, int dp, int tpSize) {
    Mesh mesh(world, {{"dp", dp}, {"tp", tpSize}});
    auto tp = std::make_shared<TpGroup>(mesh.group("tp"));
    auto model = std::make_shared<TensorParallelGPT>(tp, cfg);
    std::unique_ptr<DistributedDataParallel> ddp;
    if (dp > 1) ddp = std::make_unique<DistributedDataParallel>(model, mesh.group("dp"));
    const int64_t mine = kSequences / dp, d = mesh.coordinate("dp");
    Tensor x = idx.narrow(0, d * mine, mine).contiguous(), y = targets.narrow(0, d * mine, mine).contiguous();
    tp->resetTraffic();
    auto [sec, peak] = measure(c.iters, [&] {
      model->zeroGrad();
      model->loss(x, y).backward();
    });
    const TpGroup::Traffic t = tp->traffic();
    const long long steps = c.iters + 2;
    const long long grads = dp > 1 ? paramBytes(*model) : 0;
    const long long perStep = (t.forwardBytes + t.backwardBytes) / steps + grads;
    const long long theory =
        (2 * c.layers + 1) * mine * bsc1 * 2 + 3 * mine * s * e + grads;  // blocks, embedding/head, loss
    addRow({name, sec, 0, peak, perStep, theory});
  };
  tpRow("tp" + std::to_string(n), 1, n);
  if (n % 2 == 0 && n > 2) tpRow("dp" + std::to_string(n / 2) + " x tp2", n / 2, 2);
  auto spRow = [&](const std::string& name, SpMode mode) {
    const bool hybrid = mode == SpMode::Hybrid;
    std::vector<MeshDim> dims = hybrid ? std::vector<MeshDim>{{"ring", n / 2}, {"ulysses", 2}}
                                       : std::vector<MeshDim>{{"sp", n}};
    Mesh mesh(world, dims);
    SpGroup a(mesh.group(hybrid ? "ring" : "sp"));
    std::unique_ptr<SpGroup> b;
    if (hybrid) b = std::make_unique<SpGroup>(mesh.group("ulysses"));
    SpOptions o{.mode = mode, .layout = RingLayout::ZigZag};
    if (mode == SpMode::Ulysses) o.ulysses = &a;
    if (mode == SpMode::Ring) o.ring = &a;
    if (hybrid) {
      o.ring = &a;
      o.ulysses = b.get();
    }
    Generator g(7);
    auto model = std::make_shared<SequenceParallelGPT>(cfg, o);
    Tensor x = model->shard(idx), y = model->shard(targets, -100);
    auto [sec, peak] = measure(c.iters, [&] {
      model->zeroGrad();
      model->loss(x, y).backward();
      model->allReduceGradients();
    });
    const long long steps = c.iters + 2;
    long long counted = 0;
    for (SpGroup* grp : {o.ulysses, o.ring}) {
      if (!grp) continue;
      const SpGroup::Traffic t = grp->traffic();
      const SpGroup::Transfers f = grp->transfers();
      counted += t.forwardBytes + t.backwardBytes + f.forwardBytes + f.backwardBytes;
    }
    const long long grads = paramBytes(*model) * (hybrid ? 2 : 1);  // one allreduce per group
    const long long local = kSequences * (s / n) * c.width * e;     // this rank's activations
    long long theory = grads;
    if (mode == SpMode::Ulysses) theory += c.layers * 8 * local;   // 4 all-to-alls each way
    // Ring over R ranks: forward R - 1 blocks of k and v; backward R - 1 blocks of k, v and
    // their gradients, then the gradients home.
    auto ring = [&](long long r) { return c.layers * ((r - 1) * 2 * local + (r - 1) * 4 * local + 2 * local); };
    if (mode == SpMode::Ring) theory += ring(n);
    if (hybrid) theory += c.layers * 8 * local + ring(n / 2);
    addRow({name, sec, 0, peak, counted / steps + grads, theory});
  };
  if (n % 2 == 0 && n > 2) {  // tp2 x Ulysses over the rest
    const int spSize = n / 2;
    Mesh mesh(world, {{"sp", spSize}, {"tp", 2}});
    auto tp = std::make_shared<TpGroup>(mesh.group("tp"));
    SpGroup sp(mesh.group("sp"));
    SpOptions o{.mode = SpMode::Ulysses, .ulysses = &sp};
    auto model = std::make_shared<TensorParallelGPT>(tp, cfg, o);
    Tensor x = model->shardTokens(idx), y = model->shardTokens(targets, -100);
    tp->resetTraffic();
    auto [sec, peak] = measure(c.iters, [&] {
      model->zeroGrad();
      model->loss(x, y).backward();
      model->allReduceGradients();
    });
    const long long steps = c.iters + 2;
    const TpGroup::Traffic t = tp->traffic();
    const SpGroup::Traffic a = sp.traffic();
    const long long grads = paramBytes(*model);
    const long long tokens = s / spSize;  // per sequence on this rank
    const long long act = kSequences * tokens * c.width * e;
    const long long theory = (2 * c.layers + 1) * act * 2 + 3 * kSequences * tokens * e  // tp
                             + c.layers * 8 * act / 2                                     // Ulysses, heads/2
                             + grads;
    addRow({"sp ulysses" + std::to_string(spSize) + " x tp2", sec, 0, peak,
            (t.forwardBytes + t.backwardBytes + a.forwardBytes + a.backwardBytes) / steps + grads, theory});
  }
  spRow("sp ulysses" + std::to_string(n), SpMode::Ulysses);
  spRow("sp ring" + std::to_string(n) + " zigzag", SpMode::Ring);
  if (n % 2 == 0 && n > 2) spRow("sp ring" + std::to_string(n / 2) + " x ulysses2", SpMode::Hybrid);

  if (world.rank() == 0) {
    std::printf("parallel_layouts: %d processes, GPT width %lld, %lld layers, %lld heads, vocabulary %lld, "
                "float32; a step is %lld sequences of %lld tokens (forward, backward, gradient sync)\n",
                n, static_cast<long long>(c.width), static_cast<long long>(c.layers),
                static_cast<long long>(kHeads), static_cast<long long>(kVocab), static_cast<long long>(kSequences),
                static_cast<long long>(s));
    std::printf("%-22s %9s %11s %12s %14s %14s\n", "layout", "step s", "tokens/s", "peak MiB/rk", "bytes/step/rk",
                "formula");
    for (const Row& r : rows) printRow(r);
  }
}

void runMemory(ProcessGroup& world, const Config& c) {
  const int n = world.size();
  if (world.rank() == 0) {
    std::printf("parallel_layouts --memory: one sequence, GPT width %lld, %lld layers, %lld heads, float32; peak MiB "
                "a step adds on one rank\n",
                static_cast<long long>(c.width), static_cast<long long>(c.layers), static_cast<long long>(kHeads));
    std::printf("%8s %12s %14s %14s %10s %10s\n", "seq", "unsplit", "ulysses/rank", "ring/rank", "ratio U", "ratio R");
  }
  for (int64_t s : c.memory) {
    const nn::GPTConfig cfg = gptConfig(c, s);
    Tensor idx = tokens(1, s, 3), targets = tokens(1, s, 4);
    double unsplit = 0;
    if (world.rank() == 0) {
      Generator g(7);
      nn::GPT model(cfg, &g);
      unsplit = measure(0, [&] {
        model.zeroGrad();
        model.loss(idx, targets).backward();
      }).second;
    }
    std::vector<double> per;
    for (SpMode mode : {SpMode::Ulysses, SpMode::Ring}) {
      Mesh mesh(world, {{"sp", n}});
      SpGroup sp(mesh.group("sp"));
      SpOptions o{.mode = mode, .layout = RingLayout::ZigZag};
      (mode == SpMode::Ulysses ? o.ulysses : o.ring) = &sp;
      auto model = std::make_shared<SequenceParallelGPT>(cfg, o);
      Tensor x = model->shard(idx), y = model->shard(targets, -100);
      double peak = measure(0, [&] {
        model->zeroGrad();
        model->loss(x, y).backward();
        model->allReduceGradients();
      }).second;
      Tensor t = fromVector(std::vector<double>{peak}, {1});
      world.allReduce(t, ReduceOp::Max).wait();
      per.push_back(t.item<double>());
    }
    if (world.rank() == 0) {
      std::printf("%8lld %12.2f %14.2f %14.2f %10.2f %10.2f\n", static_cast<long long>(s), unsplit, per[0], per[1],
                  unsplit / per[0], unsplit / per[1]);
    }
    world.barrier().wait();
  }
}

const char* kUsage =
    "usage: parallel_layouts [--seq S] [--iters N] [--width C] [--layers L] [--memory S1,S2,...]\n"
    "  run under weftrun (weftrun -n 4 parallel_layouts); a lone process is a world of 1\n";

}  // namespace

int main(int argc, char** argv) {
  Config c;
  bench::Flags flags;
  flags.onValue("--seq", [&](const std::string& v) { c.seq = bench::intFlag("--seq", v, 8, 1 << 16); });
  flags.onValue("--iters", [&](const std::string& v) { c.iters = bench::intFlag("--iters", v, 1, 1000); });
  flags.onValue("--width", [&](const std::string& v) { c.width = bench::intFlag("--width", v, kHeads, 4096); });
  flags.onValue("--layers", [&](const std::string& v) { c.layers = bench::intFlag("--layers", v, 1, 64); });
  flags.onValue("--memory", [&](const std::string& v) {
    std::stringstream in(v);
    std::string part;
    while (std::getline(in, part, ',')) c.memory.push_back(bench::intFlag("--memory", part, 8, 1 << 16));
  });
  if (!bench::parseFlagsOrUsage(flags, argc, argv, "parallel_layouts", kUsage)) return 2;
  auto world = init();
  if (c.memory.empty()) {
    runLayouts(*world, c);
  } else {
    runMemory(*world, c);
  }
  return 0;
}
