// Parameter groups: per-group hyperparameters (lr, betas, eps, weight_decay, ...) as in
// torch.optim and DeepSpeed's optimizer "params". Group 0 holds the defaults the optimizer was
// created with; add() appends a group and returns its id. Every config is validated when it
// enters (validate(const Config&) throws Errc::invalid_argument naming the field), so a step
// never meets a bad one. Not thread-safe: change groups between steps, not during one.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/core/error.h"

namespace strata::optim {

template <class Config> class ParamGroups {
 public:
  explicit ParamGroups(const Config& defaults) {
    validate(defaults);
    groups_.push_back(defaults);
  }
  int add(const Config& config) {
    validate(config);
    groups_.push_back(config);
    return static_cast<int>(groups_.size()) - 1;
  }
  const Config& get(int id) const { return groups_[index(id)]; }
  void set(int id, const Config& config) {
    validate(config);
    groups_[index(id)] = config;
  }
  std::size_t size() const noexcept { return groups_.size(); }

 private:
  std::size_t index(int id) const {
    STRATA_CHECK(id >= 0 && static_cast<std::size_t>(id) < groups_.size(), Errc::invalid_argument, "parameter group ",
                 id, " does not exist (the optimizer has ", groups_.size(), ")");
    return static_cast<std::size_t>(id);
  }
  std::vector<Config> groups_;
};

}  // namespace strata::optim
