// Mesh and tensor parallelism across real processes on 127.0.0.1
// (tests/collectives/tp_helpers/tp_worker.cpp, one process per rank, Gloo): the mesh's coordinates
// and groups on 4 and 2 processes, a mismatched mesh failing every rank with both meshes named, and
// the tensor-parallel GPT against the whole nn::GPT loaded with the same weights (loss, logits and
// every gradient, float64 and float32), with its traffic against the formulas, for T = 2 and 4.
// Every wait is bounded and every process is checked to be gone at the end.
#include <doctest/doctest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "captured_text.h"
#include "mp_job.h"

using namespace std::chrono_literals;
using weft::testing::contains;
using weft::testing::allClean;
using weft::testing::MpJob;
using weft::testing::rankField;
using weft::testing::numberAfter;
using weft::testing::rankPrefix;
using weft::testing::restOfLine;

namespace {

std::vector<weft::testing::Subprocess::Result> runTpJob(const std::string& scenario, int world,
                                                        std::chrono::milliseconds timeout) {
  MpJob job({TP_WORKER_PATH, scenario}, world, [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(timeout);
  job.checkAllGone();
  REQUIRE(allClean(results));
  return results;
}

// The number after " key " on rank `rank`'s line that starts with `first`.
std::string word(const std::string& out, int rank, const std::string& first, const std::string& key) {
  const std::string line = " " + first + " " + restOfLine(out, rankPrefix(rank) + first + " ") + " ";
  const std::string rest = restOfLine(line, " " + key + " ");
  return rest.substr(0, rest.find(' '));
}

// The GPT of tp_worker (width 16, 2 layers, vocab 32, batch 2 x 8) on `t` ranks in `dtype`: every
// rank's loss, logits and gradients within `toleranceFe` (1e-15 units) of the whole model's, the
// block matrices split T ways, and the traffic per block and per step against the formulas.
void checkTpJob(const std::string& scenario, int t, long long toleranceFe) {
  auto results = runTpJob(scenario, t, 30s);
  constexpr long long kLayers = 2, kWidth = 16, kRows = 2 * 8, kVocab = 32;
  for (int r = 0; r < t; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    CHECK(rankField(out, r, "tp", "loss_diff_fe") <= toleranceFe);
    CHECK(rankField(out, r, "tp", "logits_diff_fe") <= toleranceFe);
    CHECK(rankField(out, r, "tp", "grad_diff_fe") <= toleranceFe);
    // wte, wpe, ln_f (2) and 12 per block with biases.
    CHECK(rankField(out, r, "tp", "grads") == 4 + 12 * kLayers);
    // A pipeline stage's pieces (embed, the blocks, head, lossOfLogits) give forward and loss.
    CHECK(rankField(out, r, "pieces", "logits_diff_fe") == 0);
    CHECK(rankField(out, r, "pieces", "loss_diff_fe") <= toleranceFe);
    // Split: wte, c_attn's weight and bias, c_proj's weight, c_fc's weight; whole: wpe, the
    // row-parallel biases, the layer norms.
    CHECK(word(out, r, "pieces", "split") == "1011101000");
    const std::string pieces = restOfLine(out, rankPrefix(r) + "pieces ");
    CHECK(contains(pieces, "shape InvalidArgumentError: TensorParallelGPT::lossOfLogits: expected logits [B, T, " +
                               std::to_string(kVocab / t) + "] and Int64 targets [B, T], got [2, 8, " +
                               std::to_string(kVocab / t) + "] and [2, 7] int64"));
    CHECK(contains(pieces, "unknown NotFoundError: TensorParallelGPT: no parameter named 'h.0.attn.nothing'"));
    // Gradient clipping over the whole model.
    CHECK(rankField(out, r, "clip", "clipped") == 1);
    CHECK(rankField(out, r, "clip", "norm_diff_fe") <= toleranceFe);
    CHECK(rankField(out, r, "clip", "grad_diff_fe") <= toleranceFe);
    // 12·C² matrix elements per block, 1/T of them on each rank.
    CHECK(rankField(out, r, "shapes", "block_full") == 12 * kWidth * kWidth);
    CHECK(rankField(out, r, "shapes", "block_local") * t == 12 * kWidth * kWidth);
    // One block: exactly two allreduces of B·S·C elements each way.
    const long long elem = rankField(out, r, "block", "elem");
    const long long bsc = rankField(out, r, "block", "bsc");
    CHECK(bsc == kRows * kWidth);
    CHECK(rankField(out, r, "block", "fwd_allreduces") == 2);
    CHECK(rankField(out, r, "block", "fwd_bytes") == 2 * bsc * elem);
    CHECK(rankField(out, r, "block", "bwd_allreduces") == 2);
    CHECK(rankField(out, r, "block", "bwd_bytes") == 2 * bsc * elem);
    // The step: per block 2 + the embedding's 1 + the loss's 3 (of B·S) in forward; per block 2
    // + the head's 1 in backward.
    CHECK(rankField(out, r, "model", "fwd_allreduces") == 2 * kLayers + 1 + 3);
    CHECK(rankField(out, r, "model", "fwd_bytes") == (2 * kLayers + 1) * bsc * elem + 3 * kRows * elem);
    CHECK(rankField(out, r, "model", "bwd_allreduces") == 2 * kLayers + 1);
    CHECK(rankField(out, r, "model", "bwd_bytes") == (2 * kLayers + 1) * bsc * elem);
    const std::string errors = restOfLine(out, rankPrefix(r) + "errors ");
    CHECK(contains(errors, "heads InvalidArgumentError: TensorParallelGPT: heads ("));
    CHECK(contains(errors, "must be divisible by the tensor-parallel size " + std::to_string(t)));
    CHECK(contains(errors, "target IndexError: vocabParallelCrossEntropy: target " + std::to_string(kVocab)));
  }
}

}  // namespace

TEST_SUITE_BEGIN("tensor_parallel");

TEST_CASE("a mesh {dp: 2, tp: 2} on 4 processes gives row-major coordinates and one working group per "
          "dimension") {
  auto results = runTpJob("mesh", 4, 30s);
  for (int r = 0; r < 4; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    const int dp = r / 2, tp = r % 2;
    CHECK(word(out, r, "mesh", "coords") == std::to_string(dp) + "," + std::to_string(tp));
    CHECK(word(out, r, "mesh", "tp_ranks") == std::to_string(2 * dp) + "," + std::to_string(2 * dp + 1));
    CHECK(word(out, r, "mesh", "dp_ranks") == std::to_string(tp) + "," + std::to_string(tp + 2));
    CHECK(rankField(out, r, "mesh", "tp_sum") == 2 * dp + 2 * dp + 1);
    CHECK(rankField(out, r, "mesh", "dp_sum") == tp + tp + 2);
    CHECK(rankField(out, r, "mesh", "rank_at") == r);
    CHECK(contains(restOfLine(out, rankPrefix(r) + "lookup "),
                   "NotFoundError: Mesh {dp: 2, tp: 2}: no dimension named 'pp'"));
  }
}

TEST_CASE("a mesh {dp: 1, tp: 2} on 2 processes has a group of one rank along dp") {
  auto results = runTpJob("mesh", 2, 30s);
  for (int r = 0; r < 2; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    CHECK(word(out, r, "mesh", "coords") == "0," + std::to_string(r));
    CHECK(word(out, r, "mesh", "tp_ranks") == "0,1");
    CHECK(word(out, r, "mesh", "dp_ranks") == std::to_string(r));
    CHECK(rankField(out, r, "mesh", "tp_sum") == 1);
    CHECK(rankField(out, r, "mesh", "dp_sum") == r);
  }
}

TEST_CASE("ranks that pass different meshes all fail with an InvalidArgumentError naming both") {
  auto results = runTpJob("mismatch", 4, 30s);
  for (int r = 0; r < 4; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    CHECK(restOfLine(out, rankPrefix(r) + "failed ") ==
          "InvalidArgumentError: Mesh: the ranks passed different meshes: rank 0 passed {dp: 2, tp: 2}, "
          "rank 3 passed {tp: 2, dp: 2}");
  }
}

TEST_CASE("a tensor-parallel GPT on 2 processes equals the whole GPT in float64, with two allreduces "
          "per block") {
  checkTpJob("tp64", 2, 1000);  // 1e-12
}

TEST_CASE("a tensor-parallel GPT on 4 processes equals the whole GPT in float64, with two allreduces "
          "per block") {
  checkTpJob("tp64", 4, 1000);
}

TEST_CASE("a tensor-parallel GPT on 2 and 4 processes equals the whole GPT in float32 to 1e-5") {
  checkTpJob("tp32", 2, 10'000'000'000LL);
  checkTpJob("tp32", 4, 10'000'000'000LL);
}

TEST_CASE("a tensor-parallel GPT whose vocabulary the group does not divide pads it: loss, logits, "
          "gradients and the gathered state dict equal the whole GPT's") {
  for (int t : {2, 4}) {
    INFO("T = " << t);
    auto results = runTpJob("tpvocab", t, 30s);
    // 29 = 2·15 − 1 = 4·8 − 3: the last rank holds 14 or 5 real rows of 15 or 8.
    const long long local = t == 2 ? 15 : 8;
    for (int r = 0; r < t; ++r) {
      const std::string& out = results[static_cast<size_t>(r)].out;
      INFO(out);
      CHECK(rankField(out, r, "tpvocab", "local") == local);
      CHECK(rankField(out, r, "tpvocab", "real") == (r == t - 1 ? 29 - (t - 1) * local : local));
      CHECK(rankField(out, r, "tpvocab", "loss_diff_fe") <= 1000);
      CHECK(rankField(out, r, "tpvocab", "logits_diff_fe") <= 1000);
      CHECK(rankField(out, r, "tpvocab", "padding_fe") == 0);
      CHECK(rankField(out, r, "tpvocab", "grad_diff_fe") <= 1000);
      CHECK(rankField(out, r, "tpvocab", "norm_diff_fe") <= 1000);
      CHECK(rankField(out, r, "tpvocab", "state_shapes") == 1);
      CHECK(rankField(out, r, "tpvocab", "state_diff_fe") == 0);
    }
  }
}

// Ulysses on `p` ranks: this rank's output and gradients equal whole-sequence causal attention's,
// with four allToAlls of this rank's q-sized shard each way.
void checkUlysses(int p) {
  auto results = runTpJob("ulysses", p, 30s);
  for (int r = 0; r < p; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    CHECK(rankField(out, r, "ulysses", "out_diff_fe") <= 1000);
    CHECK(rankField(out, r, "ulysses", "grad_diff_fe") <= 1000);
    const long long local = rankField(out, r, "ulysses", "local_bytes");
    CHECK(local == 2 * 4 * (8 / p) * 4 * 8);
    CHECK(rankField(out, r, "ulysses", "fwd_a2a") == 4);
    CHECK(rankField(out, r, "ulysses", "fwd_bytes") == 4 * local);
    CHECK(rankField(out, r, "ulysses", "bwd_a2a") == 4);
    CHECK(rankField(out, r, "ulysses", "bwd_bytes") == 4 * local);
    CHECK(contains(restOfLine(out, rankPrefix(r) + "ulysses_error "),
                   "InvalidArgumentError: seqToHeads: the heads (" + std::to_string(2 * p + 1) +
                       ") must be divisible by the sequence-parallel size " + std::to_string(p)));
  }
}

TEST_CASE("Ulysses attention on 2 and 4 processes equals whole-sequence causal attention, forward and "
          "backward, with four all-to-alls each way") {
  checkUlysses(2);
  checkUlysses(4);
}

TEST_CASE("a tensor-parallel GPT in DDP on a mesh {dp: 2, tp: 2} trains as the whole GPT on the whole "
          "batch, and its gathered state dict is the whole GPT's") {
  auto results = runTpJob("dptp", 4, 40s);
  for (int r = 0; r < 4; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    CHECK(rankField(out, r, "dptp", "steps") == 6);
    CHECK(rankField(out, r, "dptp", "loss_diff_fe") <= 100'000);  // 1e-10
    CHECK(rankField(out, r, "dptp", "param_diff_fe") <= 100'000);
    CHECK(rankField(out, r, "dptp", "moved_fe") >= 1'000'000'000'000LL);  // the steps changed the weights: > 1e-3
    // The state gathered from the shards is the reference's, and loads into an nn::GPT.
    CHECK(rankField(out, r, "state", "keys_equal") == 1);
    CHECK(rankField(out, r, "state", "state_diff_fe") <= 100'000);
    CHECK(rankField(out, r, "state", "restored_diff_fe") <= 100'000);
  }
}

// Ring attention on `p` ranks, every layout and mask: this rank's output and gradients equal
// whole-sequence attention's, with P - 1 transfers of a k and v block in forward, and in backward
// P - 1 of a block and P of the gradients accumulated for one, overlapped with the compute or not.
void checkRing(int p) {
  auto results = runTpJob("ring", p, 30s);
  for (int r = 0; r < p; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    for (const char* variant : {"ring_contiguous_causal", "ring_contiguous_full", "ring_zigzag_causal",
                                "ring_zigzag_full", "ring_contiguous_dropout", "ring_zigzag_dropout",
                                "ring_contiguous_sequential", "ring_zigzag_sequential"}) {
      INFO(variant);
      CHECK(rankField(out, r, variant, "out_diff_fe") <= 1000);
      CHECK(rankField(out, r, variant, "grad_diff_fe") <= 1000);
      const long long local = rankField(out, r, variant, "local_bytes");
      CHECK(local == 2 * 2 * (16 / p) * 4 * 8);
      CHECK(rankField(out, r, variant, "fwd_sends") == p - 1);
      CHECK(rankField(out, r, variant, "fwd_bytes") == (p - 1) * 2 * local);
      CHECK(rankField(out, r, variant, "bwd_sends") == 2 * p - 1);
      CHECK(rankField(out, r, variant, "bwd_bytes") == (p - 1) * 4 * local + 2 * local);
    }
  }
}

TEST_CASE("ring attention on 2 and 4 processes, contiguous and zig-zag, causal and not, with dropout too, "
          "equals whole-sequence attention forward and backward") {
  checkRing(2);
  checkRing(4);
}

TEST_CASE("2-D sequence parallelism (Ulysses inside, ring across) on a mesh {ring: 2, ulysses: 2} "
          "equals whole-sequence causal attention") {
  auto results = runTpJob("hybrid", 4, 30s);
  for (int r = 0; r < 4; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    for (const char* variant : {"hybrid_contiguous", "hybrid_zigzag"}) {
      INFO(variant);
      CHECK(rankField(out, r, variant, "tokens") == 4);
      CHECK(rankField(out, r, variant, "out_diff_fe") <= 1000);
      CHECK(rankField(out, r, variant, "grad_diff_fe") <= 1000);
    }
  }
}

// The sequence-parallel GPT on `p` ranks in every mode that fits: loss and all 28 gradients equal
// the whole GPT's on the whole sequence.
void checkSpGpt(int p) {
  auto results = runTpJob("spgpt", p, 40s);
  std::vector<std::string> modes = {"spgpt_ulysses", "spgpt_ring"};
  if (p == 4) modes.push_back("spgpt_hybrid");
  // 13 tokens, padded to the layout's multiple: 16 for every mode here but Ulysses on 2 (14).
  for (const std::string& m : std::vector<std::string>(modes)) modes.push_back(m + "_len13");
  for (int r = 0; r < p; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    for (const std::string& mode : modes) {
      INFO(mode);
      const bool padded = mode.ends_with("_len13");
      const long long length = padded && mode == "spgpt_ulysses_len13" ? (13 + p - 1) / p * p : 16;
      CHECK(rankField(out, r, mode, "tokens") == length / p);
      CHECK(rankField(out, r, mode, "grads") == 28);
      CHECK(rankField(out, r, mode, "loss_diff_fe") <= 1000);
      CHECK(rankField(out, r, mode, "grad_diff_fe") <= 1000);
    }
  }
}

TEST_CASE("a sequence-parallel GPT (Ulysses, ring, 2-D) on 2 and 4 processes has the whole GPT's loss "
          "and gradients, for a sequence length the groups do not divide too") {
  checkSpGpt(2);
  checkSpGpt(4);
}

TEST_CASE("a tensor-parallel GPT with sequence parallelism on a mesh {sp: 2, tp: 2} (Ulysses, ring) has "
          "the whole GPT's loss and gradients") {
  auto results = runTpJob("tpsp", 4, 40s);
  for (int r = 0; r < 4; ++r) {
    const std::string& out = results[static_cast<size_t>(r)].out;
    INFO(out);
    for (const char* mode : {"tpsp_ulysses_len16", "tpsp_ring_len16", "tpsp_ulysses_len13", "tpsp_ring_len13"}) {
      INFO(mode);
      // 16 tokens over 2 ranks; 13 padded to 14 (Ulysses) or 16 (ring zig-zag, chunks of 4).
      const std::string m = mode;
      CHECK(rankField(out, r, mode, "tokens") == (m == "tpsp_ulysses_len13" ? 7 : 8));
      CHECK(rankField(out, r, mode, "loss_diff_fe") <= 1000);
      CHECK(rankField(out, r, mode, "grad_diff_fe") <= 1000);
    }
  }
}

#ifdef PARALLEL_LAYOUTS_PATH
TEST_CASE("bench/parallel_layouts runs on 4 processes and counts each layout's bytes as its formula") {
  MpJob job({PARALLEL_LAYOUTS_PATH, "--seq", "16", "--iters", "1", "--width", "16"}, 4,
            [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(60s);
  job.checkAllGone();
  bool ok = true;
  for (const auto& r : results) ok = ok && !r.timedOut && r.exitCode == 0;
  if (!ok) weft::testing::dumpResults(results);
  REQUIRE(ok);
  const std::string& out = results[0].out;
  INFO(out);
  int rows = 0;
  for (const char* layout : {"dp4 ", "tp4 ", "dp2 x tp2 ", "sp ulysses2 x tp2 ", "sp ulysses4 ", "sp ring4 zigzag ",
                             "sp ring2 x ulysses2 ", "fsdp4 ", "fsdp dp2 x tp2 ", "pp2 x dp2 ", "pp2 x tp2 "}) {
    INFO(layout);
    // "<layout> step tokens/s peak bytes formula": the last two columns.
    std::istringstream row(restOfLine(out, std::string("\n") + layout));
    std::vector<std::string> cells;
    for (std::string cell; row >> cell;) cells.push_back(cell);
    REQUIRE(cells.size() >= 2);
    const std::vector<long long> numbers = {std::stoll(cells[cells.size() - 2]), std::stoll(cells.back())};
    CHECK(numbers[numbers.size() - 1] == numbers[numbers.size() - 2]);
    CHECK(numbers.back() > 0);
    ++rows;
  }
  CHECK(rows == 11);
}

TEST_CASE("bench/parallel_layouts names a size the layouts cannot split and exits 1 on every rank, without aborting") {
  // 6 heads: tp4 cannot split them. Every rank reaches that layout and says so.
  MpJob job({PARALLEL_LAYOUTS_PATH, "--seq", "16", "--iters", "1", "--width", "24", "--heads", "6"}, 4,
            [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(60s);
  job.checkAllGone();
  for (size_t r = 0; r < results.size(); ++r) {
    INFO(weft::testing::resultText(r, results[r]));
    CHECK_FALSE(results[r].timedOut);
    CHECK(results[r].signal == 0);
    CHECK(results[r].exitCode == 1);
    CHECK(results[r].err.find("heads (6) must be divisible by the tensor-parallel size 4") != std::string::npos);
  }
}

TEST_CASE("bench/parallel_layouts --memory: the longest sequence within a rank's budget grows linearly with the "
          "sequence-parallel group") {
  MpJob job({PARALLEL_LAYOUTS_PATH, "--memory", "128,256,512", "--budget-seq", "128", "--width", "16", "--heads", "4"},
            4, [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(60s);
  job.checkAllGone();
  bool ok = true;
  for (const auto& r : results) ok = ok && !r.timedOut && r.exitCode == 0;
  if (!ok) weft::testing::dumpResults(results);
  REQUIRE(ok);
  const std::string& out = results[0].out;
  INFO(out);
  // "<layout> <ranks> <longest seq>[*] <linear> <ratio>" for groups of 2 and 4, each mode.
  int rows = 0;
  for (const char* layout : {"\nulysses ", "\nring zigzag "}) {
    const std::string needle = layout;
    size_t at = 0;
    for (int ranks : {2, 4}) {
      at = out.find(needle, at);
      REQUIRE(at != std::string::npos);
      at += needle.size();
      std::istringstream row(out.substr(at, out.find('\n', at) - at));
      int n = 0;
      std::string longest;
      double linear = 0, ratio = 0;
      row >> n >> longest >> linear >> ratio;
      CAPTURE(layout);
      CAPTURE(ranks);
      CHECK(n == ranks);
      CHECK(linear == 128.0 * ranks);
      CHECK(ratio >= 0.9);
      CHECK(ratio <= 1.1);
      CHECK(std::stod(longest) == doctest::Approx(ratio * linear).epsilon(0.01));
      ++rows;
    }
  }
  CHECK(rows == 4);
}

TEST_CASE("bench/parallel_layouts --overlap times Ulysses, the ring overlapped and not, and the GPT step under each") {
  MpJob job({PARALLEL_LAYOUTS_PATH, "--overlap", "--seq", "64", "--width", "16", "--heads", "4", "--iters", "2"}, 4,
            [](int) { return weft::testing::fastFailureSettings(4); });
  auto results = job.finish(60s);
  job.checkAllGone();
  bool ok = true;
  for (const auto& r : results) ok = ok && !r.timedOut && r.exitCode == 0;
  if (!ok) weft::testing::dumpResults(results);
  REQUIRE(ok);
  const std::string& out = results[0].out;
  INFO(out);
  CHECK(out.find("causal attention over 64 tokens (16 per rank)") != std::string::npos);
  // "<variant> <median s> <ratio to Ulysses>": both positive, Ulysses' ratio 1.
  for (const char* variant : {"\nulysses ", "\nring zigzag (overlapped) ", "\nring zigzag, transfers not overlapped ",
                              "\nring zigzag  "}) {  // the last: the GPT step's row
    INFO(variant);
    const std::string needle = variant;
    const size_t at = out.find(needle);
    REQUIRE(at != std::string::npos);
    std::istringstream row(out.substr(at + needle.size(), out.find('\n', at + needle.size()) - at - needle.size()));
    double seconds = 0, ratio = 0;
    row >> seconds >> ratio;
    CHECK(seconds > 0);
    CHECK(ratio > 0);
    if (needle == "\nulysses ") CHECK(ratio == 1.0);
  }
  CHECK(out.find("ring / ulysses (goal <= 1.2): ") != std::string::npos);
}
#endif
