// HfDirWriter: writes a Hugging Face model directory (format.h) by streaming the values.
//
// Protocol. The constructor takes every tensor's name and shape in the order their values
// will come, plans the shards (format.h) from the shapes alone, checks the output and creates
// the temporary sibling directory `OUT.tmp`, and opens the first shard. write() takes the
// next values in any pieces (tensor after tensor, converted from fp32 to the dtype, rounded
// to nearest even); a shard is finished (fsynced) and the next opened when its last tensor is
// complete, so one SafetensorsWriter and its fixed buffer is all the memory used. finish()
// writes `model.safetensors.index.json` (only when there are several shards; a single shard
// is `model.safetensors`) and `config.json` (the given JSON object with `torch_dtype` set to
// the written dtype), fsyncs them and the directory, renames `OUT.tmp` to OUT and fsyncs
// OUT's parent: OUT appears complete or not at all. A writer destroyed before finish()
// (an error, an interrupt) removes `OUT.tmp` and all it holds.
//
// Output rule. OUT must not exist, or be an empty directory (replaced by the rename); any
// other OUT is refused naming it, before anything is written, so an export never mixes its
// files with another model's or deletes anything. A leftover `OUT.tmp` (from a killed
// writer) is removed when it holds only files this writer makes; otherwise it is refused.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/safetensors.h"
#include "runtime/core/dtype.h"

namespace strata::model {

class HfDirWriter {
 public:
  using Tensors = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;  // name, shape
  // `metadata` is added to each shard's __metadata__ (which always has "format": "pt", as
  // transformers requires).
  HfDirWriter(std::string out_dir, const std::string& config_json_text, const Tensors& tensors, DType dtype,
              std::uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {});
  ~HfDirWriter();
  HfDirWriter(const HfDirWriter&) = delete;
  HfDirWriter& operator=(const HfDirWriter&) = delete;

  // The next `count` values, filling the tensors in order.
  void write(const float* values, std::uint64_t count);
  void finish();

  // The weight files, in order: {"model.safetensors"} or the shards' names.
  const std::vector<std::string>& shard_files() const noexcept { return shard_names_; }
  std::uint64_t total_bytes() const noexcept { return total_bytes_; }  // every tensor's data
  const std::string& out_dir() const noexcept { return out_; }

 private:
  void prepare_tmp();
  void open_shard();
  void close_finished_shards();
  void write_json(const std::string& name, const std::string& text);
  void remove_tmp() noexcept;

  std::string out_, tmp_;
  std::string config_text_;  // with torch_dtype set
  std::map<std::string, std::string> metadata_;
  std::vector<std::vector<TensorInfo>> shards_;  // each shard's tensors
  std::vector<std::uint64_t> shard_numel_;       // each shard's elements
  std::vector<std::string> shard_names_;
  std::map<std::string, std::string> weight_map_;
  std::uint64_t total_bytes_ = 0;
  std::size_t current_ = 0;    // the shard being written
  std::uint64_t written_ = 0;  // its elements so far
  std::unique_ptr<SafetensorsWriter> writer_;
  bool finished_ = false;
};

}  // namespace strata::model
