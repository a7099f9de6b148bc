// parallel_layouts: the GPT of nn/transformer.h trained one step at a time under each parallel
// layout that collectives/ builds, on the processes weftrun starts (4 expected), side by side:
// step time and tokens/s, the peak memory a step adds on one rank, and the bytes communicated per
// step as counted (TpGroup, SpGroup, the DDP gradients, and the dp and pp groups' trafficStats)
// against the formula of the layout. Every layout processes the same global batch (4 sequences
// of --seq tokens); the unsplit baseline runs on rank 0 alone while the others wait. The layouts:
// unsplit, dp4, tp4, dp2 x tp2, sp ulysses2 x tp2, sp ulysses4, sp ring4 zigzag, sp ring2 x
// ulysses2, fsdp4 (FullyShardedDataParallel over every process, units the blocks and the root),
// fsdp dp2 x tp2 (FSDP over dp around a TensorParallelGPT, its blocks the units), and on 4
// processes pp2 x dp2 and pp2 x tp2 (pipeline::PipelineExecutor, 1F1B, two stages of
// pipeline::gptLayers of an nn::GPT or a TensorParallelGPT cut by parameter count, wte tied
// between them; M = the replica's sequences, micro-batches of b = 1 sequence: M = 2 with dp2,
// M = 4 with tp2).
//
//   weftrun -n 4 build/bench/parallel_layouts [--seq S] [--iters N] [--width C] [--layers L]
//   weftrun -n 4 build/bench/parallel_layouts --memory 1024,2048,4096,8192 --heads 4
//
// --memory: how the longest sequence one rank can hold grows with the sequence-parallel group.
// For each sequence length, the peak memory of one training step (forward, backward, gradient
// sum) of one sequence unsplit on one rank, and per rank under Ulysses and ring (zig-zag) over
// groups of 2, 4, ... processes (every power of two dividing the job and the heads; groups
// smaller than the job run side by side). One model serves every length (its position table is
// the longest's), so that the model and its gradients are the same throughout. Then, for a
// per-rank budget of the unsplit model's peak at --budget-seq tokens (default 2048), the longest
// sequence within it per group size, interpolated between the measured lengths, and its ratio to
// linear scaling (P times the unsplit model's; goal >= 0.9).
//
//   WEFT_NUM_THREADS=1 weftrun -n 4 parallel_layouts --overlap --seq 8192 --heads 8 --width 128 --iters 7
//
// --overlap: ring attention against Ulysses at equal compute: the same causal attention over --seq
// tokens split over every process (batch 1, --heads heads of --width / --heads), forward and
// backward, timed as Ulysses, as the zig-zag ring with its transfers overlapped with the compute,
// and as the same ring with each step's transfers after its compute (RingOptions::overlap =
// false: compute plus communication); then the GPT's training step (--width, --layers) under
// each. Rounds alternate the variants, each between barriers; a round is the slowest rank's time,
// and the medians over --iters rounds are printed with the ratios (goal: ring <= 1.2 x Ulysses)
// and the load average before and after. Compute dominates from a few thousand tokens per rank;
// on a shared machine the figures move with the load, so take them on a quiet one. Equal compute
// also needs the same attention kernel path: with fewer than 2 x threads heads per rank (Ulysses
// holds H/P), the kernel's backward runs in two passes and recomputes the scores, which the bench
// notes; the command above gives each Ulysses rank 2 heads and each process one kernel thread.
//
// Memory is Storage::memoryStats's peak during the step less what was live before it (CPU
// tensors of this process: activations, gradients and temporaries). Communication is rank 0's,
// forward and backward together. For the tp and sp groups and DDP it is the payload of the
// collectives started (an allreduce ring sends 2·(n−1)/n of it per rank, an all-to-all
// (n−1)/n). For FSDP's dp group and the pipeline's pp and dp groups it is what the rank put on the
// wire (ProcessGroup::trafficStats().bytesSent), whose formula counts the gloo backend's framing
// too: every collective sends each peer a call header of 80 bytes (the call exchange), and every
// point-to-point transfer costs the sender a 48-byte size header and the receiver a 48-byte
// verdict. Per step, on N ranks of FSDP's group:
//   Σ over units u of ops_u · (N−1) · (4·n'_u/N + 80),
// n'_u the unit's padded elements (N·shardNumel), ops_u = 3 for a block (all-gather before its
// forward and before its backward, reduce-scatter of its gradients; each sends (N−1)/N of the
// padded bytes) and 2 for the root unit (kept gathered from its forward through its backward);
// with tp, plus tp's payload below on the rank's sequences. Per step, on pipeline stage 0 of two
// with M micro-batches of b sequences, its activations and their gradients passing through shared
// memory (pipeline/executor.h, "Shared memory"; counted from StepStats::sharedMemoryBytes, after a
// first step that sets the links up):
//   M·(b·S·C·4 + 128) (the activations, each message with its header; stage 1 writes the same bytes
//   of their gradients back)
//   + 4·|wte| (its tied gradient, this tp rank's rows with tp, sent to the last stage)
//   + 48 + 48 (the tied gradient's size header and the verdict on the peer's)
// With WEFT_PIPELINE_SHM=0, through the group:
//   80 (the activation's shape, [dtype, ndim, 8 sizes] of Int64, once)
//   + M·b·S·C·4 (the activations; stage 1 sends the same bytes of their gradients back)
//   + 4·|wte| (as above)
//   + 48·(M + 2) (size headers: shape, activations, wte) + 48·(M + 1) (verdicts: gradients, wte)
//   + with dp2: 4·|stage's parameters| + 80 (their gradients averaged over 2 replicas: any
//     allreduce algorithm, or the call exchange carrying it, sends S to the one peer)
//   + with tp2: tp's payload for the stage's layers, per sequence the embedding's allreduce of
//     S·C·4 (forward), each block's 4 (2 forward, 2 backward), the head's 1 (backward) and the
//     loss's 3 of S·4.
#include <algorithm>
#include <exception>
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
#include "collectives/fsdp.h"
#include "collectives/init.h"
#include "collectives/mesh.h"
#include "collectives/sequence_parallel_gpt.h"
#include "collectives/tensor_parallel_gpt.h"
#include "kernels/cpu/parallel.h"
#include "nn/transformer.h"
#include "pipeline/executor.h"
#include "pipeline/shm_ring.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"
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
  int64_t heads = 8;
  std::vector<int64_t> memory;
  int64_t budgetSeq = 2048;
};

constexpr int64_t kSequences = 4;
// What the gloo backend sends besides the payload (see the file's comment): the call exchange's
// header, from every rank to every peer, for each collective; each point-to-point transfer's
// size header from the sender and the verdict that answers it.
constexpr long long kCallHeaderBytes = 10 * 8;
constexpr long long kP2pBytes = 6 * 8;
// The pipeline's shape message: [dtype, ndim, 8 sizes] of Int64.
constexpr long long kShapeBytes = 10 * 8;
// The header of a pipeline stage's message through shared memory (pipeline/shm_ring.h).
constexpr long long kRingHeaderBytes = static_cast<long long>(weft::pipeline::detail::ShmRing::kSlotHeaderBytes);
constexpr int64_t kVocab = 256;

nn::GPTConfig gptConfig(const Config& c, int64_t block) {
  return nn::GPTConfig{.vocabSize = kVocab, .blockSize = block, .layers = c.layers, .heads = c.heads,
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

  // FSDP over a group of N: every unit's shards all-gathered before its forward and, but for the
  // root (kept from its forward through its backward), again before its backward; its gradients
  // reduce-scattered once. Each sends (N - 1)/N of the unit's padded bytes from this rank.
  auto fsdpTheory = [](const FullyShardedDataParallel& f, int groupSize) {
    long long bytes = 0;
    for (const FullyShardedDataParallel::UnitInfo& u : f.units()) {
      const long long ops = u.name.empty() ? 2 : 3;
      bytes += ops * (groupSize - 1) * (u.shardNumel * 4 + kCallHeaderBytes);
    }
    return bytes;
  };
  const long long steps = c.iters + 2;
  {  // fsdp over every process
    Mesh mesh(world, {{"dp", n}});
    ProcessGroup& dp = mesh.group("dp");
    Generator g(7);
    auto model = std::make_shared<nn::GPT>(cfg, &g);
    FullyShardedDataParallel fsdp(model, dp);
    const int64_t mine = kSequences / n, d = mesh.coordinate("dp");
    Tensor x = idx.narrow(0, d * mine, mine).contiguous(), y = targets.narrow(0, d * mine, mine).contiguous();
    dp.resetTrafficStats();
    auto [sec, peak] = measure(c.iters, [&] {
      fsdp.zeroGrad();
      crossEntropy(fsdp.forward(x).view({-1, kVocab}), y.reshape({-1})).backward();
    });
    addRow({"fsdp" + std::to_string(n), sec, 0, peak, dp.trafficStats().bytesSent / steps, fsdpTheory(fsdp, n)});
  }
  if (n % 2 == 0 && n > 2) {  // fsdp over dp around a tensor-parallel GPT
    const int dpSize = n / 2;
    Mesh mesh(world, {{"dp", dpSize}, {"tp", 2}});
    ProcessGroup& dp = mesh.group("dp");
    auto tp = std::make_shared<TpGroup>(mesh.group("tp"));
    auto model = std::make_shared<TensorParallelGPT>(tp, cfg);
    FullyShardedDataParallel::Options o;
    for (const auto& b : model->blocks()) o.units.push_back(b);
    FullyShardedDataParallel fsdp(model, dp, o);
    const int64_t mine = kSequences / dpSize, d = mesh.coordinate("dp");
    Tensor x = idx.narrow(0, d * mine, mine).contiguous(), y = targets.narrow(0, d * mine, mine).contiguous();
    dp.resetTrafficStats();
    tp->resetTraffic();
    auto [sec, peak] = measure(c.iters, [&] {
      fsdp.zeroGrad();
      model->lossOfLogits(fsdp.forward(x), y).backward();
    });
    const TpGroup::Traffic t = tp->traffic();
    const long long counted = (dp.trafficStats().bytesSent + t.forwardBytes + t.backwardBytes) / steps;
    const long long theory = fsdpTheory(fsdp, dpSize) + (2 * c.layers + 1) * mine * bsc1 * 2 + 3 * mine * s * e;
    addRow({"fsdp dp" + std::to_string(dpSize) + " x tp2", sec, 0, peak, counted, theory});
  }
  // Two pipeline stages (the GPT's layers cut by parameter count), 1F1B over M micro-batches of
  // one sequence each; the bytes are stage 0's (rank 0's), see the file's comment.
  auto ppRow = [&](const std::string& name, int other, bool tensorParallel) {
    std::vector<MeshDim> dims{{"pp", 2}};
    dims.insert(tensorParallel ? dims.end() : dims.begin(), MeshDim{tensorParallel ? "tp" : "dp", other});
    Mesh mesh(world, dims);
    ProcessGroup& pp = mesh.group("pp");
    ProcessGroup* dp = tensorParallel ? nullptr : &mesh.group("dp");
    const int stage = pp.rank();
    const int replicas = tensorParallel ? 1 : other;
    const int64_t mine = kSequences / replicas, d = tensorParallel ? 0 : mesh.coordinate("dp");
    const int microbatches = static_cast<int>(mine);
    Tensor x = idx.narrow(0, d * mine, mine).contiguous(), y = targets.narrow(0, d * mine, mine).contiguous();
    std::shared_ptr<TpGroup> tp;
    std::shared_ptr<TensorParallelGPT> tpModel;
    std::shared_ptr<nn::GPT> model;
    std::shared_ptr<nn::Sequential> layers;
    std::vector<pipeline::TiedParameter> tied;
    pipeline::LossFn loss = [](const Tensor& logits, const Tensor& target) {
      return crossEntropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
    };
    if (tensorParallel) {
      tp = std::make_shared<TpGroup>(mesh.group("tp"));
      tpModel = std::make_shared<TensorParallelGPT>(tp, cfg);
      layers = pipeline::gptLayers(tpModel);
      tied = pipeline::gptTiedParameters(*tpModel, stage, 2);
      loss = [tpModel](const Tensor& logits, const Tensor& target) { return tpModel->lossOfLogits(logits, target); };
    } else {
      Generator g(7);
      model = std::make_shared<nn::GPT>(cfg, &g);
      layers = pipeline::gptLayers(model);
      tied = pipeline::gptTiedParameters(*model, stage, 2);
    }
    const std::vector<size_t> cuts = pipeline::cutsByParameterCount(*layers, 2);
    std::shared_ptr<nn::Sequential> ours = pipeline::splitSequential(*layers, cuts)[static_cast<size_t>(stage)];
    pipeline::PipelineExecutor executor(pp, ours, pipeline::oneFOneB(2, microbatches), loss,
                                        {.tied = tied, .dataParallel = dp});
    // A first step sets up the stages' shared-memory links (once per executor), not counted.
    ours->zeroGrad();
    executor.step(x, y);
    const bool rings = executor.lastStats().sharedMemoryBytes > 0;
    pp.resetTrafficStats();
    if (dp) dp->resetTrafficStats();
    if (tp) tp->resetTraffic();
    long long ringBytes = 0;
    auto [sec, peak] = measure(c.iters, [&] {
      ours->zeroGrad();
      executor.step(x, y);
      ringBytes += static_cast<long long>(executor.lastStats().sharedMemoryBytes);
    });
    long long counted = pp.trafficStats().bytesSent + (dp ? dp->trafficStats().bytesSent : 0) + ringBytes;
    if (tp) counted += tp->traffic().forwardBytes + tp->traffic().backwardBytes;
    counted /= steps;
    long long theory = 0;
    if (rings) {
      // Through shared memory: M messages of the activations (stage 0) or their gradients (stage 1),
      // each with its header; both stages send and answer the tied gradient through the group.
      theory = microbatches * (bsc1 + kRingHeaderBytes) + 2 * kP2pBytes;
    } else {
      // Stage 0 sends the shape once and M activations, and answers M gradients; stage 1 answers
      // the shape and M activations, and sends M gradients; both send and answer the tied gradient.
      const long long sends = stage == 0 ? microbatches + 1 : microbatches;
      const long long answers = stage == 0 ? microbatches : microbatches + 1;
      theory = (stage == 0 ? kShapeBytes : 0) + microbatches * bsc1 + (sends + 1 + answers + 1) * kP2pBytes;
    }
    for (const pipeline::TiedParameter& t : tied) theory += static_cast<long long>(t.parameter.nbytes());
    if (dp) theory += paramBytes(*ours) + (stage == 1 ? e : 0) + kCallHeaderBytes;  // 2 ranks: any algorithm
    if (tp) {
      // The stage's layers: the embedding's allreduce forward, each block's two forward and two
      // backward, the head's backward one and the loss's.
      const size_t first = stage == 0 ? 0 : cuts[0], end = stage == 0 ? cuts[0] : layers->size();
      for (size_t i = first; i < end; ++i) {
        const bool block = i > 0 && i + 1 < layers->size();
        theory += block ? mine * bsc1 * 4 : mine * bsc1;
        if (i + 1 == layers->size()) theory += 3 * mine * s * e;
      }
    }
    addRow({name, sec, 0, peak, counted, theory});
  };
  if (n == 4) {
    ppRow("pp2 x dp2", 2, false);
    ppRow("pp2 x tp2", 2, true);
  }

  if (world.rank() == 0) {
    std::printf("parallel_layouts: %d processes, GPT width %lld, %lld layers, %lld heads, vocabulary %lld, "
                "float32; a step is %lld sequences of %lld tokens (forward, backward, gradient sync)\n",
                n, static_cast<long long>(c.width), static_cast<long long>(c.layers),
                static_cast<long long>(c.heads), static_cast<long long>(kVocab), static_cast<long long>(kSequences),
                static_cast<long long>(s));
    std::printf("%-22s %9s %11s %12s %14s %14s\n", "layout", "step s", "tokens/s", "peak MiB/rk", "bytes/step/rk",
                "formula");
    for (const Row& r : rows) printRow(r);
  }
}

// The per-rank peak of one training step of `model` on (x, y): the total bytes of this process's
// tensors (the model, its gradients and the step's activations and temporaries) and what the step
// adds to what was live before it, in MiB.
struct Peak {
  double total = 0;
  double step = 0;
};

template <class Step>
Peak peakOf(const Step& step) {
  step();  // the gradients exist from here on, as in training
  Storage::resetPeakBytes();
  const size_t before = Storage::memoryStats().liveBytes;
  step();
  const size_t peak = Storage::memoryStats().peakBytes;
  return {static_cast<double>(peak) / (1024.0 * 1024.0), static_cast<double>(peak - before) / (1024.0 * 1024.0)};
}

// The largest sequence whose peak fits `budget`, by linear interpolation between the measured
// (seq, peak) points, extrapolated from the last two past the longest; `beyond` says so.
double longestWithin(const std::vector<int64_t>& seqs, const std::vector<double>& peaks, double budget, bool& beyond) {
  beyond = false;
  if (peaks.empty() || budget < peaks[0]) return 0;
  for (size_t i = 0; i + 1 < seqs.size(); ++i) {
    if (budget <= peaks[i + 1]) {
      const double f = (budget - peaks[i]) / std::max(peaks[i + 1] - peaks[i], 1e-12);
      return static_cast<double>(seqs[i]) + f * static_cast<double>(seqs[i + 1] - seqs[i]);
    }
  }
  if (seqs.size() < 2) return static_cast<double>(seqs[0]);
  beyond = true;
  const size_t k = seqs.size() - 1;
  const double slope = (peaks[k] - peaks[k - 1]) / static_cast<double>(seqs[k] - seqs[k - 1]);
  return static_cast<double>(seqs[k]) + (budget - peaks[k]) / std::max(slope, 1e-12);
}

void runMemory(ProcessGroup& world, const Config& c) {
  const int n = world.size();
  std::vector<int64_t> seqs = c.memory;
  std::sort(seqs.begin(), seqs.end());
  // One model for every length: its position table is the longest sequence's, so that the model
  // and its gradients are the same at every length and the peaks differ by activations only.
  const int64_t block = seqs.back();
  const nn::GPTConfig cfg = gptConfig(c, block);
  std::vector<int> sizes;  // the sequence-parallel group sizes: 2, 4, ... dividing the job
  for (int p = 2; p <= n; p *= 2)
    if (n % p == 0 && c.heads % p == 0) sizes.push_back(p);
  const SpMode modes[] = {SpMode::Ulysses, SpMode::Ring};
  // peaks[0]: unsplit; peaks[1 + 2·i + m]: group size sizes[i], mode m; per sequence length.
  std::vector<std::vector<Peak>> peaks(1 + 2 * sizes.size());
  for (int64_t s : seqs) {
    Tensor idx = tokens(1, s, 3), targets = tokens(1, s, 4);
    Peak unsplit;
    if (world.rank() == 0) {
      Generator g(7);
      nn::GPT model(cfg, &g);
      unsplit = peakOf([&] {
        model.zeroGrad();
        model.loss(idx, targets).backward();
      });
    }
    peaks[0].push_back(unsplit);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int p = sizes[i];
      std::vector<MeshDim> dims{{"sp", p}};
      if (p < n) dims.insert(dims.begin(), MeshDim{"replica", n / p});
      for (int m = 0; m < 2; ++m) {
        Mesh mesh(world, dims);
        SpGroup sp(mesh.group("sp"));
        SpOptions o{.mode = modes[m], .layout = RingLayout::ZigZag};
        (modes[m] == SpMode::Ulysses ? o.ulysses : o.ring) = &sp;
        Peak peak;
        {
          auto model = std::make_shared<SequenceParallelGPT>(cfg, o);
          Tensor x = model->shard(idx), y = model->shard(targets, -100);
          peak = peakOf([&] {
            model->zeroGrad();
            model->loss(x, y).backward();
            model->allReduceGradients();
          });
        }
        // The largest rank's.
        Tensor t = fromVector(std::vector<double>{peak.total, peak.step}, {2});
        world.allReduce(t, ReduceOp::Max).wait();
        const std::vector<double> v = t.toVector<double>();
        peaks[1 + 2 * i + static_cast<size_t>(m)].push_back({v[0], v[1]});
      }
    }
    world.barrier().wait();
  }
  if (world.rank() != 0) return;

  std::printf("parallel_layouts --memory: one sequence, GPT width %lld, %lld layers, %lld heads, position table of "
              "%lld, float32; per rank (the largest), MiB: the process's tensors at the step's peak (model, "
              "gradients, activations) and, in brackets, what the step adds\n",
              static_cast<long long>(c.width), static_cast<long long>(c.layers), static_cast<long long>(c.heads),
              static_cast<long long>(block));
  std::string header = "     seq            unsplit";
  for (int p : sizes) {
    char col[80];
    std::snprintf(col, sizeof col, " %18s %18s", ("ulysses" + std::to_string(p)).c_str(),
                  ("ring" + std::to_string(p) + " zigzag").c_str());
    header += col;
  }
  std::printf("%s\n", header.c_str());
  for (size_t j = 0; j < seqs.size(); ++j) {
    std::printf("%8lld", static_cast<long long>(seqs[j]));
    for (const auto& column : peaks) std::printf("  %8.2f (%6.2f)", column[j].total, column[j].step);
    std::printf("\n");
  }

  // The budget: the unsplit model's peak at --budget-seq; the longest sequence within it per
  // group size, against linear scaling (P times the unsplit model's).
  auto totals = [](const std::vector<Peak>& column) {
    std::vector<double> t;
    for (const Peak& p : column) t.push_back(p.total);
    return t;
  };
  bool beyond = false;
  const std::vector<double> unsplitTotals = totals(peaks[0]);
  const double budget =
      unsplitTotals[static_cast<size_t>(std::find(seqs.begin(), seqs.end(), c.budgetSeq) - seqs.begin())];
  const double single = longestWithin(seqs, unsplitTotals, budget, beyond);
  std::printf("\nbudget per rank: %.2f MiB (the unsplit model's peak at %lld tokens); the longest sequence within "
              "it (* extrapolated past %lld)\n",
              budget, static_cast<long long>(c.budgetSeq), static_cast<long long>(seqs.back()));
  std::printf("%-18s %6s %12s %12s %20s\n", "layout", "ranks", "longest seq", "linear", "ratio (goal >= 0.9)");
  std::printf("%-18s %6d %12.0f %12.0f %20.3f\n", "unsplit", 1, single, single, 1.0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int m = 0; m < 2; ++m) {
      const double longest = longestWithin(seqs, totals(peaks[1 + 2 * i + static_cast<size_t>(m)]), budget, beyond);
      const std::string name = (m == 0 ? "ulysses" : "ring zigzag");
      std::printf("%-18s %6d %11.0f%s %12.0f %20.3f\n", name.c_str(), sizes[i], longest, beyond ? "*" : " ",
                  single * sizes[i], longest / (single * sizes[i]));
    }
  }
}

// The load average of the machine, as /proc/loadavg gives it ("?" where it cannot be read).
std::string loadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  char buf[64] = "";
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string line = ok ? buf : "?";
  // The 1-, 5- and 15-minute averages.
  size_t cut = 0;
  for (int fields = 0; fields < 3 && cut != std::string::npos; ++fields) cut = line.find(' ', cut + 1);
  return line.substr(0, cut);
}

// Times `variants` in turn, `rounds` times, each run between barriers; a round's time is the
// slowest rank's. Returns each variant's median.
std::vector<double> medianRounds(ProcessGroup& world, int rounds, const std::vector<std::function<void()>>& variants) {
  for (const auto& v : variants) v();  // warm-up
  std::vector<std::vector<double>> times(variants.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < variants.size(); ++i) {
      world.barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      variants[i]();
      Tensor t = fromVector(
          std::vector<double>{std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}, {1});
      world.allReduce(t, ReduceOp::Max).wait();
      times[i].push_back(t.item<double>());
    }
  }
  std::vector<double> medians;
  for (auto& t : times) {
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

void runOverlap(ProcessGroup& world, const Config& c) {
  const int n = world.size();
  const int64_t s = c.seq, h = c.heads, d = c.width / c.heads, local = s / n;
  const std::string loadBefore = loadAverage();
  Mesh mesh(world, {{"sp", n}});
  SpGroup sp(mesh.group("sp"));

  // Attention alone: this rank's q, k, v [1, H, S/P, D] under each layout (Ulysses contiguous,
  // the ring zig-zag), forward and backward through a fixed output gradient.
  Generator g(11 + static_cast<uint64_t>(world.rank()));
  auto input = [&] { return randn({1, h, local, d}, {}, &g).requiresGrad_(true); };
  Tensor q = input(), k = input(), v = input();
  Tensor gradOut = randn({1, h, local, d}, {}, &g);
  auto backwardOf = [&](const Tensor& y) {
    for (const Tensor* t : {&q, &k, &v}) t->setGrad(Tensor());
    y.backward(gradOut);
  };
  auto ring = [&](bool overlap) {
    return [&, overlap] {
      backwardOf(ringAttention(sp, q, k, v, {.causal = true, .layout = RingLayout::ZigZag, .overlap = overlap}));
    };
  };
  const std::vector<double> attention = medianRounds(
      world, c.iters,
      {[&] { backwardOf(ulyssesAttention(sp, q, k, v, {.causal = true})); }, ring(true), ring(false)});

  // The model's training step (one sequence): the same attention inside the GPT of --width and
  // --layers.
  const nn::GPTConfig cfg = gptConfig(c, s);
  Tensor idx = tokens(1, s, 5), targets = tokens(1, s, 6);
  std::vector<std::function<void()>> steps;
  std::vector<std::shared_ptr<SequenceParallelGPT>> models;
  std::vector<std::pair<Tensor, Tensor>> shards;
  for (SpMode mode : {SpMode::Ulysses, SpMode::Ring}) {
    SpOptions o{.mode = mode, .layout = RingLayout::ZigZag};
    (mode == SpMode::Ulysses ? o.ulysses : o.ring) = &sp;
    models.push_back(std::make_shared<SequenceParallelGPT>(cfg, o));
    shards.emplace_back(models.back()->shard(idx), models.back()->shard(targets, -100));
  }
  for (size_t i = 0; i < models.size(); ++i) {
    steps.push_back([&, i] {
      models[i]->zeroGrad();
      models[i]->loss(shards[i].first, shards[i].second).backward();
      models[i]->allReduceGradients();
    });
  }
  const std::vector<double> model = medianRounds(world, c.iters, steps);
  if (world.rank() != 0) return;

  std::printf("parallel_layouts --overlap: %d processes of %d kernel threads, causal attention over %lld tokens (%lld "
              "per rank), batch 1, %lld heads of %lld, float32; forward and backward; median of %d rounds, a round "
              "the slowest rank's time; load average %s before, %s after\n",
              n, kernels::cpu::numThreads(), static_cast<long long>(s), static_cast<long long>(local),
              static_cast<long long>(h), static_cast<long long>(d), c.iters, loadBefore.c_str(),
              loadAverage().c_str());
  if (h / n < 2 * kernels::cpu::numThreads()) {
    std::printf("note: Ulysses holds %lld heads per rank, fewer than twice the %d kernel threads, so its attention "
                "backward takes the kernel's two-pass path (scores recomputed) where the ring's may not: for equal "
                "kernel work give --heads >= %d (or fewer threads, WEFT_NUM_THREADS)\n",
                static_cast<long long>(h / n), kernels::cpu::numThreads(), 2 * n * kernels::cpu::numThreads());
  }
  std::printf("%-38s %10s %12s\n", "attention", "median s", "/ ulysses");
  const char* names[] = {"ulysses", "ring zigzag (overlapped)", "ring zigzag, transfers not overlapped"};
  for (size_t i = 0; i < attention.size(); ++i) {
    std::printf("%-38s %10.4f %12.3f\n", names[i], attention[i], attention[i] / attention[0]);
  }
  std::printf("ring / ulysses (goal <= 1.2): %.3f; the overlap saves %.1f%% of the ring's unoverlapped time\n",
              attention[1] / attention[0], 100.0 * (attention[2] - attention[1]) / attention[2]);
  std::printf("%-38s %10s %12s\n", "GPT training step", "median s", "/ ulysses");
  std::printf("%-38s %10.4f %12.3f\n", "ulysses", model[0], 1.0);
  std::printf("%-38s %10.4f %12.3f\n", "ring zigzag", model[1], model[1] / model[0]);
}

const char* kUsage =
    "usage: parallel_layouts [--seq S] [--iters N] [--width C] [--layers L] [--heads H]\n"
    "                        [--memory S1,S2,... [--budget-seq S]] [--overlap]\n"
    "  run under weftrun (weftrun -n 4 parallel_layouts); a lone process is a world of 1\n";

}  // namespace

int main(int argc, char** argv) {
  Config c;
  bool overlap = false;
  bench::Flags flags;
  flags.onSwitch("--overlap", [&] { overlap = true; });
  flags.onValue("--seq", [&](const std::string& v) { c.seq = bench::intFlag("--seq", v, 8, 1 << 16); });
  flags.onValue("--iters", [&](const std::string& v) { c.iters = bench::intFlag("--iters", v, 1, 1000); });
  flags.onValue("--width", [&](const std::string& v) { c.width = bench::intFlag("--width", v, 1, 4096); });
  flags.onValue("--heads", [&](const std::string& v) { c.heads = bench::intFlag("--heads", v, 1, 256); });
  flags.onValue("--budget-seq", [&](const std::string& v) { c.budgetSeq = bench::intFlag("--budget-seq", v, 8, 1 << 16); });
  flags.onValue("--layers", [&](const std::string& v) { c.layers = bench::intFlag("--layers", v, 1, 64); });
  flags.onValue("--memory", [&](const std::string& v) {
    std::stringstream in(v);
    std::string part;
    while (std::getline(in, part, ',')) c.memory.push_back(bench::intFlag("--memory", part, 8, 1 << 16));
  });
  if (!bench::parseFlagsOrUsage(flags, argc, argv, "parallel_layouts", kUsage)) return 2;
  if (!c.memory.empty() && std::find(c.memory.begin(), c.memory.end(), c.budgetSeq) == c.memory.end()) {
    std::fprintf(stderr, "parallel_layouts: --budget-seq %lld must be one of the --memory lengths\n%s",
                 static_cast<long long>(c.budgetSeq), kUsage);
    return 2;
  }
  if (c.width % c.heads != 0) {
    std::fprintf(stderr, "parallel_layouts: --heads %lld must divide --width %lld\n%s", static_cast<long long>(c.heads),
                 static_cast<long long>(c.width), kUsage);
    return 2;
  }
  // A size a layout cannot split (e.g. heads the tp group does not divide) is the library's
  // InvalidArgumentError: said on stderr with exit status 1, as every other failure.
  try {
    auto world = init();
    if (overlap) {
      runOverlap(*world, c);
    } else if (c.memory.empty()) {
      runLayouts(*world, c);
    } else {
      runMemory(*world, c);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallel_layouts: %s\n", e.what());
    return 1;
  }
  return 0;
}
