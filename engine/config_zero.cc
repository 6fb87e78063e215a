// zero_optimization, offload_optimizer/offload_param and aio, with DeepSpeed's names,
// aliases and defaults (deepspeed/runtime/zero/config.py, offload_config.py, swap_tensor).
// "auto" bucket sizes are derived from the hidden size as Hugging Face's trainer does.
#include <limits>

#include "engine/detail/sections.h"
#include "runtime/core/error.h"

namespace strata::engine::detail {
namespace {

// DeepSpeed keys whose one behaviour Strata always has: the value is checked as DeepSpeed
// types it (what DeepSpeed refuses, "auto" included, is refused here too), then the key is
// named once among those accepted without effect.
void bool_without_effect(ObjectReader& r, std::string_view key) {
  bool v = false;
  if (r.read_bool(key, v)) r.context().add_ignored(r.path_of(key));
}
void count_without_effect(ObjectReader& r, std::string_view key) {
  std::uint64_t v = 0;
  if (r.read_count(key, 1, v)) r.context().add_ignored(r.path_of(key));
}

// DeepSpeed names the stage-3 knobs "stage3_<name>" and accepts the bare "<name>" too.
// Returns the spelling that is present (the prefixed one when neither is); both is an error.
std::string stage3_key(ObjectReader& zero, const std::string& name) {
  const std::string prefixed = "stage3_" + name;
  const bool has_prefixed = zero.has(prefixed), has_bare = zero.has(name);
  if (has_prefixed && has_bare) {
    zero.context().fail(str_cat(zero.path_of(prefixed), " and ", zero.path_of(name),
                                " are the same setting under two names: keep one"));
  }
  return has_bare ? name : prefixed;
}

// A count that "auto" may derive from the model's hidden size (Hugging Face's formulas).
void read_count_or_hidden(ObjectReader& zero, const std::string& key, std::uint64_t lo, std::uint64_t derived,
                          const char* formula, std::uint64_t& out) {
  if (!zero.is_auto(key)) {
    zero.read_count(key, lo, out);
    return;
  }
  if (zero.context().facts().hidden_size == 0) {
    zero.refuse_auto(
        key, "a number of elements like 5e8",
        str_cat("Strata derives it as ", formula, " from the model's hidden size, which is not known here"));
  }
  out = derived;
}

OffloadDevice to_device(const std::string& name) {
  if (name == "cpu") return OffloadDevice::cpu;
  if (name == "nvme") return OffloadDevice::nvme;
  return OffloadDevice::none;
}

// offload_param (param = true) or offload_optimizer, with DeepSpeed's per-section defaults.
void read_offload(ObjectReader& r, bool param, OffloadConfig& out) {
  out.buffer_count = param ? 5 : 4;
  if (param) {
    out.buffer_size = 100000000;
    out.max_in_cpu = 1000000000;
  }
  std::string device;
  if (r.read_choice("device", {"none", "cpu", "nvme"}, device)) out.device = to_device(device);
  r.read_string("nvme_path", out.nvme_path);
  r.read_bool("pin_memory", out.pin_memory);
  r.read_int("buffer_count", 1, 1 << 16, "use a whole number of buffers from 1 to 65536", out.buffer_count);
  if (param) {
    r.read_count("buffer_size", 1, out.buffer_size);
    r.read_count("max_in_cpu", 0, out.max_in_cpu);
    r.read_count("spare_chunks", 0, out.spare_chunks);
  } else {
    // DeepSpeed's speed knobs for its swapper: Strata's always pipelines reads and writes and
    // creates its files directly, so any value is accepted without effect (and said so).
    bool_without_effect(r, "pipeline_read");
    bool_without_effect(r, "pipeline_write");
    bool_without_effect(r, "fast_init");
    r.read_bool("overlap_step", out.overlap_step);
    r.read_count("spare_sub_groups", 0, out.spare_sub_groups);
    // DeepSpeed's partial offload (a share of the optimizer state stepped on the device).
    r.notice_if("ratio", 1.0,
                "is partial optimizer offload, which Strata does not support (1.0, all of it offloaded, it does): set "
                "memory_budget "
                "instead and leave offload_optimizer.device at \"none\", and placement keeps on the device what fits");
  }
  r.context().defer([r, &out] {
    if (out.device == OffloadDevice::nvme && out.nvme_path.empty()) {
      r.context().fail(str_cat(r.path_of("device"), " = \"nvme\" needs ", r.path_of("nvme_path"),
                               ": give a directory on the NVMe drive"));
    }
  });
}

// DeepSpeed reads the offload sections inside zero_optimization; Strata also takes them at
// the top level (docs/design.md, "Configuration"), but not in both places at once.
// Returns the section's path as given ("zero_optimization.offload_param") for messages.
std::string read_offload_section(ObjectReader& top, ObjectReader& zero, const char* key, bool param,
                                 OffloadConfig& out) {
  ObjectReader nested = zero.child(key);
  ObjectReader outer = top.child(key);
  if (nested.present() && outer.present()) {
    top.context().fail(str_cat(zero.path_of(key), " and ", top.path_of(key),
                               " are both given: keep one (DeepSpeed reads ", zero.path_of(key), ")"));
  }
  ObjectReader& used = outer.present() ? outer : nested;
  read_offload(used, param, out);
  return outer.present() ? top.path_of(key) : zero.path_of(key);
}

void read_zero_extras(ObjectReader& zero) {
  for (const char* key :
       {"load_from_fp32_weights", "ignore_unused_parameters", "elastic_checkpoint", "memory_efficient_linear",
        "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save", "log_trace_cache_warnings", "use_multi_rank_bucket_allreduce",
        "allgather_partitions", "override_module_apply", "pipeline_loading_checkpoint",
        "stage3_model_persistence_threshold", "model_persistence_threshold", "cpu_offload_use_pin_memory"}) {
    zero.notice(key);
  }
  const char* unsupported =
      "changes what is communicated or stored and Strata does not support it: remove the key or set it to ";
  zero.notice_if("zero_hpz_partition_size", 1, str_cat(unsupported, "1"));
  zero.notice_if("zero_quantized_weights", false, str_cat(unsupported, "false"));
  zero.notice_if("zero_quantized_nontrainable_weights", false, str_cat(unsupported, "false"));
  zero.notice_if("zero_quantized_gradients", false, str_cat(unsupported, "false"));
  zero.notice_if("mics_shard_size", -1, str_cat(unsupported, "-1"));
  zero.notice_if("mics_hierarchical_params_gather", false, str_cat(unsupported, "false"));
  zero.notice_if("legacy_stage1", false, str_cat(unsupported, "false"));
  zero.notice_if("cpu_offload", false,
                 str_cat("is DeepSpeed's deprecated switch: use ", zero.path_of("offload_optimizer"),
                         " {\"device\": \"cpu\"} instead"));
  zero.notice_if("cpu_offload_param", false,
                 str_cat("is DeepSpeed's deprecated switch: use ", zero.path_of("offload_param"),
                         " {\"device\": \"cpu\"} instead"));
}

void read_aio(ObjectReader& top, AioConfig& aio) {
  ObjectReader r = top.child("aio");
  if (r.read_count("block_size", 4096, aio.block_size) && aio.block_size % 4096 != 0) {
    r.fail_value("block_size", *r.find("block_size"),
                 "is not a multiple of 4096: O_DIRECT transfers need 4 KiB-aligned blocks "
                 "(DeepSpeed's default is 1048576)");
  }
  r.read_int("queue_depth", 1, 32768, "use a whole number from 1 to 32768 (io_uring's limit)", aio.queue_depth);
  if (r.has("intra_op_parallelism") && r.has("thread_count")) {
    r.context().fail(str_cat(r.path_of("intra_op_parallelism"), " and ", r.path_of("thread_count"),
                             " are the same setting (thread_count is the old name): keep one"));
  }
  const char* threads = r.has("thread_count") ? "thread_count" : "intra_op_parallelism";
  r.read_int(threads, 1, 1024, "use a whole number of threads from 1 to 1024", aio.intra_op_parallelism);
  r.find("intra_op_parallelism");  // both names are known keys, whichever was read
  r.find("thread_count");
  r.read_bool("single_submit", aio.single_submit);
  r.read_bool("overlap_events", aio.overlap_events);
  r.notice_if("use_gds", false,
              "asks for GPUDirect Storage, which Strata does not use (it reads NVMe through io_uring into "
              "pinned host memory): remove the key or set it to false");
}

}  // namespace

void read_zero_sections(ObjectReader& top, EngineConfig& config) {
  ObjectReader zero = top.child("zero_optimization");
  ZeroConfig& z = config.zero;
  const std::uint64_t hidden = top.context().facts().hidden_size;
  zero.read_int("stage", 0, 3, "use 0, 1, 2 or 3", z.stage);
  // DeepSpeed's layout and communication knobs with one behaviour in Strata: gradients always
  // land in contiguous buckets, are always reduce-scattered (the same sum as an all-reduce),
  // stage-3 gathers go per layer under the prefetch bucket, and bucket order is fixed. Any
  // value is accepted without effect, and named once as such.
  bool_without_effect(zero, "contiguous_gradients");
  bool_without_effect(zero, "reduce_scatter");
  read_count_or_hidden(zero, "reduce_bucket_size", 1, hidden * hidden, "hidden_size * hidden_size",
                       z.reduce_bucket_size);
  count_without_effect(zero, "allgather_bucket_size");
  z.overlap_comm = z.stage == 3;  // DeepSpeed: on by default for stage 3 only
  zero.read_bool("overlap_comm", z.overlap_comm);
  bool_without_effect(zero, "round_robin_gradients");
  zero.read_count("sub_group_size", 1, z.sub_group_size);
  read_count_or_hidden(zero, stage3_key(zero, "prefetch_bucket_size"), 0, hidden * hidden * 9 / 10,
                       "floor(0.9 * hidden_size * hidden_size)", z.stage3_prefetch_bucket_size);
  read_count_or_hidden(zero, stage3_key(zero, "param_persistence_threshold"), 0, 10 * hidden, "10 * hidden_size",
                       z.stage3_param_persistence_threshold);
  zero.read_count(stage3_key(zero, "max_live_parameters"), 0, z.stage3_max_live_parameters);
  zero.read_count(stage3_key(zero, "max_reuse_distance"), 0, z.stage3_max_reuse_distance);
  read_zero_extras(zero);

  const std::string opt_path = read_offload_section(top, zero, "offload_optimizer", false, config.offload_optimizer);
  const std::string param_path = read_offload_section(top, zero, "offload_param", true, config.offload_param);
  // Cross-key checks wait for the unknown-key check: a misspelled "stage" explains them.
  top.context().defer([&ctx = top.context(), &config, opt_path, param_path] {
    const int stage = config.zero.stage;
    const auto device_name = [](OffloadDevice d) { return d == OffloadDevice::cpu ? "\"cpu\"" : "\"nvme\""; };
    if (config.offload_param.device != OffloadDevice::none && stage != 3) {
      ctx.fail(str_cat(param_path, ".device = ", device_name(config.offload_param.device),
                       " needs zero_optimization.stage 3 (only stage 3 partitions parameters); stage is ", stage));
    }
    if (config.offload_optimizer.device != OffloadDevice::none && stage == 0) {
      ctx.fail(str_cat(opt_path, ".device = ", device_name(config.offload_optimizer.device),
                       " needs zero_optimization.stage 1, 2 or 3 (stage 0 does not partition the optimizer state)"));
    }
  });
  read_aio(top, config.aio);
}

}  // namespace strata::engine::detail
