// add_lora (lora_estimate.h).
#include "train/lora_estimate.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace strata::train {

LoraShape add_lora(std::vector<engine::ParamSpec>& params, int rank, const std::vector<std::string>& targets) {
  STRATA_CHECK(rank >= 1, Errc::invalid_argument, "--lora-rank ", rank, " must be at least 1");
  int top = 0;
  for (const auto& p : params) top = std::max(top, p.layer);
  LoraShape s;
  std::vector<engine::ParamSpec> adapters;
  for (auto& p : params) {
    p.frozen = true;
    std::uint64_t n = 1;
    for (auto d : p.shape) n *= static_cast<std::uint64_t>(d);
    s.frozen += n;
    const bool target = std::any_of(targets.begin(), targets.end(),
                                    [&](const std::string& t) { return p.name.find(t) != std::string::npos; });
    if (!target || p.shape.size() != 2) continue;
    const std::string stem =
        p.name.size() > 7 && p.name.ends_with(".weight") ? p.name.substr(0, p.name.size() - 7) : p.name;
    engine::ParamSpec a, b;
    a.name = stem + ".lora_A.weight";
    a.shape = {rank, p.shape[1]};
    b.name = stem + ".lora_B.weight";
    b.shape = {p.shape[0], rank};
    a.layer = b.layer = top + 1 + p.layer;  // the block's adapters: a trainable layer of their own
    b.init = {engine::InitKind::zeros, 0.0f};
    s.trainable += static_cast<std::uint64_t>(rank) * static_cast<std::uint64_t>(p.shape[0] + p.shape[1]);
    ++s.adapted;
    adapters.push_back(std::move(a));
    adapters.push_back(std::move(b));
  }
  std::string names;
  for (std::size_t i = 0; i < params.size() && i < 4; ++i) names += (i ? ", " : "") + params[i].name;
  STRATA_CHECK(s.adapted > 0, Errc::invalid_argument, "--lora-targets: no 2-D weight's name holds any of the targets (",
               targets.size(), " given); the model's names look like ", names);
  params.insert(params.end(), adapters.begin(), adapters.end());
  return s;
}

}  // namespace strata::train
