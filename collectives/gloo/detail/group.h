// ProcessGroupGloo, the class behind createGlooGroup (gloo/process_group_gloo.h
// describes its behaviour). Internal to weft: collectives::init holds on to
// what the group must keep alive (keepAlive), and tests read the counters of
// the call exchange; programs use createGlooGroup and ProcessGroup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/gloo/process_group_gloo.h"
#include "collectives/process_group.h"
#include "rpc/store.h"

namespace weft::collectives {

class ProcessGroupGloo final : public ProcessGroup {
 public:
  using Options = GlooOptions;

  // The constructor, returning the group as a unique_ptr.
  static std::unique_ptr<ProcessGroupGloo> create(rpc::StoreClient& store, int rank, int size, Options options);
  static std::unique_ptr<ProcessGroupGloo> create(rpc::StoreClient& store, int rank, int size) {
    return create(store, rank, size, Options{});
  }

  // See "Rendezvous". `store` must outlive the group. InvalidArgumentError for
  // a bad rank, size or option.
  ProcessGroupGloo(rpc::StoreClient& store, int rank, int size, Options options);
  ~ProcessGroupGloo() override;

  std::string backendName() const override { return "gloo"; }
  const std::string& name() const override;
  const Options& options() const;
  std::chrono::milliseconds timeout() const override { return options().timeout; }

  Work broadcast(const Tensor& tensor, int root) override;
  Work allReduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  // With `algorithm` for this call (Auto: the group's; see "Allreduce algorithms").
  Work allReduce(const Tensor& tensor, ReduceOp op, AllreduceAlgorithm algorithm);
  Work reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::Sum) override;
  Work allGather(std::vector<Tensor>& outputs, const Tensor& input) override;
  Work allGatherInto(const Tensor& output, const Tensor& input) override;
  Work gather(std::vector<Tensor>& outputs, const Tensor& input, int root) override;
  Work scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) override;
  // A ring reduce-scatter on the group's connections: N-1 steps, each rank
  // sending one shard's partial reduction to the next rank and reducing the
  // one it receives with its own input; about (N-1)/N of the inputs' bytes
  // sent per rank. Each shard is reduced starting at the rank after its
  // owner, around the ring, so float results may differ from a rank-ordered
  // reduction in the last bits.
  Work reduceScatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op = ReduceOp::Sum) override;
  Work allToAll(const Tensor& output, const Tensor& input) override;
  Work barrier() override;

  Work isend(const Tensor& tensor, int dst, uint32_t tag = 0) override;
  Work irecv(const Tensor& tensor, int src, uint32_t tag = 0) override;
  Work irecvFrom(const Tensor& tensor, const std::vector<int>& srcs, uint32_t tag = 0) override;

  std::unique_ptr<ProcessGroup> newGroup(const std::vector<int>& ranks) override;

  TrafficStats trafficStats() const override;
  void resetTrafficStats() override;
  // The group's allreduce algorithm (Options::allreduceAlgorithm, else the
  // environment's, else Auto).
  AllreduceAlgorithm allreduceAlgorithm() const;

  // Collectives started by this rank so far (the next one is numbered this).
  int64_t collectivesStarted() const;
  // Collectives that the call exchange carried whole (see "Call checking").
  int64_t fusedCollectives() const;

  // The most bytes of collective data a rank sends in one call exchange, over
  // all its peers (see "Call checking"; chosen by measurement).
  static constexpr size_t kFusedSendBytes = size_t{256} << 10;
  // The largest allReduce or broadcast, in bytes, that the call exchange
  // carries whole in this group: kFusedSendBytes / (size() - 1), rounded down
  // to a multiple of 64 (kFusedSendBytes in a group of one).
  size_t fusedLimit() const;

  // Keeps `owned` alive as long as this group or a sub-group made from it
  // after this call lives, and destroys it after their connections are
  // closed (collectives::init gives the group the store it owns).
  void keepAlive(std::shared_ptr<void> owned);

  class Impl;

 protected:
  // A contiguous CPU tensor.
  void checkTensor(const Tensor& t, const char* op, const std::string& what) const override;

 private:
  ProcessGroupGloo(std::unique_ptr<Impl> impl, int rank, int size);
  std::vector<std::shared_ptr<void>> owned_;  // before impl_: destroyed after it
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::collectives
