// The section readers of parse_config (config.cc), one per group of DeepSpeed keys. Each
// reads its keys from the top-level reader into EngineConfig and declares every key it
// knows, so ParseContext::check_unknown_keys() can report the rest.
#pragma once

#include "engine/config.h"
#include "engine/detail/json_reader.h"

namespace strata::engine::detail {

// zero_optimization (with offload_optimizer/offload_param nested, DeepSpeed's place for
// them, or at the top level) and aio.
void read_zero_sections(ObjectReader& top, EngineConfig& config);
// fp16, bf16 (old name bfloat16) and amp.
void read_precision(ObjectReader& top, EngineConfig& config);
void read_optimizer(ObjectReader& top, EngineConfig& config);
// After read_optimizer: WarmupLR's peak defaults to the optimizer's lr.
void read_scheduler(ObjectReader& top, EngineConfig& config);
void read_memory_budget(ObjectReader& top, EngineConfig& config);
void read_checkpoint(ObjectReader& top, EngineConfig& config);
// config_compat.cc: "auto" resolved as the Hugging Face trainer would, and DeepSpeed's
// deprecated spellings mapped; each returns what it did, one line per key.
std::vector<std::string> resolve_hf_auto(Json& root, const ModelFacts& facts);
std::vector<std::string> map_deprecated(Json& root, const std::string& source);

}  // namespace strata::engine::detail
