// ProcessGroupNccl, the class behind createNcclGroup (nccl/process_group_nccl.h
// describes its behaviour). Internal to weft: tests reach the group's device
// through it; programs use createNcclGroup and ProcessGroup.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/nccl/process_group_nccl.h"
#include "collectives/process_group.h"
#include "rpc/store.h"

namespace weft::collectives {

class ProcessGroupNccl final : public ProcessGroup {
 public:
  using Options = NcclOptions;

  static std::unique_ptr<ProcessGroupNccl> create(rpc::StoreClient& store, int rank, int size, Options options);
  static std::unique_ptr<ProcessGroupNccl> create(rpc::StoreClient& store, int rank, int size) {
    return create(store, rank, size, Options{});
  }

  // See "Rendezvous". `store` must outlive the group. InvalidArgumentError for
  // a bad rank, size or option; Error when no CUDA device is visible.
  ProcessGroupNccl(rpc::StoreClient& store, int rank, int size, Options options);
  ~ProcessGroupNccl() override;

  std::string backendName() const override { return "nccl"; }
  const std::string& name() const override;
  const Options& options() const;
  std::chrono::milliseconds timeout() const override { return options().timeout; }
  // The CUDA device this rank's tensors live on.
  int device() const;

  Work broadcast(const Tensor& tensor, int root) override;
  Work allReduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  Work reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::Sum) override;
  Work allGather(std::vector<Tensor>& outputs, const Tensor& input) override;
  Work allGatherInto(const Tensor& output, const Tensor& input) override;
  Work gather(std::vector<Tensor>& outputs, const Tensor& input, int root) override;
  Work scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) override;
  Work reduceScatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op = ReduceOp::Sum) override;
  Work allToAll(const Tensor& output, const Tensor& input) override;
  Work barrier() override;

  // tag must be 0 (see "Point to point").
  Work isend(const Tensor& tensor, int dst, uint32_t tag = 0) override;
  Work irecv(const Tensor& tensor, int src, uint32_t tag = 0) override;
  // Exactly one source (see "Point to point").
  Work irecvFrom(const Tensor& tensor, const std::vector<int>& srcs, uint32_t tag = 0) override;

  std::unique_ptr<ProcessGroup> newGroup(const std::vector<int>& ranks) override;

  class Impl;

 protected:
  // A contiguous CUDA tensor on device().
  void checkTensor(const Tensor& t, const char* op, const std::string& what) const override;

 private:
  ProcessGroupNccl(std::unique_ptr<Impl> impl, int rank, int size);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::collectives
