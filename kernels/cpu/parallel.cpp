#include "kernels/cpu/parallel.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"

namespace weft::kernels::cpu {
namespace {

thread_local bool tInTask = false;
thread_local int tThreadLimit = std::numeric_limits<int>::max();  // ThreadLimit's

void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until pred() holds or kSpinMicroseconds pass; returns pred().
template <class P>
bool spinFor(P&& pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
  for (int i = 1;; ++i) {
    if (pred()) return true;
    cpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return pred();
  }
}

int defaultThreads() {
  for (const char* name : {"WEFT_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n >= 1) return n;
    }
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// The job in flight. Its fields live in the pool and are rewritten only once
// every helper that claimed the previous job has finished with it.
//
// state: job id in the high 32 bits, kOpen while helpers may still join, and
// in the low bits how many have joined. A helper joins with a CAS that needs
// the id it saw and kOpen; the caller closes the job (clears kOpen) when no
// task is left to hand out, and then waits until `finished` reaches the
// number of helpers that joined.
class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive static destruction
    return *pool;
  }

  int threads() const { return threads_.load(std::memory_order_relaxed); }
  void setThreads(int n) { threads_.store(n, std::memory_order_relaxed); }

  void run(int64_t tasks, int maxThreads, detail::TaskFn fn, void* context) {
    const int want = threadsFor(tasks, maxThreads);  // 1 inside a task
    std::unique_lock<std::mutex> busy(submit_, std::defer_lock);
    if (want <= 1 || !busy.try_lock()) {
      runInline(tasks, fn, context);
      return;
    }
    ensureWorkers(want - 1);
    fn_ = fn;
    context_ = context;
    tasks_ = tasks;
    helpersAllowed_.store(want - 1, std::memory_order_relaxed);
    next_.store(0, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    const uint64_t id = ++jobId_;
    state_.store((id << 32) | kOpen, std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_release);
    wake_.notify_all();

    tInTask = true;
    drain(0);
    tInTask = false;

    // No task is left to hand out: close the job to late helpers, then wait
    // for those that joined.
    const uint64_t closed = state_.fetch_and(~kOpen, std::memory_order_acq_rel);
    const uint32_t joined = static_cast<uint32_t>(closed & kCountMask);
    auto done = [&] { return finished_.load(std::memory_order_acquire) == joined; };
    while (!spinFor(done)) {
      const uint32_t seen = finished_.load(std::memory_order_acquire);
      if (seen == joined) break;
      finished_.wait(seen, std::memory_order_acquire);
    }
    if (failed_.load(std::memory_order_acquire)) {
      failed_.store(false, std::memory_order_relaxed);
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
  }

  // In a forked child only the forking thread exists: forget the parent's workers.
  void afterForkInChild() {
    workers_ = 0;
    state_.store(0, std::memory_order_relaxed);
    new (&submit_) std::mutex();
  }

 private:
  static constexpr uint64_t kOpen = uint64_t{1} << 31;
  static constexpr uint64_t kCountMask = kOpen - 1;

  Pool() : threads_(defaultThreads()) {
    pthread_atfork(nullptr, nullptr, [] { Pool::instance().afterForkInChild(); });
  }

  static void runInline(int64_t tasks, detail::TaskFn fn, void* context) {
    struct InTask {  // restores the flag however the tasks end
      bool saved = std::exchange(tInTask, true);
      ~InTask() { tInTask = saved; }
    } inTask;
    for (int64_t t = 0; t < tasks; ++t) fn(context, t, 0);
  }

  // Runs tasks until none is left. The first exception stops the handing out
  // of tasks and is rethrown to the job's caller once every thread is done.
  void drain(int thread) {
    try {
      for (int64_t t; (t = next_.fetch_add(1, std::memory_order_relaxed)) < tasks_;) fn_(context_, t, thread);
    } catch (...) {
      next_.store(tasks_, std::memory_order_relaxed);
      bool expected = false;
      if (failed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) error_ = std::current_exception();
    }
  }

  // Called with submit_ held.
  void ensureWorkers(int n) {
    while (workers_ < n) {
      const int index = ++workers_;
      std::thread([this, index] { workerLoop(index); }).detach();
    }
  }

  void workerLoop(int index) {
    const std::string name = "weft-kernel-" + std::to_string(index);
    pthread_setname_np(pthread_self(), name.c_str());
    // Waking a worker must not preempt its waker (see parallel.h).
    sched_param batch{};
    batch.sched_priority = 0;
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);
    tInTask = true;  // kernels called from a task run on this thread alone
    uint32_t seen = wake_.load(std::memory_order_acquire);
    for (;;) {
      auto woken = [&] { return wake_.load(std::memory_order_acquire) != seen; };
      if (!spinFor(woken)) wake_.wait(seen, std::memory_order_acquire);
      seen = wake_.load(std::memory_order_acquire);
      join();
    }
  }

  // Joins the open job, if any and if it still wants a helper, and runs tasks.
  void join() {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      // helpersAllowed_ may belong to a newer job than s; the CAS then fails.
      if (!(s & kOpen) || static_cast<int>(s & kCountMask) >= helpersAllowed_.load(std::memory_order_relaxed)) return;
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
    }
    const int thread = static_cast<int>(s & kCountMask) + 1;
    drain(thread);
    finished_.fetch_add(1, std::memory_order_acq_rel);
    finished_.notify_one();
  }

  std::atomic<int> threads_;
  std::mutex submit_;  // held by the caller of the job in flight
  int workers_ = 0;    // started; guarded by submit_
  uint64_t jobId_ = 0;

  detail::TaskFn fn_ = nullptr;
  void* context_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int> helpersAllowed_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<uint32_t> finished_{0};
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;  // written by the thread that set failed_
};

}  // namespace


int numThreads() { return Pool::instance().threads(); }

void setNumThreads(int n) {
  WEFT_ENFORCE(n >= 1, InvalidArgumentError, "setNumThreads: the thread count must be at least 1, got ", n);
  Pool::instance().setThreads(n);
}

bool inParallelTask() { return tInTask; }

int threadsFor(int64_t tasks, int maxThreads) {
  if (tInTask) return 1;
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({static_cast<int64_t>(maxThreads), numThreads(), tasks, static_cast<int64_t>(tThreadLimit)})));
}

ThreadLimit::ThreadLimit(int maxThreads) : previous_(tThreadLimit) {
  WEFT_ENFORCE(maxThreads >= 1, InvalidArgumentError, "ThreadLimit: the thread count must be at least 1, got ",
               maxThreads);
  tThreadLimit = maxThreads;
}

ThreadLimit::~ThreadLimit() { tThreadLimit = previous_; }

namespace detail {
void parallelRun(int64_t tasks, int maxThreads, TaskFn fn, void* context) {
  if (tasks <= 0) return;
  Pool::instance().run(tasks, maxThreads, fn, context);
}
}  // namespace detail

}  // namespace weft::kernels::cpu
