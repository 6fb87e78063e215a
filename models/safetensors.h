// The safetensors file format (https://github.com/huggingface/safetensors, format section):
// an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} relative to the data that follows (and
// an optional "__metadata__" of string pairs), padded with spaces to 8 bytes, then the data.
// Strata writes fp32 parameters so runs can be compared byte for byte and loaded by PyTorch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata::model {

struct NamedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

// Writes atomically (temporary file, then rename); throws Errc::io naming the path.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Reads F32 tensors back; throws Errc::corrupt naming the path for malformed files.
std::vector<NamedTensor> read_safetensors(const std::string& path);

}  // namespace strata::model
