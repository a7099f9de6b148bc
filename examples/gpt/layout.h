// Where the gpt example's model lives and how the steps of its training loop run there. main.cpp
// drives the loop (data, schedule, reporting) through Layout alone; a layout owns the model and
// the optimizer and says which share of the data its process draws. A parallel layout is one
// more implementation of this interface, chosen by makeLayout from the flags.
//
//   std::unique_ptr<Layout> layout = makeLayout(flags);
//   auto [x, y] = text.batch(data::TextSplit::Train, flags.batchSize, flags.block, gen,
//                            layout->dataRank(), layout->dataWorld());
//   double loss = layout->step(x, y, schedule(step));
//   double val = layout->evaluate(vx, vy);
//   std::string text = layout->sample("The ", 100, 0.8, 40, sampleGen);
//   nn::StateDict whole = layout->fullStateDict();  // every process calls; the reporting one saves
//
// Every layout starts from initialModel(flags): the one-process model of the run's seed, or with
// --load the weights of a checkpoint, so that a run and its checkpoints are the same whatever the
// layout (up to the order of floating additions).
//
// Errors: makeLayout throws the model's InvalidArgumentError for a configuration it rejects, and
// with --load nn::loadStateDictFile's errors for the file and nn::Module::loadStateDict's for a
// model of another configuration; step and evaluate throw what the model throws for bad token
// ids (IndexError).
// Threading: one thread drives a layout.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "nn/module.h"
#include "nn/transformer.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"

#include "flags.h"

namespace weft::examples::gpt {

class Layout {
 public:
  virtual ~Layout() = default;

  // The layout for the banner ("one process, 2 kernel threads").
  virtual std::string describe() const = 0;
  // The model's parameter count (every process of a job gives the whole model's).
  virtual int64_t numParameters() const = 0;
  // This process's share of the data: its rank among the replicas that draw disjoint windows,
  // and their number (TextDataset::batch).
  virtual int dataRank() const { return 0; }
  virtual int dataWorld() const { return 1; }
  // Whether this process prints the progress and writes the metrics (one process per job).
  virtual bool reports() const { return true; }

  // One optimizer step on inputs x and targets y (Int64 [batch, T]) with learning rate lr:
  // forward, mean cross-entropy, backward, gradient clipping, AdamW. Returns the loss of the
  // whole job's batch before the step.
  virtual double step(const Tensor& x, const Tensor& y, double lr) = 0;
  // The 2-norm of the whole model's gradient of the last step, before clipping (NaN without
  // clipping, --grad-clip 0, or before the first step): the norm of the one-process model's
  // gradient on the job's batch, whatever the layout.
  double gradNorm() const { return gradNorm_; }
  // The mean cross-entropy (nats per byte) of the model on (x, y), in eval mode, without grad.
  virtual double evaluate(const Tensor& x, const Tensor& y) = 0;
  // `prompt` continued by `tokens` bytes sampled in eval mode from `gen` (GPT::generate), as
  // text: the prompt's bytes and the new ones.
  virtual std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t topK,
                             Generator& gen) = 0;
  // The whole model's state dict, loadable into an nn::GPT of the run's configuration, complete on
  // the process that reports() (on the others, complete or empty). Collective: every process of
  // the job calls it at the same point of the loop.
  virtual nn::StateDict fullStateDict() = 0;

 protected:
  double gradNorm_ = std::numeric_limits<double>::quiet_NaN();
};

// The one-process model of the run in `config` (modelConfig(flags) unless a layout changes a
// detail such as checkpointing): its weights drawn from the run's seed, or with --load PATH read
// from that checkpoint.
std::shared_ptr<nn::GPT> initialModel(const Flags& flags, const nn::GPTConfig& config);
inline std::shared_ptr<nn::GPT> initialModel(const Flags& flags) { return initialModel(flags, modelConfig(flags)); }

// The layout the flags ask for: a single process holding the whole model, with --fsdp a fully
// sharded one (over the job, or over the --dp replicas of a pipeline or of tensor and sequence
// parallelism: fsdp_layout.h), with --pp P > 1 a pipeline of P stages, each over one process or
// with --tp and --sp a tp·sp group (pipeline_layout.h), or with --dp, --tp or --sp above 1 a
// process mesh (mesh_layout.h).
std::unique_ptr<Layout> makeLayout(const Flags& flags);

}  // namespace weft::examples::gpt
