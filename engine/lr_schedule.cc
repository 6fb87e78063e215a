// scheduled_lr (config.h): DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR
// (deepspeed/runtime/lr_schedules.py), evaluated for one optimizer step, in double.
//
// Step counting: DeepSpeed's schedules are functions of last_batch_iteration, the 0-based
// count of scheduler.step() calls. Strata's optimizer step `step` (1-based) uses the value
// at last_batch_iteration = step - 1, so the first step runs at the warmup's start. (DeepSpeed
// itself steps the scheduler after the optimizer, so its optimizer runs one value behind
// this sequence and starts from the value the scheduler set at construction.)
#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/config.h"
#include "runtime/core/error.h"

namespace strata::engine {
namespace {

// Warmup progress in [0, 1) at iteration `it` < warmup: log(it + 1) / log(warmup) or
// it / warmup. DeepSpeed warms up over at least 2 steps so that log(warmup) > 0.
double warmup_gamma(const SchedulerConfig& s, std::int64_t it, std::int64_t warmup) {
  if (s.warmup_type == "linear") return static_cast<double>(it) / static_cast<double>(warmup);
  return std::log(static_cast<double>(it) + 1.0) / std::log(static_cast<double>(warmup));
}

}  // namespace

float scheduled_lr(const EngineConfig& config, std::int64_t step) {
  STRATA_CHECK(step >= 1, Errc::invalid_argument, "scheduled_lr: step ", step,
               " is not valid: optimizer steps count from 1");
  const SchedulerConfig& s = config.scheduler;
  const double lr = config.optimizer.lr;
  const std::int64_t it = step - 1;  // DeepSpeed's last_batch_iteration
  const std::int64_t warmup = std::max<std::int64_t>(2, s.warmup_num_steps);
  const double min_lr = s.warmup_min_lr, delta = static_cast<double>(s.warmup_max_lr) - s.warmup_min_lr;
  switch (s.type) {
    case SchedulerType::none:
      return config.optimizer.lr;
    case SchedulerType::warmup_lr: {
      const double gamma = it < warmup ? warmup_gamma(s, it, warmup) : 1.0;
      return static_cast<float>(min_lr + delta * gamma);
    }
    case SchedulerType::warmup_decay_lr: {
      // After the warmup, linear decay from the peak to warmup_min_lr at total_num_steps.
      const double gamma =
          it < warmup ? warmup_gamma(s, it, warmup)
                      : std::max(0.0, static_cast<double>(s.total_num_steps - it) /
                                          std::max<double>(1.0, static_cast<double>(s.total_num_steps - warmup)));
      return static_cast<float>(min_lr + delta * gamma);
    }
    case SchedulerType::warmup_cosine_lr: {
      // A ratio of the optimizer's lr: warmup_min_ratio -> 1, then a half cosine down to
      // cos_min_ratio at total_num_steps. DeepSpeed's cosine keeps turning past the end (the
      // lr would rise again); Strata holds cos_min_ratio there.
      double ratio = 0;
      if (it < warmup) {
        ratio = s.warmup_min_ratio + warmup_gamma(s, it, warmup) * (1.0 - s.warmup_min_ratio);
      } else {
        const double progress = std::min(
            1.0, static_cast<double>(it - warmup + 1) / std::max(1.0, static_cast<double>(s.total_num_steps - warmup)));
        ratio = std::max(
            0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * (1.0 + std::cos(std::numbers::pi * progress)) / 2.0);
      }
      return static_cast<float>(lr * ratio);
    }
  }
  return config.optimizer.lr;
}

}  // namespace strata::engine
