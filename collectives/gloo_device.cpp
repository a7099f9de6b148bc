#include "collectives/gloo_device.h"

#include <pthread.h>
#include <sched.h>

#include <exception>

#include <gloo/transport/tcp/device.h>

#include "common/error.h"

namespace weft::collectives::gloo_detail {

namespace {

// Puts the calling thread under SCHED_BATCH for a scope (see the header).
class BatchPolicyScope {
 public:
  BatchPolicyScope() {
    ok_ = pthread_getschedparam(pthread_self(), &policy_, &param_) == 0 && policy_ == SCHED_OTHER;
    if (!ok_) return;  // a real-time or other explicit policy: leave it (and so the loop thread's) alone
    sched_param batch{};
    batch.sched_priority = 0;
    ok_ = pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch) == 0;
  }
  ~BatchPolicyScope() {
    if (ok_) pthread_setschedparam(pthread_self(), policy_, &param_);
  }
  BatchPolicyScope(const BatchPolicyScope&) = delete;
  BatchPolicyScope& operator=(const BatchPolicyScope&) = delete;

 private:
  int policy_ = SCHED_OTHER;
  sched_param param_{};
  bool ok_ = false;
};

}  // namespace

void blockSigpipeOnThisThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

SigpipeBlock::SigpipeBlock() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &previous_);
  sigset_t pending;
  sigpending(&pending);
  wasPending_ = sigismember(&pending, SIGPIPE) == 1;
}

SigpipeBlock::~SigpipeBlock() {
  if (sigismember(&previous_, SIGPIPE) == 1) return;  // it was blocked before: leave everything as it was
  sigset_t pending;
  sigpending(&pending);
  if (!wasPending_ && sigismember(&pending, SIGPIPE) == 1) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    timespec zero{0, 0};
    sigtimedwait(&set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

std::shared_ptr<gloo::transport::Device> createTcpDevice(const std::string& hostname) {
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  SigpipeBlock block;      // Gloo's loop thread inherits the mask
  BatchPolicyScope batch;  // and the scheduling policy
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw Error("cannot create a Gloo TCP device on '" + hostname + "': " + e.what());
  }
}

}  // namespace weft::collectives::gloo_detail
