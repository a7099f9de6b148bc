#include "collectives/gloo_call_check.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "collectives/process_group.h"
#include "common/dtype.h"
#include "common/error.h"

namespace weft::collectives::gloo_detail {

namespace {

constexpr int64_t kHeaderMagic = 0x7765667470670002;  // "weftpg" + version 2 (the data length in word 7)

std::array<int64_t, kHeaderWords> encode(const CallHeader& h, size_t dataBytes) {
  return {kHeaderMagic, static_cast<int64_t>(h.op), h.seq, h.dtype, h.numel, h.root, h.reduceOp,
          static_cast<int64_t>(dataBytes)};
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
  if (reduceOp >= 0) os << sep << "op " << reduceOpName(static_cast<ReduceOp>(reduceOp));
  os << ")";
  return os.str();
}

CallExchange::CallExchange(const std::shared_ptr<gloo::Context>& context, int rank, int size, size_t maxData)
    : rank_(rank),
      size_(size),
      maxData_(maxData),
      capacity_(kHeaderBytes + maxData),
      send_(capacity_),
      headers_(static_cast<size_t>(size)),
      valid_(static_cast<size_t>(size), false),
      dataBytes_(static_cast<size_t>(size), 0) {
  sendBuffer_ = context->createUnboundBuffer(send_.data(), send_.size());
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

void CallExchange::postReceives(uint64_t run) {
  auto& buffers = recvBuffers_[run % 2];
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) buffers[static_cast<size_t>(r)]->recv(r, kExchangeSlotBase + run, 0, capacity_);
  }
  postedUpTo_ = run + 1;
}

void CallExchange::run(const CallHeader& mine, const void* data, size_t bytes, Deadline deadline) {
  WEFT_CHECK(bytes <= maxData_) << bytes << " bytes of data with a call header, at most " << maxData_;
  const uint64_t run = runs_++;
  const auto words = encode(mine, bytes);
  std::memcpy(send_.data(), words.data(), kHeaderBytes);
  if (bytes > 0) std::memcpy(send_.data() + kHeaderBytes, data, bytes);
  if (postedUpTo_ <= run) postReceives(run);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) sendBuffer_->send(r, kExchangeSlotBase + run, 0, kHeaderBytes + bytes);
  }
  auto& buffers = recvBuffers_[run % 2];
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    // Nothing aborts these waits (only the group's point-to-point waits are aborted).
    WEFT_CHECK(buffers[static_cast<size_t>(r)]->waitRecv(nullptr, timeoutUntil(deadline)))
        << "call header receive from rank " << r << " aborted";
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    WEFT_CHECK(sendBuffer_->waitSend(nullptr, timeoutUntil(deadline))) << "call header send aborted";
  }
  for (int r = 0; r < size_; ++r) {
    std::array<int64_t, kHeaderWords> w;
    std::memcpy(w.data(), messageOf(r), kHeaderBytes);
    const size_t i = static_cast<size_t>(r);
    valid_[i] = decode(w.data(), maxData_, headers_[i], dataBytes_[i]);
    if (!valid_[i]) dataBytes_[i] = 0;
  }
  // The next run's receives, into the other area; a connection lost
  // meanwhile shows at that run, which posts them again.
  try {
    postReceives(run + 1);
  } catch (const std::exception&) {
    postedUpTo_ = run + 1;
  }
}

const uint8_t* CallExchange::messageOf(int r) const {
  return r == rank_ ? send_.data() : recv_[(runs_ - 1) % 2].data() + capacity_ * static_cast<size_t>(r);
}

const CallHeader* CallExchange::headerOf(int r) const {
  return valid_[static_cast<size_t>(r)] ? &headers_[static_cast<size_t>(r)] : nullptr;
}

const uint8_t* CallExchange::dataOf(int r) const { return messageOf(r) + kHeaderBytes; }

size_t CallExchange::dataBytesOf(int r) const { return dataBytes_[static_cast<size_t>(r)]; }

}  // namespace weft::collectives::gloo_detail
