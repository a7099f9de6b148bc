// rnn: a word-language-model style LSTM split between two processes, trained with RPC,
// distributed autograd and a DistributedOptimizer (after PyTorch's examples/distributed/rpc/rnn).
//
//   ./build/tools/weftrun/weftrun -n 2 ./build/examples/rnn/rnn
//       [--iterations 400] [--seed 0] [--ntoken 8] [--ninp 32] [--nhid 64] [--nlayers 2] [--bptt 20]
//       [--batch-size 32] [--dropout 0.5] [--noise 0.1] [--lr 1.0] [--dtype float32|float64]
//       [--log-interval 50] [--metrics rnn_metrics.csv] [--check-gradients] [--upstream]
//
// Roles, and what lives where:
//   rank 0  "ps": the embedding table and the decoder (model.h), which the trainer builds there
//           through remote(); it only serves: its shutdown() answers the trainer until the job ends.
//   rank 1  "trainer": the LSTM, the data (task.h), the loss and the DistributedOptimizer.
// Per batch, on the trainer, inside a distributed autograd context: detach the hidden state,
// embedding on ps by RPC, the LSTM here, decoder on ps by RPC, cross-entropy here, distributed
// backward, DistributedOptimizer step (SGD) over every parameter's RRef (the embedding's and the
// decoder's fetched from ps, the LSTM's made here with makeRRef). --check-gradients replays each
// batch locally and compares the gradients (gradient_check.h). README.md explains the task, the
// flags and the output.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "nn/rnn.h"
#include "rpc/options.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "examples/common/dist_app.h"
#include "examples/common/metrics.h"

#include "flags.h"
#include "gradient_check.h"
#include "inputs.h"
#include "model.h"
#include "summary.h"

using namespace weft;
using namespace weft::examples::rnn;
namespace app = weft::examples::app;
using app::say;

namespace {

void runTrainer(rpc::Agent& agent, const Flags& flags) {
  const DType dtype = parseDType(flags.dtype);
  const auto seed = static_cast<int64_t>(flags.seed);
  const char* name = agent.name().c_str();  // the agent's own string, alive as long as the agent
  // The model: the two remote halves on ps, the LSTM here.
  RRef<EmbeddingTable> emb =
      agent.remote<EmbeddingTable>("ps", flags.ntoken, flags.ninp, flags.dropout, seed, flags.dtype);
  RRef<Decoder> dec = agent.remote<Decoder>("ps", flags.ntoken, flags.nhid, flags.dropout, seed, flags.dtype);
  const nn::LstmOptions lstmOptions{
      .inputSize = flags.ninp, .hiddenSize = flags.nhid, .numLayers = flags.nlayers, .dropout = flags.dropout};
  auto lstm = std::make_shared<nn::LSTM>(lstmOptions);
  Generator init(flags.seed + 2);
  lstm->resetParameters(&init);
  lstm->to(dtype);

  // Every parameter's RRef, in the model's order: embedding (on ps), LSTM (here), decoder (on ps).
  std::vector<RRef<Tensor>> params;
  const int64_t embCount = emb.rpcSync(&EmbeddingTable::parameterTensorCount);
  for (int64_t i = 0; i < embCount; ++i) params.push_back(emb.remote(&EmbeddingTable::parameter, i));
  const std::vector<Tensor> lstmParams = lstm->parameters();
  for (const Tensor& p : lstmParams) params.push_back(makeRRef(agent, p));
  const int64_t decCount = dec.rpcSync(&Decoder::parameterTensorCount);
  for (int64_t i = 0; i < decCount; ++i) params.push_back(dec.remote(&Decoder::parameter, i));
  dist_optim::DistributedOptimizer optimizer(agent, nn::optim::SGDOptions{.lr = flags.lr}, params);
  printModel(agent, flags, params);

  std::variant<PeriodicTask, RandomTask> task = makeTask(flags);
  nn::LstmState hidden = initialState(flags, dtype);
  std::optional<GradientCheck> check;
  if (flags.checkGradients) check.emplace(lstmOptions, dtype, flags.ntoken, flags.dropout);
  app::CsvFile csv(flags.metrics, check ? "iteration,loss,seconds,max_rel_diff" : "iteration,loss,seconds");
  csv.setPrecision(8);

  LossWindows losses(flags.iterations, flags.logInterval);
  double trainSeconds = 0, maxDiff = 0;
  app::Window window;
  for (int64_t it = 1; it <= flags.iterations; ++it) {
    auto [x, y] = std::visit([&](auto& t) { return t.next(flags.bptt); }, task);
    // This batch: its tokens, the carried state detached (backward stops here), its dropout seeds.
    ReplayBatch batch{x, y, detached(hidden), dropoutSeed(flags.seed, it, 1), dropoutSeed(flags.seed, it, 2),
                      dropoutSeed(flags.seed, it, 3)};
    if (check) check->copyWeights(params, lstmParams);  // before this batch's step

    const auto t0 = app::Clock::now();
    double lossValue = 0, diff = 0;
    {
      dist_autograd::Context ctx(agent);
      Tensor e = emb.rpcSync(&EmbeddingTable::forward, x, batch.embSeed);
      Generator lstmGen(static_cast<uint64_t>(batch.lstmSeed));
      lstm->setGenerator(&lstmGen);
      nn::LstmOutput out = lstm->forward(e, batch.state);
      lstm->setGenerator(nullptr);
      Tensor logits = dec.rpcSync(&Decoder::forward, out.output, batch.decSeed);
      Tensor loss = crossEntropy(logits.reshape({-1, flags.ntoken}), y.reshape({-1}));
      ctx.backward({loss});
      hidden = out.state;
      lossValue = loss.to(DType::Float64).item<double>();
      if (check) maxDiff = std::max(maxDiff, diff = check->replay(agent, ctx, batch, loss, params, lstmParams));
      optimizer.step(ctx);
    }
    const double seconds = app::secondsSince(t0);
    trainSeconds += seconds;
    if (check) csv.row(it, lossValue, seconds, diff);
    else csv.row(it, lossValue, seconds);
    window.add(lossValue, 0, 0);
    if (it % flags.logInterval == 0 || it == flags.iterations) {
      say("%s: iteration %" PRId64 "/%" PRId64 " loss %.4f %.1f iterations/s%s\n", name, it, flags.iterations,
          window.meanLoss(), window.batchesPerSecond(),
          check ? (" max relative gradient difference " + std::to_string(maxDiff)).c_str() : "");
      window.reset();
    }
    losses.add(it, lossValue);
  }
  csv.close();

  const double chance = std::log(static_cast<double>(flags.ntoken));
  say("final loss %.4f (mean of the last %" PRId64 " iterations; first %" PRId64
      ": %.4f; ln(ntoken) %.4f; ratio to ln(ntoken) %.3f), %" PRId64 " iterations, %.5f s/iteration; metrics in %s\n",
      losses.last, losses.window, losses.window, losses.first, chance, losses.last / chance, flags.iterations,
      trainSeconds / static_cast<double>(flags.iterations), flags.metrics.c_str());
  if (check) {
    say("gradient check: max relative difference %.3e between distributed and local autograd over %zu parameter "
        "tensors and %" PRId64 " iterations (%s)\n",
        maxDiff, params.size(), flags.iterations, flags.dtype.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parseFlags(argc, argv);
  try {
    rpc::Options options = rpc::Options::fromEnv();
    if (options.worldSize != 2) {
      throw Error("needs exactly 2 processes (rank 0: the parameter server \"ps\", rank 1: the trainer), got a world "
                  "of " + std::to_string(options.worldSize) + "; start it with weftrun -n 2 " + kProgram);
    }
    options.name = options.rank == 0 ? "ps" : "trainer";
    options.validate();
    rpc::Agent agent(options);
    bindGradientOf(agent);
    agent.start();
    if (options.rank == 0) {
      say("%s: holding the embedding table and the decoder for the trainer\n", agent.name().c_str());
    } else {
      runTrainer(agent, flags);
    }
    app::shutdownCleanly(agent);  // the job's end: every rank's objects released, every call answered
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
