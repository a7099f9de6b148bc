#include "data/data_loader.h"

#include <algorithm>
#include <span>

#include "common/error.h"

namespace weft::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
                       std::shared_ptr<Sampler> sampler)
    : dataset_(std::move(dataset)), options_(options), sampler_(std::move(sampler)) {
  WEFT_ENFORCE(dataset_ != nullptr, InvalidArgumentError, "DataLoader: null dataset");
  WEFT_ENFORCE(options_.batchSize >= 1, InvalidArgumentError, "DataLoader: batchSize must be at least 1, got ",
               options_.batchSize);
  WEFT_ENFORCE(!(options_.shuffle && sampler_), InvalidArgumentError,
               "DataLoader: shuffle cannot be combined with a sampler (the sampler decides the order)");
  if (!sampler_) {
    if (options_.shuffle) {
      sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
    } else {
      sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
    }
  }
}

int64_t DataLoader::numBatches() const {
  const int64_t n = sampler_->size();
  const int64_t b = options_.batchSize;
  return options_.dropLast ? n / b : (n + b - 1) / b;
}

DataLoader::Iterator DataLoader::begin() {
  auto order = std::make_shared<const std::vector<int64_t>>(sampler_->indices());
  WEFT_ENFORCE(static_cast<int64_t>(order->size()) == sampler_->size(), InvalidArgumentError,
               "DataLoader: the sampler returned ", order->size(), " indices but its size() is ", sampler_->size());
  return Iterator(this, std::move(order), 0);
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
  WEFT_ENFORCE(loader_ != nullptr && order_ != nullptr, StateError,
               "DataLoader: dereferencing an iterator that is not inside an epoch");
  if (!loaded_) {
    current_ = loader_->batchAt(*order_, batch_);
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
