// rnn: a word-language-model style LSTM split between two processes, trained with RPC,
// distributed autograd and a DistributedOptimizer (after PyTorch's
// examples/distributed/rpc/rnn). Rank 0 is "ps": it holds the embedding table and the decoder,
// which the trainer builds there through remote(). Rank 1 is "trainer": it holds the LSTM, the
// data and the optimizer.
//
//   ./build/tools/weftrun/weftrun -n 2 ./build/examples/rnn/rnn
//       [--iterations 400] [--seed 0] [--ntoken 8] [--ninp 32] [--nhid 64] [--nlayers 2] [--bptt 20]
//       [--batch-size 32] [--dropout 0.5] [--noise 0.1] [--lr 1.0] [--dtype float32|float64]
//       [--log-interval 50] [--metrics rnn_metrics.csv] [--check-gradients] [--upstream]
//
// Per batch, on the trainer, inside a distributed autograd context: detach the hidden state,
// embedding on ps by RPC, the LSTM here, decoder on ps by RPC, cross-entropy here, distributed
// backward, DistributedOptimizer step (SGD) over every parameter's RRef (the embedding's and the
// decoder's fetched from ps, the LSTM's made here with makeRRef). --check-gradients replays each
// batch locally on copies of the weights with plain autograd and compares the gradients.
// README.md explains the task, the flags and the output.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "common/future.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/rnn.h"
#include "rpc/agent.h"
#include "rpc/options.h"
#include "rref/rref.h"
#include "tensor/autograd.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "examples/common/rpc_app.h"

#include "model.h"
#include "task.h"

using namespace weft;
using namespace std::chrono_literals;
using weft::examples::rnn::Decoder;
using weft::examples::rnn::EmbeddingTable;
using Clock = std::chrono::steady_clock;

namespace app = weft::examples::app;

namespace {

using app::say;

constexpr const char* kProgram = "rnn";

struct Flags {
  int64_t iterations = 400;
  uint64_t seed = 0;
  int64_t ntoken = 8;
  int64_t ninp = 32;
  int64_t nhid = 64;
  int64_t nlayers = 2;
  int64_t bptt = 20;
  int64_t batchSize = 32;
  double dropout = 0.5;
  double noise = 0.1;
  double lr = 1.0;
  std::string dtype = "float32";
  int64_t logInterval = 50;
  std::string metrics = "rnn_metrics.csv";
  bool checkGradients = false;
  bool upstream = false;
};

[[noreturn]] void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n 2",
                     "[--iterations N] [--seed N] [--ntoken N] [--ninp N] [--nhid N]\n"
                     "          [--nlayers N] [--bptt N] [--batch-size N] [--dropout P] [--noise P] [--lr X]\n"
                     "          [--dtype float32|float64] [--log-interval N] [--metrics PATH] [--check-gradients] [--upstream]\n"
                     "  (rank 0 is the parameter server \"ps\", rank 1 the trainer)\n");
}

// Flags given explicitly win over --upstream's preset, wherever they stand on the command line.
Flags parseFlags(int argc, char** argv) {
  struct Given {
    std::optional<int64_t> iterations, ntoken, ninp, nhid, nlayers, bptt, batchSize;
    std::optional<double> lr;
  } given;
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    if (a == "--check-gradients") {
      f.checkGradients = true;
      continue;
    }
    if (a == "--upstream") {
      f.upstream = true;
      continue;
    }
    const std::string& v = args.value();
    if (a == "--iterations") given.iterations = args.integer();
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--ntoken") given.ntoken = args.integer();
    else if (a == "--ninp") given.ninp = args.integer();
    else if (a == "--nhid") given.nhid = args.integer();
    else if (a == "--nlayers") given.nlayers = args.integer();
    else if (a == "--bptt") given.bptt = args.integer();
    else if (a == "--batch-size") given.batchSize = args.integer();
    else if (a == "--dropout") f.dropout = args.real();
    else if (a == "--noise") f.noise = args.real();
    else if (a == "--lr") given.lr = args.real();
    else if (a == "--dtype") f.dtype = v;
    else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else args.unknown();
  }
  if (f.upstream) {
    // Upstream's sizes: 10 epochs of 5 batches, sequences of 5 tokens, 6 sequences per batch.
    f.iterations = 50;
    f.ntoken = 7;
    f.ninp = 2;
    f.nhid = 3;
    f.nlayers = 4;
    f.bptt = 5;
    f.batchSize = 6;
    f.lr = 0.05;
  }
  f.iterations = given.iterations.value_or(f.iterations);
  f.ntoken = given.ntoken.value_or(f.ntoken);
  f.ninp = given.ninp.value_or(f.ninp);
  f.nhid = given.nhid.value_or(f.nhid);
  f.nlayers = given.nlayers.value_or(f.nlayers);
  f.bptt = given.bptt.value_or(f.bptt);
  f.batchSize = given.batchSize.value_or(f.batchSize);
  f.lr = given.lr.value_or(f.lr);
  if (f.iterations < 1) usage("--iterations must be at least 1");
  if (f.ntoken < 2) usage("--ntoken must be at least 2");
  if (f.ninp < 1 || f.nhid < 1 || f.nlayers < 1) usage("--ninp, --nhid and --nlayers must be at least 1");
  if (f.bptt < 1) usage("--bptt must be at least 1");
  if (f.batchSize < 1) usage("--batch-size must be at least 1");
  if (!(f.dropout >= 0 && f.dropout < 1)) usage("--dropout must be in [0, 1)");
  if (!(f.noise >= 0 && f.noise <= 1)) usage("--noise must be in [0, 1]");
  if (!(f.lr > 0)) usage("--lr must be positive");
  if (f.logInterval < 1) usage("--log-interval must be at least 1");
  try {
    examples::rnn::parseDType(f.dtype);
  } catch (const Error& e) {
    usage(e.what());
  }
  return f;
}

// splitmix64: the dropout seed of one (iteration, site) pair, from the run's seed.
int64_t dropoutSeed(uint64_t seed, int64_t iteration, uint64_t site) {
  uint64_t z = seed ^ (site << 48) ^ static_cast<uint64_t>(iteration);
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<int64_t>((z ^ (z >> 31)) >> 1);
}

// The job's own messages, bound on both ranks before it starts.
inline const Function<Tensor(RRef<Tensor>, int64_t)> gradientOf{"rnn.gradientOf"};

void bind(rpc::Agent& agent) {
  // The gradient a parameter owned here holds in distributed autograd context `contextId`
  // (undefined when it has none): what the gradient check compares.
  agent.registry().impl(gradientOf, [&agent](RRef<Tensor> param, int64_t contextId) {
    return dist_autograd::gradients(agent, contextId).get(*param.localValue());
  });
}

// After the graceful shutdown: nothing of the job may be left in this process.
void checkShutdown(rpc::Agent& agent, const rpc::ShutdownReport& report) {
  app::checkShutdown(agent, report,
                     {app::layerCounts("RRefs", rref::debugCounts(agent)),
                      app::layerCounts("autograd", dist_autograd::debugCounts(agent)),
                      app::layerCounts("optimizer", dist_optim::debugCounts(agent))});
}

// ps only hosts the trainer's objects: its shutdown serves the trainer until the whole job ends.
int runServer(rpc::Agent& agent) {
  say("%s: holding the embedding table and the decoder for the trainer\n", agent.name().c_str());
  checkShutdown(agent, agent.shutdown());
  return 0;
}

// max |a - b| / max |b| (0 when both are zero).
double relativeDifference(const Tensor& a, const Tensor& b) {
  NoGradGuard noGrad;
  const double diff = max(abs(sub(a, b))).to(DType::Float64).item<double>();
  const double scale = max(abs(b)).to(DType::Float64).item<double>();
  if (diff == 0) return 0;
  return scale > 0 ? diff / scale : INFINITY;
}

int runTrainer(rpc::Agent& agent, const Flags& flags) {
  const DType dtype = examples::rnn::parseDType(flags.dtype);
  const auto seed = static_cast<int64_t>(flags.seed);
  {
    // The model: the two remote halves on ps, the LSTM here.
    RRef<EmbeddingTable> emb = agent.remote<EmbeddingTable>("ps", flags.ntoken, flags.ninp, flags.dropout, seed,
                                                            flags.dtype);
    RRef<Decoder> dec = agent.remote<Decoder>("ps", flags.ntoken, flags.nhid, flags.dropout, seed, flags.dtype);
    const nn::LstmOptions lstmOptions{
        .inputSize = flags.ninp, .hiddenSize = flags.nhid, .numLayers = flags.nlayers, .dropout = flags.dropout};
    auto lstm = std::make_shared<nn::LSTM>(lstmOptions);
    {
      Generator init(flags.seed + 2);
      lstm->resetParameters(&init);
      lstm->to(dtype);
    }

    // Every parameter's RRef, in the model's order: embedding, LSTM, decoder.
    std::vector<RRef<Tensor>> params;
    const int64_t embCount = emb.rpcSync(&EmbeddingTable::parameterTensorCount);
    for (int64_t i = 0; i < embCount; ++i) params.push_back(emb.remote(&EmbeddingTable::parameter, i));
    const std::vector<Tensor> lstmParams = lstm->parameters();
    for (const Tensor& p : lstmParams) params.push_back(makeRRef(agent, p));
    const int64_t decCount = dec.rpcSync(&Decoder::parameterTensorCount);
    for (int64_t i = 0; i < decCount; ++i) params.push_back(dec.remote(&Decoder::parameter, i));
    dist_optim::DistributedOptimizer optimizer(agent, nn::optim::SgdOptions{.lr = flags.lr}, params);

    int64_t scalars = 0;
    for (const RRef<Tensor>& p : params) scalars += p.toHere().numel();
    say("%s: model built: embedding %" PRId64 "x%" PRId64 " and decoder %" PRId64 "->%" PRId64
        " on ps, LSTM %" PRId64 "->%" PRId64 " x%" PRId64 " layers here; %zu parameter tensors (%" PRId64
        " values), dropout %.2f, %s\n",
        agent.name().c_str(), flags.ntoken, flags.ninp, flags.nhid, flags.ntoken, flags.ninp, flags.nhid,
        flags.nlayers, params.size(), scalars, flags.dropout, flags.dtype.c_str());
    say("%s: task %s, %" PRId64 " iterations of %" PRId64 " steps x %" PRId64 " sequences, SGD lr %g%s\n",
        agent.name().c_str(),
        flags.upstream ? "random tokens (upstream sizes; nothing to learn)" : "periodic sequence with noise",
        flags.iterations, flags.bptt, flags.batchSize, flags.lr,
        flags.checkGradients ? ", checking gradients against local autograd" : "");

    std::variant<examples::rnn::PeriodicTask, examples::rnn::RandomTask> task =
        flags.upstream ? std::variant<examples::rnn::PeriodicTask, examples::rnn::RandomTask>(
                             examples::rnn::RandomTask(flags.ntoken, flags.batchSize, flags.seed + 3))
                       : examples::rnn::PeriodicTask(flags.ntoken, flags.batchSize, flags.noise, flags.seed + 3);

    nn::LstmState hidden;
    if (flags.upstream) {
      // Upstream starts from a random state.
      Generator g(flags.seed + 4);
      const TensorOptions o{.dtype = dtype};
      hidden = {randn({flags.nlayers, flags.batchSize, flags.nhid}, o, &g),
                randn({flags.nlayers, flags.batchSize, flags.nhid}, o, &g)};
    }

    std::unique_ptr<nn::LSTM> replayLstm;
    if (flags.checkGradients) {
      replayLstm = std::make_unique<nn::LSTM>(lstmOptions);
      replayLstm->to(dtype);
    }

    std::ofstream csv(flags.metrics);
    if (!csv) throw Error("cannot write the metrics file '" + flags.metrics + "'");
    csv << "iteration,loss,seconds" << (flags.checkGradients ? ",max_rel_diff" : "") << '\n';
    csv.precision(8);

    const int64_t window = std::min(flags.logInterval, flags.iterations);
    double firstWindow = 0, lastWindow = 0, windowLoss = 0, trainSeconds = 0, maxDiff = 0;
    auto windowStart = Clock::now();
    for (int64_t it = 1; it <= flags.iterations; ++it) {
      auto [x, y] = std::visit([&](auto& t) { return t.next(flags.bptt); }, task);
      const int64_t embSeed = dropoutSeed(flags.seed, it, 1);
      const int64_t lstmSeed = dropoutSeed(flags.seed, it, 2);
      const int64_t decSeed = dropoutSeed(flags.seed, it, 3);
      // Detach the state carried from the previous batch: backward stops at this batch.
      nn::LstmState state{hidden.h.defined() ? hidden.h.detach() : Tensor(),
                          hidden.c.defined() ? hidden.c.detach() : Tensor()};

      // The replay's weights: copies of the current values, taken before this batch's step.
      Tensor embW, decW, decB;
      if (flags.checkGradients) {
        auto leaf = [](const Tensor& t) { return t.detach().clone().requiresGrad_(); };
        embW = leaf(params[0].toHere());
        decW = leaf(params[params.size() - 2].toHere());
        decB = leaf(params[params.size() - 1].toHere());
        NoGradGuard noGrad;
        std::vector<Tensor> copies = replayLstm->parameters();
        for (size_t i = 0; i < copies.size(); ++i) copies[i].copy_(lstmParams[i]);
        replayLstm->zeroGrad(true);
      }

      auto t0 = Clock::now();
      double lossValue = 0, diff = 0;
      {
        dist_autograd::Context ctx(agent);
        Tensor e = emb.rpcSync(&EmbeddingTable::forward, x, embSeed);
        Generator lstmGen(static_cast<uint64_t>(lstmSeed));
        lstm->setGenerator(&lstmGen);
        nn::LstmOutput out = lstm->forward(e, state);
        lstm->setGenerator(nullptr);
        Tensor logits = dec.rpcSync(&Decoder::forward, out.output, decSeed);
        Tensor loss = crossEntropy(logits.reshape({-1, flags.ntoken}), y.reshape({-1}));
        ctx.backward({loss});
        hidden = out.state;
        lossValue = loss.to(DType::Float64).item<double>();

        if (flags.checkGradients) {
          // The same batch on this process alone: same weights, same masks, plain autograd.
          Generator embGen(static_cast<uint64_t>(embSeed)), decGen(static_cast<uint64_t>(decSeed)),
              replayGen(static_cast<uint64_t>(lstmSeed));
          replayLstm->setGenerator(&replayGen);
          Tensor le = examples::rnn::embedTokens(embW, x, flags.dropout, &embGen);
          nn::LstmOutput lout = replayLstm->forward(le, state);
          replayLstm->setGenerator(nullptr);
          Tensor llogits = examples::rnn::decode(decW, decB, lout.output, flags.dropout, &decGen);
          Tensor lloss = crossEntropy(llogits.reshape({-1, flags.ntoken}), y.reshape({-1}));
          lloss.backward();
          diff = std::max(diff, relativeDifference(loss.detach(), lloss.detach()));
          const dist_autograd::GradientMap local = ctx.gradients();
          const std::vector<Tensor> replayParams = replayLstm->parameters();
          for (size_t i = 0; i < lstmParams.size(); ++i) {
            Tensor g = local.get(lstmParams[i]);
            if (!g.defined()) throw Error("gradient check: LSTM parameter " + std::to_string(i) + " has no gradient");
            diff = std::max(diff, relativeDifference(g, replayParams[i].grad()));
          }
          const std::vector<std::pair<size_t, Tensor>> remote = {
              {0, embW.grad()}, {params.size() - 2, decW.grad()}, {params.size() - 1, decB.grad()}};
          for (const auto& [index, expected] : remote) {
            Tensor g = agent.sync("ps", gradientOf, params[index], ctx.id());
            if (!g.defined()) {
              throw Error("gradient check: parameter " + std::to_string(index) + " has no gradient on ps");
            }
            diff = std::max(diff, relativeDifference(g, expected));
          }
          maxDiff = std::max(maxDiff, diff);
        }
        optimizer.step(ctx);
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      trainSeconds += seconds;
      csv << it << ',' << lossValue << ',' << seconds;
      if (flags.checkGradients) csv << ',' << diff;
      csv << '\n';

      windowLoss += lossValue;
      if (it % flags.logInterval == 0 || it == flags.iterations) {
        const int64_t n = (it - 1) % flags.logInterval + 1;
        const double elapsed = std::chrono::duration<double>(Clock::now() - windowStart).count();
        const double mean = windowLoss / static_cast<double>(n);
        say("%s: iteration %" PRId64 "/%" PRId64 " loss %.4f %.1f iterations/s%s\n", agent.name().c_str(), it,
            flags.iterations, mean, static_cast<double>(n) / elapsed,
            flags.checkGradients ? (" max relative gradient difference " + std::to_string(maxDiff)).c_str() : "");
        windowLoss = 0;
        windowStart = Clock::now();
      }
      if (it <= window) firstWindow += lossValue / static_cast<double>(window);
      if (it > flags.iterations - window) lastWindow += lossValue / static_cast<double>(window);
    }
    csv.close();
    if (!csv) throw Error("could not write the metrics file '" + flags.metrics + "'");

    const double perIteration = trainSeconds / static_cast<double>(flags.iterations);
    const double chance = std::log(static_cast<double>(flags.ntoken));
    say("final loss %.4f (mean of the last %" PRId64 " iterations; first %" PRId64
        ": %.4f; ln(ntoken) %.4f; ratio to ln(ntoken) %.3f), %" PRId64 " iterations, %.5f s/iteration; metrics in %s\n",
        lastWindow, window, window, firstWindow, chance, lastWindow / chance, flags.iterations, perIteration,
        flags.metrics.c_str());
    if (flags.checkGradients) {
      say("gradient check: max relative difference %.3e between distributed and local autograd over %zu parameter "
          "tensors and %" PRId64 " iterations (%s)\n",
          maxDiff, params.size(), flags.iterations, flags.dtype.c_str());
    }
  }
  checkShutdown(agent, agent.shutdown());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parseFlags(argc, argv);
  try {
    rpc::Options options = rpc::Options::fromEnv();
    if (options.worldSize != 2) {
      throw Error("needs exactly 2 processes (rank 0: the parameter server \"ps\", rank 1: the trainer), got a world "
                  "of " + std::to_string(options.worldSize) + "; start it with weftrun -n 2 " + kProgram);
    }
    options.name = options.rank == 0 ? "ps" : "trainer";
    options.validate();
    rpc::Agent agent(options);
    bind(agent);
    agent.start();
    return options.rank == 0 ? runServer(agent) : runTrainer(agent, flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
