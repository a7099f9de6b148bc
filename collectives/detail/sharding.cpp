#include "collectives/detail/sharding.h"

#include <cstdint>

#include "collectives/object_collectives.h"
#include "common/error.h"
#include "tensor/autograd.h"

namespace weft::collectives::detail {

void checkReducible(const ProcessGroup& group, DType dtype, const std::optional<DType>& reduceDtype, const char* who,
                    const std::string& param) {
  const DType summed = reduceDtype.value_or(dtype);
  WEFT_ENFORCE(!(summed == DType::BFloat16 && group.backendName() == "gloo"), InvalidArgumentError, who,
               ": parameter '", param, "' is bfloat16 and the gloo backend sums no bfloat16: set Options::reduceDtype "
               "to float32 or float16 (its gradients are then reduced in that dtype and handed back in bfloat16)");
}

void rethrowPrefixed(const std::exception_ptr& e, const std::string& prefix) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError& x) {
    throw TimeoutError(prefix + x.what());
  } catch (const DisconnectedError& x) {
    throw DisconnectedError(prefix + x.what());
  } catch (const StateError& x) {
    throw StateError(prefix + x.what());
  } catch (const InvalidArgumentError& x) {
    throw InvalidArgumentError(prefix + x.what());
  } catch (const ProtocolError& x) {
    throw ProtocolError(prefix + x.what());
  } catch (const std::exception& x) {
    throw Error(prefix + x.what());
  }
}

void checkLayoutsAgree(ProcessGroup& group, const std::vector<size_t>& groupSizes, const std::vector<Tensor>& params,
                       const std::string& who) {
  if (group.size() == 1) return;
  // [groups, size of each group, (numel, dtype) of each parameter]
  std::vector<int64_t> layout;
  layout.push_back(static_cast<int64_t>(groupSizes.size()));
  for (size_t n : groupSizes) layout.push_back(static_cast<int64_t>(n));
  for (const Tensor& p : params) {
    layout.push_back(p.numel());
    layout.push_back(static_cast<int64_t>(p.dtype()));
  }
  std::vector<std::vector<int64_t>> all;
  try {
    all = allGatherObject(group, layout);
  } catch (const std::exception&) {
    rethrowPrefixed(std::current_exception(), who + ": comparing the ranks' parameter layouts failed: ");
  }
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::vector<int64_t>& a = all[0];
    const std::vector<int64_t>& b = all[r];
    std::string what;
    if (a[0] != b[0]) {
      what = weft::detail::concat("rank 0 has ", a[0], " parameter groups, rank ", r, " has ", b[0]);
    } else {
      // Equal group sizes mean equal parameter counts.
      const size_t ng = static_cast<size_t>(a[0]);
      for (size_t k = 1; k <= ng && what.empty(); ++k) {
        if (a[k] != b[k]) {
          what = weft::detail::concat("group ", k - 1, " has ", a[k], " parameters on rank 0 and ", b[k], " on rank ",
                                      r);
        }
      }
      for (size_t i = ng + 1; what.empty() && i + 1 < a.size(); i += 2) {
        if (a[i] != b[i] || a[i + 1] != b[i + 1]) {
          what = weft::detail::concat("parameter ", (i - ng - 1) / 2, " has ", a[i], " elements of ",
                                      dtypeName(static_cast<DType>(a[i + 1])), " on rank 0 but ", b[i],
                                      " elements of ", dtypeName(static_cast<DType>(b[i + 1])), " on rank ", r);
        }
      }
    }
    throw InvalidArgumentError(who +
                               ": the ranks wrap different parameters (every rank must pass the same groups of "
                               "parameters of the same shapes): " +
                               what);
  }
}

void broadcastModuleState(ProcessGroup& group, nn::Module& module, const std::string& who) {
  if (group.size() == 1) return;
  std::vector<Tensor> targets = module.parameters();
  for (const Tensor& b : module.buffers()) targets.push_back(b);
  NoGradGuard noGrad;
  std::vector<Tensor> sent;
  std::vector<Work> works;
  std::exception_ptr failure;
  try {
    for (const Tensor& t : targets) {
      sent.push_back(t.contiguous().clone());
      works.push_back(group.broadcast(sent.back(), 0));
    }
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  if (std::exception_ptr waited = waitAll(works, [](const Work& w) -> const Work& { return w; }).first; !failure) {
    failure = waited;
  }
  if (failure) {
    rethrowPrefixed(failure, who + ": broadcasting the parameters and buffers from rank 0 failed (every rank must "
                                   "wrap a module with the same parameters and buffers): ");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    Tensor target = targets[i];  // a handle: copy_ writes the module's tensor
    target.copy_(sent[i]);
  }
}

}  // namespace weft::collectives::detail
