#include "collectives/nccl/process_group_nccl.h"
#include "collectives/nccl/detail/group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "common/error.h"
#include "kernels/device.h"

namespace weft::collectives {

namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;
using Deadline = Clock::time_point;

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
constexpr bool kNcclHasAvg = true;
#else
constexpr bool kNcclHasAvg = false;
#endif

void cudaEnforce(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(what + ": " + cudaGetErrorString(e));
  }
}

// ncclInProgress is not an error: a call on a non-blocking communicator
// returns it while the call completes (see Impl::waitComm).
void ncclEnforce(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string msg = what + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  if (r == ncclRemoteError) throw DisconnectedError(msg);
  throw Error(msg);
}

// Makes `device` current on this thread for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device_) cudaEnforce(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

ncclDataType_t ncclTypeOf(DType t) {
  switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int32: return ncclInt32;
    case DType::UInt8: return ncclUint8;
    case DType::Bool: return ncclUint8;  // moved only: checkReducible refuses it
  }
  WEFT_CHECK(false) << "unknown dtype " << static_cast<int>(t);
  return ncclFloat32;
}

ncclRedOp_t ncclOpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case ReduceOp::Avg: return ncclAvg;
#else
    case ReduceOp::Avg: return ncclSum;  // divided by size() afterwards (divideOnHost)
#endif
    case ReduceOp::Product: return ncclProd;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// The avg of an NCCL without ncclAvg: the sum, divided after the op completed.
void divideOnHost(void* data, DType t, size_t n, int by) {
  if (n == 0) return;
  const size_t nbytes = n * elementSize(t);
  std::vector<uint8_t> host(nbytes);
  cudaEnforce(cudaMemcpy(host.data(), data, nbytes, cudaMemcpyDeviceToHost), "avg: copy of the sum to the host");
  if (t == DType::Float32) {
    auto* p = reinterpret_cast<float*>(host.data());
    for (size_t i = 0; i < n; ++i) p[i] /= static_cast<float>(by);
  } else {
    WEFT_CHECK(t == DType::Float64) << "avg on the host of " << dtypeName(t);
    auto* p = reinterpret_cast<double*>(host.data());
    for (size_t i = 0; i < n; ++i) p[i] /= static_cast<double>(by);
  }
  cudaEnforce(cudaMemcpy(data, host.data(), nbytes, cudaMemcpyHostToDevice), "avg: copy of the average to the device");
}

// ---- argument checks ------------------------------------------------------------------

void checkReducible(DType t, ReduceOp op, const char* name) {
  WEFT_ENFORCE(t != DType::Bool, InvalidArgumentError, name,
               ": the nccl backend does not reduce bool (convert a mask to uint8: Max is any, Min is all)");
  WEFT_ENFORCE(op != ReduceOp::Avg || isFloating(t), InvalidArgumentError, name,
               ": ReduceOp avg needs a floating dtype, got ", dtypeName(t));
  WEFT_ENFORCE(op != ReduceOp::Avg || kNcclHasAvg || t == DType::Float32 || t == DType::Float64,
               InvalidArgumentError, name, ": ReduceOp avg on ", dtypeName(t),
               " needs NCCL 2.10 or newer (ncclAvg); this build has NCCL ", NCCL_MAJOR, ".", NCCL_MINOR);
}

void checkTag(uint32_t tag, const char* op) {
  WEFT_ENFORCE(tag == 0, InvalidArgumentError, op, ": the nccl backend has no tags (NCCL matches transfers between ",
               "two ranks in issue order); the tag must be 0, got ", tag);
}

std::string toHex(const ncclUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    auto b = static_cast<unsigned char>(c);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

ncclUniqueId fromHex(const std::string& s) {
  ncclUniqueId id;
  WEFT_ENFORCE(s.size() == 2 * sizeof(id.internal), ProtocolError, "ProcessGroupNccl: the NCCL unique id in the store has ",
               s.size(), " hex digits, expected ", 2 * sizeof(id.internal));
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw ProtocolError("ProcessGroupNccl: the NCCL unique id in the store is not hex");
  };
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>((nibble(s[2 * i]) << 4) | nibble(s[2 * i + 1]));
  }
  return id;
}

uint8_t* bytesOf(const Tensor& t) { return static_cast<uint8_t*>(t.rawData()); }

// Issues a device-to-device copy on `stream`.
void copyAsync(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return;
  cudaEnforce(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
}

}  // namespace

// ==== Impl ===================================================================================

class ProcessGroupNccl::Impl {
 public:
  // Issues NCCL calls and copies on the group's stream (group thread).
  using LaunchFn = std::function<void(ncclComm_t, cudaStream_t)>;
  // Runs on the host once the op has completed on the device.
  using FinishFn = std::function<void()>;

  Impl(rpc::StoreClient& store, int rank, int size, Options options, std::string name);
  ~Impl();

  // Records the ready event on the device's default stream, numbers and queues
  // the op. `op` is the op's name; a collective gets a sequence number, a
  // transfer passes its full description in `op` with collective == false.
  Work submit(const std::string& op, bool collective, std::vector<Tensor> keep, LaunchFn launch,
              FinishFn finish = nullptr);

  rpc::StoreClient& store_;
  const int rank_;
  const int size_;
  const Options options_;
  const std::string name_;
  const std::string prefix_;  // "weft/pg-nccl/<name>/"
  int device_ = 0;
  void* barrierBuffer_ = nullptr;  // one float on the device

  std::mutex mutex_;  // guards queue_, nextSeq_, stopping_, broken_
  int64_t nextSeq_ = 0;

 private:
  struct Task {
    Work work;
    cudaEvent_t ready = nullptr;
    cudaEvent_t done = nullptr;
    LaunchFn launch;
    FinishFn finish;
    Deadline deadline{};
  };

  void rendezvous();
  // Polls the communicator until its last call is no longer in progress.
  void waitComm(Deadline deadline, const std::string& what);
  void run();
  void launch(Task& task, std::deque<Task>& pending);
  void poll(std::deque<Task>& pending);
  // Aborts the communicator, fails `first` with `error` and every other
  // launched op with StateError; the group is unusable from then on.
  void fatal(Task& first, std::exception_ptr error, const std::string& msg, std::deque<Task>& pending);
  std::string brokenReason();
  static void release(Task& t);

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;

  std::condition_variable queued_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::string broken_;
  std::thread thread_;
};

ProcessGroupNccl::Impl::Impl(rpc::StoreClient& store, int rank, int size, Options options, std::string name)
    : store_(store),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      name_(std::move(name)),
      prefix_("weft/pg-nccl/" + name_ + "/") {
  WEFT_ENFORCE(options_.timeout.count() > 0, InvalidArgumentError, "ProcessGroupNccl: timeout must be > 0, got ",
               options_.timeout.count(), " ms");
  const int count = kernels::cudaDeviceCount();
  WEFT_ENFORCE(count > 0, Error, "ProcessGroupNccl: no CUDA device is visible; the nccl backend needs one per rank ",
               "(use the gloo backend for CPU tensors)");
  device_ = options_.device >= 0 ? options_.device : rank_ % count;
  WEFT_ENFORCE(device_ < count, InvalidArgumentError, "ProcessGroupNccl: device ", device_, " is not one of the ",
               count, " visible CUDA device(s)");
  DeviceGuard guard(device_);
  cudaEnforce(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "ProcessGroupNccl: cudaStreamCreate");
  cudaError_t e = cudaMalloc(&barrierBuffer_, sizeof(float));
  if (e != cudaSuccess) {
    cudaStreamDestroy(stream_);
    cudaEnforce(e, "ProcessGroupNccl: cudaMalloc of the barrier buffer");
  }
  try {
    rendezvous();
  } catch (...) {
    cudaFree(barrierBuffer_);
    cudaStreamDestroy(stream_);
    throw;
  }
  thread_ = std::thread([this] { run(); });
}

ProcessGroupNccl::Impl::~Impl() {
  ProcessGroupNccl::cancelQueued(mutex_, queue_, stopping_, queued_, "the op was launched", [](Task& t) { release(t); });
  if (thread_.joinable()) thread_.join();  // it finishes the launched ops, bounded by the timeout
  DeviceGuard guard(device_);
  if (comm_ != nullptr) {
    bool finalized = true;
    try {
      ncclEnforce(ncclCommFinalize(comm_), "ncclCommFinalize");
      waitComm(Clock::now() + options_.timeout, "ProcessGroupNccl: finalizing the communicator");
    } catch (const std::exception&) {
      finalized = false;  // aborted instead: the destructor never throws
    }
    if (finalized) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  cudaFree(barrierBuffer_);
  cudaStreamDestroy(stream_);
}

std::string ProcessGroupNccl::Impl::brokenReason() {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

void ProcessGroupNccl::Impl::release(Task& t) {
  if (t.ready != nullptr) cudaEventDestroy(t.ready);
  if (t.done != nullptr) cudaEventDestroy(t.done);
  t.ready = t.done = nullptr;
}

void ProcessGroupNccl::Impl::waitComm(Deadline deadline, const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclEnforce(ncclCommGetAsyncError(comm_, &state), what);
    if (state == ncclSuccess) return;
    ncclEnforce(state, what);
    WEFT_ENFORCE(Clock::now() < deadline, TimeoutError, what, ": NCCL still busy after ", options_.timeout.count(),
                 " ms");
    std::this_thread::yield();
  }
}

// ---- rendezvous -----------------------------------------------------------------------------

void ProcessGroupNccl::Impl::rendezvous() {
  const Deadline deadline = Clock::now() + options_.timeout;
  const std::string joined = prefix_ + "joined/";
  store_.set(joined + std::to_string(rank_), "1");
  ncclUniqueId id;
  if (rank_ == 0) {
    ncclEnforce(ncclGetUniqueId(&id), "ProcessGroupNccl: ncclGetUniqueId");
    store_.set(prefix_ + "id", toHex(id));
  } else {
    std::string hex;
    try {
      hex = store_.get(prefix_ + "id", options_.timeout);
    } catch (const TimeoutError& e) {
      throw TimeoutError("ProcessGroupNccl: rendezvous of group '" + name_ + "' (rank " + std::to_string(rank_) +
                         " of " + std::to_string(size_) + "): rank 0 did not publish the NCCL unique id within " +
                         std::to_string(options_.timeout.count()) + " ms (" + e.what() + ")");
    }
    id = fromHex(hex);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; waitComm bounds the wait
  ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  try {
    ncclEnforce(r, "ProcessGroupNccl: ncclCommInitRankConfig");
    waitComm(deadline, "ProcessGroupNccl: creating the communicator");
  } catch (const std::exception& e) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    std::vector<int> missing;
    for (int other = 0; other < size_; ++other) {
      try {
        if (!store_.check({joined + std::to_string(other)})) missing.push_back(other);
      } catch (const std::exception&) {
        break;
      }
    }
    std::string msg = "ProcessGroupNccl: rendezvous of group '" + name_ + "' (rank " + std::to_string(rank_) + " of " +
                      std::to_string(size_) + ") failed: ";
    if (!missing.empty()) msg += "ranks " + rankList(missing) + " never joined; ";
    msg += e.what();
    if (dynamic_cast<const TimeoutError*>(&e) != nullptr) throw TimeoutError(msg);
    if (dynamic_cast<const DisconnectedError*>(&e) != nullptr) throw DisconnectedError(msg);
    throw Error(msg);
  }
}

// ---- issue side ------------------------------------------------------------------------------

Work ProcessGroupNccl::Impl::submit(const std::string& op, bool collective, std::vector<Tensor> keep, LaunchFn launch,
                                    FinishFn finish) {
  Task task;
  {
    DeviceGuard guard(device_);
    cudaEnforce(cudaEventCreateWithFlags(&task.ready, cudaEventDisableTiming), op + ": cudaEventCreate");
    cudaError_t e = cudaEventCreateWithFlags(&task.done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(task.ready, nullptr);  // the default stream: the caller's prior work
    if (e != cudaSuccess) {
      release(task);
      cudaEnforce(e, op + ": recording the ready event");
    }
  }
  task.launch = std::move(launch);
  task.finish = std::move(finish);
  std::lock_guard<std::mutex> lock(mutex_);
  std::string what = collective ? op + " #" + std::to_string(nextSeq_++) + " on group '" + name_ + "'"
                                : op + " on group '" + name_ + "'";
  task.work = Work::start(std::move(what), std::move(keep));
  Work work = task.work;
  if (stopping_) {
    work.fail(std::make_exception_ptr(StateError(work.description() + ": the process group is being destroyed")));
    release(task);
    return work;
  }
  queue_.push_back(std::move(task));
  queued_.notify_one();
  return work;
}

// ---- the group's thread ------------------------------------------------------------------------

void ProcessGroupNccl::Impl::run() {
  cudaSetDevice(device_);
  std::deque<Task> pending;  // launched, in launch (and so completion) order
  for (;;) {
    std::deque<Task> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto ready = [&] { return stopping_ || !queue_.empty(); };
      if (pending.empty()) {
        queued_.wait(lock, ready);
      } else {
        queued_.wait_for(lock, std::chrono::microseconds(50), ready);
      }
      batch.swap(queue_);
      if (stopping_ && batch.empty() && pending.empty()) return;
    }
    for (Task& t : batch) launch(t, pending);
    poll(pending);
  }
}

void ProcessGroupNccl::Impl::launch(Task& task, std::deque<Task>& pending) {
  const std::string what = task.work.description();
  std::string broken = brokenReason();
  if (!broken.empty()) {
    task.work.fail(std::make_exception_ptr(
        StateError(what + ": the group is unusable after an earlier failure: " + broken)));
    release(task);
    return;
  }
  task.deadline = Clock::now() + options_.timeout;
  try {
    cudaEnforce(cudaStreamWaitEvent(stream_, task.ready, 0), what + ": cudaStreamWaitEvent");
    task.launch(comm_, stream_);
    waitComm(task.deadline, what);
    cudaEnforce(cudaEventRecord(task.done, stream_), what + ": cudaEventRecord");
  } catch (const std::exception& e) {
    std::string msg = what + " failed on rank " + std::to_string(rank_) + " at launch: " + e.what();
    std::exception_ptr error;
    if (dynamic_cast<const TimeoutError*>(&e) != nullptr) {
      error = std::make_exception_ptr(TimeoutError(msg));
    } else if (dynamic_cast<const DisconnectedError*>(&e) != nullptr) {
      error = std::make_exception_ptr(DisconnectedError(msg));
    } else {
      error = std::make_exception_ptr(Error(msg));
    }
    fatal(task, error, msg, pending);
    return;
  }
  task.launch = nullptr;
  pending.push_back(std::move(task));
}

void ProcessGroupNccl::Impl::poll(std::deque<Task>& pending) {
  while (!pending.empty()) {
    Task& t = pending.front();
    const std::string what = t.work.description();
    cudaError_t e = cudaEventQuery(t.done);
    if (e == cudaSuccess) {
      Task done = std::move(t);
      pending.pop_front();
      try {
        if (done.finish) done.finish();
        done.work.complete();
      } catch (const std::exception&) {
        done.work.fail(std::current_exception());
      }
      release(done);
      continue;
    }
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      std::string msg = what + " failed on rank " + std::to_string(rank_) + ": CUDA error " + cudaGetErrorString(e);
      fatal(t, std::make_exception_ptr(Error(msg)), msg, pending);
      return;
    }
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
      std::string msg = what + " failed on rank " + std::to_string(rank_) + ": NCCL reported " +
                        ncclGetErrorString(state) +
                        (state == ncclRemoteError ? " (a peer failed or its process died)" : "");
      auto error = state == ncclRemoteError ? std::make_exception_ptr(DisconnectedError(msg))
                                            : std::make_exception_ptr(Error(msg));
      fatal(t, error, msg, pending);
      return;
    }
    if (Clock::now() >= t.deadline) {
      std::string msg = what + " timed out on rank " + std::to_string(rank_) + " after " +
                        std::to_string(options_.timeout.count()) +
                        " ms (a rank did not call it, or called a different op); the NCCL communicator was aborted";
      fatal(t, std::make_exception_ptr(TimeoutError(msg)), msg, pending);
    }
    return;  // the front has not completed: neither have the ops launched after it
  }
}

void ProcessGroupNccl::Impl::fatal(Task& first, std::exception_ptr error, const std::string& msg,
                                   std::deque<Task>& pending) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.empty()) broken_ = msg;
  }
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  first.work.fail(std::move(error));
  release(first);
  for (Task& t : pending) {
    if (t.work.isCompleted()) continue;  // `first` itself
    t.work.fail(std::make_exception_ptr(
        StateError(t.work.description() + ": aborted after an earlier failure: " + msg)));
    release(t);
  }
  pending.clear();
}

// ==== ProcessGroupNccl ===========================================================================

std::unique_ptr<ProcessGroup> createNcclGroup(rpc::StoreClient& store, int rank, int size, NcclOptions options) {
  return ProcessGroupNccl::create(store, rank, size, std::move(options));
}

std::unique_ptr<ProcessGroupNccl> ProcessGroupNccl::create(rpc::StoreClient& store, int rank, int size,
                                                           Options options) {
  return std::make_unique<ProcessGroupNccl>(store, rank, size, std::move(options));
}

ProcessGroupNccl::ProcessGroupNccl(rpc::StoreClient& store, int rank, int size, Options options)
    : ProcessGroup(rank, size) {
  checkGroupName("ProcessGroupNccl", options.name);
  std::string name = options.name;
  impl_ = std::make_unique<Impl>(store, rank, size, std::move(options), std::move(name));
}

ProcessGroupNccl::ProcessGroupNccl(std::unique_ptr<Impl> impl, int rank, int size)
    : ProcessGroup(rank, size), impl_(std::move(impl)) {}

ProcessGroupNccl::~ProcessGroupNccl() = default;

const std::string& ProcessGroupNccl::name() const { return impl_->name_; }
const ProcessGroupNccl::Options& ProcessGroupNccl::options() const { return impl_->options_; }
int ProcessGroupNccl::device() const { return impl_->device_; }

void ProcessGroupNccl::checkTensor(const Tensor& t, const char* op, const std::string& what) const {
  const int device = impl_->device_;
  WEFT_ENFORCE(t.defined(), InvalidArgumentError, op, ": ", what, " is an undefined tensor");
  WEFT_ENFORCE(t.device().isCuda(), InvalidArgumentError, op, ": ", what,
               " must be a CUDA tensor for the nccl backend (use the gloo backend for CPU tensors), got one on ",
               t.device().str(), " of shape ", shapeString(t.shape()));
  WEFT_ENFORCE(t.device().index == device, InvalidArgumentError, op, ": ", what, " is on ", t.device().str(),
               " but this rank's nccl group uses cuda:", device);
  WEFT_ENFORCE(t.isContiguous(), InvalidArgumentError, op, ": ", what, " must be contiguous, got shape ",
               shapeString(t.shape()), " with strides ", shapeString(t.strides()));
}

Work ProcessGroupNccl::broadcast(const Tensor& tensor, int root) {
  checkTensor(tensor, "broadcast", "tensor");
  checkRoot(root, "broadcast");
  return impl_->submit("broadcast", true, {tensor}, [tensor, root](ncclComm_t comm, cudaStream_t s) {
    if (tensor.numel() == 0) return;
    ncclEnforce(ncclBroadcast(tensor.rawData(), tensor.rawData(), static_cast<size_t>(tensor.numel()),
                              ncclTypeOf(tensor.dtype()), root, comm, s),
                "ncclBroadcast");
  });
}

Work ProcessGroupNccl::allReduce(const Tensor& tensor, ReduceOp op) {
  checkTensor(tensor, "allReduce", "tensor");
  checkReducible(tensor.dtype(), op, "allReduce");
  Impl::FinishFn finish;
  if (!kNcclHasAvg && op == ReduceOp::Avg) {
    finish = [tensor, n = size_] { divideOnHost(tensor.rawData(), tensor.dtype(), static_cast<size_t>(tensor.numel()), n); };
  }
  return impl_->submit(
      "allReduce", true, {tensor},
      [tensor, op](ncclComm_t comm, cudaStream_t s) {
        if (tensor.numel() == 0) return;
        ncclEnforce(ncclAllReduce(tensor.rawData(), tensor.rawData(), static_cast<size_t>(tensor.numel()),
                                  ncclTypeOf(tensor.dtype()), ncclOpOf(op), comm, s),
                    "ncclAllReduce");
      },
      std::move(finish));
}

Work ProcessGroupNccl::reduce(const Tensor& tensor, int root, ReduceOp op) {
  checkTensor(tensor, "reduce", "tensor");
  checkRoot(root, "reduce");
  checkReducible(tensor.dtype(), op, "reduce");
  Impl::FinishFn finish;
  if (!kNcclHasAvg && op == ReduceOp::Avg && rank_ == root) {
    finish = [tensor, n = size_] { divideOnHost(tensor.rawData(), tensor.dtype(), static_cast<size_t>(tensor.numel()), n); };
  }
  return impl_->submit(
      "reduce", true, {tensor},
      [tensor, op, root](ncclComm_t comm, cudaStream_t s) {
        if (tensor.numel() == 0) return;
        ncclEnforce(ncclReduce(tensor.rawData(), tensor.rawData(), static_cast<size_t>(tensor.numel()),
                               ncclTypeOf(tensor.dtype()), ncclOpOf(op), root, comm, s),
                    "ncclReduce");
      },
      std::move(finish));
}

Work ProcessGroupNccl::allGather(std::vector<Tensor>& outputs, const Tensor& input) {
  checkTensor(input, "allGather", "input");
  prepareOutputs(outputs, input, "allGather");
  Tensor flat = empty({static_cast<int64_t>(size_) * input.numel()}, {.dtype = input.dtype(), .device = input.device()});
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  keep.push_back(flat);
  return impl_->submit("allGather", true, std::move(keep),
                       [input, flat, outs = outputs](ncclComm_t comm, cudaStream_t s) {
                         const size_t nbytes = input.nbytes();
                         if (nbytes == 0) return;
                         ncclEnforce(ncclAllGather(input.rawData(), flat.rawData(), static_cast<size_t>(input.numel()),
                                                   ncclTypeOf(input.dtype()), comm, s),
                                     "ncclAllGather");
                         for (size_t i = 0; i < outs.size(); ++i) copyAsync(outs[i].rawData(), bytesOf(flat) + i * nbytes, nbytes, s);
                       });
}

Work ProcessGroupNccl::allGatherInto(const Tensor& output, const Tensor& input) {
  checkTensor(input, "allGatherInto", "input");
  checkTensor(output, "allGatherInto", "output");
  WEFT_ENFORCE(output.dtype() == input.dtype() && output.numel() == input.numel() * size_, InvalidArgumentError,
               "allGatherInto: output (", dtypeName(output.dtype()), ", shape ", shapeString(output.shape()),
               ") must hold ", size_, " x ", input.numel(), " elements of ", dtypeName(input.dtype()),
               " (input shape ", shapeString(input.shape()), ")");
  return impl_->submit("allGatherInto", true, {output, input}, [input, output](ncclComm_t comm, cudaStream_t s) {
    if (input.numel() == 0) return;
    ncclEnforce(ncclAllGather(input.rawData(), output.rawData(), static_cast<size_t>(input.numel()),
                              ncclTypeOf(input.dtype()), comm, s),
                "ncclAllGather");
  });
}

Work ProcessGroupNccl::gather(std::vector<Tensor>& outputs, const Tensor& input, int root) {
  checkTensor(input, "gather", "input");
  checkRoot(root, "gather");
  if (rank_ == root) {
    prepareOutputs(outputs, input, "gather");
  } else {
    WEFT_ENFORCE(outputs.empty(), InvalidArgumentError, "gather: only the root (rank ", root,
                 ") passes outputs; rank ", rank_, " passed ", outputs.size());
  }
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  const int me = rank_;
  return impl_->submit("gather", true, std::move(keep),
                       [input, outs = outputs, root, me](ncclComm_t comm, cudaStream_t s) {
                         const size_t nbytes = input.nbytes();
                         if (nbytes == 0) return;
                         if (me == root) copyAsync(outs[static_cast<size_t>(me)].rawData(), input.rawData(), nbytes, s);
                         ncclEnforce(ncclGroupStart(), "ncclGroupStart");
                         if (me == root) {
                           for (size_t r = 0; r < outs.size(); ++r) {
                             if (static_cast<int>(r) == me) continue;
                             ncclEnforce(ncclRecv(outs[r].rawData(), nbytes, ncclInt8, static_cast<int>(r), comm, s),
                                         "ncclRecv");
                           }
                         } else {
                           ncclEnforce(ncclSend(input.rawData(), nbytes, ncclInt8, root, comm, s), "ncclSend");
                         }
                         ncclEnforce(ncclGroupEnd(), "ncclGroupEnd");
                       });
}

Work ProcessGroupNccl::scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) {
  checkTensor(output, "scatter", "output");
  checkRoot(root, "scatter");
  if (rank_ == root) {
    WEFT_ENFORCE(inputs.size() == static_cast<size_t>(size_), InvalidArgumentError, "scatter: the root passes ", size_,
                 " inputs (one per rank), got ", inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkLike(inputs[i], output, "scatter", "inputs[" + std::to_string(i) + "]", "the output");
    }
  } else {
    WEFT_ENFORCE(inputs.empty(), InvalidArgumentError, "scatter: only the root (rank ", root,
                 ") passes inputs; rank ", rank_, " passed ", inputs.size());
  }
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  const int me = rank_;
  return impl_->submit("scatter", true, std::move(keep), [output, inputs, root, me](ncclComm_t comm, cudaStream_t s) {
    const size_t nbytes = output.nbytes();
    if (nbytes == 0) return;
    if (me == root) copyAsync(output.rawData(), inputs[static_cast<size_t>(me)].rawData(), nbytes, s);
    ncclEnforce(ncclGroupStart(), "ncclGroupStart");
    if (me == root) {
      for (size_t r = 0; r < inputs.size(); ++r) {
        if (static_cast<int>(r) == me) continue;
        ncclEnforce(ncclSend(inputs[r].rawData(), nbytes, ncclInt8, static_cast<int>(r), comm, s), "ncclSend");
      }
    } else {
      ncclEnforce(ncclRecv(output.rawData(), nbytes, ncclInt8, root, comm, s), "ncclRecv");
    }
    ncclEnforce(ncclGroupEnd(), "ncclGroupEnd");
  });
}

Work ProcessGroupNccl::reduceScatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  checkTensor(output, "reduceScatter", "output");
  checkReducible(output.dtype(), op, "reduceScatter");
  WEFT_ENFORCE(inputs.size() == static_cast<size_t>(size_), InvalidArgumentError, "reduceScatter: expected ", size_,
               " inputs (one per rank), got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkLike(inputs[i], output, "reduceScatter", "inputs[" + std::to_string(i) + "]", "the output");
  }
  Tensor flat = empty({static_cast<int64_t>(size_) * output.numel()}, {.dtype = output.dtype(), .device = output.device()});
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  keep.push_back(flat);
  Impl::FinishFn finish;
  if (!kNcclHasAvg && op == ReduceOp::Avg) {
    finish = [output, n = size_] { divideOnHost(output.rawData(), output.dtype(), static_cast<size_t>(output.numel()), n); };
  }
  return impl_->submit(
      "reduceScatter", true, std::move(keep),
      [output, inputs, flat, op](ncclComm_t comm, cudaStream_t s) {
        const size_t nbytes = output.nbytes();
        if (nbytes == 0) return;
        for (size_t i = 0; i < inputs.size(); ++i) copyAsync(bytesOf(flat) + i * nbytes, inputs[i].rawData(), nbytes, s);
        ncclEnforce(ncclReduceScatter(flat.rawData(), output.rawData(), static_cast<size_t>(output.numel()),
                                      ncclTypeOf(output.dtype()), ncclOpOf(op), comm, s),
                    "ncclReduceScatter");
      },
      std::move(finish));
}

Work ProcessGroupNccl::allToAll(const Tensor& output, const Tensor& input) {
  checkTensor(input, "allToAll", "input");
  checkLike(output, input, "allToAll", "output", "the input");
  WEFT_ENFORCE(input.dim() >= 1 && input.size(0) % size_ == 0, InvalidArgumentError,
               "allToAll: dim 0 of the input (shape ", shapeString(input.shape()), ") must split into ", size_,
               " equal chunks");
  const int me = rank_;
  const int n = size_;
  return impl_->submit("allToAll", true, {output, input}, [input, output, me, n](ncclComm_t comm, cudaStream_t s) {
    const size_t chunk = input.nbytes() / static_cast<size_t>(n);
    if (chunk == 0) return;
    copyAsync(bytesOf(output) + static_cast<size_t>(me) * chunk, bytesOf(input) + static_cast<size_t>(me) * chunk,
              chunk, s);
    ncclEnforce(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const size_t at = static_cast<size_t>(r) * chunk;
      ncclEnforce(ncclSend(bytesOf(input) + at, chunk, ncclInt8, r, comm, s), "ncclSend");
      ncclEnforce(ncclRecv(bytesOf(output) + at, chunk, ncclInt8, r, comm, s), "ncclRecv");
    }
    ncclEnforce(ncclGroupEnd(), "ncclGroupEnd");
  });
}

Work ProcessGroupNccl::barrier() {
  void* buffer = impl_->barrierBuffer_;
  return impl_->submit("barrier", true, {}, [buffer](ncclComm_t comm, cudaStream_t s) {
    ncclEnforce(ncclAllReduce(buffer, buffer, 1, ncclFloat32, ncclSum, comm, s), "ncclAllReduce (barrier)");
  });
}

Work ProcessGroupNccl::isend(const Tensor& tensor, int dst, uint32_t tag) {
  checkTensor(tensor, "isend", "tensor");
  checkTag(tag, "isend");
  checkPeer(dst, "isend", "destination");
  return impl_->submit("send to rank " + std::to_string(dst), false, {tensor},
                       [tensor, dst](ncclComm_t comm, cudaStream_t s) {
                         if (tensor.nbytes() == 0) return;
                         ncclEnforce(ncclSend(tensor.rawData(), tensor.nbytes(), ncclInt8, dst, comm, s), "ncclSend");
                       });
}

Work ProcessGroupNccl::irecv(const Tensor& tensor, int src, uint32_t tag) {
  checkTensor(tensor, "irecv", "tensor");
  checkTag(tag, "irecv");
  checkPeer(src, "irecv", "source");
  Work w = impl_->submit("recv from rank " + std::to_string(src), false, {tensor},
                         [tensor, src](ncclComm_t comm, cudaStream_t s) {
                           if (tensor.nbytes() == 0) return;
                           ncclEnforce(ncclRecv(tensor.rawData(), tensor.nbytes(), ncclInt8, src, comm, s), "ncclRecv");
                         });
  w.setSourceRank(src);
  return w;
}

Work ProcessGroupNccl::irecvFrom(const Tensor& tensor, const std::vector<int>& srcs, uint32_t tag) {
  checkTensor(tensor, "irecvFrom", "tensor");
  WEFT_ENFORCE(!srcs.empty(), InvalidArgumentError, "irecvFrom: the list of source ranks is empty");
  WEFT_ENFORCE(srcs.size() == 1, InvalidArgumentError, "irecvFrom: the nccl backend cannot receive from any of ",
               rankList(srcs), " (NCCL has no any-source receive); name one source rank, or use the gloo backend");
  return irecv(tensor, srcs[0], tag);
}

std::unique_ptr<ProcessGroup> ProcessGroupNccl::newGroup(const std::vector<int>& ranks) {
  const int index = agreeOnSubgroup(impl_->store_, impl_->prefix_, impl_->options_.timeout, ranks);
  const int newRank = rankIn(ranks);
  if (newRank < 0) return nullptr;
  std::string subName = subgroupName(impl_->name_, index, ranks);
  Options subOptions = impl_->options_;
  subOptions.device = impl_->device_;
  const int subSize = static_cast<int>(ranks.size());
  auto impl = std::make_unique<Impl>(impl_->store_, newRank, subSize, std::move(subOptions), std::move(subName));
  return std::unique_ptr<ProcessGroup>(new ProcessGroupNccl(std::move(impl), newRank, subSize));
}

}  // namespace weft::collectives
