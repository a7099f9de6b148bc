// The returns of REINFORCE: discounted per episode, then normalised over a batch of episodes.
//
//   std::vector<double> g = discountedReturns({1, 1, 1}, 0.99);   // {2.9701, 1.99, 1}
//   normalizeInPlace(g, kReturnEps);                               // mean 0, unbiased std ~1
//
// Header-only and free of tensors, so that the arithmetic is tested on its own.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace weft::examples::rl {

// The eps PyTorch's example adds to the standard deviation: float32's machine epsilon
// (np.finfo(np.float32).eps, 1.1920929e-07).
inline constexpr double kReturnEps = static_cast<double>(std::numeric_limits<float>::epsilon());

// G_t = r_t + gamma·G_{t+1}, G after the last step 0: the discounted return of every step of one
// episode.
inline std::vector<double> discountedReturns(const std::vector<double>& rewards, double gamma) {
  std::vector<double> out(rewards.size());
  double g = 0;
  for (size_t i = rewards.size(); i-- > 0;) {
    g = rewards[i] + gamma * g;
    out[i] = g;
  }
  return out;
}

// v <- (v - mean) / (std + eps), std the unbiased standard deviation (as torch.std). With fewer
// than two values the standard deviation is taken as 0 (torch.std would give NaN).
inline void normalizeInPlace(std::vector<double>& v, double eps) {
  if (v.empty()) return;
  const double n = static_cast<double>(v.size());
  double mean = 0;
  for (double x : v) mean += x;
  mean /= n;
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  const double stddev = v.size() > 1 ? std::sqrt(ss / (n - 1)) : 0.0;
  for (double& x : v) x = (x - mean) / (stddev + eps);
}

}  // namespace weft::examples::rl
