// Work: the handle every ProcessGroup call returns, the way to learn when an
// asynchronous collective or point-to-point transfer has finished and whether
// it succeeded.
//
//   weft::collectives::Work w = pg.allReduce(grad);     // returns at once
//   ... compute something else ...
//   w.wait();                                           // throws the op's error, if any
//   if (w.isCompleted() && w.isSuccess()) ...
//   w.wait(std::chrono::seconds(5));                    // TimeoutError if still running after 5 s
//   weft::Future<void> f = w.future();                  // to chain: f.then(...)
//
// Handles. A Work is a cheap, copyable handle to shared state (like
// weft::Future): copies see the same completion. A default-constructed Work is
// empty (valid() == false); calling anything else on it is a bug (WEFT_CHECK).
// The state keeps the tensors of the call alive until the op has finished, so
// a caller may drop its own handles early; it must not read or write them
// before the Work completes (the backend writes into them from its thread).
//
// Errors. wait() and future().get() throw what the op failed with (see
// process_group.h, "Errors"); exception() gives it without throwing (null while
// running and on success). wait(timeout) gives up waiting, not the op: it
// throws TimeoutError naming the op when the op has not finished within
// `timeout`, and the op goes on (it is bounded by its own group timeout).
//
// Thread-safety: every method may be called from any thread, concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "common/future.h"
#include "tensor/tensor.h"

namespace weft::collectives {

namespace detail {
struct WorkState {
  explicit WorkState(std::string what) : description(std::move(what)), future(promise.getFuture()) {}
  const std::string description;  // "allReduce #3 on group 'default'"
  Promise<void> promise;
  Future<void> future;
  std::atomic<int> sourceRank{-1};
  std::vector<Tensor> tensors;  // kept alive until completion, released then
};
}  // namespace detail

class Work {
 public:
  Work() = default;

  bool valid() const noexcept { return state_ != nullptr; }
  // "allReduce #3 on group 'default'": the op, its sequence number among the
  // group's collectives (p2p ops carry their tag instead) and the group.
  const std::string& description() const;
  bool isCompleted() const;
  // Completed without error (false while running).
  bool isSuccess() const;
  // Blocks until the op completes; throws its error.
  void wait() const;
  // As wait(), but throws TimeoutError when the op is still running after
  // `timeout` (the op is not cancelled).
  void wait(std::chrono::milliseconds timeout) const;
  // The op's error; null while running and on success.
  std::exception_ptr exception() const;
  // For a receive: the group rank the data came from (the one rank it named,
  // or the sender an any-source receive matched); -1 before completion and for
  // every other op.
  int sourceRank() const;
  // Completes with the op (the same error on failure).
  Future<void> future() const;

  // ---- for backends ------------------------------------------------------------
  // A running Work for `description`, holding `tensors` until completion.
  static Work start(std::string description, std::vector<Tensor> tensors);
  // A Work that has already failed with `error` (an op refused before it ran
  // because the group is unusable).
  static Work failed(std::string description, std::exception_ptr error);
  void setSourceRank(int rank) const;
  // Exactly one of these completes the Work; both release the tensors first.
  void complete() const;
  void fail(std::exception_ptr error) const;

 private:
  explicit Work(std::shared_ptr<detail::WorkState> s) : state_(std::move(s)) {}
  detail::WorkState& state() const;
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace weft::collectives
