// pipeline_bench: pipeline parallelism on this machine, one process per stage (the bench
// re-executes itself as every rank: `/proc/self/exe --worker MODEL P M SCHEDULE STEPS TRACE
// MLP_BATCH GPT_CONTEXT`), each stage with one kernel thread.
//  1. Bubble: an MLP of 8 equal blocks (Linear(384, 384) + tanh), 2048 rows per step
//     (--mlp-batch), cut into P = 2 and 4 stages, trained with M = 1, 2, 4, 8, 16 micro-batches
//     (of 2048 down to 128 rows) under 1F1B and under interleaved 1F1B with V = 2 chunks per
//     stage (the MLP cut into 2P pieces); the measured bubble (per stage, the share of the
//     pipeline's step, its longest stage's, not spent in forward or backward, averaged over the
//     stages; the median over the timed steps) beside the theory: pipeline::idealBubble of the schedule (backward twice the
//     forward, free communication), which is (P - 1) / (M + P - 1) for 1F1B and
//     (P - 1) / (V·M + P - 1) for the interleaved schedule at M >= P; "diff" is measured - theory.
//     "sim" is the schedule's bubble with each stage's measured median forward and backward and
//     free transfers (pipeline::idealBubble with per-stage costs): it differs from the theory by
//     what uneven stages cost (the last stage also computes the loss; backward is not exactly
//     twice the forward). The stages pass activations and gradients through shared memory
//     (PipelineExecutor, "Shared memory"); "1f1b/group" is 1F1B with WEFT_PIPELINE_SHM=0, the
//     transfers through the process group (Gloo's point-to-point over loopback TCP).
//     "transfers" is measured - sim: what the transfers and the executor
//     cost, the more the smaller the micro-batches (--mlp-batch 256 gives actions of a tenth of a
//     millisecond). Of that, "calls" is the share of the step the stages' own threads spent in
//     the transfers' calls and the yields between actions (StepStats::transferSeconds, averaged
//     over the stages), and "call_us" the same per transfer in microseconds; the rest is time
//     the stages' other threads (Gloo's loop thread, the transfers' waiter threads) took from
//     their CPU and the transfers' latency on the schedule's critical path.
//  2. Memory: the peak activation memory per stage (StepStats::activationBytes: tensor bytes live
//     above the step's start, sampled after each forward), GPipe against 1F1B at M = 8 (goal:
//     1F1B <= (P/M + 0.1) x GPipe, the largest stage), GPipe with activation checkpointing, and
//     interleaved 1F1B (V = 2).
//  3. Throughput: the gpt example's default model (vocab 256, context 128 (--gpt-context), 4
//     blocks of width 128, 4 heads, batch 16) trained for a few steps: tokens/s of one process
//     (all the CPUs' threads), of vanilla model parallelism (P = 2, M = 1) and of the 2-stage
//     pipeline at M = 4 and 8, both schedules (goal: pipelined >= 1.5 x vanilla). With --trace
//     PATH, the last step of the 2-stage 1F1B run at M = 4 is written as a Chrome trace
//     (chrome://tracing, Perfetto).
//  4. Pipe over RPC: the MLP's training rows/s through a controller and remote stages, unsplit on
//     one worker, as vanilla model parallelism (2 stages, M = 1) and pipelined (M = 4, 8).
//
//   pipeline_bench [--quick] [--steps N] [--trace PATH] [--mlp-batch N] [--gpt-context N] [--no-bind]
//
// A pipeline job of at most as many processes as there are CPUs binds each process to its own
// slice of them, as `weftrun --bind-cpus` does (tools/weftrun/cpu_binding.h): the 2-stage
// pipelines here and their vanilla baseline, not the P = 4 ones on 2 cores nor the Pipe jobs
// (whose controller mostly waits). --no-bind leaves every process on every CPU, for comparison.
//
// The P = 4 runs put four processes on the cores there are: where there are fewer than four, the
// stages take turns on them and the measured bubble says so (on 2 cores at most two of four
// stages compute at once, so no stage can be busy more than half the step: a bubble of at least
// 0.5). Errors: exit status 1 with the failing run named.

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/flags.h"
#include "bench/two_process.h"
#include "collectives/init.h"
#include "collectives/object_collectives.h"
#include "kernels/cpu/parallel.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "pipeline/executor.h"
#include "pipeline/pipe.h"
#include "tools/weftrun/cpu_binding.h"
#include "tools/weftrun/options.h"
#include "rpc/agent.h"
#include "tensor/ops.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using weft::Tensor;
namespace nn = weft::nn;
namespace pipeline = weft::pipeline;
using weft::bench::fail;

constexpr const char* kUsage =
    "usage: pipeline_bench [--quick] [--steps N] [--trace PATH] [--mlp-batch N] [--gpt-context N] [--no-bind]\n";

constexpr int64_t kMlpWidth = 384;
// Sizes the coordinator's flags set and passes to every worker on its command line.
int64_t gMlpBatch = 2048;   // --mlp-batch: rows per step of the MLP (sections 1, 2, 4)
int64_t gGptContext = 128;  // --gpt-context: tokens per sequence of the GPT (section 3)
// --no-bind clears it: jobs of at most as many processes as CPUs run each process on its own
// slice of the CPUs, as weftrun --bind-cpus does (tools/weftrun/cpu_binding.h).
bool gBind = true;
constexpr int kMlpBlocks = 8;
constexpr int64_t kGptBatch = 16;

nn::GPTConfig gptConfig() {
  return {.vocabSize = 256, .blockSize = gGptContext, .layers = 4, .heads = 4, .width = 128};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// kMlpBlocks x (Linear(kMlpWidth, kMlpWidth), tanh), initialised from a fixed seed.
std::shared_ptr<nn::Sequential> benchMlp() {
  weft::Generator init(3);
  std::vector<std::shared_ptr<nn::Module>> blocks;
  for (int i = 0; i < kMlpBlocks; ++i) {
    auto l = std::make_shared<nn::Linear>(kMlpWidth, kMlpWidth);
    l->resetParameters(&init);
    blocks.push_back(l);
    blocks.push_back(std::make_shared<nn::Tanh>());
  }
  return nn::makeSequential(blocks);
}

// ---- a worker: one stage ---------------------------------------------------------------------

// What rank 0 prints for a run, one line: "result bubble B step_ms S tokens_per_s T peak_bytes A,B,..".
int runWorker(const std::string& model, int stages, int m, const std::string& scheduleName, int steps,
              const std::string& tracePath) {
  auto pg = weft::collectives::init(weft::rpc::Options::fromEnv(), {.timeout = 120s});
  const int stage = pg->rank();
  if (pg->size() != stages) fail("worker: the job has " + std::to_string(pg->size()) + " ranks, not " +
                                 std::to_string(stages));
  weft::kernels::cpu::setNumThreads(stages == 1 ? static_cast<int>(std::thread::hardware_concurrency()) : 1);

  std::shared_ptr<nn::Sequential> layers;
  std::shared_ptr<nn::GPT> gpt;
  pipeline::LossFn lossFn;
  std::vector<pipeline::TiedParameter> tied;
  weft::Generator init(3);
  if (model == "gpt") {
    gpt = std::make_shared<nn::GPT>(gptConfig(), &init);
    layers = pipeline::gptLayers(gpt);
    tied = pipeline::gptTiedParameters(*gpt, stage, stages);
    lossFn = [](const Tensor& logits, const Tensor& y) {
      return weft::crossEntropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    };
  } else {
    layers = benchMlp();
    lossFn = [](const Tensor& out, const Tensor& y) { return weft::mseLoss(out, y); };
  }
  // Interleaved: the model in V·P pieces, piece c·P + stage being this stage's chunk c.
  const int chunks = scheduleName == "interleaved" ? 2 : 1;
  auto pieces = pipeline::splitSequential(*layers, pipeline::cutsByParameterCount(*layers, stages * chunks));
  std::vector<std::shared_ptr<nn::Module>> mine;
  std::vector<Tensor> params;
  for (int c = 0; c < chunks; ++c) {
    mine.push_back(pieces[static_cast<size_t>(c * stages + stage)]);
    for (const Tensor& p : mine.back()->parameters()) params.push_back(p);
  }
  pipeline::Schedule schedule = scheduleName.rfind("gpipe", 0) == 0 ? pipeline::gpipe(stages, m)
                                : chunks > 1 ? pipeline::interleavedOneFOneB(stages, chunks, m)
                                             : pipeline::oneFOneB(stages, m);
  pipeline::PipelineExecutor pipe(*pg, mine, schedule, lossFn,
                                  {.tied = tied, .checkpoint = scheduleName == "gpipe-ckpt"});
  nn::optim::SGD opt(params, {.lr = 0.01, .momentum = 0.9});

  weft::Generator data(4);
  Tensor x, y;
  int64_t tokensPerStep = 0;
  if (model == "gpt") {
    const auto c = gptConfig();
    x = weft::randint(0, c.vocabSize, {kGptBatch, c.blockSize}, {.dtype = weft::DType::Int64}, &data);
    y = weft::randint(0, c.vocabSize, {kGptBatch, c.blockSize}, {.dtype = weft::DType::Int64}, &data);
    tokensPerStep = kGptBatch * c.blockSize;
  } else {
    x = weft::randn({gMlpBatch, kMlpWidth}, {}, &data);
    y = weft::randn({gMlpBatch, kMlpWidth}, {}, &data);
    tokensPerStep = gMlpBatch;
  }

  constexpr int kWarmup = 2;
  std::vector<double> bubbles, stepSeconds, callShares, callUs;
  std::vector<double> forwardUs, backwardUs;  // this stage's actions over the timed steps
  double peakBytes = 0;
  Clock::time_point t0;
  for (int s = 0; s < kWarmup + steps; ++s) {
    if (s == kWarmup) {
      pg->barrier().wait();
      t0 = Clock::now();
    }
    opt.zeroGrad();
    pipe.step(x, y);
    opt.step();
    if (s < kWarmup) continue;
    const auto& st = pipe.lastStats();
    peakBytes = std::max(peakBytes, static_cast<double>(st.activationBytes));
    for (const pipeline::TraceEvent& e : st.events) {
      if (e.kind == pipeline::ActionKind::Forward) forwardUs.push_back(e.endUs - e.startUs);
      if (e.kind == pipeline::ActionKind::Backward) backwardUs.push_back(e.endUs - e.startUs);
    }
    // The stages start each step together (the gather below ends the one before), so the step
    // of the pipeline is its longest stage's; each stage's bubble is the share of that it did not
    // compute, as in pipeline::idealBubble. (A stage's own step would leave out the time a stage
    // that finished early waits for the others.)
    std::vector<double> mineStats{st.computeSeconds, st.stepSeconds, st.transferSeconds,
                                  static_cast<double>(st.transfers)};
    auto all = weft::collectives::allGatherObject(*pg, mineStats);
    double longest = 0;
    for (const auto& a : all) longest = std::max(longest, a[1]);
    double bubble = 0, share = 0, us = 0;
    for (const auto& a : all) {
      bubble += (1.0 - a[0] / longest) / stages;
      share += a[2] / longest / stages;
      us += (a[3] > 0 ? a[2] / a[3] * 1e6 : 0.0) / stages;
    }
    bubbles.push_back(bubble);
    stepSeconds.push_back(longest);
    callShares.push_back(share);
    callUs.push_back(us);
  }
  pg->barrier().wait();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  auto peaks = weft::collectives::allGatherObject(*pg, peakBytes);
  // The schedule's bubble with each stage's median forward and backward (free transfers).
  auto costs = weft::collectives::allGatherObject(*pg, std::vector<double>{median(forwardUs), median(backwardUs)});
  std::vector<double> stageForward, stageBackward;
  for (const auto& c : costs) {
    stageForward.push_back(std::max(c[0], 1e-3));
    stageBackward.push_back(std::max(c[1], 1e-3));
  }
  const double simulated = pipeline::idealBubble(schedule, stageForward, stageBackward);
  if (!tracePath.empty()) {
    auto traces = weft::collectives::allGatherObject(
        *pg, pipeline::chromeTraceEvents(stage, pipe.lastStats().events));
    if (stage == 0) {
      std::ofstream out(tracePath);
      out << "[";
      for (size_t i = 0; i < traces.size(); ++i) out << (i ? "," : "") << traces[i];
      out << "]\n";
      if (!out) fail("cannot write " + tracePath);
    }
  }
  if (stage == 0) {
    std::string p;
    for (double b : peaks) {
      if (!p.empty()) p += ',';
      p += std::to_string(static_cast<long long>(b));
    }
    std::printf("result bubble %.4f step_ms %.2f tokens_per_s %.1f sim %.4f calls %.4f call_us %.1f peak_bytes %s\n",
                median(bubbles), median(stepSeconds) * 1e3, static_cast<double>(tokensPerStep) * steps / elapsed,
                simulated, median(callShares), median(callUs), p.c_str());
    std::fflush(stdout);
  }
  return 0;
}

// ---- a Pipe over RPC -----------------------------------------------------------------------------

// Rank 0 drives a Pipe over ranks 1.. (the stages, one kernel thread each; a lone stage takes every
// CPU) and prints "result rows_per_s R".
int runPipeWorker(int m, int steps) {
  weft::rpc::Agent agent(weft::rpc::Options::fromEnv());
  const int stages = agent.worldSize() - 1;
  weft::kernels::cpu::setNumThreads(stages == 1 ? static_cast<int>(std::thread::hardware_concurrency()) : 1);
  agent.start();
  if (agent.rank() == 0) {
    std::vector<std::string> workers;
    for (int r = 1; r <= stages; ++r) workers.push_back("worker" + std::to_string(r));
    pipeline::Pipe pipe(agent, "bench-mlp", workers, m);
    weft::dist_optim::DistributedOptimizer opt(agent, nn::optim::SGDOptions{.lr = 0.01}, pipe.remoteParameters());
    weft::Generator data(4);
    Tensor x = weft::randn({gMlpBatch, kMlpWidth}, {}, &data), y = weft::randn({gMlpBatch, kMlpWidth}, {}, &data);
    constexpr int kWarmup = 2;
    Clock::time_point t0;
    for (int s = 0; s < kWarmup + steps; ++s) {
      if (s == kWarmup) t0 = Clock::now();
      weft::dist_autograd::Context ctx(agent);
      Tensor loss = weft::mseLoss(pipe.forward(x), y);
      ctx.backward({loss});
      opt.step(ctx);
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("result rows_per_s %.1f\n", static_cast<double>(gMlpBatch) * steps / elapsed);
    std::fflush(stdout);
  }
  agent.shutdown();
  return 0;
}

// ---- the coordinator ---------------------------------------------------------------------------

struct RunResult {
  double bubble = 0, stepMs = 0, tokensPerS = 0;
  double simulated = 0;  // the schedule's bubble with the measured action times, free transfers
  double calls = 0;      // the stages' share of the step in transfer calls and yields (StepStats::transferSeconds)
  double callUs = 0;     // the same per transfer, microseconds
  std::vector<double> peakBytes;
};

// Runs `world` processes of this program with `args` (after argv[0]), placed as ranks of one job
// whose store is on a free port; returns rank 0's standard output once all have exited, or throws
// naming `what` when one failed.
std::string spawnJob(const std::vector<std::string>& args, int world, const std::string& what, bool bind,
                     bool sharedMemory = true) {
  const uint16_t port = weft::bench::freePort();
  int pipeFds[2];
  if (::pipe(pipeFds) != 0) fail(weft::bench::errnoText("pipe"));
  std::vector<pid_t> pids;
  const pid_t parent = ::getpid();
  std::vector<std::vector<int>> shares;
  if (bind && gBind) {
    try {
      shares = weft::weftrun::cpuShares(world);
    } catch (const weft::weftrun::UsageError&) {
      // Fewer CPUs in this process's mask than processes (P = 4 on 2 CPUs): leave them unbound.
    }
  }
  std::fflush(nullptr);
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) fail(weft::bench::errnoText("fork"));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      if (r == 0) ::dup2(pipeFds[1], STDOUT_FILENO);
      ::close(pipeFds[0]);
      ::close(pipeFds[1]);
      ::setenv("WEFT_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WEFT_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WEFT_WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("WEFT_MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("WEFT_MASTER_PORT", std::to_string(port).c_str(), 1);
      if (!sharedMemory) ::setenv("WEFT_PIPELINE_SHM", "0", 1);
      if (!shares.empty() && weft::weftrun::bindToCpus(shares[static_cast<size_t>(r)]) != 0) ::_exit(1);
      std::vector<std::string> full{"pipeline_bench"};
      full.insert(full.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : full) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  ::close(pipeFds[1]);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(pipeFds[0], buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  ::close(pipeFds[0]);
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok || out.find("result ") == std::string::npos) fail("the run " + what + " failed; rank 0 printed: " + out);
  return out.substr(out.find("result "));
}

// Runs a pipeline of `stages` worker processes and parses rank 0's result line.
RunResult runJob(const std::string& model, int stages, int m, const std::string& schedule, int steps,
                 const std::string& tracePath = "", bool sharedMemory = true) {
  const std::string what = model + " P=" + std::to_string(stages) + " M=" + std::to_string(m) + " " + schedule;
  const std::string line = spawnJob({"--worker", model, std::to_string(stages), std::to_string(m), schedule,
                                     std::to_string(steps), tracePath.empty() ? "-" : tracePath,
                                     std::to_string(gMlpBatch), std::to_string(gGptContext)},
                                    stages, what, /*bind=*/true, sharedMemory);
  RunResult r;
  char peaks[1024] = {0};
  if (std::sscanf(line.c_str(),
                  "result bubble %lf step_ms %lf tokens_per_s %lf sim %lf calls %lf call_us %lf peak_bytes %1000s",
                  &r.bubble, &r.stepMs, &r.tokensPerS, &r.simulated, &r.calls, &r.callUs, peaks) != 7) {
    fail("the run " + what + " printed no result line: " + line);
  }
  std::string p = peaks;
  for (size_t s = 0; s < p.size();) {
    size_t e = p.find(',', s);
    if (e == std::string::npos) e = p.size();
    r.peakBytes.push_back(std::stod(p.substr(s, e - s)));
    s = e + 1;
  }
  return r;
}

// A Pipe over RPC of `stages` remote stages (plus the controller) and M micro-batches: rows/s.
double runPipeJob(int stages, int m, int steps) {
  const std::string what = "Pipe stages=" + std::to_string(stages) + " M=" + std::to_string(m);
  const std::string line =
      spawnJob({"--pipe-worker", std::to_string(m), std::to_string(steps), std::to_string(gMlpBatch)}, stages + 1,
               what, /*bind=*/false);
  double rowsPerS = 0;
  if (std::sscanf(line.c_str(), "result rows_per_s %lf", &rowsPerS) != 1) fail(what + ": no result line: " + line);
  return rowsPerS;
}

double largest(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

int runCoordinator(bool quick, int steps, const std::string& tracePath) {
  std::printf("pipeline_bench: %u CPUs, load average %s, %d timed steps per run after 2 warm-up steps\n",
              std::thread::hardware_concurrency(), weft::bench::loadAverage().c_str(), steps);
  std::printf("pipeline stages bound to CPUs: %s\n",
              gBind ? "yes, in jobs of at most one process per CPU (--no-bind: no)" : "no (--no-bind)");

  std::printf("\n1. bubble, an MLP of %d x Linear(%lld, %lld)+tanh, batch %lld; 1f1b and interleaved 1F1B "
              "(V = 2)\n", kMlpBlocks, static_cast<long long>(kMlpWidth), static_cast<long long>(kMlpWidth),
              static_cast<long long>(gMlpBatch));
  std::printf("%3s %3s %-12s %8s %9s %7s %8s %9s %7s %8s %9s\n", "P", "M", "schedule", "theory", "measured", "diff",
              "sim", "transfers", "calls", "call_us", "step_ms");
  const std::vector<int> ms = quick ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8, 16};
  for (int p : {2, 4}) {
    for (int m : ms) {
      for (const char* s : {"1f1b", "1f1b/group", "interleaved"}) {
        const bool interleaved = std::string(s) == "interleaved";
        const bool group = std::string(s) == "1f1b/group";
        RunResult r = runJob("mlp", p, m, group ? "1f1b" : s, steps, "", /*sharedMemory=*/!group);
        const double theory =
            pipeline::idealBubble(interleaved ? pipeline::interleavedOneFOneB(p, 2, m) : pipeline::oneFOneB(p, m));
        std::printf("%3d %3d %-12s %8.3f %9.3f %+7.3f %8.3f %+9.3f %7.3f %8.1f %9.2f\n", p, m, s, theory, r.bubble,
                    r.bubble - theory, r.simulated, r.bubble - r.simulated, r.calls, r.callUs, r.stepMs);
        std::fflush(stdout);
      }
    }
  }

  const int memM = 8;
  std::printf("\n2. peak activation memory per stage (bytes), M = %d\n", memM);
  std::printf("%3s %-8s %-40s %10s\n", "P", "schedule", "per stage", "largest");
  for (int p : {2, 4}) {
    RunResult g = runJob("mlp", p, memM, "gpipe", steps);
    RunResult f = runJob("mlp", p, memM, "1f1b", steps);
    RunResult c = runJob("mlp", p, memM, "gpipe-ckpt", steps);
    RunResult i = runJob("mlp", p, memM, "interleaved", steps);
    auto row = [p](const char* name, const RunResult& r) {
      std::string per;
      for (double b : r.peakBytes) {
        if (!per.empty()) per += ' ';
        per += std::to_string(static_cast<long long>(b));
      }
      std::printf("%3d %-8s %-40s %10lld\n", p, name, per.c_str(), static_cast<long long>(largest(r.peakBytes)));
    };
    row("gpipe", g);
    row("1f1b", f);
    row("gpipe+ck", c);
    row("interl.", i);
    std::printf("    1f1b / gpipe = %.3f (goal <= P/M + 0.1 = %.3f)\n", largest(f.peakBytes) / largest(g.peakBytes),
                static_cast<double>(p) / memM + 0.1);
    std::fflush(stdout);
  }

  const auto c = gptConfig();
  std::printf("\n3. GPT training throughput (vocab %lld, %lld tokens, %lld blocks of width %lld, batch %lld)\n",
              static_cast<long long>(c.vocabSize), static_cast<long long>(c.blockSize),
              static_cast<long long>(c.layers), static_cast<long long>(c.width), static_cast<long long>(kGptBatch));
  RunResult single = runJob("gpt", 1, 1, "1f1b", steps);
  RunResult vanilla = runJob("gpt", 2, 1, "1f1b", steps);
  std::printf("%-34s %12s %10s %10s\n", "run", "tokens/s", "step_ms", "/vanilla");
  auto row = [&vanilla](const std::string& name, const RunResult& r) {
    std::printf("%-34s %12.1f %10.2f %10.2f\n", name.c_str(), r.tokensPerS, r.stepMs, r.tokensPerS / vanilla.tokensPerS);
    std::fflush(stdout);
  };
  row("one process, all CPUs", single);
  row("vanilla model parallel P=2 M=1", vanilla);
  for (int m : {4, 8}) {
    for (const char* s : {"gpipe", "1f1b"}) {
      const bool traced = !tracePath.empty() && m == 4 && std::string(s) == "1f1b";
      RunResult r = runJob("gpt", 2, m, s, steps, traced ? tracePath : "");
      row(std::string("pipelined P=2 M=") + std::to_string(m) + " " + s, r);
    }
  }
  std::printf("goal: pipelined >= 1.5 x vanilla\n");
  if (!tracePath.empty()) std::printf("trace of the last P=2 M=4 1f1b step: %s\n", tracePath.c_str());

  std::printf("\n4. Pipe over RPC (a controller, remote stages), the MLP of section 1, training rows/s\n");
  const double unsplit = runPipeJob(1, 1, steps);
  const double vanillaRpc = runPipeJob(2, 1, steps);
  std::printf("%-34s %12s %10s\n", "run", "rows/s", "/vanilla");
  std::printf("%-34s %12.1f %10.2f\n", "unsplit on one worker", unsplit, unsplit / vanillaRpc);
  std::printf("%-34s %12.1f %10.2f\n", "vanilla model parallel 2 stages", vanillaRpc, 1.0);
  for (int m : {4, 8}) {
    const double r = runPipeJob(2, m, steps);
    std::printf("%-34s %12.1f %10.2f\n", ("Pipe 2 stages M=" + std::to_string(m)).c_str(), r, r / vanillaRpc);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    pipeline::declareStageBuilder("bench-mlp", [](int64_t stage, int64_t stages) -> std::shared_ptr<nn::Module> {
      auto net = benchMlp();
      return pipeline::splitSequential(*net, pipeline::cutsByParameterCount(*net, static_cast<int>(stages)))
          [static_cast<size_t>(stage)];
    });
    if (argc > 1 && std::string(argv[1]) == "--pipe-worker") {
      if (argc != 5) fail("--pipe-worker takes M STEPS MLP_BATCH");
      gMlpBatch = std::atoll(argv[4]);
      return runPipeWorker(std::atoi(argv[2]), std::atoi(argv[3]));
    }
    if (argc > 1 && std::string(argv[1]) == "--worker") {
      if (argc != 10) fail("--worker takes MODEL P M SCHEDULE STEPS TRACE MLP_BATCH GPT_CONTEXT");
      const std::string trace = argv[7];
      gMlpBatch = std::atoll(argv[8]);
      gGptContext = std::atoll(argv[9]);
      return runWorker(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), argv[5], std::atoi(argv[6]),
                       trace == "-" ? "" : trace);
    }
    bool quick = false;
    int steps = 0;
    std::string trace;
    weft::bench::Flags flags;
    flags.onSwitch("--quick", [&quick] { quick = true; });
    flags.onValue("--steps", [&steps](const std::string& v) {
      steps = static_cast<int>(weft::bench::intFlag("--steps", v, 1, 1000));
    });
    flags.onValue("--trace", [&trace](const std::string& v) { trace = v; });
    // Multiples of 16 (the most micro-batches) and of the 4 heads' context respectively.
    flags.onValue("--mlp-batch", [](const std::string& v) {
      gMlpBatch = weft::bench::intFlag("--mlp-batch", v, 16, 1 << 16);
      if (gMlpBatch % 16 != 0) throw weft::bench::FlagError("--mlp-batch must be a multiple of 16, got " + v);
    });
    flags.onSwitch("--no-bind", [] { gBind = false; });
    flags.onValue("--gpt-context", [](const std::string& v) {
      gGptContext = weft::bench::intFlag("--gpt-context", v, 8, 1024);
    });
    if (!weft::bench::parseFlagsOrUsage(flags, argc, argv, "pipeline_bench", kUsage)) return 2;
    if (steps == 0) steps = quick ? 2 : 8;
    return runCoordinator(quick, steps, trace);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bench: %s\n", e.what());
    return 1;
  }
}
