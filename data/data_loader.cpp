#include "data/data_loader.h"

#include <algorithm>
#include <span>

#include "common/error.h"

namespace weft::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
                       std::shared_ptr<Sampler> sampler)
    : dataset_(std::move(dataset)), options_(options) {
  WEFT_ENFORCE(dataset_ != nullptr, InvalidArgumentError, "DataLoader: null dataset");
  WEFT_ENFORCE(options_.batchSize >= 1, InvalidArgumentError, "DataLoader: batchSize must be at least 1, got ",
               options_.batchSize);
  WEFT_ENFORCE(!(options_.shuffle && sampler), InvalidArgumentError,
               "DataLoader: shuffle cannot be combined with a sampler (the sampler decides the order)");
  if (!sampler) {
    if (options_.shuffle) {
      sampler = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
    } else {
      sampler = std::make_shared<SequentialSampler>(dataset_->size());
    }
  }
  batchSampler_ = std::make_shared<BatchSampler>(std::move(sampler), options_.batchSize, options_.dropLast);
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<BatchSampler> batchSampler)
    : dataset_(std::move(dataset)), batchSampler_(std::move(batchSampler)) {
  WEFT_ENFORCE(dataset_ != nullptr, InvalidArgumentError, "DataLoader: null dataset");
  WEFT_ENFORCE(batchSampler_ != nullptr, InvalidArgumentError, "DataLoader: null batch sampler");
  options_.batchSize = batchSampler_->batchSize();
  options_.dropLast = batchSampler_->dropLast();
}

int64_t DataLoader::numBatches() const { return batchSampler_->size(); }

DataLoader::Iterator DataLoader::begin() {
  auto batches = std::make_shared<const Iterator::Batches>(batchSampler_->batches());
  WEFT_ENFORCE(static_cast<int64_t>(batches->size()) == numBatches(), InvalidArgumentError,
               "DataLoader: the batch sampler returned ", batches->size(), " batches but its size() is ",
               numBatches());
  return Iterator(this, std::move(batches), 0);
}

DataLoader::Iterator DataLoader::end() const { return Iterator(this, nullptr, numBatches()); }

Example DataLoader::batchAt(const std::vector<int64_t>& order, int64_t b) const {
  const int64_t n = static_cast<int64_t>(order.size());
  const int64_t start = b * options_.batchSize;
  WEFT_ENFORCE(b >= 0 && start < n, IndexError, "DataLoader: batch ", b, " out of range for ", n,
               " indices in batches of ", options_.batchSize);
  const int64_t len = std::min(options_.batchSize, n - start);
  return dataset_->getBatch(std::span<const int64_t>(order.data() + start, static_cast<size_t>(len)));
}

const Example& DataLoader::Iterator::operator*() const {
  WEFT_ENFORCE(loader_ != nullptr && batches_ != nullptr && batch_ < static_cast<int64_t>(batches_->size()),
               StateError, "DataLoader: dereferencing an iterator that is not inside an epoch");
  if (!loaded_) {
    const std::vector<int64_t>& indices = (*batches_)[static_cast<size_t>(batch_)];
    current_ = loader_->dataset_->getBatch(std::span<const int64_t>(indices.data(), indices.size()));
    loaded_ = true;
  }
  return current_;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++batch_;
  current_ = Example();
  loaded_ = false;
  return *this;
}

}  // namespace weft::data
