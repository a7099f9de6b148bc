#include "collectives/process_group.h"

#include "common/error.h"

namespace weft::collectives {

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Product: return "product";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "unknown";
}

ProcessGroup::ProcessGroup(int rank, int size) : rank_(rank), size_(size) {
  WEFT_ENFORCE(size >= 1 && rank >= 0 && rank < size, InvalidArgumentError, "ProcessGroup: rank ", rank,
               " is not in a group of size ", size);
}

ProcessGroup::~ProcessGroup() = default;

Work ProcessGroup::irecvAny(const Tensor& tensor, uint32_t tag) {
  std::vector<int> others;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) others.push_back(r);
  }
  WEFT_ENFORCE(!others.empty(), InvalidArgumentError, "irecvAny: a group of one has no other rank to receive from");
  return irecvFrom(tensor, others, tag);
}

void ProcessGroup::send(const Tensor& tensor, int dst, uint32_t tag) { isend(tensor, dst, tag).wait(); }

void ProcessGroup::recv(const Tensor& tensor, int src, uint32_t tag) { irecv(tensor, src, tag).wait(); }

int ProcessGroup::recvAny(const Tensor& tensor, uint32_t tag) {
  Work w = irecvAny(tensor, tag);
  w.wait();
  return w.sourceRank();
}

}  // namespace weft::collectives
