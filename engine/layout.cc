// Layout and deterministic initialisation (see layout.h).
#include "engine/layout.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "runtime/core/error.h"
#include "runtime/core/random.h"

namespace strata::engine {

Layout::Layout(std::vector<ParamSpec> params, int world_size, std::size_t bucket_elems)
    : params_(std::move(params)), world_(world_size) {
  STRATA_CHECK(world_ >= 1, Errc::invalid_argument, "world size ", world_, " must be >= 1");
  STRATA_CHECK(!params_.empty(), Errc::invalid_argument, "no parameters registered: register the model before setup()");
  STRATA_CHECK(bucket_elems >= 1, Errc::invalid_argument, "bucket size must be >= 1 element");
  std::set<std::string> names;
  std::map<int, std::vector<int>> by_layer;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    STRATA_CHECK(!p.name.empty(), Errc::invalid_argument, "parameter #", i, " has an empty name");
    STRATA_CHECK(names.insert(p.name).second, Errc::invalid_argument, "parameter '", p.name, "' is registered twice");
    STRATA_CHECK(!p.shape.empty(), Errc::invalid_argument, "parameter '", p.name, "' has no shape");
    STRATA_CHECK(p.layer >= 0, Errc::invalid_argument, "parameter '", p.name, "' has layer ", p.layer, ": use >= 0");
    p.numel = 1;
    for (auto d : p.shape) {
      STRATA_CHECK(d > 0, Errc::invalid_argument, "parameter '", p.name, "' has a dimension of ", d, ": use > 0");
      p.numel *= static_cast<std::size_t>(d);
    }
    by_layer[p.layer].push_back(static_cast<int>(i));
  }
  const std::size_t unit_elems = static_cast<std::size_t>(world_) * kShardAlign;
  // Buckets are whole units, so only a layer's last bucket carries padding and every
  // parameter stays contiguous in the padded layer buffer.
  bucket_elems = std::max(unit_elems, bucket_elems / unit_elems * unit_elems);
  for (auto& [id, members] : by_layer) {
    LayerLayout L;
    L.id = id;
    L.params = members;
    L.frozen = params_[members.front()].frozen;
    for (int pi : members) {
      STRATA_CHECK(params_[pi].frozen == L.frozen, Errc::invalid_argument, "parameter '", params_[pi].name,
                   "' of layer ", id, " is ", L.frozen ? "trainable" : "frozen", " but '",
                   params_[members.front()].name, "' is not: a layer is frozen or trainable as a whole");
      params_[pi].offset = L.numel;
      L.numel += params_[pi].numel;
    }
    L.flat_offset = padded_;
    for (std::size_t off = 0; off < L.numel; off += bucket_elems) {
      Bucket b;
      b.layer = static_cast<int>(layers_.size());
      b.layer_offset = off;
      b.numel = std::min(bucket_elems, L.numel - off);
      b.padded = (b.numel + unit_elems - 1) / unit_elems * unit_elems;
      b.shard = b.padded / world_;
      b.flat_offset = padded_;
      padded_ += b.padded;
      L.padded += b.padded;
      L.shard_offsets.push_back(L.shard);
      L.shard += b.shard;
      L.buckets.push_back(static_cast<int>(buckets_.size()));
      buckets_.push_back(b);
    }
    numel_ += L.numel;
    layers_.push_back(std::move(L));
  }
}

std::size_t Layout::largest_layer_padded() const noexcept {
  std::size_t m = 0;
  for (const auto& L : layers_) m = std::max(m, L.padded);
  return m;
}

int Layout::layer_index(int layer_id) const {
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].id == layer_id) return static_cast<int>(i);
  }
  STRATA_THROW(Errc::invalid_argument, "layer ", layer_id, " has no registered parameters (", layers_.size(),
               " layers registered)");
}

std::uint64_t Layout::fingerprint() const noexcept {
  std::uint64_t h = kFnvOffset;
  for (const auto& p : params_) {
    h = fnv1a(p.name, h);
    for (auto d : p.shape) h = splitmix64(h ^ static_cast<std::uint64_t>(d));
    h = splitmix64(h ^ static_cast<std::uint64_t>(p.layer) ^ (static_cast<std::uint64_t>(p.init.kind) << 32));
    std::uint32_t s;
    static_assert(sizeof s == sizeof p.init.scale);
    __builtin_memcpy(&s, &p.init.scale, 4);
    h = splitmix64(h ^ s);
    if (p.lr_scale != 1.0f) {  // (left out at 1, so fingerprints of earlier checkpoints still match)
      __builtin_memcpy(&s, &p.lr_scale, 4);
      h = splitmix64(h ^ s ^ (std::uint64_t{1} << 40));
    }
    if (p.frozen) h = splitmix64(h ^ (std::uint64_t{1} << 41));  // (left out when trainable, as lr_scale 1)
  }
  return h;
}

namespace {

void init_serial(const ParamSpec& p, std::uint64_t key, std::size_t begin, std::size_t count, float* out) {
  for (std::size_t k = 0; k < count; ++k) {
    const std::uint64_t i = begin + k;
    float v = 0.0f;
    switch (p.init.kind) {
      case InitKind::zeros:
        v = 0.0f;
        break;
      case InitKind::ones:
        v = 1.0f;
        break;
      case InitKind::constant:
        v = p.init.scale;
        break;
      case InitKind::uniform:
        v = static_cast<float>((2.0 * unit_open(splitmix64(key + 2 * i)) - 1.0) * p.init.scale);
        break;
      case InitKind::normal: {
        v = static_cast<float>(box_muller(splitmix64(key + 2 * i), splitmix64(key + 2 * i + 1)) * p.init.scale);
        break;
      }
    }
    out[k] = v;
  }
}

}  // namespace

// Each value is a function of its index alone, so splitting the range changes no bit; a
// billion-parameter model's values take tens of seconds on one core.
void init_values(const ParamSpec& p, std::uint64_t seed, std::size_t begin, std::size_t count, float* out) {
  const std::uint64_t key = splitmix64(seed ^ fnv1a(p.name));
  constexpr std::size_t kGrain = std::size_t{1} << 16;
  if (count <= 4 * kGrain || (p.init.kind != InitKind::uniform && p.init.kind != InitKind::normal)) {
    init_serial(p, key, begin, count, out);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, kGrain), [&](const tbb::blocked_range<std::size_t>& r) {
    init_serial(p, key, begin + r.begin(), r.size(), out + r.begin());
  });
}

}  // namespace strata::engine
