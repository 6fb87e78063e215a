// The Hugging Face model directory (transformers' save_pretrained with safetensors), as far as
// Strata reads and writes it:
//   - `config.json`: the model's configuration, one JSON object (its `torch_dtype` names the
//     dtype the weights are stored in: "float32", "bfloat16" or "float16");
//   - the weights, either one file `model.safetensors`, or shards
//     `model-00001-of-00003.safetensors` ... (1-based, five digits each) listed by
//     `model.safetensors.index.json`: {"metadata": {"total_size": N}, "weight_map":
//     {tensor: shard file}}, where N is the bytes of every tensor's data together (headers
//     not counted) and each tensor lies whole in one shard;
//   - other files (tokenizer, generation_config.json, README) that Strata neither reads nor
//     writes.
// Shards are planned as transformers' shard_checkpoint planned them: tensors in order, a new
// shard when the next tensor would take a non-empty one past the limit, so a tensor larger
// than the limit sits alone in a shard of its own (tensors are never split). (huggingface_hub's
// newer splitter sets such a tensor aside while the current shard stays open, so a shard may
// hold tensors that are not neighbours; keeping the order lets one writer stream the shards
// in turn. Readers follow weight_map and accept either.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/dtype.h"

namespace strata::model::hf {

inline constexpr const char* kConfigName = "config.json";
inline constexpr const char* kSingleName = "model.safetensors";
inline constexpr const char* kIndexName = "model.safetensors.index.json";

// "model-00002-of-00005.safetensors" for index 1 (0-based) of 5.
std::string shard_file_name(std::size_t index, std::size_t count);

// The shard (0-based) of each tensor, given each tensor's bytes in order and the limit
// (> 0); at least one shard, even for no tensors.
std::vector<std::size_t> plan_shards(const std::vector<std::uint64_t>& tensor_bytes, std::uint64_t max_shard_bytes);

// config.json's name of a dtype: "float32", "bfloat16", "float16".
const char* torch_dtype_name(DType t);

// A shard limit written as Hugging Face's max_shard_size is: "5GB" (10^9), "500MB", "2GiB"
// (2^30), "100KB", or plain bytes ("1000000"). Hugging Face reads a size that ends in a
// lowercase "b" after its unit ("5Gb", "500mb") as bits, a silent factor of 8: such text is
// refused, asking for the unit in capitals. Throws Errc::invalid_argument naming `what` (the
// flag) and the text, also for 0.
std::uint64_t parse_shard_bytes(std::string_view text, std::string_view what = "--max-shard-size");

}  // namespace strata::model::hf
