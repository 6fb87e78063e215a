// HfModelDir: a Hugging Face model directory (format.h) opened for reading.
//
// Protocol. The constructor reads and checks everything but the tensors' data: config.json
// (one JSON object), then the weights, `model.safetensors` or the shards that
// `model.safetensors.index.json` lists. A directory with config.json alone opens too, with
// has_weights() false (but not one whose weights are PyTorch's pytorch_model.bin: refused,
// so unreadable weights never pass for none). The index is checked against the shards' own headers, so every shard
// header is read at open: each listed shard is a file inside DIR (its name relative, with no
// `..`; the file itself may be a link, as in Hugging Face's cache), every tensor of a shard
// is in weight_map pointing at that shard, every weight_map entry is in the shard it names,
// no tensor lies in two shards, and metadata.total_size, when given, is the sum of the
// tensors' bytes. Every refusal throws strata::Error naming the file, the tensor and what to
// do. The shards stay open (one descriptor each; a read buffer only once read from), and
// read() reads only the bytes of the element range asked for, counted by bytes_read().
// check() compares the tensors with the ones a model registers (weight_check.h).
// Tensors of dtypes other than F32, BF16 and F16 are listed (other_tensors()) but not read.
// Not thread-safe: one thread reads at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/hf/weight_check.h"
#include "models/safetensors.h"

namespace strata::model {

class HfModelDir {
 public:
  explicit HfModelDir(std::string dir);
  ~HfModelDir();
  HfModelDir(const HfModelDir&) = delete;
  HfModelDir& operator=(const HfModelDir&) = delete;

  const std::string& dir() const noexcept { return dir_; }
  const nlohmann::json& config() const noexcept { return config_; }
  const std::string& config_text() const noexcept { return config_text_; }
  bool has_weights() const noexcept { return !shards_.empty(); }
  // The weight files, relative to dir(): {"model.safetensors"}, the index's shards in name
  // order, or none.
  const std::vector<std::string>& shard_files() const noexcept { return shard_names_; }

  // The readable tensors of every shard (shard by shard, each in its header's order); their
  // offsets are within their shard.
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  const std::vector<OtherTensor>& other_tensors() const noexcept { return others_; }
  const TensorInfo* find(const std::string& name) const noexcept;
  // The shard file (relative to dir()) holding tensor `name`, or "" when none does.
  std::string shard_of(const std::string& name) const;
  // The bytes of every tensor's data, readable or not (the index's total_size).
  std::uint64_t total_bytes() const noexcept { return total_bytes_; }

  // Elements [elem, elem + count) of tensor `name` as fp32.
  void read(const std::string& name, std::uint64_t elem, std::uint64_t count, float* out);
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }

  // The tensors against the model's `wanted` (name, shape); check() throws Errc::
  // invalid_argument with compare()'s message when anything is wrong.
  hf::WeightCheck compare(const hf::WantedTensors& wanted) const;
  void check(const hf::WantedTensors& wanted) const;

 private:
  void read_config();
  void open_single();
  void open_index();
  void add_shard(const std::string& name);

  std::string dir_;
  nlohmann::json config_;
  std::string config_text_;
  std::vector<std::string> shard_names_;
  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
  std::vector<TensorInfo> tensors_;
  std::vector<OtherTensor> others_;
  struct Place {
    std::size_t shard = 0, index = 0;  // index into tensors_ (readable) or others_
    bool readable = true;
  };
  std::map<std::string, Place> places_;
  std::uint64_t total_bytes_ = 0;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace strata::model
