// The second class of keys: DeepSpeed settings Strata does not act on are accepted and
// listed in one notice, but only where ignoring them cannot change what is trained.
#include "tests/engine/config_test_util.h"

#include "runtime/core/log.h"

using namespace strata;
using namespace strata::engine;
using namespace strata::engine::test;

TEST_CASE("DeepSpeed's logging, monitoring and profiling keys are listed in one notice", "[config]") {
  const std::string text = R"({
    "train_batch_size": 8,
    "steps_per_print": 10, "wall_clock_breakdown": true, "dump_state": false, "memory_breakdown": false,
    "tensorboard": {"enabled": true, "output_path": "/tmp/tb"}, "wandb": {"enabled": false},
    "csv_monitor": {"enabled": false}, "comet": {"enabled": false}, "flops_profiler": {"enabled": true},
    "comms_logger": {"enabled": true}, "activation_checkpointing": {"partition_activations": false},
    "checkpoint": {"tag_validation": "Warn"}, "zero_allow_untested_optimizer": true,
    "zero_force_ds_cpu_optimizer": false, "autotuning": {"enabled": false}, "elasticity": {"enabled": false},
    "curriculum_learning": {"enabled": false}, "data_efficiency": {"enabled": false},
    "compression_training": {}, "sparse_gradients": false, "gradient_predivide_factor": 1.0,
    "prescale_gradients": false, "communication_data_type": null, "seq_parallel_communication_data_type": "fp32",
    "amp": {"enabled": "auto", "opt_level": "auto"},
    "fp16": {"enabled": false, "auto_cast": false},
    "zero_optimization": {"stage": 1, "load_from_fp32_weights": true, "ignore_unused_parameters": true,
      "elastic_checkpoint": false, "memory_efficient_linear": true, "gather_16bit_weights_on_model_save": false,
      "zero_hpz_partition_size": 1, "zero_quantized_weights": false, "zero_quantized_gradients": false,
      "mics_shard_size": -1, "log_trace_cache_warnings": false, "use_multi_rank_bucket_allreduce": true,
      "allgather_partitions": true, "cpu_offload": false}
  })";
  const auto old_level = log_level();
  set_log_level(LogLevel::info);
  StderrCapture capture;
  const EngineConfig c = parse(text);
  const std::string log = capture.text();
  set_log_level(old_level);

  const std::vector<std::string> expected = {"wall_clock_breakdown",
                                             "dump_state",
                                             "memory_breakdown",
                                             "tensorboard",
                                             "wandb",
                                             "csv_monitor",
                                             "comet",
                                             "flops_profiler",
                                             "comms_logger",
                                             "activation_checkpointing",
                                             "checkpoint.tag_validation",
                                             "zero_allow_untested_optimizer",
                                             "zero_force_ds_cpu_optimizer",
                                             "autotuning",
                                             "elasticity",
                                             "curriculum_learning",
                                             "data_efficiency",
                                             "compression_training",
                                             "sparse_gradients",
                                             "gradient_predivide_factor",
                                             "prescale_gradients",
                                             "communication_data_type",
                                             "seq_parallel_communication_data_type",
                                             "amp",
                                             "fp16.auto_cast",
                                             "zero_optimization.load_from_fp32_weights",
                                             "zero_optimization.ignore_unused_parameters",
                                             "zero_optimization.elastic_checkpoint",
                                             "zero_optimization.memory_efficient_linear",
                                             "zero_optimization.gather_16bit_weights_on_model_save",
                                             "zero_optimization.zero_hpz_partition_size",
                                             "zero_optimization.zero_quantized_weights",
                                             "zero_optimization.zero_quantized_gradients",
                                             "zero_optimization.mics_shard_size",
                                             "zero_optimization.log_trace_cache_warnings",
                                             "zero_optimization.use_multi_rank_bucket_allreduce",
                                             "zero_optimization.allgather_partitions",
                                             "zero_optimization.cpu_offload"};
  CHECK_THAT(c.ignored_keys, Catch::UnorderedEquals(expected));
  // One notice line naming the file and every key.
  std::size_t lines = 0;
  for (std::size_t at = log.find("accepted but not used"); at != std::string::npos;
       at = log.find("accepted but not used", at + 1)) {
    ++lines;
  }
  CHECK(lines == 1);
  CHECK_THAT(log, Catch::Contains("ds_config.json: accepted but not used by Strata"));
  for (const auto& key : expected) CHECK_THAT(log, Catch::Contains(key));
}

TEST_CASE("DeepSpeed's deprecated cpu_offload switches are read as their offload blocks, and said", "[config]") {
  const EngineConfig a = parse(with_batch(R"("zero_optimization": {"stage": 2, "cpu_offload": true})"));
  CHECK(a.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(a.resolved == std::vector<std::string>{"zero_optimization.cpu_offload is deprecated: read as "
                                               "zero_optimization.offload_optimizer = {\"device\": \"cpu\", "
                                               "\"pin_memory\": false}"});
  const EngineConfig b = parse(with_batch(R"("zero_optimization": {"stage": 3, "cpu_offload": true,
    "cpu_offload_param": true, "cpu_offload_use_pin_memory": true})"));
  CHECK(b.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(b.offload_param.device == OffloadDevice::cpu);
  CHECK(b.offload_param.pin_memory);
  // fp16.auto_cast asks DeepSpeed to cast the model's inputs; Strata's trainers cast their own.
  const EngineConfig c = parse(with_batch(R"("fp16": {"enabled": true, "auto_cast": true})"));
  CHECK(c.fp16.enabled);
}

TEST_CASE("a config with only honoured keys prints no notice", "[config]") {
  const auto old_level = log_level();
  set_log_level(LogLevel::info);
  StderrCapture capture;
  const EngineConfig c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})");
  const std::string log = capture.text();
  set_log_level(old_level);
  CHECK(c.ignored_keys.empty());
  CHECK(log.find("accepted but not used") == std::string::npos);
}

TEST_CASE("ignored keys that would change the numerics are errors naming them", "[config][negative]") {
  CHECK(error_of(with_batch(R"("prescale_gradients": true)")) ==
        "ds_config.json: prescale_gradients = true would change the numerics and Strata does not support it: "
        "remove the key or set it to false");
  CHECK_THAT(error_of(with_batch(R"("gradient_predivide_factor": 2.0)")),
             Catch::Contains("gradient_predivide_factor = 2.0 would change the numerics"));
  CHECK_THAT(error_of(with_batch(R"("sparse_gradients": true)")), Catch::Contains("sparse_gradients = true"));
  CHECK_THAT(error_of(with_batch(R"("communication_data_type": "fp16")")),
             Catch::Contains("communication_data_type = \"fp16\""));
  CHECK_THAT(error_of(with_batch(R"("data_types": {"grad_accum_dtype": "bf16"})")),
             Catch::Contains("data_types.grad_accum_dtype = \"bf16\""));
  CHECK_THAT(error_of(with_batch(R"("amp": {"enabled": true, "opt_level": "O1"})")),
             Catch::Contains("amp = {\"enabled\":true") && Catch::Contains("Apex AMP is not supported"));
  CHECK_THAT(error_of(with_batch(R"("elasticity": {"enabled": true})")), Catch::Contains("elasticity = "));
  CHECK_THAT(error_of(with_batch(R"("curriculum_learning": {"enabled": true})")),
             Catch::Contains("curriculum_learning"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"zero_quantized_weights": true})")),
             Catch::Contains("zero_optimization.zero_quantized_weights = true"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"zero_hpz_partition_size": 8})")),
             Catch::Contains("zero_optimization.zero_hpz_partition_size = 8"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"mics_shard_size": 4})")),
             Catch::Contains("zero_optimization.mics_shard_size = 4"));
  CHECK_THAT(error_of(with_batch(R"("zero_optimization": {"stage": 2, "cpu_offload": true,
                                   "offload_optimizer": {"device": "nvme"}})")),
             Catch::Contains("zero_optimization.cpu_offload (deprecated) and zero_optimization.offload_optimizer are "
                             "both given: keep offload_optimizer"));
  CHECK_THAT(error_of(with_batch(R"("fp16": {"consecutive_hysteresis": true})")),
             Catch::Contains("fp16.consecutive_hysteresis = true"));
  CHECK_THAT(error_of(with_batch(R"("bf16": {"enabled": true, "check_grad_overflow": true})")),
             Catch::Contains("bf16.check_grad_overflow = true"));
  CHECK_THAT(error_of(with_batch(R"("aio": {"use_gds": true})")), Catch::Contains("aio.use_gds = true"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "AdamW", "params": {"amsgrad": true}})")),
             Catch::Contains("optimizer.params.amsgrad = true"));
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 99}})")),
             Catch::Contains("scheduler.params.last_batch_iteration = 99"));
}

TEST_CASE("DeepSpeed features Strata does not have are errors naming them", "[config][negative]") {
  CHECK_THAT(error_of(with_batch(R"("pipeline": {"stages": 2})")),
             Catch::Contains("pipeline = {\"stages\":2} is a DeepSpeed feature Strata does not support"));
  CHECK_THAT(error_of(with_batch(R"("tensor_parallel": {"autotp_size": 2})")), Catch::Contains("tensor_parallel"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}})")),
             Catch::Contains("optimizer.params.max_grad_norm") && Catch::Contains("gradient_clipping"));
  CHECK_THAT(error_of(with_batch(R"("optimizer": {"type": "OneBitAdam"})")),
             Catch::Contains("optimizer.type = \"OneBitAdam\" is a DeepSpeed optimizer Strata does not implement"));
  CHECK(parse(with_batch(R"("optimizer": {"type": "Lamb", "params": {"max_coeff": 0.3}})")).optimizer.max_coeff ==
        0.3f);
  CHECK_THAT(error_of(with_batch(R"("scheduler": {"type": "OneCycle", "params": {}})")),
             Catch::Contains("use WarmupLR, WarmupDecayLR or WarmupCosineLR"));
}
