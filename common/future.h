// Future<T> / Promise<T>: the one asynchronous result type of weft.
//
// A Promise is the write end, a Future the read end of a shared state that
// completes exactly once, with a value or an error (a Status, or the
// exception_ptr of a thrown exception). RPC calls return Futures, RPC handlers
// may return them, and continuations chain on them without blocking a thread:
//
//   weft::Promise<int> p;
//   weft::Future<int> f = p.getFuture();
//   weft::Future<std::string> s = f.then([](int v) { return std::to_string(v * 2); });
//   pool.post([p]() mutable { p.setValue(21); });     // any thread
//   std::string r = s.get();                          // "42"; throws the typed error on failure
//
//   auto all = weft::whenAll(std::vector<weft::Future<Tensor>>{a, b, c});   // Future<vector<Tensor>>
//   auto first = weft::whenAny(replicas);             // Future<WhenAnyResult<T>>: index + value
//
// Handles. Future and Promise are cheap, copyable handles to the shared state
// (like std::shared_future): copies see the same completion. A default-
// constructed Future is empty (valid() == false); using one is a bug. When the
// last Promise handle of an uncompleted state is destroyed, the state fails
// with a Failed status ("broken promise"), so a waiter never hangs on a result
// nobody can produce any more.
//
// Exactly once. setValue/setError on a completed state is a bug and aborts
// (WEFT_CHECK); trySetValue/trySetError instead return false and change
// nothing, for completions that legitimately race (a reply against a timeout).
//
// Errors. get() throws: the exception_ptr given to setError as is, or for a
// Status the typed exception of throwStatus (TimeoutError, RemoteError, ...).
// status() gives the error as a Status either way (statusFromException).
//
// Continuations. then(fn) calls fn with the *value* (const T&; no argument for
// Future<void>) only when the future succeeds; an error skips fn and passes to
// the returned future unchanged. fn may return U (-> Future<U>), void
// (-> Future<void>) or Future<U> (-> Future<U>, completing when that inner
// future does: this is how a handler returns the result of a nested RPC). An
// exception thrown by fn fails the returned future with that exception.
// onComplete(fn) calls fn(const Future<T>&) on success and on error alike; fn
// must not throw (a throwing onComplete callback aborts with its message,
// like an exception escaping a std::thread).
//
// Which thread runs a continuation:
//  - registered before completion: the thread that completes the state, inside
//    its setValue/setError call, after the state's lock has been released,
//    in registration order;
//  - registered after completion: the thread calling then/onComplete, inline,
//    before that call returns.
// Continuations never run while any lock of the future is held, so they may
// freely call into the same future, its promise, or other futures. A chain
// built before completion runs recursively on the completing thread (stack
// depth grows with the chain length); keep continuations short and hand long
// work to a pool.
//
// Thread-safety: every member of Future and Promise except assignment may be
// called from any thread concurrently, through the same handle or different
// ones. Assigning to a handle while another thread uses that same handle is a
// race, as with std::shared_ptr; copies are independent.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/status.h"

namespace weft {

template <class T>
class Future;
template <class T>
class Promise;

// The first of whenAny's inputs to complete: its position and its value.
template <class T>
struct WhenAnyResult {
  size_t index;
  T value;
};

namespace detail {

// What a Future<void> stores: nothing.
struct Unit {};
template <class T>
using StoredType = std::conditional_t<std::is_void_v<T>, Unit, T>;
// What get() const& returns: void, or a reference into the shared state.
template <class T>
using GetRefType = std::conditional_t<std::is_void_v<T>, void, const StoredType<T>&>;

template <class T>
struct IsFuture : std::false_type {};
template <class T>
struct IsFuture<Future<T>> : std::true_type {};

// Future<U> -> U, anything else -> itself.
template <class T>
struct UnwrapFuture {
  using type = T;
};
template <class T>
struct UnwrapFuture<Future<T>> {
  using type = T;
};

// What fn returns when called as then() calls it.
template <class T, class F>
struct ThenResult {
  using type = std::invoke_result_t<F&, const T&>;
};
template <class F>
struct ThenResult<void, F> {
  using type = std::invoke_result_t<F&>;
};
template <class T, class F>
using ThenValue = typename UnwrapFuture<std::decay_t<typename ThenResult<T, F>::type>>::type;

class FutureStateBase;

// A move-only callable run when a state completes; it receives that state.
// (std::function would demand copyable continuations.)
class Continuation {
 public:
  Continuation() = default;
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, Continuation>)
  Continuation(F&& fn)  // NOLINT: implicit by design, like std::function
      : impl_(std::make_unique<Impl<std::decay_t<F>>>(std::forward<F>(fn))) {}
  void operator()(FutureStateBase& state) { impl_->call(state); }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void call(FutureStateBase& state) = 0;
  };
  template <class F>
  struct Impl final : Base {
    template <class G>
    explicit Impl(G&& g) : fn(std::forward<G>(g)) {}
    void call(FutureStateBase& state) override { fn(state); }
    F fn;
  };
  std::unique_ptr<Base> impl_;
};

// The part of the shared state that does not depend on T: completion flag,
// error, waiters, continuations and the count of live Promise handles.
// Invariants: once ready_ is true nothing but the value's move-out in
// Future::get()&& changes, and the continuation list is empty.
class FutureStateBase : public std::enable_shared_from_this<FutureStateBase> {
 public:
  FutureStateBase() = default;
  FutureStateBase(const FutureStateBase&) = delete;
  FutureStateBase& operator=(const FutureStateBase&) = delete;

  bool isReady() const noexcept { return ready_.load(std::memory_order_acquire); }
  // Meaningful once isReady(); false before.
  bool hasError() const noexcept { return isReady() && hasError_; }
  void wait();
  // False when the deadline passed first.
  bool waitUntil(std::chrono::steady_clock::time_point deadline);
  bool waitFor(std::chrono::nanoseconds timeout);

  // Runs c(*this) once the state completes; see "Which thread" in the header.
  void addContinuation(Continuation c);

  // Completes with an error: exception may be null (the Status alone) or set
  // (then status must be statusFromException(exception)). False when already
  // complete.
  bool tryFail(Status status, std::exception_ptr exception);
  // Completes this state with the error of `other` (which has one).
  bool tryFailFrom(const FutureStateBase& other) { return tryFail(other.status_, other.exception_); }

  // Preconditions for the three below: hasError().
  const Status& status() const noexcept { return status_; }
  // The stored exception, or one made from the status.
  std::exception_ptr exception() const;
  [[noreturn]] void rethrow() const;

  void addPromise() noexcept { promises_.fetch_add(1, std::memory_order_relaxed); }
  // The last Promise going away breaks an uncompleted state.
  void releasePromise();

 protected:
  // Completes the state: write() stores the value under the lock, so of two
  // racing completions exactly one writes; then waiters wake and the
  // continuations run on this thread, after the lock is released.
  template <class Write>
  bool tryComplete(Write&& write) {
    std::vector<Continuation> continuations;
    bool notify = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ready_.load(std::memory_order_relaxed)) return false;
      write();
      continuations.swap(continuations_);
      notify = waiters_ > 0;
      ready_.store(true, std::memory_order_release);
    }
    finishCompletion(std::move(continuations), notify);
    return true;
  }

 private:
  void finishCompletion(std::vector<Continuation> continuations, bool notify);

  std::mutex mutex_;
  std::condition_variable completed_;
  std::atomic<bool> ready_{false};
  int waiters_ = 0;                        // threads blocked in wait*, under mutex_
  std::vector<Continuation> continuations_;  // under mutex_, emptied at completion
  bool hasError_ = false;                  // written before ready_ (release)
  Status status_;
  std::exception_ptr exception_;
  std::atomic<int> promises_{0};
};

template <class T>
class FutureState final : public FutureStateBase {
 public:
  using Stored = StoredType<T>;

  bool trySetValue(Stored&& v) {
    return tryComplete([&] { value_.emplace(std::move(v)); });
  }
  // Preconditions: isReady() && !hasError().
  Stored& value() noexcept { return *value_; }

 private:
  std::optional<Stored> value_;
};

// Reaches the state behind a handle, for the free functions below.
struct FutureAccess {
  template <class T>
  static const std::shared_ptr<FutureState<T>>& state(const Future<T>& f) {
    WEFT_CHECK(f.state_ != nullptr) << "use of an empty Future";
    return f.state_;
  }
  template <class T>
  static const std::shared_ptr<FutureState<T>>& state(const Promise<T>& p) {
    WEFT_CHECK(p.state_ != nullptr) << "use of a moved-from Promise";
    return p.state_;
  }
  template <class T>
  static Future<T> makeFuture(std::shared_ptr<FutureState<T>> s) {
    return Future<T>(std::move(s));
  }
};

// Completes `promise` from the finished state `s` and the continuation fn.
template <class T, class U, class F>
void runThen(F& fn, FutureState<T>& s, Promise<U>& promise);

}  // namespace detail

template <class T>
class Future {
 public:
  using ValueType = T;

  // An empty handle (valid() == false).
  Future() = default;

  bool valid() const noexcept { return state_ != nullptr; }
  // Never block.
  bool isReady() const { return state().isReady(); }
  bool hasError() const { return state().hasError(); }

  void wait() const { state().wait(); }
  // True when the future completed within the timeout.
  template <class Rep, class Period>
  bool waitFor(std::chrono::duration<Rep, Period> timeout) const {
    if (std::chrono::duration<double>(timeout).count() > kForeverSeconds) {
      wait();
      return true;
    }
    return state().waitFor(std::chrono::ceil<std::chrono::nanoseconds>(timeout));
  }
  template <class Clock, class Duration>
  bool waitUntil(std::chrono::time_point<Clock, Duration> deadline) const {
    return waitFor(deadline - Clock::now());
  }

  // Waits, then returns the value or throws the error. The reference stays
  // valid while this handle (or any copy) lives.
  detail::GetRefType<T> get() const& {
    wait();
    if (state_->hasError()) state_->rethrow();
    if constexpr (!std::is_void_v<T>) return state_->value();
  }
  // On a temporary (`T v = rpc.callAsync(...).get();`): returns the value by
  // value, moved out when this is the only handle left, copied otherwise. A
  // move-only T is always moved out: it can be taken once, and other handles
  // then see the moved-from value.
  T get() && {
    wait();
    if (state_->hasError()) state_->rethrow();
    if constexpr (!std::is_void_v<T>) {
      if constexpr (std::is_copy_constructible_v<T>) {
        if (state_.use_count() != 1) return state_->value();
      }
      return std::move(state_->value());
    }
  }

  // Waits, then returns ok or the error.
  Status status() const {
    wait();
    return state_->hasError() ? state_->status() : Status();
  }
  // Waits, then returns the error as an exception (null on success).
  std::exception_ptr exception() const {
    wait();
    return state_->hasError() ? state_->exception() : nullptr;
  }

  // See "Continuations" in the header comment.
  template <class F>
  Future<detail::ThenValue<T, std::decay_t<F>>> then(F&& fn) const {
    using U = detail::ThenValue<T, std::decay_t<F>>;
    Promise<U> promise;
    Future<U> result = promise.getFuture();
    state().addContinuation([fn = std::forward<F>(fn), promise = std::move(promise)](
                                detail::FutureStateBase& base) mutable {
      auto& s = static_cast<detail::FutureState<T>&>(base);
      if (s.hasError()) {
        detail::FutureAccess::state(promise)->tryFailFrom(s);
        return;
      }
      detail::runThen<T, U>(fn, s, promise);
    });
    return result;
  }

  // Calls fn(const Future<T>&) once complete, with a value or an error.
  template <class F>
  void onComplete(F&& fn) const {
    state().addContinuation([fn = std::forward<F>(fn)](detail::FutureStateBase& base) mutable {
      Future<T> self(std::static_pointer_cast<detail::FutureState<T>>(base.shared_from_this()));
      try {
        fn(static_cast<const Future<T>&>(self));
      } catch (const std::exception& e) {
        WEFT_CHECK(false) << "an onComplete callback threw: " << e.what();
      } catch (...) {
        WEFT_CHECK(false) << "an onComplete callback threw a non-std::exception";
      }
    });
  }

 private:
  friend class Promise<T>;
  friend struct detail::FutureAccess;
  explicit Future(std::shared_ptr<detail::FutureState<T>> s) : state_(std::move(s)) {}

  // Timeouts beyond this (a century) wait without a deadline, so that the
  // deadline arithmetic cannot overflow.
  static constexpr double kForeverSeconds = 100.0 * 365 * 24 * 3600;

  detail::FutureState<T>& state() const {
    WEFT_CHECK(state_ != nullptr) << "use of an empty Future";
    return *state_;
  }

  std::shared_ptr<detail::FutureState<T>> state_;
};

template <class T>
class Promise {
 public:
  using Stored = detail::StoredType<T>;

  // A new, uncompleted state.
  Promise() : state_(std::make_shared<detail::FutureState<T>>()) { state_->addPromise(); }
  Promise(const Promise& other) : state_(other.state_) {
    if (state_) state_->addPromise();
  }
  Promise(Promise&& other) noexcept : state_(std::move(other.state_)) {}
  Promise& operator=(Promise other) noexcept {
    std::swap(state_, other.state_);
    return *this;
  }
  ~Promise() {
    if (state_) state_->releasePromise();
  }

  // Any number of times; every Future shares the one state.
  Future<T> getFuture() const { return Future<T>(checkedState()); }
  bool isReady() const { return checkedState()->isReady(); }

  void setValue(Stored v)
    requires(!std::is_void_v<T>)
  {
    WEFT_CHECK(trySetValue(std::move(v))) << "Promise::setValue on a future that is already complete";
  }
  void setValue()
    requires(std::is_void_v<T>)
  {
    WEFT_CHECK(trySetValue()) << "Promise::setValue on a future that is already complete";
  }
  bool trySetValue(Stored v)
    requires(!std::is_void_v<T>)
  {
    return checkedState()->trySetValue(std::move(v));
  }
  bool trySetValue()
    requires(std::is_void_v<T>)
  {
    return checkedState()->trySetValue(detail::Unit{});
  }

  // status must not be ok.
  void setError(Status status) {
    WEFT_CHECK(trySetError(std::move(status))) << "Promise::setError on a future that is already complete";
  }
  void setError(std::exception_ptr e) {
    WEFT_CHECK(trySetError(std::move(e))) << "Promise::setError on a future that is already complete";
  }
  bool trySetError(Status status) {
    WEFT_CHECK(!status.ok()) << "Promise::setError with an ok status";
    return checkedState()->tryFail(std::move(status), nullptr);
  }
  bool trySetError(std::exception_ptr e) {
    WEFT_CHECK(e != nullptr) << "Promise::setError with a null exception_ptr";
    Status s = statusFromException(e);
    return checkedState()->tryFail(std::move(s), std::move(e));
  }

  // Completes this promise with whatever `source` completes with, when it does.
  void setFrom(const Future<T>& source) {
    detail::FutureAccess::state(source)->addContinuation([self = *this](detail::FutureStateBase& base) mutable {
      auto& s = static_cast<detail::FutureState<T>&>(base);
      auto& target = detail::FutureAccess::state(self);
      bool fresh = s.hasError() ? target->tryFailFrom(s) : target->trySetValue(Stored(s.value()));
      WEFT_CHECK(fresh) << "Promise::setFrom: the promise was completed before its source";
    });
  }

 private:
  friend struct detail::FutureAccess;
  const std::shared_ptr<detail::FutureState<T>>& checkedState() const {
    WEFT_CHECK(state_ != nullptr) << "use of a moved-from Promise";
    return state_;
  }

  std::shared_ptr<detail::FutureState<T>> state_;
};

// ---- constructors of completed futures ----------------------------------------

template <class T>
Future<std::decay_t<T>> makeReadyFuture(T&& value) {
  Promise<std::decay_t<T>> p;
  p.setValue(std::forward<T>(value));
  return p.getFuture();
}
Future<void> makeReadyFuture();

// status must not be ok.
template <class T>
Future<T> makeErrorFuture(Status status) {
  Promise<T> p;
  p.setError(std::move(status));
  return p.getFuture();
}
template <class T>
Future<T> makeErrorFuture(std::exception_ptr e) {
  Promise<T> p;
  p.setError(std::move(e));
  return p.getFuture();
}

// ---- fan-out --------------------------------------------------------------------

// Completes with every value, in input order, once all inputs succeed; fails
// as soon as any input fails, with the error of the first to fail (in time).
// No inputs: ready at once with an empty vector. Values are copied from the
// inputs (which may have other readers).
template <class T>
  requires(!std::is_void_v<T>)
Future<std::vector<T>> whenAll(const std::vector<Future<T>>& inputs);
Future<void> whenAll(const std::vector<Future<void>>& inputs);

// Completes like the first input to complete (in time): with its index and
// value, or failing with its error. No inputs: fails with InvalidArgument.
template <class T>
  requires(!std::is_void_v<T>)
Future<WhenAnyResult<T>> whenAny(const std::vector<Future<T>>& inputs);
// For void inputs the result is the index alone.
Future<size_t> whenAny(const std::vector<Future<void>>& inputs);

// ---- implementation -------------------------------------------------------------

namespace detail {

template <class T, class U, class F>
void runThen(F& fn, FutureState<T>& s, Promise<U>& promise) {
  using Raw = std::decay_t<typename ThenResult<T, F>::type>;
  auto call = [&]() -> decltype(auto) {
    if constexpr (std::is_void_v<T>) {
      return std::invoke(fn);
    } else {
      return std::invoke(fn, static_cast<const T&>(s.value()));
    }
  };
  try {
    if constexpr (IsFuture<Raw>::value) {
      Raw inner = call();
      if (!inner.valid()) {
        promise.setError(Status::invalidArgument("a then() continuation returned an empty Future"));
        return;
      }
      promise.setFrom(inner);
    } else if constexpr (std::is_void_v<Raw>) {
      call();
      promise.setValue();
    } else {
      promise.setValue(call());
    }
  } catch (...) {
    // Only fn (or moving its result) can throw here; the promise is still
    // uncompleted, because completing it is the last step of each branch.
    promise.setError(std::current_exception());
  }
}

// Shared by the continuations of one whenAll.
template <class T>
struct Gather {
  explicit Gather(size_t n) : values(n), remaining(n) {}
  std::vector<std::optional<T>> values;  // slot i written only by input i's continuation
  std::atomic<size_t> remaining;
  std::atomic<bool> failed{false};
  Promise<std::vector<T>> promise;
};

}  // namespace detail

template <class T>
  requires(!std::is_void_v<T>)
Future<std::vector<T>> whenAll(const std::vector<Future<T>>& inputs) {
  if (inputs.empty()) return makeReadyFuture(std::vector<T>{});
  auto gather = std::make_shared<detail::Gather<T>>(inputs.size());
  Future<std::vector<T>> result = gather->promise.getFuture();
  for (size_t i = 0; i < inputs.size(); ++i) {
    detail::FutureAccess::state(inputs[i])->addContinuation([gather, i](detail::FutureStateBase& base) {
      auto& s = static_cast<detail::FutureState<T>&>(base);
      if (s.hasError()) {
        if (!gather->failed.exchange(true, std::memory_order_acq_rel)) {
          detail::FutureAccess::state(gather->promise)->tryFailFrom(s);
        }
      } else {
        gather->values[i].emplace(s.value());
      }
      // The last input to finish sees every slot written (acq_rel) and every
      // failure flagged before it.
      if (gather->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
          !gather->failed.load(std::memory_order_acquire)) {
        std::vector<T> values;
        values.reserve(gather->values.size());
        for (auto& v : gather->values) values.push_back(std::move(*v));
        gather->promise.setValue(std::move(values));
      }
    });
  }
  return result;
}

template <class T>
  requires(!std::is_void_v<T>)
Future<WhenAnyResult<T>> whenAny(const std::vector<Future<T>>& inputs) {
  if (inputs.empty()) return makeErrorFuture<WhenAnyResult<T>>(Status::invalidArgument("whenAny: no futures given"));
  struct Race {
    std::atomic<bool> decided{false};
    Promise<WhenAnyResult<T>> promise;
  };
  auto race = std::make_shared<Race>();
  Future<WhenAnyResult<T>> result = race->promise.getFuture();
  for (size_t i = 0; i < inputs.size(); ++i) {
    detail::FutureAccess::state(inputs[i])->addContinuation([race, i](detail::FutureStateBase& base) {
      if (race->decided.exchange(true, std::memory_order_acq_rel)) return;
      auto& s = static_cast<detail::FutureState<T>&>(base);
      if (s.hasError()) {
        detail::FutureAccess::state(race->promise)->tryFailFrom(s);
      } else {
        race->promise.setValue(WhenAnyResult<T>{i, s.value()});
      }
    });
  }
  return result;
}

}  // namespace weft
