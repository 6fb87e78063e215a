#include "models/gpt/array_access.h"

#include <algorithm>

#include "engine/layout.h"
#include "models/gpt/kernels.h"

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

std::uint64_t DeviceArrayAccess::bytes(const GptShape& s) noexcept {
  return 2 * gpt_parameter_count(s) * sizeof(float);
}

DeviceArrayAccess::DeviceArrayAccess(device::Device& dev, GptKernels& kernels,
                                     const std::vector<std::vector<NamedTensor>>& params)
    : k_(kernels), open_(params.size(), false) {
  std::size_t total = 0;
  for (const auto& layer : params)
    for (const auto& t : layer) total += 2 * t.data.size();
  mem_ = device::DeviceBuffer(dev, std::max<std::size_t>(total, 1) * sizeof(float), "gpt parameters and gradients");
  auto stream = dev.create_stream();
  float* at = mem_.as<float>();
  for (const auto& layer : params) {
    p_.emplace_back();
    g_.emplace_back();
    n_.emplace_back();
    for (const auto& t : layer) {
      stream->copy_async(at, t.data.data(), t.data.size() * sizeof(float), device::CopyKind::host_to_device);
      p_.back().push_back(at);
      g_.back().push_back(at + t.data.size());
      n_.back().push_back(t.data.size());
      at += 2 * t.data.size();
    }
  }
  stream->synchronize();
}

std::vector<const float*> DeviceArrayAccess::acquire(int layer) {
  const auto& v = p_[static_cast<std::size_t>(layer)];
  return std::vector<const float*>(v.begin(), v.end());
}

std::vector<float*> DeviceArrayAccess::grads(int layer) {
  const auto l = static_cast<std::size_t>(layer);
  if (!open_[l]) {
    for (std::size_t i = 0; i < g_[l].size(); ++i) k_.zero(g_[l][i], n_[l][i]);
    open_[l] = true;
  }
  return g_[l];
}

void DeviceArrayAccess::commit(int layer) { open_[static_cast<std::size_t>(layer)] = false; }

std::vector<std::vector<float>> DeviceArrayAccess::all_grads() {
  std::vector<std::vector<float>> out;
  for (std::size_t l = 0; l < g_.size(); ++l) {
    for (std::size_t i = 0; i < g_[l].size(); ++i) {
      out.emplace_back(n_[l][i]);
      k_.to_host(out.back().data(), g_[l][i], n_[l][i]);
    }
  }
  return out;
}

}  // namespace strata::model
