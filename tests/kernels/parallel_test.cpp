#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "weft_test.h"

using namespace weft::kernels::cpu;

namespace {

// Restores the kernel thread count when a test ends.
struct ThreadsScope {
  int saved = numThreads();
  explicit ThreadsScope(int n) { setNumThreads(n); }
  ~ThreadsScope() { setNumThreads(saved); }
};

double processCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

TEST_CASE("parallelRun runs every task once, on thread indices below threadsFor") {
  ThreadsScope two(2);
  for (int64_t tasks : {1, 2, 3, 64, 1000}) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
    const int threads = threadsFor(tasks, numThreads());
    std::atomic<int> badThread{0};
    parallelRun(tasks, numThreads(), [&](int64_t t, int thread) {
      runs[static_cast<size_t>(t)].fetch_add(1);
      if (thread < 0 || thread >= threads) badThread.fetch_add(1);
    });
    for (auto& r : runs) CHECK(r.load() == 1);
    CHECK(badThread.load() == 0);
  }
}

TEST_CASE("a job started inside a task, or with one thread, runs on the calling thread in task order") {
  ThreadsScope two(2);
  std::vector<int64_t> order;
  std::atomic<bool> nestedOnCaller{true};
  parallelRun(2, 2, [&](int64_t, int) {
    CHECK(inParallelTask());
    CHECK(threadsFor(100, 8) == 1);
    const auto self = std::this_thread::get_id();
    parallelRun(8, 8, [&](int64_t, int thread) {
      if (thread != 0 || std::this_thread::get_id() != self) nestedOnCaller = false;
    });
  });
  CHECK(nestedOnCaller.load());
  CHECK_FALSE(inParallelTask());
  ThreadsScope one(1);
  const auto self = std::this_thread::get_id();
  parallelRun(5, 8, [&](int64_t t, int thread) {
    CHECK(thread == 0);
    CHECK(std::this_thread::get_id() == self);
    order.push_back(t);
  });
  CHECK(order == std::vector<int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("a ThreadLimit caps the jobs its thread starts, nests, and leaves other threads alone") {
  ThreadsScope two(2);
  CHECK(threadsFor(100, 8) == 2);
  {
    ThreadLimit one(1);
    CHECK(threadsFor(100, 8) == 1);
    const auto self = std::this_thread::get_id();
    std::atomic<bool> onCaller{true};
    parallelRun(50, 8, [&](int64_t, int thread) {
      if (thread != 0 || std::this_thread::get_id() != self) onCaller = false;
    });
    CHECK(onCaller.load());
    int other = 0;
    std::thread([&] { other = threadsFor(100, 8); }).join();
    CHECK(other == 2);
    {
      ThreadLimit three(3);
      CHECK(threadsFor(100, 8) == 2);
    }
    CHECK(threadsFor(100, 8) == 1);
  }
  CHECK(threadsFor(100, 8) == 2);
  CHECK_THROWS_AS(ThreadLimit(0), weft::InvalidArgumentError);
}

TEST_CASE("jobs from several threads at once each run all their tasks exactly once") {
  ThreadsScope two(2);
  constexpr int kCallers = 4, kJobs = 300;
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int j = 0; j < kJobs; ++j) {
        const int64_t tasks = 1 + (c * 7 + j) % 13;
        std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
        parallelRun(tasks, 2, [&](int64_t t, int) { runs[static_cast<size_t>(t)].fetch_add(1); });
        for (auto& r : runs) wrong += r.load() != 1;
      }
    });
  }
  for (auto& t : callers) t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("an exception from a task reaches the caller after every thread stopped, and the pool goes on") {
  ThreadsScope two(2);
  std::atomic<int> after{0};
  CHECK_THROWS_WITH_AS(parallelRun(100, 2,
                                   [&](int64_t t, int) {
                                     if (t == 3) throw std::runtime_error("task 3 failed");
                                     std::this_thread::sleep_for(std::chrono::microseconds(50));
                                   }),
                       "task 3 failed", std::runtime_error);
  parallelRun(10, 2, [&](int64_t, int) { after.fetch_add(1); });
  CHECK(after.load() == 10);
  // Also when the job ran inline: the thread is out of the task afterwards.
  ThreadsScope one(1);
  CHECK_THROWS_AS(parallelRun(3, 2, [](int64_t, int) { throw std::runtime_error("inline"); }), std::runtime_error);
  CHECK_FALSE(inParallelTask());
}

TEST_CASE("the kernel thread count is at least one and can be set") {
  CHECK(numThreads() >= 1);
  CHECK_THROWS_WITH_AS(setNumThreads(0), doctest::Contains("at least 1, got 0"), weft::InvalidArgumentError);
  ThreadsScope three(3);
  CHECK(numThreads() == 3);
  CHECK(threadsFor(2, 8) == 2);
  CHECK(threadsFor(100, 2) == 2);
  CHECK(parallelChunkCount(10, 32768) == 1);
  CHECK(parallelChunkCount(1 << 20, 32768) == 12);  // about four per thread
}

TEST_CASE("idle kernel threads sleep instead of spinning") {
  // The property that matters beside other processes and communication
  // threads: once a job is done, the workers stop using the CPU within
  // kSpinMicroseconds.
  ThreadsScope two(2);
  std::atomic<int64_t> sink{0};
  parallelRun(64, 2, [&](int64_t t, int) {
    int64_t s = 0;
    for (int64_t i = 0; i < 20000; ++i) s += i ^ t;
    sink += s;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double before = processCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double idle = processCpuSeconds() - before;
  CHECK(idle < 0.02);  // a spinning worker would burn about 0.2 s here
}

TEST_CASE("a forked child starts its own kernel threads") {
  ThreadsScope two(2);
  parallelRun(8, 2, [](int64_t, int) {});  // the parent's workers exist
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::atomic<int> runs{0};
    for (int j = 0; j < 50; ++j) parallelRun(16, 2, [&](int64_t, int) { runs.fetch_add(1); });
    _exit(runs.load() == 50 * 16 ? 0 : 1);
  }
  int status = -1;
  bool reaped = false;
  for (int i = 0; i < 500 && !reaped; ++i) {  // up to 5 s
    reaped = waitpid(pid, &status, WNOHANG) == pid;
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!reaped) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL("the child hung in parallelRun");
  }
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("products are right when several threads multiply at once, and BLAS starts no threads of its own") {
  // Small transposed products from four threads at once, against a direct
  // loop: a BLAS that is not safe to call concurrently gets these wrong.
  constexpr int64_t M = 16, N = 16, K = 12;
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 4; ++c) {
    threads.emplace_back([&, c] {
      std::vector<double> a(M * K), bt(N * K), out(M * N);
      for (int it = 0; it < 2000; ++it) {
        for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<double>((i * 7 + it + c) % 13) - 6.0;
        for (int64_t i = 0; i < N * K; ++i) bt[i] = static_cast<double>((i * 5 + 3 * it - c) % 11) - 5.0;
        gemm(weft::DType::Float64, {a.data(), false, K}, {bt.data(), true, K}, M, N, K, 1.0, 0.0, out.data(), N);
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) s += a[i * K + k] * bt[j * K + k];
            wrong += out[i * N + j] != s;  // small integers: exact
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
  // Each thread that multiplied ran BLAS on itself: this process holds the
  // test's thread, the pool's workers and nothing else.
  std::vector<double> big(512 * 512, 1.0), res(512 * 512);
  gemm(weft::DType::Float64, {big.data(), false, 512}, {big.data(), false, 512}, 512, 512, 512, 1.0, 0.0, res.data(),
       512);
  CHECK(res[0] == 512.0);
  int tasks = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) tasks += entry.exists();
  CHECK(tasks <= numThreads());
}
