// What the fashion_mnist example (main.cpp) does across its processes besides the training step:
// sums and maxima of a few numbers over the group, the test accuracy, the allreduce mode's
// gradient averaging and initial broadcast, and the final check that the replicas are
// bit-identical.
//
//   std::vector<double> counts{correct};
//   reduceValues(pg, counts, ReduceOp::Sum);       // pg null (local mode): unchanged
//   averageGradients(params, *pg);                 // allreduce mode, after backward
//   WeightSummary w = checkReplicas(*model, pg);   // Error if any value differs from rank 0's
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "common/error.h"
#include "data/data.h"
#include "nn/nn.h"
#include "examples/fashion_mnist_mlp/mlp.h"
#include "tensor/ops.h"

namespace weft::examples::fashion_mnist {

// The reduction of `values` over the group's ranks, in place; `values` itself without a group
// (local mode).
inline void reduceValues(collectives::ProcessGroup* group, std::vector<double>& values, collectives::ReduceOp op) {
  if (group == nullptr) return;
  Tensor t = empty({static_cast<int64_t>(values.size())}, {.dtype = DType::Float64});
  std::copy(values.begin(), values.end(), t.data<double>());
  group->allReduce(t, op).wait();
  std::copy(t.data<double>(), t.data<double>() + t.numel(), values.begin());
}

// The fraction of the test split the model classifies right: each rank tests its own slice, the
// counts are summed over the group.
inline double groupTestAccuracy(nn::Module& model, const data::TensorDataset& test, int rank, int world,
                                collectives::ProcessGroup* group) {
  const int64_t n = test.size(), begin = n * rank / world, end = n * (rank + 1) / world;
  std::vector<double> counts{static_cast<double>(fashion_mnist_mlp::countCorrect(model, test, begin, end - begin))};
  reduceValues(group, counts, collectives::ReduceOp::Sum);
  return counts[0] / static_cast<double>(n);
}

// allreduce mode, at the start: every replica takes rank 0's parameters, as DDP's construction does.
inline void broadcastParameters(const std::vector<Tensor>& params, collectives::ProcessGroup& group) {
  std::vector<collectives::Work> works;
  for (const Tensor& p : params) works.push_back(group.broadcast(p.detach(), 0));
  for (collectives::Work& w : works) w.wait();
}

// allreduce mode, after backward: the gradient of every parameter replaced by its average over
// the ranks, one allReduce per parameter, all issued before the first is awaited.
inline void averageGradients(const std::vector<Tensor>& params, collectives::ProcessGroup& group) {
  std::vector<collectives::Work> works;
  works.reserve(params.size());
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    WEFT_ENFORCE(g.defined() && g.isContiguous(), StateError,
                 "a parameter has no contiguous gradient after backward; cannot average it");
    works.push_back(group.allReduce(g, collectives::ReduceOp::Avg));
  }
  for (collectives::Work& w : works) w.wait();
}

// The final weights of this replica: count, sum and L2 norm, printed by rank 0.
struct WeightSummary {
  int64_t values = 0;
  double sum = 0;
  double norm = 0;
};

// Compares every replica with rank 0's, bit for bit (Error "the replicas differ after training:
// N parameter values differ from rank 0's" otherwise), and summarises this one's weights.
inline WeightSummary checkReplicas(nn::Module& model, collectives::ProcessGroup* group) {
  std::vector<Tensor> flat;
  for (const Tensor& p : model.parameters()) flat.push_back(p.detach().flatten());
  Tensor mine = cat(flat).contiguous();
  WeightSummary summary{.values = mine.numel()};
  double norm2 = 0;
  for (int64_t i = 0; i < mine.numel(); ++i) {
    const double v = mine.data<float>()[i];
    summary.sum += v;
    norm2 += v * v;
  }
  summary.norm = std::sqrt(norm2);
  if (group != nullptr) {
    Tensor first = mine.clone();
    group->broadcast(first, 0).wait();
    std::vector<double> differing{0};
    for (int64_t i = 0; i < mine.numel(); ++i) differing[0] += mine.data<float>()[i] != first.data<float>()[i];
    reduceValues(group, differing, collectives::ReduceOp::Sum);
    if (differing[0] != 0) {
      throw Error("the replicas differ after training: " + std::to_string(static_cast<int64_t>(differing[0])) +
                  " parameter values differ from rank 0's (summed over the ranks)");
    }
  }
  return summary;
}

// Kernel threads per process: `requested`, or for 0 the machine's cores shared by the processes
// on it (WEFT_LOCAL_WORLD_SIZE, else LOCAL_WORLD_SIZE).
inline int threadsPerProcess(int64_t requested, int machineThreads) {
  if (requested != 0) return static_cast<int>(requested);
  int local = 1;
  if (const char* s = std::getenv("WEFT_LOCAL_WORLD_SIZE")) local = std::max(1, std::atoi(s));
  else if (const char* t = std::getenv("LOCAL_WORLD_SIZE")) local = std::max(1, std::atoi(t));
  return std::max(1, machineThreads / local);
}

}  // namespace weft::examples::fashion_mnist
