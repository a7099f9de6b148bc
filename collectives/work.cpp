#include "collectives/work.h"

#include "common/error.h"

namespace weft::collectives {

detail::WorkState& Work::state() const {
  WEFT_CHECK(state_ != nullptr) << "use of an empty Work";
  return *state_;
}

const std::string& Work::description() const { return state().description; }

bool Work::isCompleted() const { return state().future.isReady(); }

bool Work::isSuccess() const {
  const Future<void>& f = state().future;
  return f.isReady() && !f.hasError();
}

void Work::wait() const { state().future.get(); }

void Work::wait(std::chrono::milliseconds timeout) const {
  const detail::WorkState& s = state();
  WEFT_ENFORCE(s.future.waitFor(timeout), TimeoutError, "Work::wait: ", s.description, " has not completed after ",
               timeout.count(), " ms of waiting (the operation goes on; it is bounded by the group timeout)");
  s.future.get();
}

std::exception_ptr Work::exception() const {
  const Future<void>& f = state().future;
  if (!f.isReady() || !f.hasError()) return nullptr;
  return f.exception();
}

int Work::sourceRank() const { return state().sourceRank.load(std::memory_order_acquire); }

Future<void> Work::future() const { return state().future; }

Work Work::start(std::string description, std::vector<Tensor> tensors) {
  auto s = std::make_shared<detail::WorkState>(std::move(description));
  s->tensors = std::move(tensors);
  return Work(std::move(s));
}

Work Work::failed(std::string description, std::exception_ptr error) {
  Work w = start(std::move(description), {});
  w.fail(std::move(error));
  return w;
}

void Work::setSourceRank(int rank) const { state().sourceRank.store(rank, std::memory_order_release); }

void Work::complete() const {
  detail::WorkState& s = state();
  s.tensors.clear();
  s.promise.setValue();
}

void Work::fail(std::exception_ptr error) const {
  detail::WorkState& s = state();
  s.tensors.clear();
  s.promise.setError(std::move(error));
}

}  // namespace weft::collectives
