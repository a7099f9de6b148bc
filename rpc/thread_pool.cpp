#include "rpc/thread_pool.h"

#include <pthread.h>

#include "common/error.h"

namespace weft::rpc {

namespace {
thread_local bool tUnderLoad = false;
thread_local bool tOnPool = false;
}  // namespace

ThreadPool::ThreadPool(std::string name, int threads) : name_(std::move(name)) {
  WEFT_ENFORCE(threads >= 1, InvalidArgumentError, "ThreadPool '", name_, "': needs at least one thread, got ",
               threads);
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, i] {
      std::string thread = name_.substr(0, 12) + "-" + std::to_string(i);
      pthread_setname_np(pthread_self(), thread.substr(0, 15).c_str());
      run();
    });
  }
}

ThreadPool::~ThreadPool() { stop(); }

bool ThreadPool::post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
  return true;
}

void ThreadPool::stop() {
  WEFT_CHECK(!tOnPool) << "ThreadPool::stop called on a pool thread";
  std::lock_guard<std::mutex> stopLock(stopMutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool ThreadPool::underLoad() { return tUnderLoad; }

void ThreadPool::run() {
  tOnPool = true;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
      tUnderLoad = !tasks_.empty();
    }
    task();
    tUnderLoad = false;
  }
}

}  // namespace weft::rpc
