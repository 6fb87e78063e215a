// Loss scaling for fp16 training, with DeepSpeed's semantics and config names (fp16.loss_scale,
// initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale),
// so a DeepSpeed run and a Strata run walk the same scale sequence. bf16 and fp32 need no
// scaling: use a static scale of 1.
#pragma once

#include <cstdint>

namespace strata::optim {

// How clean steps count toward growth. DeepSpeed changed this once, so both are offered:
//   deepspeed: current DeepSpeed (DynamicLossScaler, and its fused fp16 optimizer for years):
//     grow when (iteration - last_overflow_iteration - 1) is a positive multiple of
//     scale_window, i.e. on the (window+1)-th clean step after an overflow or the start.
//   deepspeed_legacy: DeepSpeed's DynamicLossScaler before that change (and PyTorch's
//     GradScaler): grow when (iteration - last_overflow_iteration) is a multiple of the
//     window, i.e. on every window-th consecutive clean step.
enum class GrowthRule { deepspeed, deepspeed_legacy };

struct LossScalerConfig {
  bool dynamic = true;
  double static_scale = 1.0;            // the scale when !dynamic (DeepSpeed fp16.loss_scale > 0)
  int initial_scale_power = 16;         // dynamic: the scale starts at 2^initial_scale_power
  std::int64_t scale_window = 1000;     // clean steps between growths
  int hysteresis = 2;                   // overflows tolerated before the scale shrinks
  bool consecutive_hysteresis = false;  // refill the hysteresis on every clean step
  double min_scale = 1.0;               // floor (DeepSpeed min_loss_scale)
  double scale_factor = 2.0;
  GrowthRule growth = GrowthRule::deepspeed;
  // Overflow with the scale already at the floor and no hysteresis left: throw, as DeepSpeed's
  // DynamicLossScaler does ("cannot decrease scale anymore"); false: stay at the floor.
  bool raise_at_min_scale = true;
};

// DeepSpeed's fp16 block: loss_scale 0 means dynamic.
LossScalerConfig loss_scaler_config_from_deepspeed(double loss_scale, int initial_scale_power,
                                                   std::int64_t loss_scale_window, int hysteresis,
                                                   double min_loss_scale, bool consecutive_hysteresis = false);

// Protocol: each step, scale the loss by scale() before backward, find whether any gradient
// overflowed on any rank (grad_norm.h, all-reduced), then call update(overflow) exactly once;
// it returns true when the step must be skipped (overflow: the optimizer must not run), and
// moves the scale for the next step:
//   overflow: if hysteresis is exhausted (hysteresis == 1 or one left), scale =
//     max(scale / factor, min_scale) (or throw at the floor, see raise_at_min_scale); else
//     one unit of hysteresis is spent. The overflow's iteration is remembered.
//   clean:  with consecutive_hysteresis, hysteresis is refilled. When the growth rule says the
//     clean run is long enough (see GrowthRule), the scale grows by factor and (without
//     consecutive_hysteresis) hysteresis is refilled. The scale has no ceiling, as in DeepSpeed.
// Static scaling never moves the scale; an overflow still skips the step.
class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config = {});

  double scale() const noexcept { return scale_; }
  bool dynamic() const noexcept { return config_.dynamic; }
  const LossScalerConfig& config() const noexcept { return config_; }
  [[nodiscard]] bool update(bool overflow);

  // Everything a checkpoint needs to resume the same sequence.
  struct State {
    double scale = 1.0;
    std::int64_t iteration = 0;
    std::int64_t last_overflow_iteration = -1;
    int hysteresis_left = 1;
  };
  State state() const noexcept { return {scale_, iteration_, last_overflow_, hysteresis_left_}; }
  void restore(const State& state);

 private:
  LossScalerConfig config_;
  double scale_;
  std::int64_t iteration_ = 0;
  std::int64_t last_overflow_ = -1;
  int hysteresis_left_;
};

}  // namespace strata::optim
