// The safetensors file format (https://github.com/huggingface/safetensors, format section):
// an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} relative to the data that follows (and
// an optional "__metadata__" of string pairs), padded with spaces to 8 bytes, then the data.
//
// SafetensorsWriter streams a file: the header first (every tensor's name, dtype and shape
// are known up front), then the values tensor after tensor in pieces of any size, converted
// from fp32 to each tensor's dtype (F32, BF16, F16) through one fixed buffer, so writing
// needs no memory in proportion to the model. It writes `path.tmp` and renames it over
// `path` only when finish() finds every tensor complete (fsynced first); an unfinished
// writer removes its temporary file. SafetensorsReader reads the header and any element
// range of any tensor as fp32. It accepts only what the format allows (as Hugging Face's
// reader does): a regular file, a header of at most 100,000,000 bytes that is one JSON
// object without duplicate keys, known dtypes, whole non-negative dimensions, data_offsets
// spanning exactly each shape's bytes, tensors tiling the data region without overlap or
// hole, and a __metadata__ of strings. Both throw strata::Error naming the path (and the
// tensor). A reader opened with list_other_dtypes also accepts the format's other dtypes
// (I64, F64, F8_E4M3, ...) and lists those tensors in other_tensors(), never readable: a
// caller that checks a file against a model can then name them instead of failing at open.
// write_safetensors/read_safetensors are the whole-file forms.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"

namespace strata::model {

struct NamedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::fp32;  // fp32, bf16 or fp16
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 0;   // filled by the writer and the reader
  std::uint64_t offset = 0;  // bytes from the start of the data, filled likewise
};

// A tensor of a dtype Strata does not read, as its file describes it.
struct OtherTensor {
  std::string name;
  std::string dtype;  // safetensors' name: "I64", "F64", "F8_E4M3", ...
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;  // its data's
};

class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<TensorInfo> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // The next `count` values, filling the tensors in order.
  void write(const float* values, std::uint64_t count);
  void finish();
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }

 private:
  void put(const void* data, std::size_t bytes);
  std::string path_, tmp_;
  int fd_ = -1;
  std::vector<TensorInfo> tensors_;
  std::size_t current_ = 0;    // tensor being written
  std::uint64_t written_ = 0;  // its elements so far
  std::vector<char> buffer_;   // conversion buffer
  std::uint64_t file_offset_ = 0;
};

class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path, bool list_other_dtypes = false);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  const TensorInfo* find(const std::string& name) const noexcept;
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  // Tensors of other dtypes (empty unless opened with list_other_dtypes).
  const std::vector<OtherTensor>& other_tensors() const noexcept { return other_tensors_; }
  // Elements [elem, elem + count) of `t` (one of tensors()) as fp32.
  void read(const TensorInfo& t, std::uint64_t elem, std::uint64_t count, float* out);
  const std::string& path() const noexcept { return path_; }

 private:
  void read_header();
  std::string path_;
  bool list_other_dtypes_ = false;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<OtherTensor> other_tensors_;
  std::map<std::string, std::string> metadata_;
  std::vector<char> buffer_;  // allocated at the first read
};

// Writes fp32 tensors atomically (temporary file, then rename).
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Reads every tensor back as fp32.
std::vector<NamedTensor> read_safetensors(const std::string& path);

}  // namespace strata::model
