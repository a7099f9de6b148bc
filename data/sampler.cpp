#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/error.h"
#include "data/torch_randperm.h"

namespace weft::data {

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  WEFT_ENFORCE(n >= 0, InvalidArgumentError, "SequentialSampler: size must be non-negative, got ", n);
}

std::vector<int64_t> SequentialSampler::indices() {
  std::vector<int64_t> v(static_cast<size_t>(n_));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

std::vector<int64_t> randomPermutation(int64_t n, Generator& gen) {
  WEFT_ENFORCE(n >= 0, InvalidArgumentError, "randomPermutation: n must be non-negative, got ", n);
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(gen.nextBelow(static_cast<uint64_t>(i) + 1));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(j)]);
  }
  return v;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), gen_(seed) {
  WEFT_ENFORCE(n >= 0, InvalidArgumentError, "RandomSampler: size must be non-negative, got ", n);
}

std::vector<int64_t> RandomSampler::indices() { return randomPermutation(n_, gen_); }

DistributedSampler::DistributedSampler(int64_t datasetSize, DistributedSamplerOptions options)
    : datasetSize_(datasetSize), options_(options) {
  WEFT_ENFORCE(datasetSize >= 0, InvalidArgumentError, "DistributedSampler: dataset size must be non-negative, got ",
               datasetSize);
  WEFT_ENFORCE(options.numReplicas >= 1, InvalidArgumentError,
               "DistributedSampler: numReplicas must be at least 1, got ", options.numReplicas);
  WEFT_ENFORCE(options.rank >= 0 && options.rank < options.numReplicas, InvalidArgumentError,
               "DistributedSampler: invalid rank ", options.rank, ", rank should be in the interval [0, ",
               options.numReplicas - 1, "]");
  const int64_t r = options.numReplicas;
  // PyTorch: ceil((n - r) / r) when dropping an uneven tail, i.e. floor(n / r);
  // otherwise ceil(n / r).
  numSamples_ = (options.dropLast && datasetSize % r != 0) ? datasetSize / r : (datasetSize + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::indices() {
  std::vector<int64_t> all;
  if (options_.shuffle) {
    // torch.Generator.manual_seed(seed + epoch): Python ints wrap to uint64.
    const uint64_t seed = static_cast<uint64_t>(options_.seed) + static_cast<uint64_t>(epoch_);
    all = torchRandperm(datasetSize_, seed);
  } else {
    all.resize(static_cast<size_t>(datasetSize_));
    std::iota(all.begin(), all.end(), int64_t{0});
  }
  const int64_t total = totalSize();
  const int64_t n = datasetSize_;
  // Padding repeats the list from its start (cyclically when the padding is
  // longer than the list); dropping keeps the first `total`.
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(numSamples_));
  for (int64_t pos = options_.rank; pos < total; pos += options_.numReplicas) {
    mine.push_back(all[static_cast<size_t>(pos % n)]);
  }
  return mine;
}

BatchSampler::BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batchSize, bool dropLast)
    : sampler_(std::move(sampler)), batchSize_(batchSize), dropLast_(dropLast) {
  WEFT_ENFORCE(sampler_ != nullptr, InvalidArgumentError, "BatchSampler: null sampler");
  WEFT_ENFORCE(batchSize >= 1, InvalidArgumentError, "BatchSampler: batchSize must be at least 1, got ", batchSize);
}

int64_t BatchSampler::size() const {
  const int64_t n = sampler_->size();
  return dropLast_ ? n / batchSize_ : (n + batchSize_ - 1) / batchSize_;
}

std::vector<std::vector<int64_t>> BatchSampler::batches() {
  const std::vector<int64_t> order = sampler_->indices();
  const auto n = static_cast<int64_t>(order.size());
  WEFT_ENFORCE(n == sampler_->size(), InvalidArgumentError, "BatchSampler: the sampler returned ", n,
               " indices but its size() is ", sampler_->size());
  std::vector<std::vector<int64_t>> out;
  out.reserve(static_cast<size_t>(size()));
  for (int64_t start = 0; start < n; start += batchSize_) {
    const int64_t len = std::min(batchSize_, n - start);
    if (len < batchSize_ && dropLast_) break;
    out.emplace_back(order.begin() + start, order.begin() + start + len);
  }
  return out;
}

}  // namespace weft::data
