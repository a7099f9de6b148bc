#include "common/future.h"

namespace weft {
namespace detail {

void FutureStateBase::wait() {
  if (isReady()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  ++waiters_;
  completed_.wait(lock, [&] { return ready_.load(std::memory_order_relaxed); });
  --waiters_;
}

bool FutureStateBase::waitUntil(std::chrono::steady_clock::time_point deadline) {
  if (isReady()) return true;
  std::unique_lock<std::mutex> lock(mutex_);
  ++waiters_;
  bool ready = completed_.wait_until(lock, deadline, [&] { return ready_.load(std::memory_order_relaxed); });
  --waiters_;
  return ready;
}

bool FutureStateBase::waitFor(std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return isReady();
  return waitUntil(std::chrono::steady_clock::now() + timeout);
}

void FutureStateBase::addContinuation(Continuation c) {
  if (!isReady()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ready_.load(std::memory_order_relaxed)) {
      continuations_.push_back(std::move(c));
      return;
    }
  }
  // Already complete: run inline on the caller's thread, no lock held.
  c(*this);
}

bool FutureStateBase::tryFail(Status status, std::exception_ptr exception) {
  WEFT_CHECK(!status.ok()) << "a future cannot fail with an ok status";
  return tryComplete([&] {
    hasError_ = true;
    status_ = std::move(status);
    exception_ = std::move(exception);
  });
}

std::exception_ptr FutureStateBase::exception() const {
  if (exception_) return exception_;
  try {
    throwStatus(status_);
  } catch (...) {
    return std::current_exception();
  }
}

void FutureStateBase::rethrow() const {
  if (exception_) std::rethrow_exception(exception_);
  throwStatus(status_);
}

void FutureStateBase::releasePromise() {
  if (promises_.fetch_sub(1, std::memory_order_acq_rel) == 1 && !isReady()) {
    // No Promise is left that could complete the state: fail it rather than
    // let waiters hang. Nothing can race this completion (completing needs a
    // Promise), so the result of tryFail is not interesting.
    tryFail(Status::failed("broken promise: every Promise of this future was destroyed before completing it"),
            nullptr);
  }
}

void FutureStateBase::finishCompletion(std::vector<Continuation> continuations, bool notify) {
  if (notify) completed_.notify_all();
  for (Continuation& c : continuations) c(*this);
}

}  // namespace detail

Future<void> makeReadyFuture() {
  Promise<void> p;
  p.setValue();
  return p.getFuture();
}

Future<void> whenAll(const std::vector<Future<void>>& inputs) {
  if (inputs.empty()) return makeReadyFuture();
  struct Gather {
    explicit Gather(size_t n) : remaining(n) {}
    std::atomic<size_t> remaining;
    std::atomic<bool> failed{false};
    Promise<void> promise;
  };
  auto gather = std::make_shared<Gather>(inputs.size());
  Future<void> result = gather->promise.getFuture();
  for (const Future<void>& input : inputs) {
    detail::FutureAccess::state(input)->addContinuation([gather](detail::FutureStateBase& s) {
      if (s.hasError() && !gather->failed.exchange(true, std::memory_order_acq_rel)) {
        detail::FutureAccess::state(gather->promise)->tryFailFrom(s);
      }
      if (gather->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
          !gather->failed.load(std::memory_order_acquire)) {
        gather->promise.setValue();
      }
    });
  }
  return result;
}

Future<size_t> whenAny(const std::vector<Future<void>>& inputs) {
  if (inputs.empty()) return makeErrorFuture<size_t>(Status::invalidArgument("whenAny: no futures given"));
  struct Race {
    std::atomic<bool> decided{false};
    Promise<size_t> promise;
  };
  auto race = std::make_shared<Race>();
  Future<size_t> result = race->promise.getFuture();
  for (size_t i = 0; i < inputs.size(); ++i) {
    detail::FutureAccess::state(inputs[i])->addContinuation([race, i](detail::FutureStateBase& s) {
      if (race->decided.exchange(true, std::memory_order_acq_rel)) return;
      if (s.hasError()) {
        detail::FutureAccess::state(race->promise)->tryFailFrom(s);
      } else {
        race->promise.setValue(i);
      }
    });
  }
  return result;
}

}  // namespace weft
