// Learning-rate schedules: small values that map a step number (0 for the
// first optimizer step) to a learning rate, for any optimizer:
//
//   nn::optim::WarmupCosine schedule{.warmupSteps = 100, .totalSteps = 5000,
//                                    .maxLr = 6e-4, .minLr = 6e-5};
//   for (int64_t step = 0; step < 5000; ++step) {
//     opt.setLr(schedule(step));          // every parameter group
//     ...; opt.step();
//   }
//
// The curves are those of torch.optim.lr_scheduler where a twin exists:
// LinearWarmup is LinearLR with end factor 1 (scaled by maxLr), CosineDecay
// is CosineAnnealingLR up to its T_max (after which torch's curve rises
// again and this one stays at minLr), Sequential is SequentialLR (each
// schedule sees its steps counted from its milestone), and WarmupCosine is
// Sequential{LinearWarmup, CosineDecay}, nanoGPT's schedule.
//
// Errors: a negative step, negative step counts, totalSteps < warmupSteps,
// negative rates, minLr > maxLr, a startFactor outside [0, 1], or
// milestones that are not increasing or do not number one fewer than the
// schedules are InvalidArgumentErrors naming the schedule and the value.
// Values are immutable once built; calling them from several threads is
// safe.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace weft::nn::optim {

// maxLr at every step.
struct Constant {
  double lr;
  double operator()(int64_t step) const;
};

// maxLr · (startFactor + (1 − startFactor) · step / warmupSteps) for
// step < warmupSteps, then maxLr.
struct LinearWarmup {
  int64_t warmupSteps;
  double maxLr;
  double startFactor = 0.0;
  double operator()(int64_t step) const;
};

// minLr + (maxLr − minLr) · (1 + cos(π · step / steps)) / 2 for step <
// steps, then minLr.
struct CosineDecay {
  int64_t steps;
  double maxLr;
  double minLr = 0.0;
  double operator()(int64_t step) const;
};

// Linear warm-up from startFactor · maxLr to maxLr over [0, warmupSteps),
// cosine decay from maxLr at warmupSteps to minLr at totalSteps, minLr after.
struct WarmupCosine {
  int64_t warmupSteps;
  int64_t totalSteps;
  double maxLr;
  double minLr = 0.0;
  double startFactor = 0.0;
  double operator()(int64_t step) const;
};

// Any schedule: a callable from step to learning rate.
using Schedule = std::function<double(int64_t step)>;

// schedules[0] for steps [0, milestones[0]), schedules[k] for
// [milestones[k-1], milestones[k]) seeing step − milestones[k-1], the last
// one from the last milestone on.
struct Sequential {
  std::vector<Schedule> schedules;
  std::vector<int64_t> milestones;
  double operator()(int64_t step) const;
};

}  // namespace weft::nn::optim
