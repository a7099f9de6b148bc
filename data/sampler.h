// Samplers: the order in which a DataLoader visits a dataset, one epoch at a
// time.
//
//   using namespace weft::data;
//   // Each of 4 processes reads its own quarter of the data, in the order
//   // PyTorch's DistributedSampler would give it:
//   DistributedSampler sampler(train.size(), {.numReplicas = 4, .rank = rank, .seed = 17});
//   for (int64_t epoch = 0; epoch < 10; ++epoch) {
//     sampler.setEpoch(epoch);
//     for (int64_t i : sampler.indices()) { ... }
//   }
//
//   // The same shard cut into batches of 32, as torch.utils.data.BatchSampler:
//   BatchSampler batches(std::make_shared<DistributedSampler>(sampler), 32, /*dropLast=*/false);
//   for (const std::vector<int64_t>& batch : batches.batches()) { ... }
//
// A sampler is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tensor/generator.h"

namespace weft::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The dataset indices of the next epoch, in visiting order. Stateful
  // samplers (RandomSampler) advance to a new order on every call.
  virtual std::vector<int64_t> indices() = 0;
  // How many indices each call to indices() returns.
  virtual int64_t size() const = 0;
};

// 0, 1, ..., n-1.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices() override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A new uniformly random permutation of [0, n) per call, drawn from a
// weft::Generator seeded with `seed`: the sequence of epochs is the same on
// every run and machine for the same seed.
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices() override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  Generator gen_;
};

// A uniformly random permutation of [0, n) (Fisher-Yates on `gen`).
std::vector<int64_t> randomPermutation(int64_t n, Generator& gen);

struct DistributedSamplerOptions {
  int64_t numReplicas = 1;  // processes sharing the dataset (the world size)
  int64_t rank = 0;         // this process, in [0, numReplicas)
  bool shuffle = true;
  int64_t seed = 0;         // same on every replica
  bool dropLast = false;
};

// Splits a dataset across replicas exactly as PyTorch 1.13's
// torch.utils.data.DistributedSampler does, index for index, so a weft job
// and a PyTorch job with the same seed and epoch train on the same examples:
//  - shuffle: torch.randperm(n) from a torch.Generator seeded seed + epoch
//    (reproduced bit-exactly by data/torch_randperm.h), else 0..n-1;
//  - !dropLast: the list is padded by repeating it from the start until every
//    replica gets ceil(n / numReplicas) indices;
//    dropLast: its tail is cut so every replica gets floor(n / numReplicas);
//  - replica `rank` takes positions rank, rank + numReplicas, ...
// The order depends only on (seed, epoch), never on how often indices() was
// called: call setEpoch at the start of every epoch or each epoch repeats the
// same order.
class DistributedSampler : public Sampler {
 public:
  // numReplicas >= 1, 0 <= rank < numReplicas and datasetSize >= 0, else
  // InvalidArgumentError.
  DistributedSampler(int64_t datasetSize, DistributedSamplerOptions options);

  void setEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  std::vector<int64_t> indices() override;
  // Indices per replica (PyTorch's num_samples).
  int64_t size() const override { return numSamples_; }
  // Indices over all replicas (PyTorch's total_size).
  int64_t totalSize() const { return numSamples_ * options_.numReplicas; }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t datasetSize_;
  DistributedSamplerOptions options_;
  int64_t numSamples_;
  int64_t epoch_ = 0;
};

// Cuts the index order of any sampler into batches, as PyTorch's
// torch.utils.data.BatchSampler(sampler, batch_size, drop_last): consecutive
// runs of batchSize indices in the sampler's order, the last one shorter
// unless dropLast drops it. Shares ownership of the sampler; a
// DistributedSampler's setEpoch applies to the next batches() call.
class BatchSampler {
 public:
  // A non-null sampler and batchSize >= 1, else InvalidArgumentError.
  BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batchSize, bool dropLast = false);

  // The batches of the next epoch (one sampler->indices() call). A sampler
  // that returns a different count than its size() is an InvalidArgumentError.
  std::vector<std::vector<int64_t>> batches();
  // Batches per epoch (PyTorch's len(batch_sampler)): floor(n / batchSize)
  // with dropLast, else ceil(n / batchSize), n = sampler().size().
  int64_t size() const;
  int64_t batchSize() const { return batchSize_; }
  bool dropLast() const { return dropLast_; }
  Sampler& sampler() const { return *sampler_; }

 private:
  std::shared_ptr<Sampler> sampler_;
  int64_t batchSize_;
  bool dropLast_;
};

}  // namespace weft::data
