// DeepSpeed's batch rule, train_batch_size = micro x accumulation x world size, in every
// combination of given, absent and "auto" keys, at world sizes 1, 2 and 4.
#include "tests/engine/config_test_util.h"

using namespace strata;
using namespace strata::engine;
using namespace strata::engine::test;

namespace {

struct Batch {
  std::int64_t train, micro, accum;
  bool operator==(const Batch&) const = default;
};

Batch batch_of(const std::string& keys, int world) {
  const EngineConfig c = parse("{" + keys + "}", facts(world));
  return {c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps};
}

}  // namespace

namespace Catch {
template <> struct StringMaker<Batch> {
  static std::string convert(const Batch& b) {
    return "{train " + std::to_string(b.train) + ", micro " + std::to_string(b.micro) + ", accum " +
           std::to_string(b.accum) + "}";
  }
};
}  // namespace Catch

TEST_CASE("any two batch keys determine the third", "[config]") {
  const int w = GENERATE(1, 2, 4);
  CAPTURE(w);
  CHECK(batch_of(R"("train_batch_size": 24, "train_micro_batch_size_per_gpu": 2)", w) == Batch{24, 2, 12 / w});
  CHECK(batch_of(R"("train_batch_size": 24, "gradient_accumulation_steps": 3)", w) == Batch{24, 8 / w, 3});
  CHECK(batch_of(R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3)", w) == Batch{6 * w, 2, 3});
  const std::string all = R"("train_batch_size": 24, "train_micro_batch_size_per_gpu": 2, )"
                          R"("gradient_accumulation_steps": )" +
                          std::to_string(12 / w);
  CHECK(batch_of(all, w) == Batch{24, 2, 12 / w});
}

TEST_CASE("one batch key alone takes DeepSpeed's defaults", "[config]") {
  const int w = GENERATE(1, 2, 4);
  CAPTURE(w);
  CHECK(batch_of(R"("train_batch_size": 16)", w) == Batch{16, 16 / w, 1});
  CHECK(batch_of(R"("train_micro_batch_size_per_gpu": 3)", w) == Batch{3 * w, 3, 1});
  CHECK(batch_of(R"("train_batch_size": 8.0)", w) == Batch{8, 8 / w, 1});  // a whole float is a whole number
}

TEST_CASE("auto batch keys are derived from the other two", "[config]") {
  const int w = GENERATE(1, 2, 4);
  CAPTURE(w);
  CHECK(batch_of(R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
                    "gradient_accumulation_steps": 3)",
                 w) == Batch{6 * w, 2, 3});
  CHECK(batch_of(R"("train_batch_size": 24, "train_micro_batch_size_per_gpu": "auto",
                    "gradient_accumulation_steps": 3)",
                 w) == Batch{24, 8 / w, 3});
  CHECK(batch_of(R"("train_batch_size": 24, "train_micro_batch_size_per_gpu": 2,
                    "gradient_accumulation_steps": "auto")",
                 w) == Batch{24, 2, 12 / w});
}

TEST_CASE("auto batch keys without two numbers take the Hugging Face trainer's defaults", "[config]") {
  const int w = GENERATE(1, 2, 4);
  CAPTURE(w);
  // per_device_train_batch_size 8 and gradient_accumulation_steps 1, as the trainer fills them.
  CHECK(batch_of(R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                    "gradient_accumulation_steps": "auto")",
                 w) == Batch{8 * w, 8, 1});
  CHECK(batch_of(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto")", w) == Batch{32, 8, 4 / w});
  CHECK(batch_of(R"("train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto")", w) ==
        Batch{4 * w, 4, 1});
  const EngineConfig c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})");
  CHECK_THAT(c.resolved,
             Catch::VectorContains(std::string("train_micro_batch_size_per_gpu = 8 (the Hugging Face trainer's default "
                                               "per_device_train_batch_size)")));
}

TEST_CASE("inconsistent batch keys show the arithmetic", "[config][negative]") {
  const int w = GENERATE(1, 2, 4);
  CAPTURE(w);
  CHECK(error_of(R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 5})",
                 facts(w)) ==
        "ds_config.json: train_batch_size = 24 does not equal train_micro_batch_size_per_gpu x "
        "gradient_accumulation_steps x world size = 2 x 5 x " +
            std::to_string(w) + " = " + std::to_string(10 * w) +
            ": fix one of them, or leave one out and it is derived from the other two");
  CHECK(
      error_of(R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 5})", facts(w)) ==
      "ds_config.json: train_batch_size = 24 is not a multiple of train_micro_batch_size_per_gpu x world size = 5 x " +
          std::to_string(w) + " = " + std::to_string(5 * w) +
          ": DeepSpeed's rule is train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps "
          "x world size");
  CHECK_THAT(error_of(R"({"train_batch_size": 24, "gradient_accumulation_steps": 7})", facts(w)),
             Catch::Contains("train_batch_size = 24 is not a multiple of gradient_accumulation_steps x world size"));
}

TEST_CASE("batch sizes that cannot work are errors", "[config][negative][boundary]") {
  CHECK_THAT(error_of(R"({"train_batch_size": 6})", facts(4)),
             Catch::Contains("train_batch_size = 6 is not a multiple of the world size = 4"));
  CHECK(error_of(R"({"zero_optimization": {"stage": 1}})") ==
        "ds_config.json: no batch size: give train_batch_size or train_micro_batch_size_per_gpu (or two of them "
        "with gradient_accumulation_steps)");
  CHECK_THAT(error_of(R"({"gradient_accumulation_steps": 4})"),
             Catch::Contains("gradient_accumulation_steps alone does not determine the batch"));
  CHECK(error_of(R"({"train_batch_size": 0})") ==
        "ds_config.json: train_batch_size = 0 is out of range: use a whole number >= 1");
  CHECK(error_of(R"({"train_micro_batch_size_per_gpu": "8"})") ==
        "ds_config.json: train_micro_batch_size_per_gpu = \"8\" has the wrong type: use a whole number >= 1");
  CHECK_THAT(error_of(R"({"train_micro_batch_size_per_gpu": 2.5})"), Catch::Contains("is not a whole number"));
  CHECK_THAT(error_of(R"({"train_micro_batch_size_per_gpu": 4000000000, "gradient_accumulation_steps": 4000000000})",
                      facts(4)),
             Catch::Contains("does not fit in 64 bits"));
}

TEST_CASE("a misspelled batch key is reported before the missing batch size", "[config][negative]") {
  CHECK(error_of(R"({"train_batch_sise": 8})") ==
        "ds_config.json: unknown key 'train_batch_sise'; did you mean 'train_batch_size'?");
  CHECK(error_of(R"({"train_batch_size": 8, "zero_optimization": {"stgae": 3, "offload_param": {"device": "cpu"}}})") ==
        "ds_config.json: unknown key 'zero_optimization.stgae'; did you mean 'zero_optimization.stage'?");
}
