// Whether a set of weights on disk is the one a model registers: the model's wanted tensors
// (name, shape) against the tensors found (name, shape, safetensors dtype). Pure: it knows
// neither files nor models. Every problem is collected, not only the first, so one message
// can say all that is wrong with a directory: the tensors missing, extra, of another shape,
// and those stored in a dtype Strata does not read (anything but F32, BF16 and F16). A
// wanted tensor of an unreadable dtype counts as mis-typed (not also mis-shaped); an unwanted
// one as extra.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata::model::hf {

using WantedTensors = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

struct FoundTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string dtype;  // safetensors' name: "F32", "BF16", "I64", ...
};

struct WeightCheck {
  struct Misshaped {
    std::string name;
    std::vector<std::int64_t> expected, found;
  };
  struct Mistyped {
    std::string name, dtype;
  };
  std::vector<std::string> missing, extra;  // in the model's order; by name
  std::vector<Misshaped> misshaped;
  std::vector<Mistyped> mistyped;

  bool ok() const noexcept { return missing.empty() && extra.empty() && misshaped.empty() && mistyped.empty(); }
  // One message for all of it, "" when ok(): per kind, its count and its first few tensors,
  // then what to do. `where` names the weights ("'DIR'").
  std::string message(const std::string& where) const;
};

WeightCheck compare_weights(const WantedTensors& wanted, const std::vector<FoundTensor>& found);

}  // namespace strata::model::hf
