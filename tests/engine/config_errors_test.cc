// The third class of keys and bad values: unknown keys name the nearest known one, bad
// values name key, value and range, "auto" is refused by name, and file and JSON errors
// name the path and position.
#include "tests/engine/config_test_util.h"

#include <filesystem>
#include <fstream>

using namespace strata;
using namespace strata::engine;
using namespace strata::engine::test;

TEST_CASE("misspelled keys name the nearest known key at every level", "[config][negative]") {
  CHECK(error_of(with_batch(R"("zero_optimisation": {"stage": 2})")) ==
        "ds_config.json: unknown key 'zero_optimisation'; did you mean 'zero_optimization'?");
  CHECK(error_of(with_batch(R"("zero_optimization": {"stag": 2})")) ==
        "ds_config.json: unknown key 'zero_optimization.stag'; did you mean 'zero_optimization.stage'?");
  CHECK(error_of(with_batch(R"("zero_optimization": {"stage": 3, "offload_param": {"devcie": "cpu"}})")) ==
        "ds_config.json: unknown key 'zero_optimization.offload_param.devcie'; did you mean "
        "'zero_optimization.offload_param.device'?");
  CHECK(error_of(with_batch(R"("optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}})")) ==
        "ds_config.json: unknown key 'optimizer.params.weight_decy'; did you mean 'optimizer.params.weight_decay'?");
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}})")),
             Catch::Contains("did you mean 'scheduler.params.warmup_num_steps'?"));
  CHECK_THAT(error_of(with_batch(R"("aio": {"queue_dept": 8})")), Catch::Contains("did you mean 'aio.queue_depth'?"));
  CHECK_THAT(error_of(with_batch(R"("fp16": {"loss_scale_windows": 8})")),
             Catch::Contains("did you mean 'fp16.loss_scale_window'?"));
  CHECK_THAT(error_of(with_batch(R"("memory_budget": {"hots": "8GiB"})")),
             Catch::Contains("did you mean 'memory_budget.host'?"));
  CHECK_THAT(error_of(R"({"Train_Batch_Size": 8})"), Catch::Contains("did you mean 'train_batch_size'?"));
  CHECK_THAT(error_of(with_batch(R"("gradient_cliping": 1.0)")), Catch::Contains("did you mean 'gradient_clipping'?"));
}

TEST_CASE("a key at the wrong level points to where it belongs", "[config][negative]") {
  CHECK(error_of(with_batch(R"("stage": 3)")) ==
        "ds_config.json: unknown key 'stage'; did you mean 'zero_optimization.stage'?");
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"gradient_clipping": 1.0})")),
             Catch::Contains("did you mean 'gradient_clipping'?"));
  CHECK_THAT(error_of(with_batch(
                 R"("zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu", "buffer_size": 4}})")),
             Catch::Contains("did you mean 'zero_optimization.offload_param.buffer_size'?"));
}

TEST_CASE("an unknown key with nothing close lists the valid keys", "[config][negative]") {
  CHECK(error_of(with_batch(R"("memory_budget": {"gpu_ram": "8GiB"})")) ==
        "ds_config.json: unknown key 'memory_budget.gpu_ram'; the keys known in 'memory_budget' are: device, "
        "host, nvme");
}

TEST_CASE("an unknown top-level key is ignored with a warning, as DeepSpeed ignores it; a near miss is not",
          "[config]") {
  CHECK(parse(with_batch(R"("comms_config": {"verbose": false}, "zero_optimization": {"stage": 2})")).zero.stage == 2);
  CHECK_THAT(error_of(with_batch(R"("zero_optimisation": {"stage": 2})")),
             Catch::Contains("did you mean 'zero_optimization'?"));
}

TEST_CASE("keys that belong to another optimizer or scheduler type say so", "[config][negative]") {
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "Lion", "params": {"eps": 1e-8}})")),
             Catch::Contains("optimizer.params.eps = 1e-08 is not a parameter of Lion"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "Adagrad", "params": {"betas": [0.9, 0.9]}})")),
             Catch::Contains("not a parameter of Adagrad"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}})")),
             Catch::Contains("contradicts optimizer.type \"AdamW\""));
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100,
      "warmup_max_lr": 0.1}})")),
             Catch::Contains("scheduler.params.warmup_max_lr = 0.1 is not a parameter of WarmupCosineLR"));
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 100}})")),
             Catch::Contains("not a parameter of WarmupLR"));
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "WarmupDecayLR", "params": {}})")),
             Catch::Contains("scheduler.params.total_num_steps is required by WarmupDecayLR"));
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100,
      "warmup_num_steps": 100}})")),
             Catch::Contains("scheduler.params.total_num_steps = 100 is out of range"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"params": {"lr": 0.1}})")),
             Catch::Contains("optimizer.type is missing"));
}

TEST_CASE("bad values name the key, the value and the allowed range", "[config][negative][boundary]") {
  CHECK(error_of(with_batch(R"("zero_optimization": {"stage": 4})")) ==
        "ds_config.json: zero_optimization.stage = 4 is out of range: use 0, 1, 2 or 3");
  CHECK(error_of(with_batch(R"("zero_optimization": {"stage": -1})")) ==
        "ds_config.json: zero_optimization.stage = -1 is out of range: use 0, 1, 2 or 3");
  CHECK(error_of(with_batch(R"("zero_optimization": {"stage": "3"})")) ==
        "ds_config.json: zero_optimization.stage = \"3\" has the wrong type: use 0, 1, 2 or 3");
  CHECK(error_of(with_batch(R"("zero_optimization": {"stage": 2.5})")) ==
        "ds_config.json: zero_optimization.stage = 2.5 is not a whole number: use 0, 1, 2 or 3");
  CHECK(error_of(with_batch(R"("fp16": {"enabled": "yes"})")) ==
        "ds_config.json: fp16.enabled = \"yes\" has the wrong type: use true or false");
  CHECK(
      error_of(with_batch(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}})")) ==
      "ds_config.json: zero_optimization.offload_param.device = \"gpu\" is not a valid choice: use none, cpu or nvme");
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"reduce_bucket_size": 5.5})")),
             Catch::Contains("zero_optimization.reduce_bucket_size = 5.5 is not a whole number"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"reduce_bucket_size": 0})")),
             Catch::Contains("zero_optimization.reduce_bucket_size = 0 is out of range: use a whole number of "
                             "elements >= 1"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"reduce_bucket_size": "lots"})")),
             Catch::Contains("ds_config.json: zero_optimization.reduce_bucket_size = 'lots'"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"sub_group_size": -5})")),
             Catch::Contains("zero_optimization.sub_group_size = -5 is out of range"));
  CHECK_THAT(error_of(with_batch(R"("memory_budget": {"host": "8 parsecs"})")),
             Catch::Contains("memory_budget.host = '8 parsecs' has unknown unit"));
  CHECK_THAT(error_of(with_batch(R"("memory_budget": {"device": -1})")),
             Catch::Contains("memory_budget.device = -1 is out of range"));
  CHECK_THAT(error_of(with_batch(R"("aio": {"block_size": 1000})")),
             Catch::Contains("aio.block_size = 1000 is out of range"));
  CHECK_THAT(error_of(with_batch(R"("aio": {"block_size": 6000})")),
             Catch::Contains("aio.block_size = 6000 is not a multiple of 4096"));
  CHECK_THAT(error_of(with_batch(R"("aio": {"queue_depth": 0})")),
             Catch::Contains("aio.queue_depth = 0 is out of range: use a whole number from 1 to 32768"));
  CHECK_THAT(error_of(with_batch(R"("gradient_clipping": -1)")),
             Catch::Contains("gradient_clipping = -1 is out of range: use a number >= 0"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "AdamW", "params": {"lr": -0.1}})")),
             Catch::Contains("optimizer.params.lr = -0.1 is out of range"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "AdamW", "params": {"betas": [0.9]}})")),
             Catch::Contains("optimizer.params.betas = [0.9] has the wrong type: use two numbers"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}})")),
             Catch::Contains("optimizer.params.betas = [0.9,1.0] is out of range"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"stage": 3, "offload_param": {"buffer_count": 0}})")),
             Catch::Contains("zero_optimization.offload_param.buffer_count = 0 is out of range"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"stage": 3, "offload_optimizer": {"ratio": 1.5}})")),
             Catch::Contains("zero_optimization.offload_optimizer.ratio = 1.5 is partial optimizer offload, which "
                             "Strata does not support"));
  CHECK_THAT(error_of(with_batch(R"("fp16": {"min_loss_scale": 0})")), Catch::Contains("fp16.min_loss_scale = 0"));
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}})")),
             Catch::Contains("scheduler.params.warmup_type = \"cosine\" is not a valid choice: use log or linear"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": 3)")),
             Catch::Contains("zero_optimization = 3 has the wrong type: expected an object"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": true)")),
             Catch::Contains("zero_optimization = true is DeepSpeed's old format"));
  CHECK_THAT(error_of(with_batch(R"("fp16": {"enabled": true}, "bf16": {"enabled": true})")),
             Catch::Contains("fp16.enabled and bf16.enabled are both true"));
}

TEST_CASE("auto takes the Hugging Face trainer's default where nothing else gives it, and is said", "[config]") {
  const EngineConfig c = parse(with_batch(R"("optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
      "eps": "auto", "weight_decay": "auto"}}, "gradient_clipping": "auto", "fp16": {"enabled": "auto"},
      "bf16": {"enabled": "auto"}, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
      "warmup_max_lr": "auto", "warmup_num_steps": "auto"}})"));
  CHECK(c.optimizer.lr == 5e-5f);
  CHECK(c.optimizer.beta1 == 0.9f);
  CHECK(c.optimizer.beta2 == 0.999f);
  CHECK(c.optimizer.eps == 1e-8f);
  CHECK(c.optimizer.weight_decay == 0.0f);
  CHECK(c.gradient_clipping == 1.0f);
  CHECK_FALSE(c.fp16.enabled);
  CHECK_FALSE(c.bf16);
  CHECK(c.resolved.size() == 10);
  CHECK_THAT(c.resolved,
             Catch::VectorContains(std::string("scheduler.params.warmup_max_lr = 5e-05 (the optimizer's lr)")));
  CHECK_THAT(
      c.resolved,
      Catch::VectorContains(std::string("gradient_clipping = 1.0 (the Hugging Face trainer's default max_grad_norm)")));
}

TEST_CASE("auto is refused by name where neither Strata nor the trainer's defaults give it", "[config][negative]") {
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}})")),
             Catch::Contains("scheduler.params.total_num_steps = \"auto\""));
  ModelFacts f = facts();
  f.total_steps = 300;
  CHECK(parse(with_batch(R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}})"), f)
            .scheduler.total_num_steps == 300);
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"stage": "auto"})")),
             Catch::Contains("zero_optimization.stage = \"auto\""));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "auto"})")), Catch::Contains("optimizer.type = \"auto\""));
}

TEST_CASE("JSON syntax errors name the file, line, column and byte", "[config][negative]") {
  const std::string bad = "{\n  \"train_batch_size\": 8\n  \"steps_per_print\": 1\n}";
  const std::string message = error_of(bad);
  // nlohmann reports the position after the unexpected token: the end of "steps_per_print".
  CHECK_THAT(message, Catch::StartsWith("ds_config.json: invalid JSON at line 3, column 19 (byte 45): "));
  CHECK_THAT(message, Catch::Contains("expected '}'"));
  CHECK_THAT(error_of(""), Catch::StartsWith("ds_config.json: invalid JSON at line 1"));
  CHECK_THAT(error_of("{\"train_batch_size\": 8,}"), Catch::Contains("invalid JSON"));
  CHECK(error_of("[1, 2]") == "ds_config.json: the top level must be a JSON object {...}, not array");
  CHECK_THAT(error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 2}})"),
             Catch::Contains("ds_config.json: key 'zero_optimization.stage' appears twice"));
  CHECK_THAT(error_of(R"({"train_batch_size": 8, "train_batch_size": 8})"),
             Catch::Contains("key 'train_batch_size' appears twice"));
}

TEST_CASE("load_config names the path of a missing, unreadable or invalid file", "[config][negative]") {
  strata::test::TempDir dir("strata-config-test");
  const std::string missing = dir.file("nope.json");
  try {
    load_config(missing, facts());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("config file '" + missing + "' does not exist"));
  }
  try {
    load_config(dir.path(), facts());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("config file '" + dir.path() + "' is a directory"));
  }
  const std::string broken = dir.file("broken.json");
  std::ofstream(broken) << "{\n\"train_batch_size\": 8,\n";
  try {
    load_config(broken, facts());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::StartsWith(broken + ": invalid JSON at line 3"));
  }
  const std::string good = dir.file("ds_config.json");
  std::ofstream(good) << R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}})";
  const EngineConfig c = load_config(good, facts(2));
  CHECK(c.train_batch_size == 4);
  CHECK(c.zero.stage == 2);
  std::ofstream(good) << R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stag": 2}})";
  CHECK_THAT(([&] {
               try {
                 load_config(good, facts());
               } catch (const Error& e) {
                 return std::string(e.what());
               }
               return std::string("no error");
             }()),
             Catch::StartsWith(good + ": unknown key 'zero_optimization.stag'"));
}

TEST_CASE("a world size below 1 is refused", "[config][negative][boundary]") {
  CHECK_THAT(error_of(R"({"train_batch_size": 8})", facts(0)), Catch::Contains("world size 0 is not valid"));
}
