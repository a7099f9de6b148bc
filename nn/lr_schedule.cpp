#include "nn/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "common/error.h"

namespace weft::nn::optim {
namespace {

void checkStep(const char* schedule, int64_t step) {
  WEFT_ENFORCE(step >= 0, InvalidArgumentError, schedule, ": step ", step, " is negative");
}

void checkRates(const char* schedule, double maxLr, double minLr) {
  WEFT_ENFORCE(maxLr >= 0 && minLr >= 0, InvalidArgumentError, schedule, ": learning rates must be >= 0, got maxLr ",
               maxLr, " and minLr ", minLr);
  WEFT_ENFORCE(minLr <= maxLr, InvalidArgumentError, schedule, ": minLr ", minLr, " exceeds maxLr ", maxLr);
}

void checkStartFactor(const char* schedule, double startFactor) {
  WEFT_ENFORCE(startFactor >= 0 && startFactor <= 1, InvalidArgumentError, schedule, ": startFactor ", startFactor,
               " is not in [0, 1]");
}

double linear(int64_t step, int64_t steps, double maxLr, double startFactor) {
  if (step >= steps) return maxLr;
  const double t = static_cast<double>(step) / static_cast<double>(steps);
  return maxLr * (startFactor + (1.0 - startFactor) * t);
}

double cosine(int64_t step, int64_t steps, double maxLr, double minLr) {
  if (step >= steps) return minLr;
  const double t = static_cast<double>(step) / static_cast<double>(steps);
  return minLr + (maxLr - minLr) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
}

}  // namespace

double Constant::operator()(int64_t step) const {
  checkStep("Constant", step);
  WEFT_ENFORCE(lr >= 0, InvalidArgumentError, "Constant: learning rate ", lr, " is negative");
  return lr;
}

double LinearWarmup::operator()(int64_t step) const {
  checkStep("LinearWarmup", step);
  WEFT_ENFORCE(warmupSteps >= 0, InvalidArgumentError, "LinearWarmup: warmupSteps ", warmupSteps, " is negative");
  checkRates("LinearWarmup", maxLr, 0.0);
  checkStartFactor("LinearWarmup", startFactor);
  return linear(step, warmupSteps, maxLr, startFactor);
}

double CosineDecay::operator()(int64_t step) const {
  checkStep("CosineDecay", step);
  WEFT_ENFORCE(steps >= 0, InvalidArgumentError, "CosineDecay: steps ", steps, " is negative");
  checkRates("CosineDecay", maxLr, minLr);
  return cosine(step, steps, maxLr, minLr);
}

double WarmupCosine::operator()(int64_t step) const {
  checkStep("WarmupCosine", step);
  WEFT_ENFORCE(warmupSteps >= 0 && totalSteps >= warmupSteps, InvalidArgumentError,
               "WarmupCosine: expected 0 <= warmupSteps <= totalSteps, got warmupSteps ", warmupSteps,
               " and totalSteps ", totalSteps);
  checkRates("WarmupCosine", maxLr, minLr);
  checkStartFactor("WarmupCosine", startFactor);
  if (step < warmupSteps) return linear(step, warmupSteps, maxLr, startFactor);
  return cosine(step - warmupSteps, totalSteps - warmupSteps, maxLr, minLr);
}

double Sequential::operator()(int64_t step) const {
  checkStep("Sequential", step);
  WEFT_ENFORCE(!schedules.empty() && milestones.size() + 1 == schedules.size(), InvalidArgumentError,
               "Sequential: ", schedules.size(), " schedules need ",
               schedules.empty() ? 0 : schedules.size() - 1, " milestones, got ", milestones.size());
  for (size_t k = 0; k < milestones.size(); ++k) {
    WEFT_ENFORCE(milestones[k] > (k == 0 ? 0 : milestones[k - 1]), InvalidArgumentError, "Sequential: milestone ",
                 k, " (", milestones[k], ") is not after ", k == 0 ? "step 0" : "the previous one");
  }
  size_t k = 0;
  while (k < milestones.size() && step >= milestones[k]) ++k;
  const int64_t from = k == 0 ? 0 : milestones[k - 1];
  WEFT_ENFORCE(static_cast<bool>(schedules[k]), InvalidArgumentError, "Sequential: schedule ", k, " is empty");
  return schedules[k](step - from);
}

}  // namespace weft::nn::optim
