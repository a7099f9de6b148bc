#include "collectives/gloo/detail/call_check.h"
#include "collectives/gloo/detail/traffic.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "collectives/gloo/process_group_gloo.h"
#include "collectives/process_group.h"
#include "common/dtype.h"
#include "common/error.h"

namespace weft::collectives::detail {

namespace {

constexpr int64_t kHeaderMagic = 0x7765667470670003;  // "weftpg" + version 3 (the algorithm and split in words 8, 9)

std::array<int64_t, kHeaderWords> encode(const CallHeader& h, size_t dataBytes) {
  return {kHeaderMagic, static_cast<int64_t>(h.op), h.seq, h.dtype, h.numel, h.root, h.reduceOp,
          static_cast<int64_t>(dataBytes), h.algorithm, h.split};
}

// False when `w` is not a call header of this version (or claims more data than a message holds).
bool decode(const int64_t* w, size_t maxData, CallHeader& h, size_t& dataBytes) {
  if (w[0] != kHeaderMagic || w[7] < 0 || static_cast<size_t>(w[7]) > maxData) return false;
  h.op = static_cast<OpCode>(w[1]);
  h.seq = w[2];
  h.dtype = w[3];
  h.numel = w[4];
  h.root = w[5];
  h.reduceOp = w[6];
  h.algorithm = w[8];
  h.split = w[9];
  dataBytes = static_cast<size_t>(w[7]);
  return true;
}

}  // namespace

std::chrono::milliseconds timeoutUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

const char* opName(OpCode op) {
  switch (op) {
    case OpCode::Broadcast: return "broadcast";
    case OpCode::AllReduce: return "allReduce";
    case OpCode::Reduce: return "reduce";
    case OpCode::AllGather: return "allGather";
    case OpCode::Gather: return "gather";
    case OpCode::Scatter: return "scatter";
    case OpCode::ReduceScatter: return "reduceScatter";
    case OpCode::AllToAll: return "allToAll";
    case OpCode::Barrier: return "barrier";
  }
  return "unknown collective";
}

std::string CallHeader::describe() const {
  std::ostringstream os;
  os << opName(op) << " #" << seq << "(";
  const char* sep = "";
  if (dtype >= 0) {
    os << dtypeName(static_cast<DType>(dtype));
    sep = ", ";
  }
  if (numel >= 0) {
    os << sep << numel << " elements";
    sep = ", ";
  }
  if (root >= 0) {
    os << sep << "root " << root;
    sep = ", ";
  }
  if (reduceOp >= 0) {
    os << sep << "op " << reduceOpName(static_cast<ReduceOp>(reduceOp));
    sep = ", ";
  }
  if (algorithm >= 0) {
    os << sep << "algorithm " << allreduceAlgorithmName(static_cast<AllreduceAlgorithm>(algorithm));
    sep = ", ";
  }
  if (split >= 0) os << sep << "shard sizes #" << std::hex << split << std::dec;
  os << ")";
  return os.str();
}

CallExchange::CallExchange(const std::shared_ptr<gloo::Context>& context, int rank, int size, size_t maxData)
    : context_(context),
      rank_(rank),
      size_(size),
      maxData_(maxData),
      capacity_(kHeaderBytes + maxData),
      headers_(static_cast<size_t>(size)),
      valid_(static_cast<size_t>(size), false),
      dataBytes_(static_cast<size_t>(size), 0) {
  for (size_t set = 0; set < 2; ++set) {
    recv_[set].resize(capacity_ * static_cast<size_t>(size));
    recvBuffers_[set].resize(static_cast<size_t>(size));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      recvBuffers_[set][static_cast<size_t>(r)] =
          context->createUnboundBuffer(recv_[set].data() + capacity_ * static_cast<size_t>(r), capacity_);
    }
  }
}

CallExchange::~CallExchange() = default;

std::unique_ptr<CallExchange::Staging> CallExchange::takeStaging(size_t size) {
  {
    std::lock_guard<std::mutex> lock(poolMutex_);
    auto& pool = size == kHeaderBytes ? headerPool_ : fullPool_;
    if (!pool.empty()) {
      std::unique_ptr<Staging> staging = std::move(pool.back());
      pool.pop_back();
      return staging;
    }
  }
  auto staging = std::make_unique<Staging>();
  staging->bytes.resize(size);
  staging->buffer = context_->createUnboundBuffer(staging->bytes.data(), staging->bytes.size());
  return staging;
}

std::unique_ptr<CallExchange::Outgoing> CallExchange::post(const CallHeader& mine, bool withData) {
  auto out = std::make_unique<Outgoing>();
  out->run = posted_++;
  out->header = mine;
  if (!withData) {
    out->staging = takeStaging(kHeaderBytes);
    sendToPeers(*out, 0);
  }
  return out;
}

void CallExchange::send(Outgoing& out, const void* data, size_t bytes) {
  WEFT_CHECK(bytes <= maxData_ && !out.staging) << bytes << " bytes of data with a call header, at most " << maxData_;
  out.staging = takeStaging(capacity_);
  if (bytes > 0) std::memcpy(out.staging->bytes.data() + kHeaderBytes, data, bytes);
  sendToPeers(out, bytes);
}

void CallExchange::sendToPeers(Outgoing& out, size_t bytes) {
  const auto words = encode(out.header, bytes);
  std::memcpy(out.staging->bytes.data(), words.data(), kHeaderBytes);
  try {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      out.staging->buffer->send(r, kExchangeSlotBase + out.run, 0, kHeaderBytes + bytes);
      ++out.sends;
    }
  } catch (const std::exception&) {
    out.postError = std::current_exception();
  }
}

void CallExchange::postReceives(uint64_t run) {
  auto& buffers = recvBuffers_[run % 2];
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) buffers[static_cast<size_t>(r)]->recv(r, kExchangeSlotBase + run, 0, capacity_);
  }
  receivedUpTo_ = run + 1;
}

void CallExchange::finish(std::unique_ptr<Outgoing> out, Deadline deadline) {
  const uint64_t run = out->run;
  try {
    WEFT_CHECK(out->staging) << "run " << run << " finished before its message was sent";
    if (out->postError) std::rethrow_exception(out->postError);
    if (receivedUpTo_ <= run) postReceives(run);
    auto& buffers = recvBuffers_[run % 2];
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      // Nothing aborts these waits (only the group's point-to-point waits are aborted).
      WEFT_CHECK(buffers[static_cast<size_t>(r)]->waitRecv(nullptr, timeoutUntil(deadline)))
          << "call header receive from rank " << r << " aborted";
    }
    for (int i = 0; i < out->sends; ++i) {
      WEFT_CHECK(out->staging->buffer->waitSend(nullptr, timeoutUntil(deadline))) << "call header send aborted";
    }
  } catch (const std::exception&) {
    retire(std::move(out));
    throw;
  }
  if (current_) {
    std::lock_guard<std::mutex> lock(poolMutex_);
    (current_->staging->bytes.size() == kHeaderBytes ? headerPool_ : fullPool_).push_back(std::move(current_->staging));
  }
  current_ = std::move(out);
  for (int r = 0; r < size_; ++r) {
    std::array<int64_t, kHeaderWords> w;
    std::memcpy(w.data(), messageOf(r), kHeaderBytes);
    const size_t i = static_cast<size_t>(r);
    valid_[i] = decode(w.data(), maxData_, headers_[i], dataBytes_[i]);
    if (!valid_[i]) dataBytes_[i] = 0;
    // Posted with room for the most data; this is what came.
    if (r != rank_) countReceivedAs(*recvBuffers_[run % 2][i], kHeaderBytes + dataBytes_[i]);
  }
  // The next run's receives, into the other area; a connection lost
  // meanwhile shows at that run, which posts them again.
  try {
    postReceives(run + 1);
  } catch (const std::exception&) {
    receivedUpTo_ = run + 1;
  }
}

void CallExchange::abandon(std::unique_ptr<Outgoing> out) { retire(std::move(out)); }

void CallExchange::retire(std::unique_ptr<Outgoing> out) {
  std::lock_guard<std::mutex> lock(poolMutex_);
  retired_.push_back(std::move(out));
}

const uint8_t* CallExchange::messageOf(int r) const {
  return r == rank_ ? current_->staging->bytes.data()
                    : recv_[current_->run % 2].data() + capacity_ * static_cast<size_t>(r);
}

const CallHeader* CallExchange::headerOf(int r) const {
  return valid_[static_cast<size_t>(r)] ? &headers_[static_cast<size_t>(r)] : nullptr;
}

const uint8_t* CallExchange::dataOf(int r) const { return messageOf(r) + kHeaderBytes; }

size_t CallExchange::dataBytesOf(int r) const { return dataBytes_[static_cast<size_t>(r)]; }

}  // namespace weft::collectives::detail
