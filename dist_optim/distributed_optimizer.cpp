#include "dist_optim/distributed_optimizer.h"

#include <algorithm>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>

#include "common/dtype.h"
#include "common/error.h"
#include "common/type_tag.h"
#include "tensor/autograd.h"

namespace weft {

// ---- OptimizerOptions on the wire ---------------------------------------------------------------

namespace {

using nn::optim::AdagradOptions;
using nn::optim::AdamOptions;
using nn::optim::AdamWOptions;
using nn::optim::OptimizerOptions;
using nn::optim::RMSpropOptions;
using nn::optim::SGDOptions;

}  // namespace

}  // namespace weft

// Each options struct is a record of its fields in declaration order. A field added to a struct in
// nn/optim.h must be added here (the field count is checked on decode, so programs built from
// different versions refuse each other's options instead of misreading them).
namespace weft::nn::optim {
WEFT_CODEC_FIELDS(SGDOptions, lr, momentum, dampening, weightDecay, nesterov, maximize);
WEFT_CODEC_FIELDS(AdamOptions, lr, betas, eps, weightDecay, amsgrad, maximize);
WEFT_CODEC_FIELDS(AdamWOptions, lr, betas, eps, weightDecay, amsgrad, maximize);
WEFT_CODEC_FIELDS(AdagradOptions, lr, lrDecay, weightDecay, initialAccumulatorValue, eps, maximize);
WEFT_CODEC_FIELDS(RMSpropOptions, lr, alpha, eps, weightDecay, momentum, centered, maximize);
}  // namespace weft::nn::optim

namespace weft {

namespace rpc {

void Codec<nn::optim::OptimizerOptions>::encode(const nn::optim::OptimizerOptions& v, wire::Value::Builder out,
                                                EncodeContext& ctx) {
  std::visit([&](const auto& o) { encodeValue(o, out, ctx); }, v);
}

nn::optim::OptimizerOptions Codec<nn::optim::OptimizerOptions>::decode(wire::Value::Reader in, DecodeContext& ctx) {
  if (in.which() != wire::Value::RECORD) throwKindMismatch("struct " + typeName(), in);
  auto nameText = in.getRecord().getTypeName();
  std::string_view name(nameText.cStr(), nameText.size());
  std::optional<nn::optim::OptimizerOptions> out;
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((!out && name == Codec<std::variant_alternative_t<I, OptimizerOptions>>::typeName()
          ? (out = Codec<std::variant_alternative_t<I, OptimizerOptions>>::decode(in, ctx), true)
          : false),
     ...);
  }(std::make_index_sequence<std::variant_size_v<OptimizerOptions>>());
  if (!out) throw ProtocolError("expected struct " + typeName() + ", got struct " + std::string(name));
  return *std::move(out);
}

}  // namespace rpc

namespace dist_optim {

// ---- per-worker parameter locks -----------------------------------------------------------------

namespace detail {

// The locks of the parameters some OwnerOptimizer of one worker updates, by the parameter's
// TensorImpl. An OwnerOptimizer holds its parameters (so their TensorImpls stay alive and their
// addresses are not reused) and shares ownership of their locks; the table keeps weak references,
// so an entry expires with the last OwnerOptimizer of that parameter. Shared by the agent's
// extension and every OwnerOptimizer, so either may go first when the agent is torn down.
class LockTable {
 public:
  std::shared_ptr<std::mutex> lockFor(const TensorImpl* impl) {
    std::lock_guard<std::mutex> guard(mutex_);
    std::weak_ptr<std::mutex>& slot = locks_[impl];
    std::shared_ptr<std::mutex> lock = slot.lock();
    if (!lock) {
      lock = std::make_shared<std::mutex>();
      slot = lock;
    }
    // Drop expired entries once the table has doubled since the last sweep.
    if (locks_.size() >= 2 * sweptSize_ + 16) {
      std::erase_if(locks_, [](const auto& entry) { return entry.second.expired(); });
      sweptSize_ = locks_.size();
    }
    return lock;
  }

  void optimizerBuilt() {
    std::lock_guard<std::mutex> guard(mutex_);
    ++ownerOptimizers_;
  }
  void optimizerDropped() {
    std::lock_guard<std::mutex> guard(mutex_);
    --ownerOptimizers_;
  }

  DebugCounts counts() {
    std::lock_guard<std::mutex> guard(mutex_);
    std::erase_if(locks_, [](const auto& entry) { return entry.second.expired(); });
    sweptSize_ = locks_.size();
    return {ownerOptimizers_, locks_.size()};
  }

 private:
  std::mutex mutex_;
  std::unordered_map<const TensorImpl*, std::weak_ptr<std::mutex>> locks_;
  size_t sweptSize_ = 0;
  size_t ownerOptimizers_ = 0;
};

}  // namespace detail

namespace {

using detail::LockTable;

class OptimLayer final : public rpc::AgentExtension {
 public:
  const std::shared_ptr<LockTable>& table() const { return table_; }

 private:
  std::shared_ptr<LockTable> table_ = std::make_shared<LockTable>();
};

LockTable& tableOf(rpc::Agent& agent) { return *agent.extension<OptimLayer>().table(); }

rpc::Agent& agentOfParams(const nn::optim::OptimizerOptions& options, const std::vector<RRef<Tensor>>& params) {
  WEFT_ENFORCE(!params.empty(), InvalidArgumentError, "OwnerOptimizer(", nn::optim::optimizerName(options),
               "): got an empty parameter list");
  WEFT_ENFORCE(params[0].valid(), InvalidArgumentError, "OwnerOptimizer(", nn::optim::optimizerName(options),
               "): parameter 0 is an empty RRef");
  return params[0].agent();
}

// Completes when every call has completed: with the first error in the calls' order, if any.
Future<void> whenAllSettled(const std::vector<Future<int64_t>>& calls) {
  WEFT_CHECK(!calls.empty()) << "whenAllSettled: no calls";
  struct Gather {
    std::mutex mutex;
    size_t left = 0;
    std::vector<std::exception_ptr> errors;
    Promise<void> done;
  };
  auto gather = std::make_shared<Gather>();
  gather->left = calls.size();
  gather->errors.resize(calls.size());
  Future<void> result = gather->done.getFuture();
  for (size_t i = 0; i < calls.size(); ++i) {
    calls[i].onComplete([gather, i](const Future<int64_t>& f) {
      bool last = false;
      {
        std::lock_guard<std::mutex> guard(gather->mutex);
        if (f.hasError()) gather->errors[i] = f.exception();
        last = --gather->left == 0;
      }
      if (!last) return;
      for (const std::exception_ptr& e : gather->errors) {
        if (e) {
          gather->done.setError(e);
          return;
        }
      }
      gather->done.setValue();
    });
  }
  return result;
}

}  // namespace

std::string DebugCounts::toString() const {
  return "ownerOptimizers " + std::to_string(ownerOptimizers) + " parameterLocks " + std::to_string(parameterLocks);
}

DebugCounts debugCounts(rpc::Agent& agent) { return tableOf(agent).counts(); }

namespace detail {
bool installLayer() {
  return rpc::Agent::installExtension(typeTag<OptimLayer>(), [](rpc::Agent&) -> std::shared_ptr<rpc::AgentExtension> {
    return std::make_shared<OptimLayer>();
  });
}
}  // namespace detail

// ---- OwnerOptimizer ----------------------------------------------------------------------------

OwnerOptimizer::OwnerOptimizer(nn::optim::OptimizerOptions options, std::vector<RRef<Tensor>> params)
    : agent_(agentOfParams(options, params)), options_(std::move(options)) {
  nn::optim::validate(options_);
  const char* opt = nn::optim::optimizerName(options_);
  params_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    WEFT_ENFORCE(params[i].valid(), InvalidArgumentError, "OwnerOptimizer(", opt, "): parameter ", i,
                 " is an empty RRef");
    // InvalidArgumentError when this worker is not the owner; the value's own error if it failed.
    // Waits (on this handler thread) for a value still being built: the caller created the
    // parameter references before this object, so their building was queued first.
    Tensor p = *params[i].localValue();
    WEFT_ENFORCE(p.defined(), InvalidArgumentError, "OwnerOptimizer(", opt, ") on worker '", agent_.name(),
                 "': parameter ", i, " (RRef ", params[i].id(), ") is an undefined tensor");
    WEFT_ENFORCE(isFloating(p.dtype()), InvalidArgumentError, "OwnerOptimizer(", opt, ") on worker '", agent_.name(),
                 "': parameter ", i, " (RRef ", params[i].id(), ") has non-floating dtype ", dtypeName(p.dtype()));
    for (size_t j = 0; j < params_.size(); ++j) {
      WEFT_ENFORCE(!params_[j].sameAs(p), InvalidArgumentError, "OwnerOptimizer(", opt, ") on worker '",
                   agent_.name(), "': parameter ", i, " (RRef ", params[i].id(),
                   ") is the same tensor as parameter ", j, " (RRef ", params[j].id(), ")");
    }
    params_.push_back(std::move(p));
  }
  state_.resize(params_.size());
  table_ = agent_.extension<OptimLayer>().table();
  std::vector<const TensorImpl*> order;
  order.reserve(params_.size());
  for (const Tensor& p : params_) order.push_back(p.impl());
  std::sort(order.begin(), order.end(), std::less<const TensorImpl*>());
  locks_.reserve(order.size());
  for (const TensorImpl* impl : order) locks_.push_back(table_->lockFor(impl));
  table_->optimizerBuilt();
}

OwnerOptimizer::~OwnerOptimizer() { table_->optimizerDropped(); }

int64_t OwnerOptimizer::step(int64_t contextId) {
  dist_autograd::GradientMap grads;
  try {
    grads = dist_autograd::gradients(agent_, contextId);
  } catch (const NotFoundError& e) {
    throw NotFoundError(::weft::detail::concat("DistributedOptimizer(", nn::optim::optimizerName(options_),
                                               "): worker '", agent_.name(),
                                               "' knows no distributed autograd context ", contextId, " (", e.what(),
                                               ")"));
  }
  std::vector<Tensor> g;
  g.reserve(params_.size());
  int64_t updated = 0;
  for (const Tensor& p : params_) {
    g.push_back(grads.get(p));
    updated += g.back().defined() ? 1 : 0;
  }
  if (updated == 0) return 0;
  // Every parameter's lock, in address order (see "Concurrency" in the header).
  std::vector<std::unique_lock<std::mutex>> held;
  held.reserve(locks_.size());
  for (const auto& lock : locks_) held.emplace_back(*lock);
  nn::optim::step(options_, params_, g, state_);
  return updated;
}

// ---- DistributedOptimizer ---------------------------------------------------------------------

DistributedOptimizer::DistributedOptimizer(rpc::Agent& agent, nn::optim::OptimizerOptions options,
                                           std::vector<RRef<Tensor>> params)
    : agent_(agent), options_(std::move(options)), params_(std::move(params)) {
  nn::optim::validate(options_);
  const char* opt = name();
  WEFT_ENFORCE(!params_.empty(), InvalidArgumentError, "DistributedOptimizer(", opt, "): got an empty parameter list");
  std::map<int, std::vector<RRef<Tensor>>> byOwner;
  std::map<uint64_t, size_t> seen;  // RRef id -> index
  for (size_t i = 0; i < params_.size(); ++i) {
    const RRef<Tensor>& p = params_[i];
    WEFT_ENFORCE(p.valid(), InvalidArgumentError, "DistributedOptimizer(", opt, "): parameter ", i,
                 " is an empty RRef");
    WEFT_ENFORCE(&p.agent() == &agent_, InvalidArgumentError, "DistributedOptimizer(", opt, "): parameter ", i,
                 " is a handle of another agent than the one given (worker '", agent_.name(), "')");
    auto [it, fresh] = seen.emplace(p.id(), i);
    WEFT_ENFORCE(fresh, InvalidArgumentError, "DistributedOptimizer(", opt, "): parameter ", i, " (RRef ", p.id(),
                 ") is the same reference as parameter ", it->second);
    byOwner[p.owner()].push_back(p);
  }
  for (auto& [rank, owned] : byOwner) {
    owners_.push_back({rank, agent_.remote<OwnerOptimizer>(rank, options_, owned)});
  }
  // Wait until every owner has built its optimizer, so that a refusal surfaces here.
  std::vector<Future<int64_t>> built;
  built.reserve(owners_.size());
  for (const Owner& o : owners_) built.push_back(o.optimizer.rpcAsync(&OwnerOptimizer::parameterCount));
  whenAllSettled(built).get();
}

Future<void> DistributedOptimizer::stepAsync(int64_t contextId) const {
  // In owner order (errors are raised in that order). Remote owners are called first, so that
  // they work while this worker steps its own parameters, in place and without a message.
  std::vector<Future<int64_t>> calls(owners_.size());
  for (size_t i = 0; i < owners_.size(); ++i) {
    const RRef<OwnerOptimizer>& opt = owners_[i].optimizer;
    if (!opt.isOwner()) calls[i] = opt.rpcAsync(&OwnerOptimizer::step, contextId);
  }
  for (size_t i = 0; i < owners_.size(); ++i) {
    const RRef<OwnerOptimizer>& opt = owners_[i].optimizer;
    if (!opt.isOwner()) continue;
    try {
      calls[i] = makeReadyFuture(opt.localValue()->step(contextId));
    } catch (...) {
      calls[i] = makeErrorFuture<int64_t>(std::current_exception());
    }
  }
  return whenAllSettled(calls);
}

std::vector<int> DistributedOptimizer::ownerRanks() const {
  std::vector<int> ranks;
  ranks.reserve(owners_.size());
  for (const Owner& o : owners_) ranks.push_back(o.rank);
  return ranks;
}

}  // namespace dist_optim
}  // namespace weft
