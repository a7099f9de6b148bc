// UpdateLock: the parameter server's reader/writer lock, held across RPCs. A trainer's forward and
// backward hold it shared, an optimizer step holds it exclusively, so that no in-place update of
// the weights happens between a forward and the backward that uses the tensors it saved.
//
//   UpdateLock lock;
//   Future<void> f = lock.acquire(UpdateLock::Mode::Shared);   // completes when granted
//   f.get();                                                    // forward, backward ...
//   lock.transition(UpdateLock::Mode::Shared, UpdateLock::Mode::Exclusive).get();
//   ...                                                         // optimizer step
//   lock.release(UpdateLock::Mode::Exclusive);
//
// Unlike std::shared_mutex, a hold belongs to no thread: it is taken in one RPC handler and given
// back in another, and nobody blocks while waiting: acquire() returns a Future (an RPC method may
// return it, so no handler thread of the server waits for the lock; rref/remote_class.h).
//
// Fairness. Requests are granted strictly in arrival order: a shared request behind a waiting
// exclusive one waits for it, so a stream of forwards cannot starve an update and vice versa.
// Consecutive shared requests at the head are granted together.
//
// Thread-safety: every method may be called from any thread. Completions of granted requests run
// after the internal mutex is released (a continuation may call back into the lock).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/future.h"

namespace weft::examples::parameter_server {

class UpdateLock {
 public:
  enum class Mode { Shared, Exclusive };

  struct Counts {
    int64_t shared = 0;      // shared holds granted and not released
    bool exclusive = false;  // an exclusive hold is granted
    size_t waiting = 0;      // requests not granted yet
  };

  // Queues a request for `mode`; the future completes when it is granted.
  Future<void> acquire(Mode mode) {
    std::vector<Promise<void>> granted;
    Future<void> result;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      result = enqueue(mode);
      granted = grantLocked();
    }
    complete(granted);
    return result;
  }

  // Gives back a hold of `mode`; StateError when none is held in that mode.
  void release(Mode mode) {
    std::vector<Promise<void>> granted;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      releaseLocked(mode);
      granted = grantLocked();
    }
    complete(granted);
  }

  // release(from) and acquire(to) in one step: the new request joins the queue at the moment the
  // old hold is given back (StateError, and nothing queued, when `from` is not held).
  Future<void> transition(Mode from, Mode to) {
    std::vector<Promise<void>> granted;
    Future<void> result;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      releaseLocked(from);
      result = enqueue(to);
      granted = grantLocked();
    }
    complete(granted);
    return result;
  }

  Counts counts() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return {shared_, exclusive_, queue_.size()};
  }

 private:
  Future<void> enqueue(Mode mode) {
    queue_.emplace_back(mode, Promise<void>());
    return queue_.back().second.getFuture();
  }

  void releaseLocked(Mode mode) {
    if (mode == Mode::Shared) {
      WEFT_ENFORCE(shared_ > 0, StateError, "UpdateLock: release of a shared hold, but none is held");
      --shared_;
    } else {
      WEFT_ENFORCE(exclusive_, StateError, "UpdateLock: release of the exclusive hold, but it is not held");
      exclusive_ = false;
    }
  }

  // Pops the requests at the head of the queue that can be granted now.
  std::vector<Promise<void>> grantLocked() {
    std::vector<Promise<void>> granted;
    while (!queue_.empty() && !exclusive_) {
      auto& [mode, promise] = queue_.front();
      if (mode == Mode::Shared) {
        ++shared_;
      } else if (shared_ == 0) {
        exclusive_ = true;
      } else {
        break;
      }
      granted.push_back(std::move(promise));
      queue_.pop_front();
    }
    return granted;
  }

  static void complete(std::vector<Promise<void>>& granted) {
    for (Promise<void>& p : granted) p.setValue();
  }

  mutable std::mutex mutex_;
  int64_t shared_ = 0;
  bool exclusive_ = false;
  std::deque<std::pair<Mode, Promise<void>>> queue_;
};

}  // namespace weft::examples::parameter_server
