// The CPU kernels' threads: one pool per process, shared by every thread that
// runs kernels (the main thread, RPC handler threads, a backward pass on any
// thread), so a process never has more kernel threads running than its CPUs.
//
//   // body(task, thread) for task in [0, 100), on up to numThreads() threads:
//   kernels::cpu::parallelRun(100, kernels::cpu::numThreads(), [&](int64_t task, int thread) { ... });
//   kernels::cpu::setNumThreads(1);                 // kernels run on the calling thread only
//   { kernels::cpu::ThreadLimit one(1); ... }       // this thread's kernels run on it alone
//
// Why not OpenMP: libgomp gives each thread that opens a parallel region a
// team of its own, and an idle team spins for milliseconds before it sleeps.
// In a training process (a main thread and RPC handler threads running
// kernels, beside communication threads, often several processes per
// machine) those spinning workers take the CPUs that the next kernel, another
// process or a collective's network thread needs, and a DDP step slows down
// most where CPUs are fewest.
//
// The pool: numThreads() - 1 worker threads (the caller is the first thread of
// every job), started on first use. Tasks are handed out one at a time, so a
// thread the OS has descheduled delays only the task it holds. An idle worker
// spins for kSpinMicroseconds, then sleeps on a futex; workers run under
// SCHED_BATCH, so waking one never preempts the thread that woke it (on a busy
// CPU that would stall the job's own caller). One job runs at a time: a job
// started while another is running, or from inside a task, runs entirely on
// its calling thread, in task order.
//
// Threads that run kernels side by side (nn::DataParallel's replicas) each
// hold a ThreadLimit of 1: the pool serves one job at a time, so the replica
// that got it would add numThreads() - 1 workers to the replicas' own threads
// while the others ran alone; with the limit, R replicas are R threads.
//
// numThreads(): setNumThreads(n) if called, else WEFT_NUM_THREADS, else
// OMP_NUM_THREADS, else the CPUs this process may run on (its affinity mask).
// Each BLAS call runs on its calling thread, and large products are split
// over the pool (kernels/cpu/gemm.h).
//
// A forked child starts with no workers and starts its own on first use.
#pragma once

#include <cstdint>
#include <type_traits>

namespace weft::kernels::cpu {

// Idle workers spin this long before they sleep.
inline constexpr int64_t kSpinMicroseconds = 50;

int numThreads();
// n >= 1 (InvalidArgumentError otherwise). Takes effect for the next job.
void setNumThreads(int n);
// True on a thread while it runs a task of a job (kernels called there run
// on that thread alone).
bool inParallelTask();

namespace detail {
using TaskFn = void (*)(void* context, int64_t task, int thread);
void parallelRun(int64_t tasks, int maxThreads, TaskFn fn, void* context);
}  // namespace detail

// Runs body(task, thread) for every task in [0, tasks) on up to
// min(maxThreads, numThreads(), tasks) threads and returns when all have run.
// `thread` is in [0, that count) and fixed for the duration of one thread's
// share (index per-thread scratch with it); which tasks a thread runs is not
// fixed. An exception from a task stops the handing out of tasks and is
// rethrown here once every thread has stopped (the first one, if several).
template <class F>
void parallelRun(int64_t tasks, int maxThreads, F&& body) {
  detail::parallelRun(
      tasks, maxThreads,
      [](void* context, int64_t task, int thread) { (*static_cast<std::remove_reference_t<F>*>(context))(task, thread); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

// The threads a job of `tasks` tasks would use now (1 inside a task, at most
// the calling thread's ThreadLimit).
int threadsFor(int64_t tasks, int maxThreads);

// Caps, for its lifetime, the threads of every job the calling thread starts
// (with 1, its kernels run on it alone); guards nest, the innermost applies.
// maxThreads >= 1 (InvalidArgumentError otherwise).
class ThreadLimit {
 public:
  explicit ThreadLimit(int maxThreads);
  ~ThreadLimit();
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;

 private:
  int previous_;
};


}  // namespace weft::kernels::cpu
