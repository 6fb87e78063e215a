// How a model's parameters are laid out and partitioned (ZeRO's flat buffers). Each layer's
// parameters are packed, in registration order, into one flat buffer; the flat buffer is
// cut into buckets of at most `bucket_elems` elements, rounded down to whole padding units
// (a layer larger than a bucket is split; only its last bucket is padded); each bucket is padded with zeros to a
// multiple of world_size x kShardAlign elements and cut into world_size equal shards, rank r owning [r*shard,
// (r+1)*shard). Padding costs at most world_size x kShardAlign - 1 elements per bucket; it keeps every shard 64-byte
// aligned and every rank's work equal. The layout depends only on the registrations, the world size and the bucket
// size, so every stage sees the same buckets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::engine {

enum class InitKind { normal, uniform, zeros, ones, constant };

// normal: N(0, scale^2); uniform: U(-scale, scale); constant: every element = scale.
struct ParamInit {
  InitKind kind = InitKind::normal;
  float scale = 0.02f;
};

struct ParamSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  int layer = 0;  // the user's layer id
  ParamInit init;
  // Multiplies the learning rate of this parameter's updates (a model that stores a weight
  // at a scale other than the one it computes with: models/gpt/unit_scale.h); decoupled
  // weight decay (AdamW, Lion) keeps the base rate, so p *= 1 - lr * weight_decay as before.
  float lr_scale = 1.0f;
  // Its layer is frozen (Engine::freeze_layer): no gradient, no optimizer state.
  bool frozen = false;
  std::size_t numel = 0;   // filled by Layout
  std::size_t offset = 0;  // within its layer's flat buffer, filled by Layout
};

struct Bucket {
  int layer = 0;                 // dense layer index
  std::size_t layer_offset = 0;  // first element within the layer's flat buffer
  std::size_t numel = 0;         // real elements
  std::size_t padded = 0;        // numel rounded up to world_size x kShardAlign
  std::size_t shard = 0;         // padded / world_size
  std::size_t flat_offset = 0;   // within the whole model's padded flat buffer
};

struct LayerLayout {
  int id = 0;  // the user's layer id
  // Frozen (Engine::freeze_layer): its parameters are held in the compute dtype only and never
  // take a gradient or optimizer state.
  bool frozen = false;
  std::vector<int> params;   // indices into Layout::params()
  std::vector<int> buckets;  // indices into Layout::buckets()
  std::size_t numel = 0;
  std::size_t padded = 0;       // sum of its buckets' padded sizes
  std::size_t flat_offset = 0;  // of its first bucket
  // One rank's shard of the layer: its shard of every bucket, concatenated in bucket order.
  std::size_t shard = 0;                   // elements
  std::vector<std::size_t> shard_offsets;  // per bucket: where its shard starts in the layer's
};

class Layout {
 public:
  static constexpr std::size_t kShardAlign = 16;

  // Throws Errc::invalid_argument for an empty model, duplicate names, bad shapes, a layer
  // whose parameters disagree on `frozen`.
  Layout(std::vector<ParamSpec> params, int world_size, std::size_t bucket_elems);

  const std::vector<ParamSpec>& params() const noexcept { return params_; }
  const std::vector<LayerLayout>& layers() const noexcept { return layers_; }
  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  int world_size() const noexcept { return world_; }
  std::size_t total_numel() const noexcept { return numel_; }
  std::size_t total_padded() const noexcept { return padded_; }
  std::size_t largest_layer_padded() const noexcept;
  // Elements of one rank's shard of layer li: its shard of every bucket, concatenated.
  std::size_t layer_shard(int li) const { return layers_[li].shard; }
  // Dense index of a user layer id; throws naming the id when it was never registered.
  int layer_index(int layer_id) const;
  // 64-bit hash of every registration (names, shapes, layers, init, lr_scale, frozen) for cross-rank checks.
  std::uint64_t fingerprint() const noexcept;

 private:
  std::vector<ParamSpec> params_;
  std::vector<LayerLayout> layers_;
  std::vector<Bucket> buckets_;
  int world_;
  std::size_t numel_ = 0, padded_ = 0;
};

// Deterministic initial values: element i of parameter p depends only on (seed, p.name,
// p.init, i), never on rank, world size or stage. Writes `count` values from `begin`.
void init_values(const ParamSpec& p, std::uint64_t seed, std::size_t begin, std::size_t count, float* out);

}  // namespace strata::engine
