// Model tensors against the tensors on disk (see weight_check.h).
#include "models/hf/weight_check.h"

#include <algorithm>
#include <map>

#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::model::hf {
namespace {

constexpr std::size_t kShown = 5;  // tensors named per kind of problem

bool readable(const std::string& dtype) { return dtype == "F32" || dtype == "BF16" || dtype == "F16"; }

// "3 missing: 'a', 'b', 'c'" or "12 missing: 'a', ... (and 7 more)".
template <class T, class F> std::string listing(const std::vector<T>& items, const char* kind, F describe) {
  std::string out = str_cat(items.size(), " ", kind, ": ");
  for (std::size_t i = 0; i < items.size() && i < kShown; ++i) out += (i ? ", " : "") + describe(items[i]);
  if (items.size() > kShown) out += str_cat(" (and ", items.size() - kShown, " more)");
  return out;
}

}  // namespace

WeightCheck compare_weights(const WantedTensors& wanted, const std::vector<FoundTensor>& found) {
  WeightCheck c;
  std::map<std::string, const FoundTensor*> by_name;
  for (const auto& f : found) by_name.emplace(f.name, &f);
  std::map<std::string, bool> is_wanted;
  for (const auto& [name, shape] : wanted) {
    is_wanted[name] = true;
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      c.missing.push_back(name);
    } else if (!readable(it->second->dtype)) {
      c.mistyped.push_back({name, it->second->dtype});
    } else if (it->second->shape != shape) {
      c.misshaped.push_back({name, shape, it->second->shape});
    }
  }
  for (const auto& f : found)
    if (!is_wanted.count(f.name)) c.extra.push_back(f.name);
  std::sort(c.extra.begin(), c.extra.end());
  return c;
}

std::string WeightCheck::message(const std::string& where) const {
  if (ok()) return {};
  const auto quoted = [](const std::string& n) { return "'" + n + "'"; };
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back(listing(missing, "missing (the model registers them)", quoted));
  if (!extra.empty()) parts.push_back(listing(extra, "extra (the model does not register them)", quoted));
  if (!misshaped.empty()) {
    parts.push_back(listing(misshaped, "mis-shaped", [](const Misshaped& m) {
      return str_cat("'", m.name, "' (expected ", format_shape(m.expected), ", found ", format_shape(m.found), ")");
    }));
  }
  if (!mistyped.empty()) {
    parts.push_back(listing(mistyped, "mis-typed (Strata reads F32, BF16 and F16)",
                            [](const Mistyped& m) { return str_cat("'", m.name, "' (", m.dtype, ")"); }));
  }
  std::string out = str_cat(where, " does not hold this model's weights: ");
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out +
         ". Check that the directory is a checkpoint of this model (config.json's architecture and sizes), or "
         "convert its weights to F32, BF16 or F16";
}

}  // namespace strata::model::hf
