// scheduled_lr against DeepSpeed's lr_schedules.py formulas, values computed by hand (in
// the comments) at steps in the warmup, at its end, in the decay and past the end.
// Strata's step n runs at DeepSpeed's last_batch_iteration n - 1.
#include "tests/engine/config_test_util.h"

#include <limits>

using namespace strata;
using namespace strata::engine;
using namespace strata::engine::test;

namespace {

// float result of a double computation from float inputs: a few ulps of relative error.
Approx near(double expected) { return Approx(expected).epsilon(4 * std::numeric_limits<float>::epsilon()); }

EngineConfig with_schedule(const std::string& optimizer_params, const std::string& scheduler) {
  return parse(with_batch(R"("optimizer": {"type": "AdamW", "params": )" + optimizer_params + "}, " +
                          R"("scheduler": )" + scheduler));
}

}  // namespace

TEST_CASE("WarmupLR warms up logarithmically from min to max, then holds", "[config][lr]") {
  const EngineConfig c = with_schedule(R"({"lr": 0.05})", R"({"type": "WarmupLR", "params":
      {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 10}})");
  CHECK(scheduled_lr(c, 1) == near(0.001));                // min + 0.009 * log(1)/log(10)
  CHECK(scheduled_lr(c, 2) == near(0.00370926996097583));  // min + 0.009 * log10(2)
  CHECK(scheduled_lr(c, 5) == near(0.00729073003902417));  // min + 0.009 * log10(5)
  CHECK(scheduled_lr(c, 10) == near(0.01));                // iteration 9: log(10)/log(10)
  CHECK(scheduled_lr(c, 11) == near(0.01));
  CHECK(scheduled_lr(c, 100000) == near(0.01));
}

TEST_CASE("WarmupLR warms up linearly when warmup_type is linear", "[config][lr]") {
  const EngineConfig c = with_schedule(R"({"lr": 0.05})", R"({"type": "WarmupLR", "params":
      {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "linear"}})");
  CHECK(scheduled_lr(c, 1) == near(0.001));    // iteration 0: 0/10
  CHECK(scheduled_lr(c, 6) == near(0.0055));   // 0.001 + 0.009 * 5/10
  CHECK(scheduled_lr(c, 10) == near(0.0091));  // 0.001 + 0.009 * 9/10
  CHECK(scheduled_lr(c, 11) == near(0.01));
}

TEST_CASE("WarmupLR peaks at the optimizer's lr when warmup_max_lr is not given", "[config][lr]") {
  const EngineConfig c = with_schedule(R"({"lr": 0.02})", R"({"type": "WarmupLR", "params": {"warmup_num_steps": 4}})");
  CHECK(c.scheduler.warmup_max_lr == 0.02f);
  CHECK(scheduled_lr(c, 1) == 0.0f);
  CHECK(scheduled_lr(c, 2) == near(0.01));  // 0.02 * log(2)/log(4)
  CHECK(scheduled_lr(c, 5) == near(0.02));
}

TEST_CASE("WarmupLR warms up over at least 2 steps, as DeepSpeed does", "[config][lr][boundary]") {
  const EngineConfig c = with_schedule(R"({"lr": 0.01})", R"({"type": "WarmupLR", "params":
      {"warmup_max_lr": 0.01, "warmup_num_steps": 0}})");
  CHECK(scheduled_lr(c, 1) == 0.0f);        // log(1)/log(2)
  CHECK(scheduled_lr(c, 2) == near(0.01));  // log(2)/log(2)
  CHECK(scheduled_lr(c, 3) == near(0.01));
}

TEST_CASE("WarmupDecayLR decays linearly to 0 at total_num_steps", "[config][lr]") {
  const EngineConfig c = with_schedule(R"({"lr": 0.05})", R"({"type": "WarmupDecayLR", "params":
      {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 10, "total_num_steps": 110,
       "warmup_type": "linear"}})");
  CHECK(scheduled_lr(c, 1) == 0.0f);
  CHECK(scheduled_lr(c, 6) == near(0.005));     // 0.01 * 5/10
  CHECK(scheduled_lr(c, 11) == near(0.01));     // iteration 10: (110 - 10) / (110 - 10)
  CHECK(scheduled_lr(c, 12) == near(0.0099));   // (110 - 11) / 100
  CHECK(scheduled_lr(c, 61) == near(0.005));    // (110 - 60) / 100
  CHECK(scheduled_lr(c, 110) == near(0.0001));  // (110 - 109) / 100
  CHECK(scheduled_lr(c, 111) == 0.0f);
  CHECK(scheduled_lr(c, 5000) == 0.0f);
}

TEST_CASE("WarmupDecayLR peaks at 0.001 when warmup_max_lr is not given", "[config][lr]") {
  const EngineConfig c = with_schedule(R"({"lr": 0.05})", R"({"type": "WarmupDecayLR", "params":
      {"warmup_num_steps": 10, "total_num_steps": 110}})");
  CHECK(scheduled_lr(c, 2) == near(0.000301029995663981));  // 0.001 * log10(2)
  CHECK(scheduled_lr(c, 11) == near(0.001));
}

TEST_CASE("WarmupCosineLR follows a half cosine from the optimizer's lr to cos_min_ratio", "[config][lr]") {
  const EngineConfig c = with_schedule(R"({"lr": 0.001})", R"({"type": "WarmupCosineLR", "params":
      {"warmup_num_steps": 10, "total_num_steps": 110, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.1,
       "warmup_type": "linear"}})");
  CHECK(scheduled_lr(c, 1) == near(0.0001));   // ratio 0.1 + 0 * 0.9
  CHECK(scheduled_lr(c, 6) == near(0.00055));  // 0.1 + 0.5 * 0.9
  // iteration 10: progress (10 - 10 + 1) / 100; (1 + cos(0.01 pi)) / 2 = 0.999753280182866
  CHECK(scheduled_lr(c, 11) == near(0.000999777952164579));
  CHECK(scheduled_lr(c, 60) == near(0.00055));  // progress 0.5: 0.1 + 0.9 * 0.5
  CHECK(scheduled_lr(c, 110) == near(0.0001));  // progress 1: cos(pi) = -1
  CHECK(scheduled_lr(c, 300) == near(0.0001));  // held at cos_min_ratio past the end
}

TEST_CASE("WarmupCosineLR warms up logarithmically by default", "[config][lr]") {
  const EngineConfig c = with_schedule(R"({"lr": 0.001})", R"({"type": "WarmupCosineLR", "params":
      {"warmup_num_steps": 10, "total_num_steps": 110, "warmup_min_ratio": 0.1}})");
  CHECK(c.scheduler.cos_min_ratio == 1e-4f);                // DeepSpeed's default
  CHECK(scheduled_lr(c, 5) == near(0.000729073003902417));  // 0.1 + 0.9 * log10(5)
}

TEST_CASE("without a scheduler the lr is the optimizer's", "[config][lr][boundary]") {
  const EngineConfig c = parse(with_batch(R"("optimizer": {"type": "Lion", "params": {"lr": 3e-4}})"));
  CHECK(scheduled_lr(c, 1) == 3e-4f);
  CHECK(scheduled_lr(c, 1000000) == 3e-4f);
  try {
    scheduled_lr(c, 0);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("count from 1"));
  }
}
