// The engine's configuration, read from one DeepSpeed-style JSON file (docs/design.md,
// "Configuration"). Every key is in one of three classes: honoured (below); DeepSpeed keys
// that do not apply to Strata (logging, monitoring, profiling...), accepted with one notice
// listing them; unknown or misspelled keys, an error naming the key and the nearest known
// one. A bad value names the key, the value and the allowed range. "auto" (Hugging Face's
// placeholder) is resolved where Strata can derive it (ModelFacts, world size) and refused
// by name otherwise. Nothing is silently ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/moment_format.h"

namespace strata::engine {

enum class OptimizerType { adam, adamw, lion, adagrad, lamb, muon };
enum class SchedulerType { none, warmup_lr, warmup_decay_lr, warmup_cosine_lr };
enum class OffloadDevice { none, cpu, nvme };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool bias_correction = true;
  // DeepSpeed's "Adam" with adam_w_mode=true (its default) is AdamW; false is Adam with L2.
  float max_coeff = 10.0f, min_coeff = 0.01f;  // Lamb: the trust ratio's clamp
  // Muon (optim/muon.h) on the hidden matrices (2-D parameters outside the first and the last
  // layer) at lr; AdamW with betas, eps and the same weight decay on the rest at adam_lr (< 0:
  // lr). Under a scheduler its rate is Muon's, and AdamW's that rate times adam_lr / lr.
  float momentum = 0.95f;
  bool nesterov = true;
  int ns_steps = 5;
  bool muon_match_rms_adamw = false;  // lr_adjust "match_rms_adamw" (else "original")
  float adam_lr = -1.0f;
  // exp_avg and exp_avg_sq: fp32, bf16 (bf16.bf16_optimizer_states, or optimizer.moments
  // "bf16"; rounded to nearest even each step) or q8 (optimizer.moments "q8", Adam and AdamW:
  // 8-bit codes with a power-of-two scale per 16 elements, runtime/core/q8_codec.h). The
  // master weights stay fp32 in every case.
  MomentFormat moment_format = MomentFormat::fp32;
};

// Bytes per element of a shard's optimizer state: the fp32 master and the two moments (12,
// 8, or 6.125 with q8 moments).
inline double state_bytes_per_elem(const OptimizerConfig& o) { return 4 + 2 * moment_bytes_per_elem(o.moment_format); }
// Bytes of the optimizer state of `elems` elements (shards are whole q8 blocks: exact).
inline std::uint64_t state_bytes(const OptimizerConfig& o, std::uint64_t elems) {
  return 4 * elems + 2 * moment_bytes(o.moment_format, elems);
}
// What that state is, for messages: "fp32 master, exp_avg, exp_avg_sq" or with "bf16 moments".
inline std::string state_description(const OptimizerConfig& o) {
  if (o.type == OptimizerType::muon)
    return "fp32 master, exp_avg, exp_avg_sq; Muon keeps no exp_avg_sq for hidden matrices in device memory or host "
           "RAM";
  return o.moment_format == MomentFormat::fp32
             ? "fp32 master, exp_avg, exp_avg_sq"
             : std::string("fp32 master, ") + moment_format_name(o.moment_format) + " exp_avg and exp_avg_sq";
}

// DeepSpeed's scheduler "params" with its defaults (deepspeed/runtime/lr_schedules.py).
struct SchedulerConfig {
  SchedulerType type = SchedulerType::none;
  float warmup_min_lr = 0.0f;
  float warmup_max_lr = 1e-3f;  // WarmupLR/WarmupDecayLR; WarmupCosineLR uses the optimizer lr
  std::int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";   // "log" or "linear"
  std::int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR (required there)
  float warmup_min_ratio = 0.0f;     // WarmupCosineLR
  float cos_min_ratio = 1e-4f;       // WarmupCosineLR
};

struct ZeroConfig {
  int stage = 0;
  std::uint64_t reduce_bucket_size = 500000000;               // elements
  bool overlap_comm = false;                                  // DeepSpeed: true for stage 3 by default
  std::uint64_t sub_group_size = 1000000000;                  // elements per optimizer-step tile
  std::uint64_t stage3_prefetch_bucket_size = 50000000;       // elements
  std::uint64_t stage3_param_persistence_threshold = 100000;  // elements
  std::uint64_t stage3_max_live_parameters = 1000000000;      // elements
  std::uint64_t stage3_max_reuse_distance = 1000000000;       // elements
};

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;
  bool pin_memory = false;
  int buffer_count = 0;           // offload_param: 5, offload_optimizer: 4
  std::uint64_t buffer_size = 0;  // offload_param: 1e8 elements
  std::uint64_t max_in_cpu = 0;   // offload_param: 1e9 elements
  // offload_optimizer (Strata's key): the optimizer of layers on NVMe or in host RAM steps
  // each layer as its gradient completes, during backward, and rolls back when the step's
  // global check fails (overlapped_step.h).
  bool overlap_step = false;
  // offload_optimizer (Strata's key): spare swap files per sub-group length (0: one per
  // sub-group, so the drive holds two generations of the state; offload/optimizer_swapper.h).
  std::uint64_t spare_sub_groups = 0;
  // offload_param (Strata's key): spare swap files per chunk length of the NVMe parameter
  // shards (a chunk: buffer_size elements of a layer's shard; 0: one per chunk, two
  // generations; offload/param_store.h).
  std::uint64_t spare_chunks = 0;
};

struct AioConfig {
  std::uint64_t block_size = 1048576;
  int queue_depth = 8;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
};

struct Fp16Config {
  bool enabled = false;
  float loss_scale = 0.0f;  // 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  float min_loss_scale = 1.0f;
};

// Strata's "fp8" block: the GPT's matrix products with FP8 operands, simulated on the host
// (models/gpt/fp8.h has the recipe). The compute dtype (bf16, fp16, fp32) still decides what
// the engine stores, gathers and reduces; FP8 applies to the products' inputs only.
struct Fp8Config {
  bool enabled = false;
  std::string format = "hybrid";     // hybrid: E4M3 forward, E5M2 gradients; e4m3: E4M3 everywhere
  int amax_history_len = 1024;       // optimizer steps of amax each tensor's scale looks back on
  std::string amax_compute = "max";  // max | most_recent
  int margin = 0;                    // scales leave 2^margin of headroom below the format's max
  bool block_scaling = false;        // per 1 x 128 tile (activations, gradients), 128 x 128 block (weights)
  std::string scaling = "delayed";   // delayed: scales from the amax history; none: scale 1 (unit-scaled models)
};

struct MemoryBudget {  // Strata's own key; bytes, 0 = not set
  std::uint64_t device = 0, host = 0, nvme = 0;
};

// Strata's keys in DeepSpeed's "checkpoint" block (DeepSpeed's own keys there are accepted
// with a notice); the CLI's --save-dir, --save-every and --keep override them.
struct CheckpointConfig {
  std::string save_dir;         // empty: no saving
  std::int64_t save_every = 0;  // steps between saves; 0: only after the last step
  int keep = 0;                 // newest checkpoints kept; 0: all
  bool async = false;           // write in the background (SaveOptions::async)
};

struct EngineConfig {
  std::int64_t train_batch_size = 0;  // resolved: micro * accumulation * world
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 0;
  float gradient_clipping = 0.0f;    // 0 = off
  std::int64_t steps_per_print = 0;  // the trainer's progress line every N steps; 0: not given (every step)
  bool bf16 = false;
  Fp16Config fp16;
  Fp8Config fp8;
  ZeroConfig zero;
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
  AioConfig aio;
  OptimizerConfig optimizer;
  bool optimizer_given = false;  // the config has an optimizer block (else Strata's defaults above)
  SchedulerConfig scheduler;
  MemoryBudget memory_budget;
  CheckpointConfig checkpoint;
  std::vector<std::string> ignored_keys;  // the accepted-with-notice keys that were present
  std::vector<std::string> resolved;      // "auto" values filled and deprecated keys mapped, one line each
};

// What Strata knows when it resolves "auto": the world size and the model's sizes.
struct ModelFacts {
  int world_size = 1;
  std::uint64_t hidden_size = 0;  // largest dimension of any 2-D parameter; 0 = unknown
  std::int64_t total_steps = 0;   // the run's optimizer steps (scheduler "auto"); 0 = unknown
};

// Bounds on what a config file may be, so that any file is read, or refused with a one-line
// error, in well under a second: real DeepSpeed configs are a few KiB, nest four levels and
// hold a few dozen keys per object. Keys longer than kMaxSuggestedKey get no "did you mean";
// keys and values are echoed in errors cut to kEchoChars characters (and their length).
inline constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;
inline constexpr int kMaxConfigDepth = 64;          // objects and arrays inside each other
inline constexpr std::size_t kMaxConfigKeys = 256;  // keys in one object
inline constexpr std::size_t kMaxSuggestedKey = 64;
inline constexpr std::size_t kEchoChars = 60;

// Parses and validates. `source` names the file in errors ("ds_config.json"). Throws
// Errc::invalid_argument with a one-line message naming the source and, for JSON errors,
// the line, column and key path. Prints the one notice for accepted-but-ignored keys (log
// info). A JSON null means "not set" (DeepSpeed's default applies).
EngineConfig parse_config(const std::string& json_text, const std::string& source, const ModelFacts& facts);
// Reads the file (at most kMaxConfigBytes: /dev/zero or an endless pipe stops there), then
// parse_config with the path as source.
EngineConfig load_config(const std::string& path, const ModelFacts& facts);

// "AdamW", "Adam", "Lion", "Adagrad" or "Lamb".
const char* optimizer_type_name(OptimizerType t);
// One line: the optimizer and its hyperparameters, the schedule and clipping, and whether the
// optimizer is Strata's default (no optimizer block): trainers print it once at start.
std::string describe_training(const EngineConfig& config);

// lr at 1-based step `step` for the configured scheduler (optimizer lr when none).
// Step `step` uses DeepSpeed's value at last_batch_iteration = step - 1, so step 1 runs at
// the warmup's start (DeepSpeed's engine lags this by one step; see lr_schedule.cc).
float scheduled_lr(const EngineConfig& config, std::int64_t step);

// Host bytes the engine's ledger may hold: memory_budget.host, or (unset) no limit but the
// machine's RAM.
inline std::uint64_t host_budget_of(const EngineConfig& c) {
  return c.memory_budget.host ? c.memory_budget.host : ~std::uint64_t{0} / 2;
}

// Whether the overlapped step (offload_optimizer.overlap_step) steps host-RAM optimizer state
// during backward, into spare arrays: not for LAMB or Muon, not under a host budget (the placement
// fills it), and not beside state on NVMe (which only a host budget puts there).
inline bool overlaps_host_state(const EngineConfig& c, bool state_on_nvme) {
  return c.offload_optimizer.overlap_step && c.optimizer.type != OptimizerType::lamb &&
         c.optimizer.type != OptimizerType::muon && c.memory_budget.host == 0 && !state_on_nvme;
}

// The dtype of parameters and gradients the trainer sees: bf16, fp16 or fp32.
inline DType compute_dtype_of(const EngineConfig& c) {
  return c.bf16 ? DType::bf16 : c.fp16.enabled ? DType::fp16 : DType::fp32;
}

}  // namespace strata::engine
