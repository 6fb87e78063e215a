// File names, shard planning and size parsing of the Hugging Face directory (see format.h).
#include "models/hf/format.h"

#include <cctype>
#include <cstdio>

#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::model::hf {

std::string shard_file_name(std::size_t index, std::size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

std::vector<std::size_t> plan_shards(const std::vector<std::uint64_t>& tensor_bytes, std::uint64_t max_shard_bytes) {
  STRATA_CHECK(max_shard_bytes > 0, Errc::invalid_argument, "the shard size limit is 0 bytes: give a positive size");
  std::vector<std::size_t> shard(tensor_bytes.size());
  std::size_t current = 0;
  std::uint64_t filled = 0;  // bytes in the current shard
  bool empty = true;
  for (std::size_t i = 0; i < tensor_bytes.size(); ++i) {
    const std::uint64_t b = tensor_bytes[i];
    // A new shard when this tensor would overflow a non-empty one; one larger than the
    // limit then fills the new shard alone, and the next tensor starts another.
    if (!empty && (b > max_shard_bytes || filled > max_shard_bytes - b)) {
      ++current;
      filled = 0;
    }
    shard[i] = current;
    filled += b;
    empty = false;
  }
  return shard;
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::fp32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::fp16:
      return "float16";
    default:
      STRATA_THROW(Errc::invalid_argument, "Hugging Face directories are written here in fp32, bf16 or fp16, not ",
                   dtype_name(t));
  }
}

std::uint64_t parse_shard_bytes(std::string_view text, std::string_view what) {
  // "5Gb", "500mb", "100kb": Hugging Face's convert_file_size_to_int divides these by 8.
  const std::size_t n = text.size();
  if (n >= 2 && text[n - 1] == 'b') {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(text[n - 2])));
    STRATA_CHECK(unit != 'K' && unit != 'M' && unit != 'G' && unit != 'T', Errc::invalid_argument, what, " '", text,
                 "' ends in a lowercase b, which Hugging Face reads as bits (an eighth of the bytes): write the unit "
                 "in capitals, like 5GB, 500MB or 2GiB");
  }
  const std::uint64_t bytes = parse_bytes(text, what);
  STRATA_CHECK(bytes > 0, Errc::invalid_argument, what, " '", text,
               "' is 0 bytes: give the largest shard to write, like 5GB");
  return bytes;
}

}  // namespace strata::model::hf
