// DataLoader: walks a Dataset in batches, one epoch per range-for loop.
//
//   using namespace weft::data;
//   auto train = std::make_shared<TensorDataset>(loadFashionMnist({.flatten = true}));
//   DataLoader loader(train, {.batchSize = 64, .shuffle = true, .seed = 1});
//   for (int epoch = 0; epoch < 5; ++epoch) {
//     for (const Example& batch : loader) {   // batch.data [64, 784], batch.target [64]
//       ...
//     }
//   }
//
//   // Across processes: each rank reads its share, ordered as PyTorch would.
//   auto sampler = std::make_shared<DistributedSampler>(train->size(),
//       DistributedSamplerOptions{.numReplicas = world, .rank = rank, .seed = 0});
//   DataLoader shard(train, {.batchSize = 64}, sampler);
//   sampler->setEpoch(epoch);   // before each epoch's loop
//
//   // Or batches decided by a BatchSampler (PyTorch's batch_sampler=):
//   DataLoader byBatch(train, std::make_shared<BatchSampler>(sampler, 64, /*dropLast=*/true));
//
// Every begin() starts a new epoch: it asks the batch sampler for the epoch's
// batches (built from the sampler, or with shuffle and no sampler from a
// RandomSampler seeded with `seed`, so the sequence of epochs is
// reproducible). Batches are built lazily, one per
// step, by Dataset::getBatch (for a TensorDataset: one memcpy per row into
// fresh batch tensors that the caller may keep). The loader shares ownership
// of its dataset and sampler, and is iterated by one thread at a time.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"

namespace weft::data {

struct DataLoaderOptions {
  int64_t batchSize = 1;
  // Visit the examples in a new random order each epoch. Not allowed
  // together with a sampler (the sampler decides the order).
  bool shuffle = false;
  uint64_t seed = 0;
  // Drop the last batch of an epoch when it is smaller than batchSize.
  bool dropLast = false;
};

class DataLoader {
 public:
  // batchSize >= 1; shuffle and a sampler together are an
  // InvalidArgumentError (as in PyTorch).
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {},
             std::shared_ptr<Sampler> sampler = nullptr);
  // Batches exactly as `batchSampler` cuts them (its batch size and dropLast
  // stand for the options'); a null batch sampler is an InvalidArgumentError.
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<BatchSampler> batchSampler);

  // Input iterator over one epoch's batches.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Example;
    using difference_type = std::ptrdiff_t;
    using pointer = const Example*;
    using reference = const Example&;

    Iterator() = default;
    const Example& operator*() const;
    const Example* operator->() const { return &**this; }
    Iterator& operator++();
    // Comparison is by position: any iterator at the end equals end().
    bool operator==(const Iterator& o) const { return batch_ == o.batch_; }

   private:
    friend class DataLoader;
    using Batches = std::vector<std::vector<int64_t>>;
    Iterator(const DataLoader* loader, std::shared_ptr<const Batches> batches, int64_t batch)
        : loader_(loader), batches_(std::move(batches)), batch_(batch) {}

    const DataLoader* loader_ = nullptr;
    std::shared_ptr<const Batches> batches_;
    int64_t batch_ = 0;
    mutable Example current_;
    mutable bool loaded_ = false;
  };

  // Starts a new epoch (draws the next batches from the batch sampler).
  Iterator begin();
  Iterator end() const;

  // Batches per epoch (PyTorch's len(loader)).
  int64_t numBatches() const;
  // Examples visited per epoch, including those of a dropped last batch.
  int64_t numExamples() const { return batchSampler_->sampler().size(); }
  const Dataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  Sampler& sampler() const { return batchSampler_->sampler(); }
  BatchSampler& batchSampler() const { return *batchSampler_; }

  // Batch `b` of the given epoch order (what the iterator yields).
  Example batchAt(const std::vector<int64_t>& order, int64_t b) const;

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<BatchSampler> batchSampler_;
};

}  // namespace weft::data
