// The out_of_budget message of plan_placement() (see placement.h): every tier whose budget
// is below what it must hold whatever the placement (its floor), then the smallest budget
// of each single tier that makes the plan fit with the others as they are, and whether an
// nvme_path would make it fit. Each number is one the planner accepts and refuses one byte below.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "offload/detail/placement_model.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::offload::detail {
namespace {

const char* key(int t) {
  return t == kDevice ? "memory_budget.device" : t == kHost ? "memory_budget.host" : "memory_budget.nvme";
}
const char* word(int t) { return t == kDevice ? "device" : t == kHost ? "host" : "NVMe"; }

__extension__ typedef unsigned __int128 U128;

// format_bytes() rounds to two decimals; a config value must be a whole number of bytes.
// True when format_bytes(b) reads back as exactly b ("40.00 MiB"), false for "1.17 KiB".
bool round_trips(std::uint64_t b) {
  U128 unit = 1;
  while (b / unit >= 1024 && unit < (U128{1} << 50)) unit *= 1024;
  if (unit == 1) return true;
  const U128 hundredths = (U128{b} * 100 + unit / 2) / unit;
  return hundredths * unit == U128{b} * 100;
}

// "1.18 KiB": two decimals rounded up, so a shown minimum is never below the true one.
std::string format_up(std::uint64_t b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  U128 unit = 1;
  int u = 0;
  while (b / unit >= 1024 && u < 5) unit *= 1024, ++u;
  if (u == 0) return str_cat(b, " B");
  const auto h = static_cast<std::uint64_t>((U128{b} * 100 + unit - 1) / unit);
  return str_cat(h / 100, ".", h % 100 < 10 ? "0" : "", h % 100, " ", units[u]);
}

// A value to type into the config: "40.00 MiB" when exact, else the bytes ("1200 B").
std::string typeable(std::uint64_t b) { return round_trips(b) ? format_bytes(b) : str_cat(b, " B"); }

std::string budget_text(const Model& m, int t) {
  if (m.cap[t] == kUnlimited) return "unlimited";
  return round_trips(m.cap[t]) ? format_bytes(m.cap[t]) : str_cat(m.cap[t], " B (", format_bytes(m.cap[t]), ")");
}

// A budget as the model's state has it: the device's is what the trainer leaves of it.
std::string budget_text(const PlacementProblem& p, const Model& m, int t) {
  if (t != kDevice || p.device_held == 0 || m.cap[t] == kUnlimited) return budget_text(m, t);
  return str_cat(budget_text(m, t), " (what is left of it after the ", format_bytes(p.device_held),
                 " the trainer holds)");
}

// What to set a budget to for the model's state to have `bytes` of it.
std::string raise_to(const PlacementProblem& p, int t, std::uint64_t bytes) {
  return typeable(bytes + (t == kDevice ? p.device_held : 0));
}

struct Floor {
  std::uint64_t total = 0;
  std::string parts;  // "live window 40.00 MiB, parameters 8.00 MiB"
};

// What tier t holds whatever the placement: its fixed bytes, the state the stage keeps
// there and the items the configuration fixes there. Every other item can live elsewhere.
Floor floor_of(const PlacementProblem& p, const Model& m, int t) {
  Floor f;
  auto add = [&](const std::string& what, std::uint64_t bytes) {
    if (bytes == 0) return;
    f.parts += str_cat(f.parts.empty() ? "" : ", ", what, " ", format_bytes(bytes));
    f.total += bytes;
  };
  if (t == kDevice) add("live window and persistent layers", p.device_fixed_bytes);
  if (t == kHost) add("reduction scratch and gather staging", p.host_fixed_bytes);
  if (t == kDevice)
    add(p.stage == 0 ? "optimizer state and parameters at ZeRO stage 0" : "parameters below ZeRO stage 3",
        m.immovable[kDevice]);
  std::uint64_t opt = 0, params = 0;
  bool nvme = false;
  std::array<bool, 2> nvme_of{};  // [optimizer]
  for (const Item& it : m.items) {
    if (!it.fixed) continue;
    for (int q = 0; q < 3; ++q) {
      if (!it.can(q)) continue;
      (it.optimizer ? opt : params) += it.bytes[q][t];
      nvme = nvme || q == kNvme;
      nvme_of[it.optimizer] = nvme_of[it.optimizer] || q == kNvme;
    }
  }
  if (p.optimizer_fixed)
    add(str_cat("optimizer state (offload_optimizer.device = \"", config_value(*p.optimizer_fixed), "\")"), opt);
  if (p.params_fixed)
    add(str_cat("parameter shards (offload_param.device = \"", config_value(*p.params_fixed), "\")"), params);
  if (t == kHost && nvme) add("NVMe swap buffers", m.buffer);
  if (t == kNvme && nvme_of[1]) add("spare files (offload_optimizer.spare_sub_groups)", m.spare[1]);
  if (t == kNvme && nvme_of[0]) add("spare files (offload_param.spare_chunks)", m.spare[0]);
  return f;
}

std::string join(const std::vector<std::string>& parts, const char* between) {
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : between) + part;
  return out;
}

std::string needs(int t, std::uint64_t bytes) {
  return str_cat("the ", word(t), " needs at least ", format_up(bytes), " (", bytes, " B)");
}

}  // namespace

std::string refusal_message(const PlacementProblem& p, const Model& m) {
  // The fixes lead (every floor that must be raised, then the alternatives, one of which
  // suffices), in a sentence of their own; the reasons follow.
  std::vector<std::string> required, either;
  std::vector<std::pair<double, std::string>> raises;  // (needed / budget, the fix)
  std::ostringstream os;
  os << "At ZeRO stage " << p.stage << " (" << p.layers.size() << " layers):";
  Model raised = m;
  bool floored = false;
  for (int t = 0; t < 3; ++t) {
    const Floor f = floor_of(p, m, t);
    if (f.total <= m.cap[t]) continue;
    floored = true;
    raised.cap[t] = f.total;
    os << " " << key(t) << " = " << budget_text(p, m, t) << " is too small for this model at ZeRO stage " << p.stage
       << ": " << needs(t, f.total) << " with everything else " << (t == kDevice ? "offloaded" : "on other tiers")
       << " (" << f.parts << "). Raise " << key(t) << " to at least " << raise_to(p, t, f.total) << ".";
    required.push_back(str_cat(key(t), " to at least ", raise_to(p, t, f.total)));
  }
  const auto lead = [&] {
    std::string text = "no placement of the model state fits the memory budgets: ";
    if (!required.empty()) text += "raise " + join(required, " and ");
    if (!either.empty()) text += str_cat(required.empty() ? "" : ", then ", join(either, ", or "));
    if (required.empty() && either.empty()) text += "raise several budgets, or give the model more ranks";
    return text + ". Why: " + os.str();
  };
  if (floored) {
    if (complete(raised, solve(raised, p.search_nodes).state)) return lead();
    os << " Even then nothing fits:";
  }
  int alternatives = 0;
  for (int t = 0; t < 3; ++t) {
    if (t == kNvme && (!p.nvme_available || raised.cap[kNvme] == kUnlimited)) continue;
    const auto least = min_cap(raised, t, p.search_nodes);
    if (!least || *least <= raised.cap[t]) continue;
    os << (alternatives++ ? " Or:" : "") << " " << key(t) << " = " << budget_text(p, raised, t)
       << " is too small for this model at ZeRO stage " << p.stage << " with ";
    int others = 0;
    for (int u = 0; u < 3; ++u) {
      if (u == t || (u == kNvme && !p.nvme_available)) continue;
      os << (others++ ? " and " : "") << key(u) << " = " << budget_text(p, raised, u);
    }
    os << ": " << needs(t, *least) << ". Raise " << key(t) << " to at least " << raise_to(p, t, *least) << ".";
    // The smallest raise, relative to the budget it changes, leads.
    raises.emplace_back(static_cast<double>(*least) / static_cast<double>(std::max<std::uint64_t>(1, raised.cap[t])),
                        str_cat("raise ", key(t), " to at least ", raise_to(p, t, *least)));
  }
  std::stable_sort(raises.begin(), raises.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& r : raises) either.push_back(std::move(r.second));
  if (!p.nvme_available) {
    PlacementProblem q = p;
    q.nvme_available = true;
    q.nvme_budget = 0;
    Model with_nvme = build_model(q);
    with_nvme.cap[kDevice] = raised.cap[kDevice];
    with_nvme.cap[kHost] = raised.cap[kHost];
    const Outcome o = solve(with_nvme, p.search_nodes);
    if (complete(with_nvme, o.state)) {
      bool opt = false, params = false;
      for (std::size_t i = 0; i < with_nvme.items.size(); ++i) {
        if (o.state.place[i] == kNvme) (with_nvme.items[i].optimizer ? opt : params) = true;
      }
      os << (alternatives++ ? " Or:" : "") << " set " << (opt ? "offload_optimizer.nvme_path" : "")
         << (opt && params ? " and " : "") << (params ? "offload_param.nvme_path" : "") << " so that "
         << (opt && params ? "optimizer state and parameters"
             : opt         ? "optimizer state"
                           : "parameters")
         << " can move to NVMe (no nvme_path is configured).";
      either.push_back(str_cat("set ", opt ? "offload_optimizer.nvme_path" : "", opt && params ? " and " : "",
                               params ? "offload_param.nvme_path" : ""));
    }
  }
  if (alternatives == 0) os << " No single budget is enough: raise several, or give the model more ranks.";
  return lead();
}

}  // namespace strata::offload::detail
