#include "collectives/process_group.h"

#include <algorithm>

#include "common/error.h"
#include "common/future.h"
#include "rpc/store.h"

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

std::string rankList(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s + "]";
}

void ProcessGroup::checkLike(const Tensor& t, const Tensor& ref, const char* op, const std::string& what,
                             const std::string& refWhat) const {
  checkTensor(t, op, what);
  WEFT_ENFORCE(t.dtype() == ref.dtype() && t.shape() == ref.shape(), InvalidArgumentError, op, ": ", what, " (",
               dtypeName(t.dtype()), ", shape ", shapeString(t.shape()), ") must have the dtype and shape of ",
               refWhat, " (", dtypeName(ref.dtype()), ", shape ", shapeString(ref.shape()), ")");
}

void ProcessGroup::prepareOutputs(std::vector<Tensor>& outputs, const Tensor& input, const char* op) const {
  if (outputs.empty()) outputs.resize(static_cast<size_t>(size_));
  WEFT_ENFORCE(outputs.size() == static_cast<size_t>(size_), InvalidArgumentError, op, ": expected ", size_,
               " output tensors (one per rank), got ", outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) outputs[i] = empty(input.shape(), {.dtype = input.dtype(), .device = input.device()});
    checkLike(outputs[i], input, op, "outputs[" + std::to_string(i) + "]", "the input");
  }
}

std::exception_ptr ProcessGroup::destroyedBefore(const Work& work, const char* notStarted) {
  return std::make_exception_ptr(
      StateError(work.description() + ": the process group was destroyed before " + notStarted));
}

void ProcessGroup::checkRoot(int root, const char* op) const {
  WEFT_ENFORCE(root >= 0 && root < size_, InvalidArgumentError, op, ": root ", root,
               " is not a rank of a group of size ", size_);
}

void ProcessGroup::checkPeer(int peer, const char* op, const char* role) const {
  WEFT_ENFORCE(peer >= 0 && peer < size_, InvalidArgumentError, op, ": ", role, " rank ", peer,
               " is not a rank of a group of size ", size_);
  WEFT_ENFORCE(peer != rank_, InvalidArgumentError, op, ": rank ", rank_, " cannot ", op, " to or from itself");
}

void ProcessGroup::checkSubgroupRanks(const std::vector<int>& ranks) const {
  WEFT_ENFORCE(!ranks.empty(), InvalidArgumentError, "newGroup: the list of ranks is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  WEFT_ENFORCE(sorted.front() >= 0 && sorted.back() < size_, InvalidArgumentError, "newGroup: ranks ",
               rankList(ranks), " are not all ranks of group '", name(), "' of size ", size_);
  WEFT_ENFORCE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), InvalidArgumentError,
               "newGroup: ranks ", rankList(ranks), " name a rank twice");
}

int ProcessGroup::agreeOnSubgroup(rpc::StoreClient& store, const std::string& prefix,
                                  std::chrono::milliseconds timeout, const std::vector<int>& ranks) {
  const int index = nextSubgroup_.fetch_add(1);
  const std::string what = "newGroup #" + std::to_string(index) + " on group '" + name() + "'";
  const std::string keys = prefix + "newGroup/" + std::to_string(index) + "/";
  const std::string mine = rankList(ranks);
  // Posted before the local check, so that the others learn of a bad list
  // too instead of waiting for this rank.
  store.set(keys + std::to_string(rank_), mine);
  checkSubgroupRanks(ranks);
  std::vector<std::pair<int, Future<std::string>>> theirs;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) theirs.emplace_back(r, store.getAsync(keys + std::to_string(r), timeout));
  }
  std::vector<std::string> lists(static_cast<size_t>(size_));
  lists[static_cast<size_t>(rank_)] = mine;
  std::vector<int> missing;
  std::exception_ptr storeError;
  for (auto& [r, f] : theirs) {
    f.wait();
    if (!f.hasError()) {
      lists[static_cast<size_t>(r)] = f.get();
      continue;
    }
    try {
      f.get();
    } catch (const TimeoutError&) {
      missing.push_back(r);
    } catch (const std::exception&) {
      if (!storeError) storeError = std::current_exception();
    }
  }
  if (storeError) {
    try {
      std::rethrow_exception(storeError);
    } catch (const std::exception& e) {
      throw DisconnectedError(what + ": the store failed while the ranks compared their lists: " + e.what());
    }
  }
  WEFT_ENFORCE(missing.empty(), TimeoutError, what, ": ranks ", rankList(missing), " did not call it within ",
               timeout.count(), " ms (every rank of the group calls newGroup, in the same order)");
  if (std::all_of(lists.begin(), lists.end(), [&](const std::string& l) { return l == mine; })) return index;
  std::string msg = what + ": the ranks passed different rank lists:";
  for (int r = 0; r < size_; ++r) msg += "\n  rank " + std::to_string(r) + " passed " + lists[static_cast<size_t>(r)];
  throw InvalidArgumentError(msg);
}

int ProcessGroup::rankIn(const std::vector<int>& ranks) const {
  auto at = std::find(ranks.begin(), ranks.end(), rank_);
  return at == ranks.end() ? -1 : static_cast<int>(at - ranks.begin());
}

std::string ProcessGroup::subgroupName(const std::string& parent, int index, const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(ranks[i]);
  }
  return parent + "/sub" + std::to_string(index) + "[" + text + "]";
}

void ProcessGroup::checkGroupName(const char* backend, const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
                c == '-');
  }
  WEFT_ENFORCE(ok, InvalidArgumentError, backend, ": group name '", name,
               "' must be 1 to 64 characters from [A-Za-z0-9_.-]");
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
