#include "server.h"

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "data/mnist.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace weft::examples::parameter_server {

const char* updateModeName(UpdateMode mode) { return mode == UpdateMode::Serialized ? "serialized" : "snapshot"; }

UpdateMode parseUpdateMode(const std::string& name) {
  if (name == "serialized") return UpdateMode::Serialized;
  if (name == "snapshot") return UpdateMode::Snapshot;
  throw InvalidArgumentError("unknown update mode '" + name + "' (expected serialized or snapshot)");
}

Net::Net(uint64_t seed) : Module("Net") {
  conv1_ = registerModule("conv1", std::make_shared<nn::Conv2d>(1, 32, 3));
  conv2_ = registerModule("conv2", std::make_shared<nn::Conv2d>(32, 64, 3));
  fc1_ = registerModule("fc1", std::make_shared<nn::Linear>(9216, 128));
  fc2_ = registerModule("fc2", std::make_shared<nn::Linear>(128, 10));
  Generator gen(seed);
  conv1_->resetParameters(&gen);
  conv2_->resetParameters(&gen);
  fc1_->resetParameters(&gen);
  fc2_->resetParameters(&gen);
}

Tensor Net::forward(const Tensor& x) { return forwardWith(parameters(), x, nullptr); }

Tensor Net::forwardWith(const std::vector<Tensor>& p, const Tensor& x, Generator* dropout) {
  WEFT_ENFORCE(p.size() == kNetParameterTensors, InvalidArgumentError, "Net::forwardWith: expected ",
               kNetParameterTensors, " parameter tensors, got ", p.size());
  WEFT_ENFORCE(x.dim() == 4 && x.size(1) == 1 && x.size(2) == 28 && x.size(3) == 28, InvalidArgumentError,
               "Net: expected images [N, 1, 28, 28], got ", x.shape());
  const bool training = dropout != nullptr;
  Tensor h = relu(conv2d(x, p[0], p[1]));
  h = maxPool2d(conv2d(h, p[2], p[3]), 2);
  h = weft::dropout(h, 0.25, training, dropout).flatten(1);
  h = weft::dropout(relu(linear(h, p[4], p[5])), 0.5, training, dropout);
  return logSoftmax(linear(h, p[6], p[7]), 1);
}

ParameterServer::ParameterServer(int64_t seed, std::string mode, std::string dataDir)
    : mode_(parseUpdateMode(mode)),
      net_(std::make_shared<Net>(static_cast<uint64_t>(seed))),
      params_(net_->parameters()),
      test_(data::loadFashionMnist({.root = std::move(dataDir),
                                    .split = data::Split::Test,
                                    .normalize = data::Normalization{kMean, kStd}})) {
  WEFT_CHECK(params_.size() == kNetParameterTensors) << "Net has " << params_.size() << " parameter tensors";
}

Tensor ParameterServer::parameter(int64_t index) {
  WEFT_ENFORCE(index >= 0 && index < static_cast<int64_t>(params_.size()), IndexError,
               "ParameterServer::parameter: index ", index, " outside 0..", params_.size() - 1);
  return params_[static_cast<size_t>(index)];
}

int64_t ParameterServer::parameterTensorCount() { return static_cast<int64_t>(params_.size()); }

int64_t ParameterServer::parameterCount() {
  int64_t n = 0;
  for (const Tensor& p : params_) n += p.numel();
  return n;
}

std::string ParameterServer::updateMode() { return updateModeName(mode_); }

Future<void> ParameterServer::lockForward() {
  WEFT_ENFORCE(mode_ == UpdateMode::Serialized, StateError,
               "ParameterServer::lockForward: only the serialized update mode locks forwards (this server runs ",
               updateModeName(mode_), ")");
  return lock_.acquire(UpdateLock::Mode::Shared);
}

Future<void> ParameterServer::beginUpdate(bool holdsForwardLock) {
  if (holdsForwardLock) return lock_.transition(UpdateLock::Mode::Shared, UpdateLock::Mode::Exclusive);
  return lock_.acquire(UpdateLock::Mode::Exclusive);
}

void ParameterServer::endUpdate() { lock_.release(UpdateLock::Mode::Exclusive); }

Tensor ParameterServer::forward(Tensor images, int64_t dropoutSeed) {
  Generator dropout(static_cast<uint64_t>(dropoutSeed));
  forwards_.fetch_add(1, std::memory_order_relaxed);
  if (mode_ == UpdateMode::Serialized) return Net::forwardWith(params_, images, &dropout);
  // Snapshot: copy the weights while no step writes them. The copies are clones, so the
  // gradients flow through them to the parameters (leaves of the distributed context).
  std::vector<Tensor> snapshot;
  snapshot.reserve(params_.size());
  lock_.acquire(UpdateLock::Mode::Shared).get();
  try {
    for (const Tensor& p : params_) snapshot.push_back(p.clone());
  } catch (...) {
    lock_.release(UpdateLock::Mode::Shared);
    throw;
  }
  lock_.release(UpdateLock::Mode::Shared);
  return Net::forwardWith(snapshot, images, &dropout);
}

double ParameterServer::testAccuracy() {
  lock_.acquire(UpdateLock::Mode::Shared).get();
  int64_t correct = 0;
  try {
    NoGradGuard noGrad;
    const int64_t n = test_.size();
    constexpr int64_t kChunk = 500;
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t len = std::min(kChunk, n - start);
      Tensor pred = argmax(Net::forwardWith(params_, test_.data().narrow(0, start, len), nullptr), 1);
      correct += eq(pred, test_.targets().narrow(0, start, len)).sum().item<int64_t>();
    }
  } catch (...) {
    lock_.release(UpdateLock::Mode::Shared);
    throw;
  }
  lock_.release(UpdateLock::Mode::Shared);
  return static_cast<double>(correct) / static_cast<double>(test_.size());
}

int64_t ParameterServer::forwardCount() { return forwards_.load(std::memory_order_relaxed); }

}  // namespace weft::examples::parameter_server
