// The closing lines rank 0 of the fashion_mnist example (main.cpp) prints: the final weights,
// the throughput and the median step, and where the metrics went.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <string>
#include <vector>

#include "examples/common/app.h"

#include "flags.h"
#include "replicas.h"

namespace weft::examples::fashion_mnist {

// "weights: ...", "throughput: ..." and "metrics written to ...". `stepSeconds` (this rank's
// steps) is reordered.
inline void printSummary(const WeightSummary& weights, int world, int threads, const Flags& flags, int64_t steps,
                         double trainSamples, double trainSeconds, std::vector<double>& stepSeconds) {
  const double throughput = trainSamples / std::max(trainSeconds, 1e-9);
  // The median step is little disturbed by other work on the machine, unlike the total.
  std::nth_element(stepSeconds.begin(), stepSeconds.begin() + stepSeconds.size() / 2, stepSeconds.end());
  const double median = stepSeconds[stepSeconds.size() / 2];
  app::say("weights: %" PRId64 " values, sum %.9g, L2 norm %.9g; %s\n", weights.values, weights.sum, weights.norm,
           world == 1 ? "one replica" : ("identical on all " + std::to_string(world) + " replicas").c_str());
  app::say("throughput: %.0f samples/s (%d process(es) x %d thread(s), mode %s, %" PRId64
           " steps in %.2f s); median step %.3f ms, %.0f samples/s\n",
           throughput, world, threads, modeName(flags.mode), steps, trainSeconds, median * 1e3,
           static_cast<double>(flags.batchSize) / median);
  app::say("metrics written to %s\n", flags.metrics.c_str());
}

}  // namespace weft::examples::fashion_mnist
