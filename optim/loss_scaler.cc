// DeepSpeed-compatible static and dynamic loss scaling (see loss_scaler.h for the rules).
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.h"

namespace strata::optim {

LossScalerConfig loss_scaler_config_from_deepspeed(double loss_scale, int initial_scale_power,
                                                   std::int64_t loss_scale_window, int hysteresis,
                                                   double min_loss_scale, bool consecutive_hysteresis) {
  STRATA_CHECK(std::isfinite(loss_scale) && loss_scale >= 0, Errc::invalid_argument, "fp16.loss_scale ", loss_scale,
               " must be 0 (dynamic) or a positive static scale");
  LossScalerConfig c;
  c.dynamic = loss_scale == 0;
  c.static_scale = c.dynamic ? 1.0 : loss_scale;
  c.initial_scale_power = initial_scale_power;
  c.scale_window = loss_scale_window;
  c.hysteresis = hysteresis;
  c.min_scale = min_loss_scale;
  c.consecutive_hysteresis = consecutive_hysteresis;
  return c;
}

LossScaler::LossScaler(const LossScalerConfig& c) : config_(c) {
  if (c.dynamic) {
    STRATA_CHECK(c.initial_scale_power >= -126 && c.initial_scale_power <= 127, Errc::invalid_argument,
                 "fp16.initial_scale_power ", c.initial_scale_power, " is out of range [-126, 127]");
    STRATA_CHECK(c.scale_window >= 1, Errc::invalid_argument, "fp16.loss_scale_window ", c.scale_window,
                 " must be >= 1");
    STRATA_CHECK(c.hysteresis >= 1, Errc::invalid_argument, "fp16.hysteresis ", c.hysteresis, " must be >= 1");
    STRATA_CHECK(std::isfinite(c.min_scale) && c.min_scale > 0, Errc::invalid_argument, "fp16.min_loss_scale ",
                 c.min_scale, " must be finite and > 0");
    STRATA_CHECK(std::isfinite(c.scale_factor) && c.scale_factor > 1, Errc::invalid_argument, "loss scale factor ",
                 c.scale_factor, " must be finite and > 1");
    scale_ = std::ldexp(1.0, c.initial_scale_power);
  } else {
    STRATA_CHECK(std::isfinite(c.static_scale) && c.static_scale > 0, Errc::invalid_argument, "fp16.loss_scale ",
                 c.static_scale, " must be finite and > 0");
    scale_ = c.static_scale;
  }
  hysteresis_left_ = c.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!config_.dynamic) {
    ++iteration_;
    if (overflow) last_overflow_ = iteration_ - 1;
    return overflow;
  }
  if (overflow) {
    if (config_.hysteresis == 1 || hysteresis_left_ == 1) {
      STRATA_CHECK(!(scale_ == config_.min_scale && config_.raise_at_min_scale), Errc::invalid_argument,
                   "loss scale is already at fp16.min_loss_scale ", config_.min_scale,
                   " and gradients still overflow at iteration ", iteration_,
                   ": training diverged; lower the learning rate or min_loss_scale, or set "
                   "raise_at_min_scale = false to keep going at the floor");
      scale_ = std::max(scale_ / config_.scale_factor, config_.min_scale);
    } else {
      --hysteresis_left_;
    }
    last_overflow_ = iteration_;
  } else {
    if (config_.consecutive_hysteresis) hysteresis_left_ = config_.hysteresis;
    const std::int64_t clean_run = iteration_ - last_overflow_;  // clean steps including this one
    const bool grow = config_.growth == GrowthRule::deepspeed
                          ? clean_run - 1 > 0 && (clean_run - 1) % config_.scale_window == 0
                          : clean_run % config_.scale_window == 0;
    if (grow) {
      if (!config_.consecutive_hysteresis) hysteresis_left_ = config_.hysteresis;
      scale_ *= config_.scale_factor;
    }
  }
  ++iteration_;
  return overflow;
}

void LossScaler::restore(const State& s) {
  STRATA_CHECK(std::isfinite(s.scale) && s.scale > 0, Errc::invalid_argument, "loss scaler state: scale ", s.scale,
               " must be finite and > 0");
  STRATA_CHECK(s.iteration >= 0 && s.last_overflow_iteration >= -1 && s.last_overflow_iteration < s.iteration + 1,
               Errc::invalid_argument, "loss scaler state: iteration ", s.iteration, " / last overflow ",
               s.last_overflow_iteration, " are inconsistent");
  STRATA_CHECK(s.hysteresis_left >= 1, Errc::invalid_argument, "loss scaler state: hysteresis_left ", s.hysteresis_left,
               " must be >= 1");
  scale_ = s.scale;
  iteration_ = s.iteration;
  last_overflow_ = s.last_overflow_iteration;
  hysteresis_left_ = s.hysteresis_left;
}

}  // namespace strata::optim
