// UvLoop: one libuv event loop running on a thread of its own, and the one way
// other threads hand it work (post).
//
// weft keeps every socket and timer of a process on a loop thread; other
// threads never touch them, they post a task that does. (State that callers
// reach on the latency path, such as an Agent's per-peer call tables and a
// connection's write queue, is guarded by a mutex instead: docs/design.md,
// "Threads".) The rendezvous store (server and client) runs on a UvLoop, and
// the Agent's transport shares the same kind of loop:
//
//   weft::rpc::UvLoop loop("weft-store");
//   loop.post([&] { uv_timer_init(loop.raw(), &timer); ... });   // any thread; runs on the loop
//   int port = loop.call([&] { return listener.bind(); });        // blocks for the result
//   loop.stop();                                                   // or the destructor
//
// Tasks. post() queues a move-only callable; tasks run on the loop thread in the
// order they were posted (FIFO across all posting threads), each to completion.
// A task may post further tasks (they run in a later turn of the loop). An
// exception escaping a task is a bug in weft and aborts with its message, like
// one escaping a std::thread. post() returns false, and destroys the task on the
// calling thread without running it, once stop() has begun: a caller learns
// either that its task will run or that it will not, never both.
//
// Stopping. stop() (idempotent, called by the destructor, never from the loop
// thread) refuses new tasks, runs every task already accepted, gives the loop
// one more turn for the close callbacks those tasks started, and returns
// without waiting for timers or sockets still active. Owners of handles close
// them before the loop stops (typically from their own destructor, through
// call()); a handle still open at that point is closed by stop() without its
// close callback, with one warning line, so the loop can always be released.
// After stop() returns, an owner whose post() fails knows its handles are
// closed and their memory may be freed.
//
// Signals. The loop thread blocks every asynchronous signal (SIGPIPE, SIGINT,
// SIGTERM, ...): a write to a socket whose peer is gone fails with EPIPE on
// that thread instead of killing the process, and termination signals are
// delivered to the program's own threads. Nothing process-wide is changed.
//
// Thread-safety: post, call, inLoopThread and stop may be called from any
// thread; raw() only on the loop thread.
//
// Loop-thread functions. In the agent and its transport (rpc/agent*.cpp,
// rpc/transport/), a function that must run on the loop thread
// (it touches state only the loop owns) has a name ending in OnLoop, and its
// first line is WEFT_DCHECK_ON_LOOP(loop): in debug and sanitizer builds it
// aborts, naming the function, when called from another thread (compiled out
// otherwise; common/error.h, WEFT_DCHECK); a few keep a WEFT_CHECK, on in
// every build, instead (Connection::startOnLoop, closeNowOnLoop). libuv's
// callbacks run on the loop by construction.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/future.h"

struct uv_loop_s;   // libuv's loop; the header <uv.h> stays out of weft's public headers
struct uv_async_s;

namespace weft::rpc {

namespace detail {

// A move-only callable taking no arguments (std::function demands copyable
// targets; a task often owns a Promise or a buffer).
class Task {
 public:
  Task() = default;
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, Task> && std::is_invocable_v<std::decay_t<F>&>)
  Task(F&& fn)  // NOLINT: implicit by design, like std::function
      : impl_(std::make_unique<Impl<std::decay_t<F>>>(std::forward<F>(fn))) {}
  explicit operator bool() const noexcept { return impl_ != nullptr; }
  void operator()() { impl_->call(); }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void call() = 0;
  };
  template <class F>
  struct Impl final : Base {
    template <class G>
    explicit Impl(G&& g) : fn(std::forward<G>(g)) {}
    void call() override { fn(); }
    F fn;
  };
  std::unique_ptr<Base> impl_;
};

}  // namespace detail

class UvLoop {
 public:
  using Task = detail::Task;

  // Starts the loop thread; `name` names the thread (first 15 characters, as
  // the kernel keeps them) and appears in the loop's log lines.
  explicit UvLoop(std::string name = "weft-loop");
  // stop().
  ~UvLoop();
  UvLoop(const UvLoop&) = delete;
  UvLoop& operator=(const UvLoop&) = delete;

  // Queues task to run on the loop thread. False once stop() has begun (the
  // task was destroyed unrun). Never runs the task inline, not even when called
  // on the loop thread.
  bool post(Task task);

  // Runs fn on the loop thread and returns its result (or rethrows what it
  // threw) on the calling thread, which blocks meanwhile. Called on the loop
  // thread it runs fn inline. Throws StateError when the loop has stopped.
  template <class F>
  std::invoke_result_t<F&> call(F&& fn);

  // True on the loop thread.
  bool inLoopThread() const noexcept { return std::this_thread::get_id() == threadId_.load(); }
  // True once stop() has begun.
  bool stopping() const;
  const std::string& name() const noexcept { return name_; }

  // The libuv loop, for initialising handles. Loop thread only (WEFT_CHECK).
  uv_loop_s* raw() const;

  // See "Stopping" above. Must not be called on the loop thread (WEFT_CHECK):
  // the loop cannot join itself.
  void stop();

 private:
  void run();
  void drainTasks();
  static void onAsync(uv_async_s* handle);

  std::string name_;
  std::unique_ptr<uv_loop_s> loop_;
  std::unique_ptr<uv_async_s> wakeup_;
  std::atomic<std::thread::id> threadId_{};
  std::thread thread_;

  mutable std::mutex mutex_;
  std::vector<Task> tasks_;  // under mutex_
  bool stopping_ = false;    // under mutex_; once true, post() refuses
  bool stopped_ = false;     // under mutex_; the thread has been joined
  std::mutex stopMutex_;     // serialises concurrent stop() calls
};

// ---- implementation -------------------------------------------------------------

template <class F>
std::invoke_result_t<F&> UvLoop::call(F&& fn) {
  using R = std::invoke_result_t<F&>;
  if (inLoopThread()) return fn();
  Promise<R> promise;
  Future<R> result = promise.getFuture();
  bool posted = post([&fn, promise]() mutable {
    try {
      if constexpr (std::is_void_v<R>) {
        fn();
        promise.setValue();
      } else {
        promise.setValue(fn());
      }
    } catch (...) {
      promise.setError(std::current_exception());
    }
  });
  if (!posted) throw StateError("event loop '" + name_ + "' has stopped; cannot run a task on it");
  if constexpr (std::is_void_v<R>) {
    result.get();
  } else {
    return std::move(result).get();
  }
}

}  // namespace weft::rpc

// Checks that the caller runs on `loop`'s thread (see "Loop-thread functions" above).
#define WEFT_DCHECK_ON_LOOP(loop) WEFT_DCHECK((loop).inLoopThread()) << __func__ << " off the loop thread"
