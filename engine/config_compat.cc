// What a DeepSpeed config written for the Hugging Face trainer needs before it is read:
// "auto" values resolved as the trainer would resolve them, and DeepSpeed's deprecated
// spellings mapped to their current keys, each said once. Runs on the JSON before the
// sections are read (config.cc), so every later check sees ordinary values.
//
// "auto" is resolved from what Strata knows (the step count --steps gives; the hidden size
// for bucket sizes, config_zero.cc), else from the trainer's TrainingArguments defaults:
// per_device_train_batch_size 8, gradient_accumulation_steps 1, max_grad_norm 1.0,
// learning_rate 5e-5, adam_beta1/2 0.9/0.999, adam_epsilon 1e-8, weight_decay 0.0,
// warmup_steps 0, fp16 and bf16 off. The batch keys are first derived from each other
// (config.cc: train = micro x accumulation x world); the trainer's defaults fill in "auto"
// micro-batch, then accumulation, only while fewer than two of the three are numbers.
#include <string>
#include <vector>

#include "engine/detail/sections.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"

namespace strata::engine::detail {
namespace {

bool is_auto(const Json* v) { return v != nullptr && v->is_string() && v->get<std::string>() == "auto"; }

// The object at `path` (dot-separated) in root, or null.
Json* object_at(Json& root, const std::string& path) {
  Json* at = &root;
  std::size_t from = 0;
  while (from < path.size()) {
    const std::size_t dot = path.find('.', from);
    const std::string key = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &(*at)[key];
    from = dot == std::string::npos ? path.size() : dot + 1;
  }
  return at->is_object() ? at : nullptr;
}

struct AutoDefault {
  const char* section;  // "" for the top level
  const char* key;
  Json value;
  const char* why;
};

}  // namespace

std::vector<std::string> resolve_hf_auto(Json& root, const ModelFacts& facts) {
  std::vector<std::string> said;
  auto resolve = [&](const std::string& section, const char* key, const Json& value, const std::string& why) {
    Json* obj = section.empty() ? (root.is_object() ? &root : nullptr) : object_at(root, section);
    if (obj == nullptr || !obj->contains(key) || !is_auto(&(*obj)[key])) return;
    (*obj)[key] = value;
    said.push_back(str_cat(section.empty() ? "" : section + ".", key, " = ", value.dump(), " (", why, ")"));
  };
  const char* hf = "the Hugging Face trainer's default";
  auto batch_numbers = [&] {
    int n = 0;
    for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
      n += root.is_object() && root.contains(k) && root[k].is_number();
    return n;
  };
  if (batch_numbers() < 2)
    resolve("", "train_micro_batch_size_per_gpu", 8, str_cat(hf, " per_device_train_batch_size"));
  if (batch_numbers() < 2) {
    resolve("", "gradient_accumulation_steps", 1, str_cat(hf, " gradient_accumulation_steps"));
    // Absent, it is DeepSpeed's default 1 too: give it, so train_batch_size "auto" derives.
    if (root.is_object() && !root.contains("gradient_accumulation_steps") && root.contains("train_batch_size") &&
        is_auto(&root["train_batch_size"]))
      root["gradient_accumulation_steps"] = 1;
  }
  const std::vector<AutoDefault> defaults = {
      {"", "gradient_clipping", 1.0, "the Hugging Face trainer's default max_grad_norm"},
      {"optimizer.params", "lr", 5e-5, "the Hugging Face trainer's default learning_rate"},
      {"optimizer.params", "betas", Json::array({0.9, 0.999}), "the Hugging Face trainer's default adam_beta1/2"},
      {"optimizer.params", "eps", 1e-8, "the Hugging Face trainer's default adam_epsilon"},
      {"optimizer.params", "weight_decay", 0.0, "the Hugging Face trainer's default weight_decay"},
      {"scheduler.params", "warmup_min_lr", 0.0, "the Hugging Face trainer warms up from 0"},
      {"scheduler.params", "warmup_num_steps", 0, "the Hugging Face trainer's default warmup_steps"},
      {"fp16", "enabled", false, "the Hugging Face trainer's default: no --fp16"},
      {"bf16", "enabled", false, "the Hugging Face trainer's default: no --bf16"},
      {"bfloat16", "enabled", false, "the Hugging Face trainer's default: no --bf16"},
  };
  for (const auto& d : defaults) resolve(d.section, d.key, d.value, d.why);
  // warmup_max_lr follows the optimizer's learning rate, as the trainer sets both from one.
  if (const Json* p = object_at(root, "optimizer.params"); p != nullptr && p->contains("lr") && (*p)["lr"].is_number())
    resolve("scheduler.params", "warmup_max_lr", (*p)["lr"], "the optimizer's lr");
  if (facts.total_steps > 0) resolve("scheduler.params", "total_num_steps", facts.total_steps, "the run's step count");
  return said;
}

std::vector<std::string> map_deprecated(Json& root, const std::string& source) {
  std::vector<std::string> said;
  Json* zero = object_at(root, "zero_optimization");
  if (zero == nullptr) return said;
  const bool pin = zero->contains("cpu_offload_use_pin_memory") && (*zero)["cpu_offload_use_pin_memory"] == true;
  auto map = [&](const char* old_key, const char* new_key) {
    if (!zero->contains(old_key) || (*zero)[old_key] != true) return;
    if (zero->contains(new_key)) {
      STRATA_THROW(Errc::invalid_argument, source, ": zero_optimization.", old_key,
                   " (deprecated) and zero_optimization.", new_key, " are both given: keep ", new_key);
    }
    (*zero)[new_key] = Json{{"device", "cpu"}, {"pin_memory", pin}};
    zero->erase(old_key);
    said.push_back(str_cat("zero_optimization.", old_key, " is deprecated: read as zero_optimization.", new_key,
                           " = {\"device\": \"cpu\", \"pin_memory\": ", pin ? "true" : "false", "}"));
  };
  map("cpu_offload", "offload_optimizer");
  map("cpu_offload_param", "offload_param");
  map("cpu_offload_params", "offload_param");
  return said;
}

}  // namespace strata::engine::detail
