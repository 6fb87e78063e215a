// parse_config and load_config (config.h): the top level of a DeepSpeed-style config, the
// batch-size rule (train = micro x accumulation x world size) and the accepted-with-notice
// and refused DeepSpeed keys that live at the top level. Sections are in config_zero.cc
// and config_training.cc; the typed reader in detail/json_reader.cc.
#include "engine/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <limits>

#include "engine/detail/json_reader.h"
#include "engine/detail/sections.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine {
namespace {

using detail::Json;
using detail::ObjectReader;

constexpr const char* kTrain = "train_batch_size";
constexpr const char* kMicro = "train_micro_batch_size_per_gpu";
constexpr const char* kAccum = "gradient_accumulation_steps";

std::int64_t checked_product(const detail::ParseContext& ctx, std::int64_t a, std::int64_t b, std::int64_t c) {
  std::int64_t ab = 0, abc = 0;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) {
    ctx.fail(str_cat(kMicro, " x ", kAccum, " x world size = ", a, " x ", b, " x ", c,
                     " does not fit in 64 bits: use realistic batch sizes"));
  }
  return abc;
}

struct BatchEntry {
  const char* key;
  bool given = false, is_auto = false;
  std::int64_t value = 0;
};

void resolve_batch(detail::ParseContext& ctx, const ObjectReader& top, EngineConfig& config, BatchEntry train,
                   BatchEntry micro, BatchEntry accum, int numbers, std::int64_t world);

// DeepSpeed's rule: any two of the three determine the third; one alone takes DeepSpeed's
// defaults (accumulation 1, micro = train / world); "auto" is derived only from two numbers.
void read_batch(ObjectReader& top, EngineConfig& config) {
  detail::ParseContext& ctx = top.context();
  const std::int64_t world = ctx.facts().world_size;
  BatchEntry train{kTrain}, micro{kMicro}, accum{kAccum};
  int numbers = 0;
  for (BatchEntry* e : {&train, &micro, &accum}) {
    e->is_auto = top.is_auto(e->key);
    if (!e->is_auto)
      e->given = top.read_int(e->key, 1, std::numeric_limits<std::int64_t>::max(), "use a whole number >= 1", e->value);
    numbers += e->given ? 1 : 0;
  }
  // The arithmetic runs after the unknown-key check: "train_batch_sise" explains itself.
  ctx.defer([&ctx, &config, top, train, micro, accum, numbers, world] {
    resolve_batch(ctx, top, config, train, micro, accum, numbers, world);
  });
}

void resolve_batch(detail::ParseContext& ctx, const ObjectReader& top, EngineConfig& config, BatchEntry train,
                   BatchEntry micro, BatchEntry accum, int numbers, std::int64_t world) {
  for (const BatchEntry* e : {&train, &micro, &accum}) {
    if (e->is_auto && numbers < 2) {
      top.refuse_auto(e->key, "a whole number >= 1",
                      str_cat("Strata derives it from the other two of ", kTrain, ", ", kMicro, " and ", kAccum,
                              " (train = micro x accumulation x world size), and ",
                              numbers == 0 ? "none is" : "only one is", " a number"));
    }
  }
  auto must_divide = [&](std::int64_t total, const char* total_key, std::int64_t part, const std::string& what) {
    if (total % part != 0) {
      ctx.fail(str_cat(total_key, " = ", total, " is not a multiple of ", what, " = ", part, ": DeepSpeed's rule is ",
                       kTrain, " = ", kMicro, " x ", kAccum, " x world size"));
    }
    return total / part;
  };
  if (train.given && micro.given && accum.given) {
    const std::int64_t product = checked_product(ctx, micro.value, accum.value, world);
    if (product != train.value) {
      ctx.fail(str_cat(kTrain, " = ", train.value, " does not equal ", kMicro, " x ", kAccum,
                       " x world size = ", micro.value, " x ", accum.value, " x ", world, " = ", product,
                       ": fix one of them, or leave one out and it is derived from the other two"));
    }
  } else if (train.given && micro.given) {
    accum.value = must_divide(train.value, kTrain, checked_product(ctx, micro.value, world, 1),
                              str_cat(kMicro, " x world size = ", micro.value, " x ", world));
  } else if (train.given && accum.given) {
    micro.value = must_divide(train.value, kTrain, checked_product(ctx, accum.value, world, 1),
                              str_cat(kAccum, " x world size = ", accum.value, " x ", world));
  } else if (micro.given && accum.given) {
    train.value = checked_product(ctx, micro.value, accum.value, world);
  } else if (train.given) {
    accum.value = 1;
    micro.value = must_divide(train.value, kTrain, world, "the world size");
  } else if (micro.given) {
    accum.value = 1;
    train.value = checked_product(ctx, micro.value, 1, world);
  } else if (accum.given) {
    ctx.fail(str_cat(kAccum, " alone does not determine the batch: give ", kTrain, " or ", kMicro, " too"));
  } else {
    ctx.fail(str_cat("no batch size: give ", kTrain, " or ", kMicro, " (or two of them with ", kAccum, ")"));
  }
  config.train_batch_size = train.value;
  config.train_micro_batch_size_per_gpu = micro.value;
  config.gradient_accumulation_steps = accum.value;
}

// DeepSpeed keys at the top level that Strata does not act on. Logging, monitoring,
// profiling and the trainer's own business are accepted with the notice; anything that
// would change what is trained is accepted only at DeepSpeed's default.
void read_top_level_extras(ObjectReader& top) {
  for (const char* key : {"wall_clock_breakdown",
                          "memory_breakdown",
                          "dump_state",
                          "tensorboard",
                          "wandb",
                          "csv_monitor",
                          "comet",
                          "monitor_config",
                          "flops_profiler",
                          "comms_logger",
                          "timers",
                          "autotuning",
                          "activation_checkpointing",
                          "nebula",
                          "zero_allow_untested_optimizer",
                          "zero_force_ds_cpu_optimizer",
                          "dataloader_drop_last",
                          "sparse_attention",
                          "compression_training",
                          "eigenvalue",
                          "graph_harvesting",
                          "seq_parallel_comm_data_type",
                          "seq_parallel_communication_data_type",
                          "use_data_before_expert_parallelism"}) {
    top.notice(key);
  }
  const char* numerics = "would change the numerics and Strata does not support it: remove the key or set it to ";
  top.notice_if("sparse_gradients", false, str_cat(numerics, "false"));
  top.notice_if("prescale_gradients", false, str_cat(numerics, "false"));
  top.notice_if("gradient_predivide_factor", 1.0, str_cat(numerics, "1.0"));
  top.notice_if("communication_data_type", nullptr,
                str_cat(numerics, "null (gradients are reduced in the training precision)"));
  top.notice_if("disable_allgather", false, str_cat(numerics, "false"));
  ObjectReader data_types = top.child("data_types");
  data_types.notice_if("grad_accum_dtype", nullptr, str_cat(numerics, "null"));
  top.notice_if_disabled("amp", "Apex AMP is not supported: use bf16 or fp16 instead", /*auto_is_off=*/true);
  top.notice_if_disabled("elasticity", "elastic training changes the batch size at run time; Strata does not");
  top.notice_if_disabled("curriculum_learning",
                         "it changes the training data; Strata leaves the data to the trainer: set enabled false");
  top.notice_if_disabled("data_efficiency",
                         "it changes the training data; Strata leaves the data to the trainer: set enabled false");
  top.notice_if_disabled("progressive_layer_drop", "Strata does not skip layers: set enabled false");
  top.notice_if_disabled("quantize_training", "Strata does not quantize during training: set enabled false");
  top.notice_if_disabled("hybrid_engine", "DeepSpeed-Chat's hybrid engine is not supported: set enabled false");
  top.notice_if_disabled("torch_autocast",
                         "the trainer owns the forward pass in Strata and chooses its own autocast: set enabled false");
  top.refuse("pipeline", "Strata's pipeline executor does not read DeepSpeed's PipelineEngine settings");
  top.refuse("tensor_parallel", "tensor parallelism (AutoTP) is not supported");
  top.refuse("compile", "DeepCompile is not supported; the trainer owns the forward and backward passes");
}

}  // namespace

EngineConfig parse_config(const std::string& json_text, const std::string& source, const ModelFacts& facts) {
  STRATA_CHECK(facts.world_size >= 1, Errc::invalid_argument, source, ": world size ", facts.world_size,
               " is not valid: it must be 1 or more");
  Json root = detail::parse_json(json_text, source);
  std::vector<std::string> resolved = detail::map_deprecated(root, source);
  for (auto& line : detail::resolve_hf_auto(root, facts)) resolved.push_back(std::move(line));
  detail::ParseContext ctx(source, facts);
  if (!root.is_object()) {
    ctx.fail(str_cat("the top level must be a JSON object {...}, not ", root.type_name()));
  }
  ObjectReader top(ctx, &root, "");
  EngineConfig config;
  if (const Json* zero = top.find("zero_optimization"); zero != nullptr && zero->is_boolean()) {
    top.fail_value("zero_optimization", *zero, "is DeepSpeed's old format: use an object such as {\"stage\": 1}");
  }
  read_batch(top, config);
  if (top.is_auto("gradient_clipping")) {
    top.refuse_auto("gradient_clipping", "a number (0 turns clipping off)",
                    "the trainer copies its max_grad_norm there, which Strata cannot see");
  }
  top.read_float("gradient_clipping", 0, std::numeric_limits<double>::max(), "use a number >= 0 (0 turns clipping off)",
                 config.gradient_clipping);
  top.read_int("steps_per_print", 1, std::numeric_limits<std::int64_t>::max(), "use a whole number >= 1",
               config.steps_per_print);
  detail::read_precision(top, config);
  detail::read_zero_sections(top, config);
  detail::read_optimizer(top, config);
  detail::read_scheduler(top, config);
  detail::read_memory_budget(top, config);
  detail::read_checkpoint(top, config);
  read_top_level_extras(top);
  ctx.check_unknown_keys();
  ctx.run_deferred();

  config.ignored_keys = ctx.ignored();
  config.resolved = resolved;
  for (const auto& line : resolved) STRATA_LOG(warn, source, ": ", line);
  if (!config.ignored_keys.empty()) {
    std::string list;
    for (const auto& key : config.ignored_keys) list += (list.empty() ? "" : ", ") + key;
    STRATA_LOG(
        info, source, ": accepted but not used by Strata (DeepSpeed settings for logging, monitoring, ",
        "profiling, checkpoint saving, knobs for behaviour Strata always has, or set to their defaults): ", list);
  }
  return config;
}

namespace {

// The file's bytes, at most kMaxConfigBytes of them: a larger regular file is refused by its
// size, anything else (/dev/zero, a pipe) when the read passes the limit.
std::string read_config_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    ::strata::detail::throw_error(Errc::io, str_cat("config file '", path, "' cannot be opened: ", errno_text(err)),
                                  __FILE__, __LINE__, err);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const char* advice = "DeepSpeed configs are a few KiB: check that it is the config you meant";
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) > kMaxConfigBytes) {
    STRATA_THROW(Errc::invalid_argument, "config file '", path, "' is ", st.st_size, " bytes, over the ",
                 kMaxConfigBytes >> 20, " MiB limit for a config file: ", advice);
  }
  std::string text;
  std::vector<char> buffer(std::size_t{1} << 16);
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), std::min(buffer.size(), kMaxConfigBytes + 1 - text.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::strata::detail::throw_error(Errc::io, str_cat("config file '", path, "' could not be read: ", errno_text(err)),
                                    __FILE__, __LINE__, err);
    }
    if (n == 0) return text;
    text.append(buffer.data(), static_cast<std::size_t>(n));
    STRATA_CHECK(text.size() <= kMaxConfigBytes, Errc::invalid_argument, "config file '", path,
                 "' holds more than the ", kMaxConfigBytes >> 20, " MiB limit for a config file (reading stopped at ",
                 text.size(), " bytes): ", advice);
  }
}

}  // namespace

EngineConfig load_config(const std::string& path, const ModelFacts& facts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  STRATA_CHECK(fs::exists(status), Errc::invalid_argument, "config file '", path,
               "' does not exist: give the path of a DeepSpeed-style JSON file");
  STRATA_CHECK(!fs::is_directory(status), Errc::invalid_argument, "config file '", path,
               "' is a directory: give the path of the JSON file inside it");
  return parse_config(read_config_file(path), path, facts);
}

}  // namespace strata::engine
