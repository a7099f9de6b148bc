// ThreadPool: the threads that run the bodies of registered functions.
//
//   rpc::ThreadPool pool("weft-handler", 4);
//   pool.post([frame = std::move(frame)]() mutable { serve(frame); });
//   pool.stop();                        // runs what is queued, joins (or the destructor)
//
// Tasks run in FIFO order, several at once (one per thread). A task must not
// throw: an exception escaping one is a bug in weft and aborts with its message.
//
// Write coalescing: while a pool thread runs a task and more tasks are already
// queued behind it, underLoad() is true on that thread; the transport then
// leaves the frames that task sends to the loop thread, which writes frames
// queued together in one system call, instead of writing each one at once. An
// idle pool (one call at a time) keeps the direct write and its latency.
//
// Thread-safety: post() and stop() from any thread; stop() not from a pool
// thread (WEFT_CHECK).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rpc/uv_loop.h"

namespace weft::rpc {

class ThreadPool {
 public:
  using Task = detail::Task;

  ThreadPool(std::string name, int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // False (task destroyed unrun) once stop() has begun.
  bool post(Task task);
  // Lets the queued tasks run, then joins the threads. Idempotent.
  void stop();

  int size() const { return static_cast<int>(threads_.size()); }
  // True on a pool thread whose current task has others queued behind it.
  static bool underLoad();

 private:
  void run();

  std::string name_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  std::mutex stopMutex_;
};

}  // namespace weft::rpc
