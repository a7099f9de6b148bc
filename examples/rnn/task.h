// The training data of examples/rnn: batches of token sequences [T, N] and their targets.
//
//   PeriodicTask task(8, 32, 0.1, seed);        // ntoken, streams, noise
//   auto [x, y] = task.next(20);                // x, y Int64 [20, 32]; y[t] is the token after x[t]
//
// PeriodicTask (the default, learnable): each of the N streams walks the same cycle, a
// permutation of the ntoken tokens drawn from the seed, from its own random starting point; every
// token is replaced, with probability `noise`, by a token drawn uniformly. A batch continues each
// stream where the previous batch stopped (x[0] is the previous batch's last target), so a hidden
// state carried from batch to batch stays meaningful. The next token is a deterministic function
// of the current one except where noise struck: a model that has learned the cycle predicts the
// target with probability about 1 - noise + noise/ntoken, a cross-entropy floor of about 0.47 for
// ntoken 8 and noise 0.1, against ln(ntoken) = 2.08 for a model that knows nothing.
//
// RandomTask (the upstream mode): x and y drawn uniformly and independently, as the upstream
// program's uninitialised tensors are in effect; nothing can be learned (the loss stays near
// ln(ntoken)). For timing comparisons only.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/error.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace weft::examples::rnn {

class PeriodicTask {
 public:
  // InvalidArgumentError when ntoken < 2, streams < 1 or noise outside [0, 1].
  PeriodicTask(int64_t ntoken, int64_t streams, double noise, uint64_t seed)
      : ntoken_(ntoken), streams_(streams), noise_(noise), gen_(seed) {
    WEFT_ENFORCE(ntoken >= 2 && streams >= 1, InvalidArgumentError,
                 "PeriodicTask: needs at least 2 tokens and 1 stream, got ", ntoken, " and ", streams);
    WEFT_ENFORCE(noise >= 0.0 && noise <= 1.0, InvalidArgumentError, "PeriodicTask: noise must be in [0, 1], got ",
                 noise);
    cycle_.resize(static_cast<size_t>(ntoken));
    for (int64_t i = 0; i < ntoken; ++i) cycle_[static_cast<size_t>(i)] = i;
    for (int64_t i = ntoken - 1; i > 0; --i) {
      std::swap(cycle_[static_cast<size_t>(i)], cycle_[gen_.nextBelow(static_cast<uint64_t>(i) + 1)]);
    }
    position_.resize(static_cast<size_t>(streams));
    last_.resize(static_cast<size_t>(streams));
    for (int64_t n = 0; n < streams; ++n) {
      position_[static_cast<size_t>(n)] = static_cast<int64_t>(gen_.nextBelow(static_cast<uint64_t>(ntoken)));
      last_[static_cast<size_t>(n)] = draw(n);
    }
  }

  // The next `steps` positions of every stream: (x, y), Int64 [steps, N], y[t] = x[t + 1] for
  // t < steps - 1.
  std::pair<Tensor, Tensor> next(int64_t steps) {
    WEFT_ENFORCE(steps >= 1, InvalidArgumentError, "PeriodicTask::next: steps must be positive, got ", steps);
    std::vector<int64_t> x(static_cast<size_t>(steps * streams_)), y(x.size());
    for (int64_t t = 0; t < steps; ++t) {
      for (int64_t n = 0; n < streams_; ++n) {
        const size_t i = static_cast<size_t>(t * streams_ + n);
        x[i] = last_[static_cast<size_t>(n)];
        y[i] = last_[static_cast<size_t>(n)] = draw(n);
      }
    }
    return {fromVector(x, {steps, streams_}), fromVector(y, {steps, streams_})};
  }

  // The cycle: cycle()[k + 1] follows cycle()[k] (and cycle()[0] follows the last).
  const std::vector<int64_t>& cycle() const { return cycle_; }

 private:
  // Stream n's next token: the cycle's, or a uniform one with probability noise.
  int64_t draw(int64_t n) {
    int64_t& pos = position_[static_cast<size_t>(n)];
    int64_t token = cycle_[static_cast<size_t>(pos)];
    pos = (pos + 1) % ntoken_;
    if (noise_ > 0 && gen_.nextDouble() < noise_) token = static_cast<int64_t>(gen_.nextBelow(static_cast<uint64_t>(ntoken_)));
    return token;
  }

  int64_t ntoken_;
  int64_t streams_;
  double noise_;
  Generator gen_;
  std::vector<int64_t> cycle_;
  std::vector<int64_t> position_;
  std::vector<int64_t> last_;
};

class RandomTask {
 public:
  RandomTask(int64_t ntoken, int64_t streams, uint64_t seed) : ntoken_(ntoken), streams_(streams), gen_(seed) {
    WEFT_ENFORCE(ntoken >= 1 && streams >= 1, InvalidArgumentError,
                 "RandomTask: needs at least 1 token and 1 stream, got ", ntoken, " and ", streams);
  }
  // (x, y), Int64 [steps, N], independent and uniform in [0, ntoken).
  std::pair<Tensor, Tensor> next(int64_t steps) {
    Tensor x = randint(0, ntoken_, {steps, streams_}, {.dtype = DType::Int64}, &gen_);
    Tensor y = randint(0, ntoken_, {steps, streams_}, {.dtype = DType::Int64}, &gen_);
    return {x, y};
  }

 private:
  int64_t ntoken_;
  int64_t streams_;
  Generator gen_;
};

}  // namespace weft::examples::rnn
