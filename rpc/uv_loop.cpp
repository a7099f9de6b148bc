#include "rpc/uv_loop.h"

#include <pthread.h>
#include <signal.h>
#include <uv.h>

#include "common/logging.h"

namespace weft::rpc {
namespace {

// Every signal that is not the synchronous result of the thread's own fault:
// those must stay deliverable (a blocked SIGSEGV would not stop a crash, and
// sanitizers rely on their handlers).
void blockAsynchronousSignals() {
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace

UvLoop::UvLoop(std::string name) : name_(std::move(name)), loop_(std::make_unique<uv_loop_s>()),
                                   wakeup_(std::make_unique<uv_async_s>()) {
  int rc = uv_loop_init(loop_.get());
  WEFT_CHECK(rc == 0) << "uv_loop_init failed: " << uv_strerror(rc);
  rc = uv_async_init(loop_.get(), wakeup_.get(), &UvLoop::onAsync);
  WEFT_CHECK(rc == 0) << "uv_async_init failed: " << uv_strerror(rc);
  wakeup_->data = this;
  thread_ = std::thread([this] { run(); });
  // inLoopThread() is meaningful as soon as the constructor returns.
  threadId_.store(thread_.get_id());
}

UvLoop::~UvLoop() { stop(); }

bool UvLoop::post(Task task) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  // Under the lock, so that no send can reach the wakeup handle after the
  // stopping loop closed it (drainTasks closes it under the same lock).
  // Sends coalesce: several before the loop wakes run one callback, which
  // drains the whole queue.
  uv_async_send(wakeup_.get());
  return true;
}

bool UvLoop::stopping() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

uv_loop_s* UvLoop::raw() const {
  WEFT_CHECK(inLoopThread()) << "UvLoop::raw() of loop '" << name_ << "' used off its loop thread";
  return loop_.get();
}

void UvLoop::run() {
  std::string threadName = name_.substr(0, 15);
  pthread_setname_np(pthread_self(), threadName.c_str());
  blockAsynchronousSignals();
  // Runs until drainTasks, stopping, has run the last task and called uv_stop.
  uv_run(loop_.get(), UV_RUN_DEFAULT);
  // One more turn for what the last tasks started (close callbacks).
  uv_run(loop_.get(), UV_RUN_NOWAIT);

  // Handles their owners left open: close them so the loop can be released.
  int leftover = 0;
  uv_walk(
      loop_.get(),
      [](uv_handle_t* handle, void* arg) {
        if (uv_is_closing(handle)) return;
        ++*static_cast<int*>(arg);
        uv_close(handle, nullptr);
      },
      &leftover);
  if (leftover > 0) {
    WEFT_LOG(Warn) << "event loop '" << name_ << "' stopped with " << leftover
                   << " handle(s) still open; closed them without their owners";
  }
  uv_run(loop_.get(), UV_RUN_DEFAULT);
  int rc = uv_loop_close(loop_.get());
  WEFT_CHECK(rc == 0) << "uv_loop_close of loop '" << name_ << "' failed: " << uv_strerror(rc);
}

void UvLoop::onAsync(uv_async_s* handle) { static_cast<UvLoop*>(handle->data)->drainTasks(); }

void UvLoop::drainTasks() {
  while (true) {
    std::vector<Task> batch;
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      batch.swap(tasks_);
      stopping = stopping_;
    }
    for (Task& task : batch) {
      try {
        task();
      } catch (const std::exception& e) {
        WEFT_CHECK(false) << "a task on event loop '" << name_ << "' threw: " << e.what();
      } catch (...) {
        WEFT_CHECK(false) << "a task on event loop '" << name_ << "' threw a non-std::exception";
      }
    }
    if (!stopping) return;  // tasks posted by this batch run at the next wakeup
    // Stopping: nothing more can be queued once the queue is seen empty here,
    // so closing the wakeup handle cannot strand an accepted task.
    std::lock_guard<std::mutex> lock(mutex_);
    if (tasks_.empty()) {
      uv_close(reinterpret_cast<uv_handle_t*>(wakeup_.get()), nullptr);
      // Owners' handles still active (a timer, a listener) must not keep the
      // loop running: their owners failed to close them; run() deals with them.
      uv_stop(loop_.get());
      return;
    }
  }
}

void UvLoop::stop() {
  WEFT_CHECK(!inLoopThread()) << "UvLoop::stop() called on the thread of loop '" << name_ << "' itself";
  std::lock_guard<std::mutex> serial(stopMutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopping_ = true;
    uv_async_send(wakeup_.get());
  }
  thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
}

}  // namespace weft::rpc
