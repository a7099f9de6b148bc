#include "pipeline/pipe.h"

#include <map>
#include <mutex>
#include <utility>

#include "common/error.h"
#include "tensor/ops.h"

namespace weft::pipeline {

namespace {

struct Builders {
  std::mutex mutex;
  std::map<std::string, StageBuilder> byName;  // under mutex
};

Builders& builders() {
  static Builders b;
  return b;
}

}  // namespace

void declareStageBuilder(const std::string& name, StageBuilder builder) {
  WEFT_ENFORCE(!name.empty() && builder, InvalidArgumentError,
               "declareStageBuilder: a builder needs a name and a function");
  Builders& b = builders();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.byName[name] = std::move(builder);
}

PipeStage::PipeStage(std::string builder, int64_t stage, int64_t stages) {
  WEFT_ENFORCE(stages >= 1 && stage >= 0 && stage < stages, InvalidArgumentError, "PipeStage: stage ", stage,
               " outside [0, ", stages, ")");
  StageBuilder build;
  {
    Builders& b = builders();
    std::lock_guard<std::mutex> lock(b.mutex);
    auto it = b.byName.find(builder);
    WEFT_ENFORCE(it != b.byName.end(), NotFoundError, "PipeStage: no stage builder named '", builder,
                 "' is declared in this program (pipeline::declareStageBuilder)");
    build = it->second;
  }
  module_ = build(stage, stages);
  WEFT_ENFORCE(module_ != nullptr, InvalidArgumentError, "PipeStage: builder '", builder, "' returned no module for stage ",
               stage);
}

Tensor PipeStage::forward(Tensor x) { return module_->forward(x); }

Tensor PipeStage::forwardFrom(RRef<Tensor> previous) { return module_->forward(previous.toHere()); }

int64_t PipeStage::parameterCount() { return static_cast<int64_t>(module_->parameters().size()); }

Tensor PipeStage::parameter(int64_t index) {
  std::vector<Tensor> params = module_->parameters();
  WEFT_ENFORCE(index >= 0 && index < static_cast<int64_t>(params.size()), InvalidArgumentError, "PipeStage: parameter ",
               index, " of ", params.size());
  return params[static_cast<size_t>(index)];
}

Pipe::Pipe(rpc::Agent& agent, const std::string& builder, const std::vector<std::string>& workers, int microbatches)
    : microbatches_(microbatches) {
  WEFT_ENFORCE(!workers.empty(), InvalidArgumentError, "Pipe: no stage workers given");
  WEFT_ENFORCE(microbatches >= 1, InvalidArgumentError, "Pipe: microbatches must be >= 1, got ", microbatches);
  const auto n = static_cast<int64_t>(workers.size());
  for (int64_t s = 0; s < n; ++s) {
    stages_.push_back(agent.remote<PipeStage>(workers[static_cast<size_t>(s)], builder, s, n));
  }
}

Tensor Pipe::forward(const Tensor& x) const {
  WEFT_ENFORCE(x.defined() && x.dim() >= 1 && x.size(0) >= microbatches_, InvalidArgumentError,
               "Pipe::forward: the batch must have at least ", microbatches_, " rows (one per micro-batch), got ",
               x.defined() ? shapeString(x.shape()) : std::string("undefined"));
  std::vector<Future<Tensor>> outputs;
  for (const Tensor& part : chunk(x, microbatches_, 0)) {
    RRef<Tensor> r = stages_[0].remote(&PipeStage::forward, part.contiguous());
    for (size_t s = 1; s < stages_.size(); ++s) r = stages_[s].remote(&PipeStage::forwardFrom, r);
    outputs.push_back(r.toHereAsync());
  }
  std::vector<Tensor> parts;
  for (auto& f : outputs) parts.push_back(f.get());
  return cat(parts, 0);
}

std::vector<RRef<Tensor>> Pipe::remoteParameters() const {
  std::vector<Future<int64_t>> counts;
  for (const auto& s : stages_) counts.push_back(s.rpcAsync(&PipeStage::parameterCount));
  std::vector<RRef<Tensor>> out;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const int64_t n = counts[s].get();
    for (int64_t i = 0; i < n; ++i) out.push_back(stages_[s].remote(&PipeStage::parameter, i));
  }
  return out;
}

}  // namespace weft::pipeline
