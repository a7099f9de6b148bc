// What the data-parallel wrappers share: error prefixing (ddp.h, zero.h,
// sharded_ddp.h, fsdp.h), the check that the backend sums the gradients'
// dtype (ddp.h, sharded_ddp.h) and, for the sharded ones (zero.h, sharded_ddp.h,
// fsdp.h), the check that every rank wraps the same parameters and the
// broadcast of rank 0's module state.
#pragma once

#include <cstddef>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/process_group.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace weft::collectives::detail {

// InvalidArgumentError, naming `who` and `param`, when the gradients of a
// parameter of `dtype` would be summed in a dtype `group`'s backend does not
// sum (gloo: bfloat16): `reduceDtype` is the wrapper's option (unset: the
// parameter's own dtype is summed).
void checkReducible(const ProcessGroup& group, DType dtype, const std::optional<DType>& reduceDtype, const char* who,
                    const std::string& param);

// Rethrows `e` as the same weft error type with `prefix` in front of its message.
[[noreturn]] void rethrowPrefixed(const std::exception_ptr& e, const std::string& prefix);

// Waits for the Work of every item (`workOf(item)`; invalid ones are
// skipped), so that none is left running when the caller goes on, and
// returns the first failure with the position of its item (nullptr and 0
// when every one succeeded).
template <class Items, class WorkOf>
std::pair<std::exception_ptr, size_t> waitAll(const Items& items, WorkOf workOf) {
  std::exception_ptr first;
  size_t at = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Work& w = workOf(items[i]);
    if (!w.valid()) continue;
    try {
      w.wait();
    } catch (const std::exception&) {
      if (!first) {
        first = std::current_exception();
        at = i;
      }
    }
  }
  return {first, at};
}

// Collective (nothing on a group of one): compares every rank's `groupSizes`
// and each parameter's element count and dtype with rank 0's; on a
// difference, InvalidArgumentError on every rank, "<who>: the ranks wrap
// different parameters (...): <the first difference>" ("parameter 1 has 5
// elements of float32 on rank 0 but 6 elements of float32 on rank 1").
void checkLayoutsAgree(ProcessGroup& group, const std::vector<size_t>& groupSizes, const std::vector<Tensor>& params,
                       const std::string& who);

// Collective (nothing on a group of one): every rank's parameters and
// buffers of `module` take rank 0's values, one broadcast per tensor (of a
// contiguous copy, written back once all have arrived). Every broadcast is
// waited for before a failure is rethrown, as its own type, "<who>:
// broadcasting the parameters and buffers from rank 0 failed (every rank
// must wrap a module with the same parameters and buffers): <error>".
void broadcastModuleState(ProcessGroup& group, nn::Module& module, const std::string& who);

}  // namespace weft::collectives::detail
