// A program for the multiprocess tests of Mesh and tensor parallelism
// (tests/collectives/tensor_parallel_mp_test.cpp): one rank of a job, which finds its place through
// rpc::Options::fromEnv, builds a ProcessGroupGloo and plays its rank's part in the scenario it is
// given, printing one line per result ("rank R <phrase> key value ..."). Differences are printed in
// units of 1e-15 (integers) for the test to bound.
//
//   WEFT_RANK=0 WEFT_WORLD_SIZE=4 WEFT_MASTER_ADDR=127.0.0.1 WEFT_MASTER_PORT=29500 tp_worker mesh
//
// Scenarios:
//   mesh      [4 ranks: {dp: 2, tp: 2}; 2 ranks: {dp: 1, tp: 2}] "mesh coords C,C dp_ranks R,R
//             tp_ranks R,R dp_sum S tp_sum S rank_at A": coordinates, the world ranks of this rank's
//             group per dimension, an allreduce of the world ranks over each group, the world rank
//             that rankAt gives for this rank's coordinates; then "lookup <ErrorType>: <message>"
//             for a dimension the mesh does not have.
//   mismatch  [any world size] The last rank passes {tp: 2, dp: W/2}, the others {dp: W/2, tp: 2}:
//             "failed <ErrorType>: <message>".
//   tp64, tp32 [T ranks, T dividing 4] A GPT (vocab 32, block 16, 2 layers, 4 heads, width 16,
//             float64 or float32) built whole on every rank from one seed, and a TensorParallelGPT
//             over the world loaded from it. "tp loss_diff_fe N logits_diff_fe N grad_diff_fe N
//             grads G": the loss, this rank's logits and every parameter's gradient against the
//             whole model's (shard of), in 1e-15; "shapes block_local L block_full F": the block
//             matrices' elements on this rank and in the whole model; "block fwd_allreduces A
//             fwd_bytes B bwd_allreduces A bwd_bytes B elem E bsc N": the traffic of one block's
//             forward and backward; "clip norm_diff_fe N grad_diff_fe N clipped 0|1":
//             clipGradNorm(0.01) against nn::clipGradNorm_ on the whole model (the norm and the
//             clipped gradients); "model fwd_allreduces ... bwd_bytes B" the traffic of the loss
//             and its backward; "errors heads <ErrorType>: ... target <ErrorType>: ...".
//   tpvocab   [T ranks, T = 2 or 4] The GPT of tp64 with a vocabulary of 29 (padded to 30 or 32):
//             "tpvocab loss_diff_fe N logits_diff_fe N padding_fe N grad_diff_fe N norm_diff_fe N
//             state_shapes 0|1 state_diff_fe N local L real R": the loss, this rank's real logits
//             columns and every gradient (against the whole model's, padded by shard) in 1e-15, the
//             largest padding logit, clipGradNorm's norm against nn::clipGradNorm_'s, fullStateDict
//             against the whole model's parameters, this rank's rows and real rows.
//   ulysses   [P ranks, P dividing 4] Causal attention over q, k, v [2, 4, 8, 4] float64 whole on
//             every rank, and ulyssesAttention over this rank's 8/P tokens: "ulysses out_diff_fe N
//             grad_diff_fe N fwd_a2a A fwd_bytes B bwd_a2a A bwd_bytes B local_bytes L" (this rank's
//             output and q, k, v gradients against the whole attention's, in 1e-15; the allToAlls);
//             "ulysses_error <ErrorType>: <message>" for 2·P + 1 heads.
//   ring      [P ranks, P dividing 8] Attention over q, k, v [2, 2, 16, 4] float64 whole on every
//             rank, and ringAttention over this rank's tokens, for each layout (contiguous, zigzag)
//             and mask (causal, full, causal with dropout 0.3 from the default generator seeded
//             alike, causal with RingOptions::overlap off):
//             "ring_<layout>_<causal|full|dropout|sequential> out_diff_fe N grad_diff_fe N
//             fwd_sends S fwd_bytes B bwd_sends S bwd_bytes B local_bytes L".
//   hybrid    [4 ranks] Mesh {ring: 2, ulysses: 2}: causal attention over [2, 4, 16, 4] float64
//             against hybridAttention over this rank's 4 tokens, for each ring layout:
//             "hybrid_<layout> out_diff_fe N grad_diff_fe N tokens T".
//   spgpt     [P ranks, P dividing 8] The GPT of tp64 (float64) on [2, 16] tokens, one target
//             ignored, whole against a SequenceParallelGPT over this rank's tokens: Ulysses and ring
//             (zig-zag) over all ranks, and on 4 ranks 2-D {ring: 2, ulysses: 2}; each again on 13
//             tokens ("_len13", padded by shard()):
//             "spgpt_<mode> loss_diff_fe N grad_diff_fe N grads G tokens T" (the gradients after
//             allReduceGradients).
//   tpsp      [4 ranks] Mesh {sp: 2, tp: 2}: the GPT of tp64 as a TensorParallelGPT with sequence
//             parallelism (Ulysses, then ring zig-zag) on [2, 16] and [2, 13] tokens against the
//             whole GPT: "tpsp_<mode>_len<S> loss_diff_fe N grad_diff_fe N tokens T" (gradients after
//             allReduceGradients, against the whole model's shards).
//   dptp      [4 ranks] Mesh {dp: 2, tp: 2}: the GPT of tp64 split over tp and wrapped in DDP over
//             dp, 6 SGD steps (lr 0.1) on batches of 4 sequences, each dp rank taking 2, against the
//             whole GPT stepping on all 4: "dptp loss_diff_fe N param_diff_fe N moved_fe N steps 6"
//             (the dp-averaged loss of each step and the final parameters against the reference's,
//             how far the parameters moved from the start, in 1e-15); "state keys_equal 0|1
//             state_diff_fe N restored_diff_fe N": fullStateDict against the reference's state dict,
//             and an nn::GPT loaded from it (strict).
// Every rank first prints "rank R pid P started" and last "rank R done".
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "collectives/gloo/detail/group.h"
#include "collectives/ddp.h"
#include "collectives/mesh.h"
#include "collectives/sequence_parallel.h"
#include "collectives/sequence_parallel_gpt.h"
#include "collectives/tensor_parallel_gpt.h"
#include "common/error.h"
#include "mp_worker.h"
#include "nn/optim.h"
#include "nn/utils.h"
#include "nn/transformer.h"
#include "rpc/options.h"
#include "rpc/store.h"
#include "tensor/ops.h"

namespace {

using namespace std::chrono_literals;
using weft::DType;
using weft::Generator;
using weft::Tensor;
using weft::collectives::Mesh;
using weft::collectives::ProcessGroup;
using weft::collectives::ProcessGroupGloo;
using weft::testing::say;

int gRank = 0;

void sayLine(const std::string& line) { say(weft::testing::prefix(gRank) + line); }

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

long long diffFe(const Tensor& a, const Tensor& b) {
  double m = weft::max(weft::abs(a.to(DType::Float64) - b.to(DType::Float64))).item<double>();
  return std::llround(m * 1e15);
}

void runMesh(ProcessGroup& world) {
  std::vector<weft::collectives::MeshDim> dims =
      world.size() == 4 ? std::vector<weft::collectives::MeshDim>{{"dp", 2}, {"tp", 2}}
                        : std::vector<weft::collectives::MeshDim>{{"dp", world.size() / 2}, {"tp", 2}};
  Mesh mesh(world, dims);
  std::string line = "mesh coords " + joined(mesh.coordinates());
  for (const char* d : {"dp", "tp"}) {
    line += std::string(" ") + d + "_ranks " + joined(mesh.groupRanks(d));
  }
  for (const char* d : {"dp", "tp"}) {
    Tensor t = weft::fromVector(std::vector<int64_t>{world.rank()}, {1});
    mesh.group(d).allReduce(t).wait();
    line += std::string(" ") + d + "_sum " + std::to_string(t.item<int64_t>());
  }
  line += " rank_at " + std::to_string(mesh.rankAt(mesh.coordinates()));
  sayLine(line);
  try {
    mesh.group("pp");
    sayLine("lookup none");
  } catch (...) {
    sayLine("lookup " + weft::testing::describe(std::current_exception()));
  }
}

void runMismatch(ProcessGroup& world) {
  const int half = world.size() / 2;
  std::vector<weft::collectives::MeshDim> dims = {{"dp", half}, {"tp", 2}};
  if (world.rank() == world.size() - 1) dims = {{"tp", 2}, {"dp", half}};
  try {
    Mesh mesh(world, dims);
    sayLine("failed none");
  } catch (...) {
    sayLine("failed " + weft::testing::describe(std::current_exception()));
  }
}

void runTp(ProcessGroup& world, DType dtype) {
  using namespace weft::collectives;
  Mesh mesh(world, {{"tp", world.size()}});
  auto tp = std::make_shared<TpGroup>(mesh.group("tp"));
  weft::nn::GPTConfig cfg{.vocabSize = 32, .blockSize = 16, .layers = 2, .heads = 4, .width = 16};
  Generator init(7);
  auto full = std::make_shared<weft::nn::GPT>(cfg, &init);
  full->to(dtype);
  auto model = std::make_shared<TensorParallelGPT>(tp, cfg);
  model->to(dtype);
  model->loadFrom(*full);

  const int64_t b = 2, s = 8, c = cfg.width;
  Generator data(11);
  Tensor idx = weft::randint(0, cfg.vocabSize, {b, s}, {.dtype = DType::Int64}, &data);
  Tensor targets = weft::randint(0, cfg.vocabSize, {b, s}, {.dtype = DType::Int64}, &data);
  {
    weft::NoGradGuard noGrad;
    targets.view({-1}).narrow(0, 3, 1).fill_(-100);
  }

  Tensor fullLogits = full->forward(idx);
  Tensor fullLoss = full->loss(idx, targets);
  fullLoss.backward();
  tp->resetTraffic();
  Tensor loss = model->loss(idx, targets);
  TpGroup::Traffic fwd = tp->traffic();
  loss.backward();
  TpGroup::Traffic all = tp->traffic();
  Tensor logits;
  {
    weft::NoGradGuard noGrad;
    logits = model->forward(idx);
  }
  const int64_t local = cfg.vocabSize / tp->size();
  long long logitsDiff = diffFe(logits, fullLogits.narrow(2, tp->rank() * local, local));
  std::map<std::string, Tensor> fullParams;
  for (auto& [n, p] : full->namedParameters()) fullParams[n] = p;
  long long gradDiff = 0;
  int grads = 0;
  for (auto& [n, p] : model->namedParameters()) {
    weft::testing::require(p.grad().defined(), "no gradient for " + n);
    gradDiff = std::max(gradDiff, diffFe(p.grad(), model->shard(n, fullParams.at(n).grad())));
    ++grads;
  }
  sayLine("tp loss_diff_fe " + std::to_string(diffFe(loss, fullLoss)) + " logits_diff_fe " +
          std::to_string(logitsDiff) + " grad_diff_fe " + std::to_string(gradDiff) + " grads " +
          std::to_string(grads));
  {
    // The pieces a pipeline stage runs: head(blocks(embed(idx))) and lossOfLogits give forward's
    // logits and loss's value; which parameters are split.
    weft::NoGradGuard noGrad;
    Tensor h = model->embed(idx, false);
    for (const auto& block : model->blocks()) h = block->forward(h);
    Tensor pieced = model->head(h);
    Tensor piecedLoss = model->lossOfLogits(pieced, targets);
    std::string split;
    for (const char* n : {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
                          "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.1.mlp.c_fc.weight",
                          "h.1.mlp.c_proj.bias", "h.1.ln_2.weight", "ln_f.bias"}) {
      split += model->isSplit(n) ? '1' : '0';
    }
    std::string errors;
    try {
      model->lossOfLogits(pieced, targets.narrow(1, 0, s - 1));
      errors += "none";
    } catch (...) {
      errors += weft::testing::describe(std::current_exception());
    }
    errors += " unknown ";
    try {
      (void)model->isSplit("h.0.attn.nothing");
      errors += "none";
    } catch (...) {
      errors += weft::testing::describe(std::current_exception());
    }
    sayLine("pieces logits_diff_fe " + std::to_string(diffFe(pieced, logits)) + " loss_diff_fe " +
            std::to_string(diffFe(piecedLoss, fullLoss)) + " split " + split + " shape " + errors);
  }

  int64_t blockLocal = 0, blockFull = 0;
  for (auto& [n, p] : model->blocks()[0]->namedParameters()) {
    if (p.dim() == 2) blockLocal += p.numel();
  }
  for (auto& [n, p] : full->blocks()[0]->namedParameters()) {
    if (p.dim() == 2) blockFull += p.numel();
  }
  {
    // Clipping to a norm below the gradients' own: the whole model's norm, and the same scaling.
    const double fullNorm = weft::nn::clipGradNorm_(full->parameters(), 0.01);
    const double norm = model->clipGradNorm(0.01);
    long long clippedDiff = 0;
    for (auto& [n, p] : model->namedParameters()) {
      clippedDiff = std::max(clippedDiff, diffFe(p.grad(), model->shard(n, fullParams.at(n).grad())));
    }
    sayLine("clip norm_diff_fe " + std::to_string(std::llround(std::abs(norm - fullNorm) * 1e15)) + " grad_diff_fe " +
            std::to_string(clippedDiff) + " clipped " + std::to_string(fullNorm > 0.01 ? 1 : 0));
  }
  sayLine("shapes block_local " + std::to_string(blockLocal) + " block_full " + std::to_string(blockFull));

  Tensor x = weft::randn({b, s, c}, {.dtype = dtype}, &data).requiresGrad_();
  tp->resetTraffic();
  Tensor y = model->blocks()[0]->forward(x);
  TpGroup::Traffic bf = tp->traffic();
  weft::sum(weft::square(y)).backward();
  TpGroup::Traffic bb = tp->traffic();
  const long long elem = static_cast<long long>(weft::elementSize(dtype));
  sayLine("block fwd_allreduces " + std::to_string(bf.forwardAllReduces) + " fwd_bytes " +
          std::to_string(bf.forwardBytes) + " bwd_allreduces " + std::to_string(bb.backwardAllReduces) +
          " bwd_bytes " + std::to_string(bb.backwardBytes) + " elem " + std::to_string(elem) + " bsc " +
          std::to_string(b * s * c));
  sayLine("model fwd_allreduces " + std::to_string(fwd.forwardAllReduces) + " fwd_bytes " +
          std::to_string(fwd.forwardBytes) + " bwd_allreduces " + std::to_string(all.backwardAllReduces) +
          " bwd_bytes " + std::to_string(all.backwardBytes));

  std::string errors = "errors heads ";
  try {
    weft::nn::GPTConfig bad = cfg;
    bad.heads = 2;
    bad.vocabSize = 8 * tp->size();
    if (tp->size() == 2) bad.heads = 1;
    TensorParallelGPT wrong(tp, bad);
    errors += "none";
  } catch (...) {
    errors += weft::testing::describe(std::current_exception());
  }
  errors += " target ";
  try {
    Tensor bogus = targets.clone();
    {
      weft::NoGradGuard noGrad;
      bogus.view({-1}).narrow(0, 0, 1).fill_(static_cast<double>(cfg.vocabSize));
    }
    model->loss(idx, bogus);
    errors += "none";
  } catch (...) {
    errors += weft::testing::describe(std::current_exception());
  }
  sayLine(errors);
  world.barrier().wait();
}

void runTpVocab(ProcessGroup& world) {
  using namespace weft::collectives;
  Mesh mesh(world, {{"tp", world.size()}});
  auto tp = std::make_shared<TpGroup>(mesh.group("tp"));
  weft::nn::GPTConfig cfg{.vocabSize = 29, .blockSize = 16, .layers = 2, .heads = 4, .width = 16};
  Generator init(7);
  auto full = std::make_shared<weft::nn::GPT>(cfg, &init);
  full->to(DType::Float64);
  auto model = std::make_shared<TensorParallelGPT>(tp, cfg);
  model->to(DType::Float64);
  model->loadFrom(*full);

  Generator data(11);
  Tensor idx = weft::randint(0, cfg.vocabSize, {2, 8}, {.dtype = DType::Int64}, &data);
  Tensor targets = weft::randint(0, cfg.vocabSize, {2, 8}, {.dtype = DType::Int64}, &data);
  {
    weft::NoGradGuard noGrad;
    targets.view({-1}).narrow(0, 0, 1).fill_(cfg.vocabSize - 1);  // the last rank's last real column
    targets.view({-1}).narrow(0, 3, 1).fill_(-100);
  }
  Tensor fullLogits = full->forward(idx);
  Tensor fullLoss = full->loss(idx, targets);
  fullLoss.backward();
  Tensor loss = model->loss(idx, targets);
  loss.backward();
  Tensor logits;
  {
    weft::NoGradGuard noGrad;
    logits = model->forward(idx);
  }
  const int64_t real = model->wte()->localVocab(), local = logits.size(2);
  long long logitsDiff = diffFe(logits.narrow(2, 0, real), fullLogits.narrow(2, model->wte()->vocabStart(), real));
  long long padding = 0;
  if (real < local) padding = diffFe(logits.narrow(2, real, local - real), weft::zerosLike(logits.narrow(2, real, local - real)));
  std::map<std::string, Tensor> fullParams;
  for (auto& [n, p] : full->namedParameters()) fullParams[n] = p;
  long long gradDiff = 0;
  for (auto& [n, p] : model->namedParameters()) {
    gradDiff = std::max(gradDiff, diffFe(p.grad(), model->shard(n, fullParams.at(n).grad())));
  }
  const double fullNorm = weft::nn::clipGradNorm_(full->parameters(), 0.01);
  const double norm = model->clipGradNorm(0.01);
  weft::nn::StateDict gathered = model->fullStateDict();
  long long stateDiff = 0;
  bool shapes = gathered.size() == fullParams.size();
  for (auto& [n, p] : fullParams) {
    shapes = shapes && gathered.count(n) && gathered.at(n).shape() == p.shape();
    if (shapes) stateDiff = std::max(stateDiff, diffFe(gathered.at(n), p));
  }
  sayLine("tpvocab loss_diff_fe " + std::to_string(diffFe(loss, fullLoss)) + " logits_diff_fe " +
          std::to_string(logitsDiff) + " padding_fe " + std::to_string(padding) + " grad_diff_fe " +
          std::to_string(gradDiff) + " norm_diff_fe " + std::to_string(std::llround(std::abs(norm - fullNorm) * 1e15)) +
          " state_shapes " + std::to_string(shapes ? 1 : 0) + " state_diff_fe " + std::to_string(stateDiff) +
          " local " + std::to_string(local) + " real " + std::to_string(real));
  world.barrier().wait();
}

void runUlysses(ProcessGroup& world) {
  using namespace weft::collectives;
  Mesh mesh(world, {{"sp", world.size()}});
  SpGroup sp(mesh.group("sp"));
  const int64_t p = world.size(), b = 2, h = 4, s = 8, d = 4, local = s / p;
  Generator gen(21);
  weft::TensorOptions f64{.dtype = DType::Float64};
  Tensor q = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
  Tensor k = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
  Tensor v = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
  Tensor w = weft::randn({b, h, s, d}, f64, &gen);
  weft::AttentionOptions o;
  o.causal = true;
  weft::sum(weft::scaledDotProductAttention(q, k, v, o) * w).backward();
  Tensor y;
  {
    weft::NoGradGuard noGrad;
    y = weft::scaledDotProductAttention(q, k, v, o);
  }
  auto mine = [&](const Tensor& t) { return t.detach().narrow(2, sp.rank() * local, local).contiguous(); };
  Tensor ql = mine(q).requiresGrad_(), kl = mine(k).requiresGrad_(), vl = mine(v).requiresGrad_();
  sp.resetTraffic();
  Tensor yl = ulyssesAttention(sp, ql, kl, vl, o);
  SpGroup::Traffic fwd = sp.traffic();
  weft::sum(yl * mine(w)).backward();
  SpGroup::Traffic all = sp.traffic();
  long long gradDiff = std::max({diffFe(ql.grad(), mine(q.grad())), diffFe(kl.grad(), mine(k.grad())),
                                 diffFe(vl.grad(), mine(v.grad()))});
  sayLine("ulysses out_diff_fe " + std::to_string(diffFe(yl, mine(y))) + " grad_diff_fe " + std::to_string(gradDiff) +
          " fwd_a2a " + std::to_string(fwd.forwardAllToAlls) + " fwd_bytes " + std::to_string(fwd.forwardBytes) +
          " bwd_a2a " + std::to_string(all.backwardAllToAlls) + " bwd_bytes " + std::to_string(all.backwardBytes) +
          " local_bytes " + std::to_string(ql.nbytes()));
  try {
    Tensor odd = weft::randn({b, 2 * p + 1, local, d}, f64, &gen);
    ulyssesAttention(sp, odd, odd, odd, o);
    sayLine("ulysses_error none");
  } catch (...) {
    sayLine("ulysses_error " + weft::testing::describe(std::current_exception()));
  }
  world.barrier().wait();
}

void runRing(ProcessGroup& world) {
  using namespace weft::collectives;
  Mesh mesh(world, {{"sp", world.size()}});
  SpGroup sp(mesh.group("sp"));
  const int64_t b = 2, h = 2, s = 16, d = 4;
  weft::TensorOptions f64{.dtype = DType::Float64};
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::ZigZag}) {
    for (int variant = 0; variant < 4; ++variant) {
      // Causal, full, causal with dropout 0.3 (every rank's default generator seeded as the
      // whole attention's), and causal with the transfers not overlapped.
      const bool causal = variant != 1;
      const double drop = variant == 2 ? 0.3 : 0.0;
      Generator gen(31);
      Tensor q = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
      Tensor k = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
      Tensor v = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
      Tensor w = weft::randn({b, h, s, d}, f64, &gen);
      weft::AttentionOptions o;
      o.causal = causal;
      o.dropout = drop;
      weft::manualSeed(77);
      Tensor y = weft::scaledDotProductAttention(q, k, v, o);
      weft::sum(y * w).backward();
      auto mine = [&](const Tensor& t) { return shardSequence(t.detach(), 2, sp, layout); };
      Tensor ql = mine(q).requiresGrad_(), kl = mine(k).requiresGrad_(), vl = mine(v).requiresGrad_();
      sp.resetTraffic();
      RingOptions ro;
      ro.causal = causal;
      ro.layout = layout;
      ro.dropout = drop;
      ro.overlap = variant != 3;
      weft::manualSeed(77);
      Tensor yl = ringAttention(sp, ql, kl, vl, ro);
      SpGroup::Transfers fwd = sp.transfers();
      weft::sum(yl * mine(w)).backward();
      SpGroup::Transfers all = sp.transfers();
      long long gradDiff = std::max({diffFe(ql.grad(), mine(q.grad())), diffFe(kl.grad(), mine(k.grad())),
                                     diffFe(vl.grad(), mine(v.grad()))});
      sayLine(std::string("ring_") + (layout == RingLayout::ZigZag ? "zigzag" : "contiguous") +
              (variant == 3 ? "_sequential" : variant == 2 ? "_dropout" : causal ? "_causal" : "_full") + " out_diff_fe " + std::to_string(diffFe(yl, mine(y))) +
              " grad_diff_fe " + std::to_string(gradDiff) + " fwd_sends " + std::to_string(fwd.forwardSends) +
              " fwd_bytes " + std::to_string(fwd.forwardBytes) + " bwd_sends " + std::to_string(all.backwardSends) +
              " bwd_bytes " + std::to_string(all.backwardBytes) + " local_bytes " + std::to_string(ql.nbytes()));
    }
  }
  world.barrier().wait();
}

void runHybrid(ProcessGroup& world) {
  using namespace weft::collectives;
  Mesh mesh(world, {{"ring", 2}, {"ulysses", 2}});
  SpGroup ring(mesh.group("ring"));
  SpGroup ulysses(mesh.group("ulysses"));
  const int64_t b = 2, h = 4, s = 16, d = 4;
  weft::TensorOptions f64{.dtype = DType::Float64};
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::ZigZag}) {
    Generator gen(41);
    Tensor q = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
    Tensor k = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
    Tensor v = weft::randn({b, h, s, d}, f64, &gen).requiresGrad_();
    Tensor w = weft::randn({b, h, s, d}, f64, &gen);
    weft::AttentionOptions o;
    o.causal = true;
    Tensor y = weft::scaledDotProductAttention(q, k, v, o);
    weft::sum(y * w).backward();
    auto mine = [&](const Tensor& t) { return shardSequence2d(t.detach(), 2, ulysses, ring, layout); };
    Tensor ql = mine(q).requiresGrad_(), kl = mine(k).requiresGrad_(), vl = mine(v).requiresGrad_();
    RingOptions ro;
    ro.causal = true;
    ro.layout = layout;
    Tensor yl = hybridAttention(ulysses, ring, ql, kl, vl, ro);
    weft::sum(yl * mine(w)).backward();
    long long gradDiff = std::max({diffFe(ql.grad(), mine(q.grad())), diffFe(kl.grad(), mine(k.grad())),
                                   diffFe(vl.grad(), mine(v.grad()))});
    sayLine(std::string("hybrid_") + (layout == RingLayout::ZigZag ? "zigzag" : "contiguous") + " out_diff_fe " +
            std::to_string(diffFe(yl, mine(y))) + " grad_diff_fe " + std::to_string(gradDiff) + " tokens " +
            std::to_string(ql.size(2)));
  }
  world.barrier().wait();
}

// The whole GPT's loss and gradients on [2, 16] tokens against a SequenceParallelGPT's with `o`.
void checkSpGpt(const std::string& name, weft::collectives::SpOptions o, int64_t length = 16) {
  using namespace weft::collectives;
  weft::nn::GPTConfig cfg{.vocabSize = 32, .blockSize = 16, .layers = 2, .heads = 4, .width = 16};
  Generator init(7);
  weft::nn::GPT full(cfg, &init);
  full.to(DType::Float64);
  auto model = std::make_shared<SequenceParallelGPT>(cfg, o);
  model->to(DType::Float64);
  model->loadFrom(full);
  Generator data(51);
  Tensor idx = weft::randint(0, cfg.vocabSize, {2, length}, {.dtype = DType::Int64}, &data);
  Tensor targets = weft::randint(0, cfg.vocabSize, {2, length}, {.dtype = DType::Int64}, &data);
  {
    weft::NoGradGuard noGrad;
    targets.view({-1}).narrow(0, 5, 1).fill_(-100);
  }
  Tensor fullLoss = full.loss(idx, targets);
  fullLoss.backward();
  Tensor loss = model->loss(model->shard(idx), model->shard(targets, -100));
  loss.backward();
  model->allReduceGradients();
  std::map<std::string, Tensor> fullParams;
  for (auto& [n, p] : full.namedParameters()) fullParams[n] = p;
  long long gradDiff = 0;
  int grads = 0;
  for (auto& [n, p] : model->namedParameters()) {
    weft::testing::require(p.grad().defined(), "no gradient for " + n);
    gradDiff = std::max(gradDiff, diffFe(p.grad(), fullParams.at(n).grad()));
    ++grads;
  }
  sayLine("spgpt_" + name + " loss_diff_fe " + std::to_string(diffFe(loss, fullLoss)) + " grad_diff_fe " +
          std::to_string(gradDiff) + " grads " + std::to_string(grads) + " tokens " +
          std::to_string(model->shard(idx).size(1)));
}

void runSpGpt(ProcessGroup& world) {
  using namespace weft::collectives;
  {
    Mesh mesh(world, {{"sp", world.size()}});
    SpGroup sp(mesh.group("sp"));
    checkSpGpt("ulysses", {.mode = SpMode::Ulysses, .ulysses = &sp});
    checkSpGpt("ring", {.mode = SpMode::Ring, .ring = &sp, .layout = RingLayout::ZigZag});
    checkSpGpt("ulysses_len13", {.mode = SpMode::Ulysses, .ulysses = &sp}, 13);
    checkSpGpt("ring_len13", {.mode = SpMode::Ring, .ring = &sp, .layout = RingLayout::ZigZag}, 13);
  }
  if (world.size() == 4) {
    Mesh mesh(world, {{"ring", 2}, {"ulysses", 2}});
    SpGroup ring(mesh.group("ring"));
    SpGroup ulysses(mesh.group("ulysses"));
    checkSpGpt("hybrid", {.mode = SpMode::Hybrid, .ulysses = &ulysses, .ring = &ring, .layout = RingLayout::ZigZag});
    checkSpGpt("hybrid_len13",
               {.mode = SpMode::Hybrid, .ulysses = &ulysses, .ring = &ring, .layout = RingLayout::ZigZag}, 13);
  }
  world.barrier().wait();
}

void runTpSp(ProcessGroup& world) {
  using namespace weft::collectives;
  Mesh mesh(world, {{"sp", 2}, {"tp", 2}});
  auto tp = std::make_shared<TpGroup>(mesh.group("tp"));
  SpGroup sp(mesh.group("sp"));
  weft::nn::GPTConfig cfg{.vocabSize = 32, .blockSize = 16, .layers = 2, .heads = 4, .width = 16};
  for (int64_t length : {16, 13}) {
    for (SpMode mode : {SpMode::Ulysses, SpMode::Ring}) {
      SpOptions o{.mode = mode, .layout = RingLayout::ZigZag};
      (mode == SpMode::Ulysses ? o.ulysses : o.ring) = &sp;
      Generator init(7);
      weft::nn::GPT full(cfg, &init);
      full.to(DType::Float64);
      auto model = std::make_shared<TensorParallelGPT>(tp, cfg, o);
      model->to(DType::Float64);
      model->loadFrom(full);
      Generator data(61);
      Tensor idx = weft::randint(0, cfg.vocabSize, {2, length}, {.dtype = DType::Int64}, &data);
      Tensor targets = weft::randint(0, cfg.vocabSize, {2, length}, {.dtype = DType::Int64}, &data);
      Tensor fullLoss = full.loss(idx, targets);
      fullLoss.backward();
      Tensor loss = model->loss(model->shardTokens(idx), model->shardTokens(targets, -100));
      loss.backward();
      model->allReduceGradients();
      std::map<std::string, Tensor> fullParams;
      for (auto& [n, p] : full.namedParameters()) fullParams[n] = p;
      long long gradDiff = 0;
      for (auto& [n, p] : model->namedParameters()) {
        weft::testing::require(p.grad().defined(), "no gradient for " + n);
        gradDiff = std::max(gradDiff, diffFe(p.grad(), model->shard(n, fullParams.at(n).grad())));
      }
      sayLine(std::string("tpsp_") + (mode == SpMode::Ulysses ? "ulysses" : "ring") + "_len" +
              std::to_string(length) + " loss_diff_fe " + std::to_string(diffFe(loss, fullLoss)) +
              " grad_diff_fe " + std::to_string(gradDiff) + " tokens " +
              std::to_string(model->shardTokens(idx).size(1)));
    }
  }
  world.barrier().wait();
}

void runDpTp(ProcessGroup& world) {
  using namespace weft::collectives;
  Mesh mesh(world, {{"dp", 2}, {"tp", 2}});
  auto tp = std::make_shared<TpGroup>(mesh.group("tp"));
  weft::nn::GPTConfig cfg{.vocabSize = 32, .blockSize = 16, .layers = 2, .heads = 4, .width = 16};
  Generator init(7);
  auto reference = std::make_shared<weft::nn::GPT>(cfg, &init);
  reference->to(DType::Float64);
  auto model = std::make_shared<TensorParallelGPT>(tp, cfg);
  model->to(DType::Float64);
  model->loadFrom(*reference);
  DistributedDataParallel ddp(model, mesh.group("dp"));
  weft::nn::optim::SGD refOpt(reference->parameters(), {.lr = 0.1});
  weft::nn::optim::SGD opt(model->parameters(), {.lr = 0.1});
  constexpr int kSteps = 6;
  const int64_t rows = 4, s = 8, mine = rows / 2, dp = mesh.coordinate("dp");
  long long lossDiff = 0;
  for (int step = 0; step < kSteps; ++step) {
    Generator data(100 + static_cast<uint64_t>(step));
    Tensor idx = weft::randint(0, cfg.vocabSize, {rows, s}, {.dtype = DType::Int64}, &data);
    Tensor targets = weft::randint(0, cfg.vocabSize, {rows, s}, {.dtype = DType::Int64}, &data);
    refOpt.zeroGrad();
    Tensor refLoss = reference->loss(idx, targets);
    refLoss.backward();
    refOpt.step();

    opt.zeroGrad();
    Tensor logits = ddp.forward(idx.narrow(0, dp * mine, mine).contiguous());
    Tensor loss = vocabParallelCrossEntropy(*tp, logits.view({-1, logits.size(2)}),
                                            targets.narrow(0, dp * mine, mine).reshape({-1}),
                                            model->wte()->vocabStart());
    loss.backward();
    opt.step();
    Tensor mean = loss.detach().clone();
    mesh.group("dp").allReduce(mean, weft::collectives::ReduceOp::Avg).wait();
    lossDiff = std::max(lossDiff, diffFe(mean, refLoss));
  }
  std::map<std::string, Tensor> refParams;
  for (auto& [n, p] : reference->namedParameters()) refParams[n] = p;
  long long paramDiff = 0, moved = 0;
  Generator again(7);
  weft::nn::GPT start(cfg, &again);
  std::map<std::string, Tensor> startParams;
  for (auto& [n, p] : start.namedParameters()) startParams[n] = p;
  for (auto& [n, p] : model->namedParameters()) {
    paramDiff = std::max(paramDiff, diffFe(p, model->shard(n, refParams.at(n))));
    moved = std::max(moved, diffFe(p, model->shard(n, startParams.at(n))));
  }
  weft::nn::StateDict gathered = model->fullStateDict();
  weft::nn::StateDict want = reference->stateDict();
  bool keysEqual = gathered.size() == want.size();
  long long stateDiff = 0;
  for (auto& [n, t] : want) {
    auto it = gathered.find(n);
    if (it == gathered.end() || it->second.shape() != t.shape()) {
      keysEqual = false;
      continue;
    }
    stateDiff = std::max(stateDiff, diffFe(it->second, t));
  }
  weft::nn::GPT restored(cfg);
  restored.to(DType::Float64);
  restored.loadStateDict(gathered);
  sayLine("state keys_equal " + std::to_string(keysEqual ? 1 : 0) + " state_diff_fe " + std::to_string(stateDiff) +
          " restored_diff_fe " +
          std::to_string(diffFe(restored.parameters()[0], reference->parameters()[0])));
  sayLine("dptp loss_diff_fe " + std::to_string(lossDiff) + " param_diff_fe " + std::to_string(paramDiff) +
          " moved_fe " + std::to_string(moved) + " steps " + std::to_string(kSteps));
  world.barrier().wait();
}

}  // namespace

int main(int argc, char** argv) {
  return weft::testing::workerMain("tp_worker", {"mesh", "mismatch", "tp64", "tp32", "ulysses", "ring", "hybrid", "spgpt", "tpsp", "dptp", "tpvocab"}, argc, argv,
                                   [](const std::string& scenario) {
    weft::rpc::Options opt = weft::rpc::Options::fromEnv();
    gRank = opt.rank;
    say(weft::testing::prefix(gRank) + "pid " + std::to_string(::getpid()) + " started");
    std::unique_ptr<weft::rpc::StoreServer> server;
    if (opt.rank == 0) server = std::make_unique<weft::rpc::StoreServer>(weft::rpc::StoreServer::configFor(opt));
    weft::rpc::StoreClient store(weft::rpc::StoreClient::configFor(opt));
    {
      auto pg = ProcessGroupGloo::create(store, opt.rank, opt.worldSize, {.timeout = 20s});
      if (scenario == "mesh") runMesh(*pg);
      else if (scenario == "mismatch") runMismatch(*pg);
      else if (scenario == "ulysses") runUlysses(*pg);
      else if (scenario == "dptp") runDpTp(*pg);
      else if (scenario == "ring") runRing(*pg);
      else if (scenario == "hybrid") runHybrid(*pg);
      else if (scenario == "spgpt") runSpGpt(*pg);
      else if (scenario == "tpsp") runTpSp(*pg);
      else if (scenario == "tpvocab") runTpVocab(*pg);
      else runTp(*pg, scenario == "tp64" ? DType::Float64 : DType::Float32);
    }
    if (opt.rank == 0) {
      std::vector<std::string> left;
      for (int r = 1; r < opt.worldSize; ++r) left.push_back("tp_worker/left/" + std::to_string(r));
      store.wait(left, 20s);
    } else {
      store.set("tp_worker/left/" + std::to_string(opt.rank), "1");
    }
    sayLine("done");
    return 0;
  });
}
