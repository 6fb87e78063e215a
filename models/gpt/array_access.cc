#include "models/gpt/array_access.h"

#include <algorithm>

#include "engine/layout.h"

namespace strata::model {

std::vector<NamedTensor> gpt_initial_params(const GptShape& s, std::uint64_t seed, bool unit_scaled) {
  std::vector<NamedTensor> out;
  for (const auto& p : gpt_params(s, unit_scaled)) {
    engine::ParamSpec spec{p.name, p.shape, p.layer, p.init};
    std::size_t n = 1;
    for (auto d : p.shape) n *= static_cast<std::size_t>(d);
    std::vector<float> v(n);
    engine::init_values(spec, seed, 0, n, v.data());
    out.push_back({p.name, p.shape, std::move(v)});
  }
  return out;
}

ArrayAccess::ArrayAccess(std::vector<std::vector<NamedTensor>>& params)
    : p_(params), g_(params.size()), open_(params.size(), false) {}

std::vector<std::vector<NamedTensor>> ArrayAccess::by_layer(const GptShape& s, std::vector<NamedTensor> all) {
  std::vector<std::vector<NamedTensor>> out(static_cast<std::size_t>(s.layers + 2));
  const auto specs = gpt_params(s);
  for (std::size_t i = 0; i < specs.size() && i < all.size(); ++i) {
    out[static_cast<std::size_t>(specs[i].layer)].push_back(std::move(all[i]));
  }
  return out;
}

std::vector<const float*> ArrayAccess::acquire(int layer) {
  std::vector<const float*> out;
  for (auto& t : p_[static_cast<std::size_t>(layer)]) out.push_back(t.data.data());
  return out;
}

std::vector<float*> ArrayAccess::grads(int layer) {
  const auto l = static_cast<std::size_t>(layer);
  if (!open_[l]) {
    if (g_[l].empty()) {
      for (auto& t : p_[l]) g_[l].push_back({t.name, t.shape, std::vector<float>(t.data.size())});
    }
    for (auto& t : g_[l]) std::fill(t.data.begin(), t.data.end(), 0.0f);
    open_[l] = true;
  }
  std::vector<float*> out;
  for (auto& t : g_[l]) out.push_back(t.data.data());
  return out;
}

void ArrayAccess::commit(int layer) { open_[static_cast<std::size_t>(layer)] = false; }

std::vector<NamedTensor> ArrayAccess::all_grads() const {
  std::vector<NamedTensor> out;
  for (const auto& l : g_) out.insert(out.end(), l.begin(), l.end());
  return out;
}

}  // namespace strata::model
