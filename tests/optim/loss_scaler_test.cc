// The loss scaler walks DeepSpeed's exact scale sequence through overflow, hysteresis,
// growth and the floor; static scaling never moves; state survives a checkpoint round trip.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "optim/loss_scaler.h"
#include "runtime/core/error.h"

using namespace strata;
using optim::GrowthRule;
using optim::LossScaler;
using optim::LossScalerConfig;

namespace {

// Runs the pattern ('O' overflow, 'C' clean) and returns the scale each step used.
std::vector<double> walk(LossScaler& s, const std::string& pattern, std::vector<bool>* skipped = nullptr) {
  std::vector<double> used;
  for (char c : pattern) {
    used.push_back(s.scale());
    const bool skip = s.update(c == 'O');
    if (skipped) skipped->push_back(skip);
  }
  return used;
}

LossScalerConfig small_config(GrowthRule rule) {
  LossScalerConfig c;
  c.initial_scale_power = 4;  // 16
  c.scale_window = 3;
  c.hysteresis = 2;
  c.min_scale = 2;
  c.raise_at_min_scale = false;
  c.growth = rule;
  return c;
}

// Overflows at 0, 1, 9, 11, 12, 13, 14, 15.
const std::string kPattern = "OOCCCCCCCOCOOOOOCCCC";

}  // namespace

TEST_CASE("dynamic loss scaling follows DeepSpeed's sequence through hysteresis, growth and the floor",
          "[optim][regression]") {
  LossScaler s(small_config(GrowthRule::deepspeed));
  std::vector<bool> skipped;
  const auto used = walk(s, kPattern, &skipped);
  // 0: hysteresis 2 -> 1, scale kept. 1: halve. 5: clean run 4 since the overflow at 1, minus
  // one = 3 = window: grow, hysteresis refilled. 8: 6 = 2 windows: grow. 9: hysteresis
  // spent. 10: clean, no refill. 11..14: halve each time. 15: at the floor, stays. 19: grow.
  const std::vector<double> want = {16, 16, 8, 8, 8, 8, 16, 16, 16, 32, 32, 32, 16, 8, 4, 2, 2, 2, 2, 2};
  CHECK(used == want);
  CHECK(s.scale() == 4);
  for (std::size_t i = 0; i < kPattern.size(); ++i) CHECK(skipped[i] == (kPattern[i] == 'O'));
}

TEST_CASE("the legacy DeepSpeed growth rule grows on every window-th clean step", "[optim][regression]") {
  LossScaler s(small_config(GrowthRule::deepspeed_legacy));
  const auto used = walk(s, kPattern);
  const std::vector<double> want = {16, 16, 8, 8, 8, 16, 16, 16, 32, 32, 32, 32, 16, 8, 4, 2, 2, 2, 2, 4};
  CHECK(used == want);
  CHECK(s.scale() == 4);
}

TEST_CASE("consecutive hysteresis refills on every clean step", "[optim]") {
  LossScalerConfig c = small_config(GrowthRule::deepspeed);
  c.scale_window = 100;
  LossScaler plain(c);
  CHECK(walk(plain, "OCOCOO") == std::vector<double>{16, 16, 16, 8, 8, 4});
  CHECK(plain.scale() == 2);
  c.consecutive_hysteresis = true;
  LossScaler consecutive(c);
  CHECK(walk(consecutive, "OCOCOO") == std::vector<double>{16, 16, 16, 16, 16, 16});
  CHECK(consecutive.scale() == 8);
}

TEST_CASE("DeepSpeed's defaults start at 2^16 and double after the window of clean steps", "[optim]") {
  LossScaler current;
  CHECK(current.scale() == 65536);
  for (int i = 0; i < 1000; ++i) REQUIRE_FALSE(current.update(false));
  CHECK(current.scale() == 65536);
  (void)current.update(false);
  CHECK(current.scale() == 131072);

  LossScalerConfig legacy;
  legacy.growth = GrowthRule::deepspeed_legacy;
  LossScaler old(legacy);
  for (int i = 0; i < 1000; ++i) (void)old.update(false);
  CHECK(old.scale() == 131072);
}

TEST_CASE("an overflow at the minimum scale is an error unless told to keep going", "[optim][negative]") {
  LossScalerConfig c;
  c.initial_scale_power = 3;
  c.min_scale = 4;
  c.hysteresis = 1;
  LossScaler s(c);
  CHECK(s.update(true));
  CHECK(s.scale() == 4);
  try {
    (void)s.update(true);
    FAIL("expected an error at the minimum scale");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("min_loss_scale") != std::string::npos);
  }
  c.raise_at_min_scale = false;
  LossScaler keep(c);
  CHECK(walk(keep, "OOO") == std::vector<double>{8, 4, 4});
}

TEST_CASE("static loss scaling keeps its scale and still skips overflowing steps", "[optim]") {
  const auto c = optim::loss_scaler_config_from_deepspeed(128, 16, 1000, 2, 1);
  LossScaler s(c);
  CHECK_FALSE(s.dynamic());
  CHECK(s.scale() == 128);
  CHECK(s.update(true));
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 128);
  const auto d = optim::loss_scaler_config_from_deepspeed(0, 12, 500, 3, 0.5);
  LossScaler dyn(d);
  CHECK(dyn.dynamic());
  CHECK(dyn.scale() == 4096);
}

TEST_CASE("a restored loss scaler continues the same sequence", "[optim]") {
  LossScaler a(small_config(GrowthRule::deepspeed));
  (void)walk(a, kPattern.substr(0, 10));
  LossScaler b(small_config(GrowthRule::deepspeed));
  b.restore(a.state());
  CHECK(walk(a, kPattern.substr(10)) == walk(b, kPattern.substr(10)));
}

TEST_CASE("loss scaler settings out of range are rejected by name", "[optim][negative]") {
  LossScalerConfig c;
  c.hysteresis = 0;
  CHECK_THROWS_WITH(LossScaler(c), Catch::Contains("hysteresis"));
  c = {};
  c.scale_window = 0;
  CHECK_THROWS_WITH(LossScaler(c), Catch::Contains("loss_scale_window"));
  c = {};
  c.min_scale = 0;
  CHECK_THROWS_WITH(LossScaler(c), Catch::Contains("min_loss_scale"));
  CHECK_THROWS_WITH(optim::loss_scaler_config_from_deepspeed(-1, 16, 1000, 2, 1), Catch::Contains("loss_scale"));
}
