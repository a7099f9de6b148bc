// Pipe: pipeline parallelism driven by one controller over RPC, after the
// RPC framework's pipeline tutorial. The stages are objects on other
// workers (PipeStage, a remote class); a batch is split into micro-batches
// that flow through them as asynchronous remote() calls, each stage fetching
// its input from the previous stage's worker through an RRef (never through
// the controller); backward runs through distributed autograd and a
// DistributedOptimizer steps every stage's parameters where they live.
//
//   // in every program of the job, before the agent starts:
//   pipeline::declareStageBuilder("mlp", [](int64_t stage, int64_t stages) {
//     auto net = buildMlp(/*seed=*/1);                                   // the whole model
//     return pipeline::splitSequential(*net, pipeline::cutsByParameterCount(*net, stages))[stage];
//   });
//   // on the controller:
//   pipeline::Pipe pipe(agent, "mlp", {"worker1", "worker2"}, /*microbatches=*/4);
//   dist_optim::DistributedOptimizer opt(agent, nn::optim::SGDOptions{.lr = 0.05}, pipe.remoteParameters());
//   {
//     dist_autograd::Context ctx(agent);
//     Tensor loss = mseLoss(pipe.forward(x), y);
//     ctx.backward({loss});
//     opt.step(ctx);
//   }
//
// Flow. forward(x) splits x along dim 0 into M micro-batches (as
// tensor/ops_shape.h's chunk: the last may be smaller) and, for each, asks
// stage 0 to keep its output (remote(&PipeStage::forward)), then stage s to
// keep its output computed from stage s − 1's RRef (forwardFrom: the stage's
// worker fetches the activation from the previous stage's worker), all at
// once; then it fetches the last stage's outputs and concatenates them. The
// owners queue calls on values not yet computed, so micro-batch i + 1 runs on
// stage s while i runs on stage s + 1. Inside a distributed autograd context
// every transfer is recorded, so backward from a loss on the controller
// reaches every stage; without one, forward is plain inference.
//
// Stage builders. A stage is built on its worker by name: every program of
// the job declares the same builders (a process-wide declaration, like a
// remote function), each returning stage `stage` of `stages` as a module
// with a single-tensor forward. Stages of one Pipe must agree on the model
// (the same seed, say). A builder name no program declared, or one that
// throws, fails the Pipe's first use with the owner's error (RemoteError
// naming the worker and "PipeStage constructor").
//
// Errors: an empty worker list or microbatches < 1 -> InvalidArgumentError;
// a batch with fewer rows than micro-batches -> InvalidArgumentError naming
// both; a stage's worker dying -> DisconnectedError naming it (rref/rref.h,
// Failures), from forward() or from the context's backward().
//
// Threading: forward() may be called from several threads (each in its own
// context); the stages run on their workers' handler threads, and a stage
// module's forward must not change module state (nn/module.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "rpc/agent.h"
#include "rref/remote_class.h"
#include "rref/rref.h"

namespace weft::pipeline {

// Stage `stage` of `stages` of a model, built on the stage's worker.
using StageBuilder = std::function<std::shared_ptr<nn::Module>(int64_t stage, int64_t stages)>;

// Declares (or replaces) the builder `name` in this process.
void declareStageBuilder(const std::string& name, StageBuilder builder);

// One stage on its worker (a remote class; see the header comment).
class PipeStage {
 public:
  // Builds stage `stage` of `stages` with builder `builder`: NotFoundError for
  // an undeclared builder, InvalidArgumentError for a null module or a stage
  // outside [0, stages).
  PipeStage(std::string builder, int64_t stage, int64_t stages);
  // The stage's output for input x.
  Tensor forward(Tensor x);
  // The stage's output for the value `previous` holds, fetched from its owner.
  Tensor forwardFrom(RRef<Tensor> previous);
  int64_t parameterCount();
  // Parameter `index` of the module's parameters(): the tensor itself.
  Tensor parameter(int64_t index);

 private:
  std::shared_ptr<nn::Module> module_;
};
WEFT_REMOTE_CLASS(PipeStage, WEFT_CONSTRUCTORS((std::string, int64_t, int64_t)), forward, forwardFrom, parameterCount,
                  parameter);

class Pipe {
 public:
  // Builds stage s on workers[s] (returns at once; see "Stage builders").
  Pipe(rpc::Agent& agent, const std::string& builder, const std::vector<std::string>& workers, int microbatches);

  // The model's output for x (see "Flow").
  Tensor forward(const Tensor& x) const;
  // Every stage's parameters, stage by stage, each owned by its stage's worker.
  std::vector<RRef<Tensor>> remoteParameters() const;

  int numStages() const { return static_cast<int>(stages_.size()); }
  int microbatches() const { return microbatches_; }

 private:
  std::vector<RRef<PipeStage>> stages_;
  int microbatches_;
};

}  // namespace weft::pipeline
