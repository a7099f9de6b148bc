// The command line of the gpt example (main.cpp): its flags, their defaults and their checks,
// read through the examples' shared FlagReader. The defaults train the model of the README in
// one to three minutes on two cores.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/text.h"
#include "examples/common/app.h"
#include "nn/transformer.h"

namespace weft::examples::gpt {

inline constexpr const char* kProgram = "gpt";

struct Flags {
  // The model.
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t width = 128;
  int64_t block = 128;  // context length: the training windows and the position table
  double dropout = 0.0;
  std::string checkpoint = "none";  // none, every-block, every:K, sqrt
  std::string precision = "float32";  // float32, or bf16: products in bfloat16 (tensor/autocast.h)
  std::string device = "cpu";          // cpu, cuda or cuda:N: where the one-process model trains
  // The optimisation.
  int64_t steps = 1500;
  int64_t batchSize = 16;
  double lr = 1e-3;      // the peak, reached at the end of the warm-up
  double minLr = 1e-4;   // the end of the cosine decay
  int64_t warmup = 50;   // steps of linear warm-up from lr / warmup
  double weightDecay = 0.1;  // on the matrices only (nn::optim::decayGroups)
  double gradClip = 1.0;     // the largest gradient norm; 0 = no clipping
  // Reporting.
  int64_t logInterval = 20;
  int64_t evalInterval = 100;  // also at step 0 and after the last step
  int64_t evalBatches = 8;    // validation windows: evalBatches x batchSize
  std::string metrics = "gpt_metrics.csv";
  // The sample printed at the end.
  std::string prompt = "The ";
  int64_t sampleTokens = 300;
  double temperature = 0.8;
  int64_t topK = 40;
  // The data and the run.
  std::string dataDir = data::kFortunesDir;
  uint64_t seed = 0;
  // Checkpoints of the whole model (nn/serialize.h), whatever the layout: --load starts from the
  // weights of a file instead of the seed's; --save writes the trained model after the last step.
  std::string load;
  std::string save;

  int64_t pp = 1;                 // pipeline stages, one per process (weftrun -n P)
  std::string schedule = "1f1b";  // gpipe, 1f1b or interleaved (2 chunks per stage), with --pp
  int64_t microbatches = 4;       // per step, with --pp; must divide --batch-size
  // Fully sharded data parallel (fsdp_layout.h): over the job's processes, or with --pp, --tp or
  // --sp (any of them together) over the --dp replicas.
  bool fsdp = false;

  // Data-parallel replicas: with --pp, of the pipeline, its stages tensor- and sequence-parallel
  // with --tp and --sp (weftrun -n D·P·T·S, pipeline_layout.h); otherwise of a process mesh
  // (mesh_layout.h) with tensor- and sequence-parallel sizes, whose product is the job's size
  // (weftrun -n dp·tp·sp). --batch-size is each data-parallel replica's.
  int64_t dp = 1;
  int64_t zero = 0;                 // with --dp alone: 1 ZeroRedundancyOptimizer, 2 ShardedDataParallel
  int64_t tp = 1;
  int64_t sp = 1;
  std::string spMode = "ulysses";  // ulysses, ring (zig-zag) or 2d (Ulysses x ring)
};

[[noreturn]] inline void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "",
                     "[--layers N] [--heads N] [--width N] [--block N] [--dropout P]\n"
                     "           [--checkpoint none|every-block|every:K|sqrt] [--precision float32|bf16]\n"
                     "           [--device cpu|cuda|cuda:N]\n"
                     "           [--steps N] [--batch-size N]\n"
                     "           [--lr X] [--min-lr X] [--warmup N] [--weight-decay X] [--grad-clip X]\n"
                     "           [--log-interval N] [--eval-interval N] [--eval-batches N] [--metrics PATH]\n"
                     "           [--prompt TEXT] [--sample-tokens N] [--temperature X] [--top-k N]\n"
                     "           [--data-dir DIR] [--seed N] [--load PATH] [--save PATH]\n"
                     "           [--pp P [--schedule gpipe|1f1b|interleaved] [--microbatches M] [--dp D] [--tp T] [--sp S]]\n"
                     "             (P > 1: weftrun -n D·P·T·S)\n"
                     "           [--dp D [--zero 1|2]] [--tp T] [--sp S [--sp-mode ulysses|ring|2d]]\n"
                     "             (D·T·S > 1: weftrun -n D·T·S)\n"
                     "           [--fsdp [--dp D [--pp P] [--tp T] [--sp S]]]\n"
                     "             (fully sharded data parallel: over the job, or over D replicas of a pipeline\n"
                     "             of tp/sp stages or of a tp/sp mesh; weftrun -n D·P·T·S)\n");
}

// The checkpointing policy a --checkpoint value names; usage() for anything else.
inline nn::CheckpointPolicy checkpointPolicy(const std::string& v) {
  if (v == "none") return nn::CheckpointPolicy::none();
  if (v == "every-block") return nn::CheckpointPolicy::everyBlock();
  if (v == "sqrt") return nn::CheckpointPolicy::sqrtN();
  if (v.rfind("every:", 0) == 0) {
    char* end = nullptr;
    long k = std::strtol(v.c_str() + 6, &end, 10);
    if (end != v.c_str() + 6 && *end == '\0' && k >= 1 && k <= 1 << 20) return nn::CheckpointPolicy::every(static_cast<int>(k));
  }
  usage("invalid value '" + v + "' for --checkpoint (none, every-block, every:K with K >= 1, sqrt)");
}

// Whether the flags ask for a process mesh (mesh_layout.h).
inline bool meshLayout(const Flags& f) { return f.dp > 1 || f.tp > 1 || f.sp > 1; }

// The Ulysses size of --sp-mode 2d: the largest divisor U of --sp with 1 < U < sp that divides
// the heads of a tensor-parallel rank (the ring then has sp / U positions); 0 when there is none.
inline int64_t ulyssesSize2d(const Flags& f) {
  for (int64_t u = f.sp - 1; u > 1; --u)
    if (f.sp % u == 0 && f.tp > 0 && f.heads % f.tp == 0 && (f.heads / f.tp) % u == 0) return u;
  return 0;
}

// The checks of --dp, --zero, --tp, --sp and --sp-mode that need no process group (the job's size
// is checked by the layout).
inline void checkMeshFlags(const Flags& f) {
  if (f.dp < 1 || f.tp < 1 || f.sp < 1) usage("--dp, --tp and --sp must be positive");
  if (f.zero < 0 || f.zero > 2) usage("invalid value '" + std::to_string(f.zero) + "' for --zero (1, 2)");
  if (f.spMode != "ulysses" && f.spMode != "ring" && f.spMode != "2d") {
    usage("invalid value '" + f.spMode + "' for --sp-mode (ulysses, ring, 2d)");
  }
  if (!meshLayout(f)) {
    if (f.zero > 0) usage("--zero needs --dp > 1");
    return;
  }
  if (f.zero > 0 && (f.dp < 2 || f.tp > 1 || f.sp > 1 || f.pp > 1)) {
    usage("--zero needs --dp > 1 and no --tp, --sp or --pp");
  }
  if (f.heads % f.tp != 0) {
    usage("--tp " + std::to_string(f.tp) + " must divide --heads " + std::to_string(f.heads) +
          " (each tensor-parallel rank holds whole heads)");
  }
  if (f.sp > 1 && f.spMode == "ulysses" && (f.heads / f.tp) % f.sp != 0) {
    usage("--sp " + std::to_string(f.sp) + " with --sp-mode ulysses must divide the heads of a tensor-parallel rank (" +
          std::to_string(f.heads / f.tp) + ")");
  }
  if (f.sp > 1 && f.spMode == "2d" && ulyssesSize2d(f) == 0) {
    usage("--sp " + std::to_string(f.sp) + " with --sp-mode 2d must be U x R with U, R >= 2 and U dividing the heads of a"
          " tensor-parallel rank (" + std::to_string(f.heads / f.tp) + ")");
  }
  if (f.pp > 1) return;  // the pipeline checks its precision and device itself
  if (f.precision != "float32") usage("--precision " + f.precision + " trains in one process; --dp, --tp and --sp in float32");
  if (f.device != "cpu") usage("--device cuda trains in one process; --dp, --tp and --sp run on CPUs");
}

inline nn::GPTConfig modelConfig(const Flags& f) {
  return {.vocabSize = data::ByteTokenizer::kVocab,
          .blockSize = f.block,
          .layers = f.layers,
          .heads = f.heads,
          .width = f.width,
          .dropout = f.dropout,
          .bias = true,
          .checkpoint = checkpointPolicy(f.checkpoint)};
}

inline Flags parseFlags(int argc, char** argv) {
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    if (a == "--fsdp") {  // a switch: no value
      f.fsdp = true;
      continue;
    }
    const std::string& v = args.value();
    if (a == "--layers") f.layers = args.integer();
    else if (a == "--heads") f.heads = args.integer();
    else if (a == "--width") f.width = args.integer();
    else if (a == "--block") f.block = args.integer();
    else if (a == "--dropout") f.dropout = args.real(true);
    else if (a == "--checkpoint") f.checkpoint = v;
    else if (a == "--precision") f.precision = v;
    else if (a == "--device") f.device = v;
    else if (a == "--steps") f.steps = args.integer();
    else if (a == "--batch-size") f.batchSize = args.integer();
    else if (a == "--lr") f.lr = args.real(true);
    else if (a == "--min-lr") f.minLr = args.real(true);
    else if (a == "--warmup") f.warmup = args.integer();
    else if (a == "--weight-decay") f.weightDecay = args.real(true);
    else if (a == "--grad-clip") f.gradClip = args.real(true);
    else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--eval-interval") f.evalInterval = args.integer();
    else if (a == "--eval-batches") f.evalBatches = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else if (a == "--prompt") f.prompt = v;
    else if (a == "--sample-tokens") f.sampleTokens = args.integer();
    else if (a == "--temperature") f.temperature = args.real(true);
    else if (a == "--top-k") f.topK = args.integer();
    else if (a == "--data-dir") f.dataDir = v;
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--load") f.load = v;
    else if (a == "--save") f.save = v;
    else if (a == "--pp") f.pp = args.integer();
    else if (a == "--schedule") f.schedule = v;
    else if (a == "--microbatches") f.microbatches = args.integer();
    else if (a == "--dp") f.dp = args.integer();
    else if (a == "--zero") f.zero = args.integer();
    else if (a == "--tp") f.tp = args.integer();
    else if (a == "--sp") f.sp = args.integer();
    else if (a == "--sp-mode") f.spMode = v;
    else args.unknown();
  }
  if (f.layers < 1 || f.heads < 1 || f.width < 1 || f.block < 2) {
    usage("--layers, --heads and --width must be positive, --block at least 2");
  }
  if (f.width % f.heads != 0) usage("--heads must divide --width");
  if (f.dropout < 0 || f.dropout >= 1) usage("--dropout must lie in [0, 1)");
  checkpointPolicy(f.checkpoint);
  if (f.precision != "float32" && f.precision != "bf16") {
    usage("invalid value '" + f.precision + "' for --precision (float32, bf16)");
  }
  try {
    (void)Device::parse(f.device);
  } catch (const Error&) {
    usage("invalid value '" + f.device + "' for --device (cpu, cuda, cuda:N)");
  }
  if (f.device != "cpu" && f.pp > 1) usage("--device cuda trains in one process; --pp runs on CPUs");
  if (f.precision != "float32" && f.pp > 1) usage("--precision " + f.precision + " trains in one process; --pp in float32");
  if (f.steps < 1 || f.batchSize < 1) usage("--steps and --batch-size must be positive");
  if (f.lr <= 0 || f.minLr < 0 || f.minLr > f.lr) usage("--lr must be positive and --min-lr in [0, lr]");
  if (f.warmup < 0 || f.warmup > f.steps) usage("--warmup must lie in [0, steps]");
  if (f.weightDecay < 0 || f.gradClip < 0) usage("--weight-decay and --grad-clip must be non-negative");
  if (f.logInterval < 1 || f.evalInterval < 1 || f.evalBatches < 1) {
    usage("--log-interval, --eval-interval and --eval-batches must be positive");
  }
  if (f.prompt.empty()) usage("--prompt must not be empty");
  if (f.pp < 1 || f.microbatches < 1) usage("--pp and --microbatches must be positive");
  if (f.schedule != "gpipe" && f.schedule != "1f1b" && f.schedule != "interleaved") {
    usage("invalid value '" + f.schedule + "' for --schedule (gpipe, 1f1b, interleaved)");
  }
  if (f.fsdp && f.device != "cpu") usage("--fsdp runs on CPUs");
  if (f.fsdp && f.zero > 0) usage("--fsdp does not combine with --zero");
  if (f.fsdp && (f.pp > 1 || f.tp > 1 || f.sp > 1) && f.dp < 2) {
    usage("--fsdp with --pp, --tp or --sp shards over the data-parallel replicas: it needs --dp > 1");
  }
  if (f.pp > 1 && f.batchSize % f.microbatches != 0) usage("--microbatches must divide --batch-size");
  if (f.sampleTokens < 0 || f.temperature < 0 || f.topK < 0) {
    usage("--sample-tokens, --temperature and --top-k must be non-negative");
  }
  checkMeshFlags(f);
  return f;
}

}  // namespace weft::examples::gpt
