// Placement::explain() (see placement.h): one row per run of layers placed alike, with the
// bytes each layer takes per tier and why each item sits where it does, then the tiers
// against their budgets and the bytes predicted to move per step.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "offload/detail/placement_model.h"
#include "runtime/core/error.h"
#include "runtime/core/units.h"

namespace strata::offload {
namespace {

using namespace detail;

// Why an item is at q: the configuration, or the places that would move fewer bytes are
// full (the planner ends with no single move to a cheaper place that fits, so they are).
std::string why(const Item& it, int q) {
  const char* kind = it.optimizer ? "optimizer " : "params ";
  const Tier at = static_cast<Tier>(q);
  if (it.fixed) {
    return str_cat(kind, tier_name(at), ": ", it.optimizer ? "offload_optimizer" : "offload_param", ".device = \"",
                   config_value(at), "\"");
  }
  std::string full;
  for (int b : {kDevice, kHost, kNvme}) {
    if (it.can(b) && it.moved[b] < it.moved[q])
      full += str_cat(full.empty() ? "" : " and ", tier_name(static_cast<Tier>(b)));
  }
  if (full.empty()) {
    return str_cat(kind, tier_name(at),
                   it.optimizer ? ": budget left"
                   : q == kHost ? ": fewest bytes moved (gathers stage through host)"
                                : ": fewest bytes moved");
  }
  const bool spares_nvme = q != kNvme && it.can(kNvme) && it.moved[kNvme] > it.moved[q];
  return str_cat(kind, tier_name(at), ": ", full, " full", spares_nvme ? ", keeps NVMe traffic down" : "");
}

struct Row {
  std::string first, last;
  std::size_t count = 1;
  std::string optimizer, params, why;
  std::array<std::uint64_t, 3> bytes{};
  bool same(const Row& o) const {
    return optimizer == o.optimizer && params == o.params && why == o.why && bytes == o.bytes;
  }
};

std::string budget(std::uint64_t b) { return b == kUnlimited ? std::string("unlimited") : format_bytes(b); }

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

}  // namespace

std::string Placement::explain(const PlacementProblem& p) const {
  const Model m = build_model(p);
  STRATA_CHECK(layers.size() == p.layers.size(), Errc::invalid_argument, "Placement::explain: the placement has ",
               layers.size(), " layers, the problem ", p.layers.size());
  const std::uint64_t c = p.compute_bytes;
  std::vector<Row> rows;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const auto& L = p.layers[i];
    Row r;
    r.first = r.last = L.name;
    r.optimizer = tier_name(layers[i].optimizer);
    r.params = tier_name(layers[i].params);
    if (m.opt_item[i] >= 0) {
      const Item& it = m.items[m.opt_item[i]];
      const int q = static_cast<int>(layers[i].optimizer);
      for (int t = 0; t < 3; ++t) r.bytes[t] += it.bytes[q][t];
      r.why = why(it, q);
    } else if (L.frozen) {
      r.optimizer = "-";
      r.why = "frozen: no gradient or optimizer state";
    } else {
      r.bytes[kDevice] += static_cast<std::uint64_t>(
          std::llround((p.state_bytes + 4) * double(L.padded_elems)));  // state and accumulator, as the model counts
      r.why = "optimizer device: ZeRO stage 0";
    }
    if (m.param_item[i] >= 0) {
      const Item& it = m.items[m.param_item[i]];
      const int q = static_cast<int>(layers[i].params);
      for (int t = 0; t < 3; ++t) r.bytes[t] += it.bytes[q][t];
      r.why += "; " + why(it, q);
    } else {
      r.bytes[kDevice] += c * L.padded_elems;
      r.why += str_cat("; params device: ZeRO stage ", p.stage, " keeps them there");
    }
    if (!rows.empty() && rows.back().same(r)) {
      rows.back().last = r.last;
      ++rows.back().count;
    } else {
      rows.push_back(std::move(r));
    }
  }
  std::vector<std::string> names;
  std::size_t name_w = 6;
  for (const Row& r : rows) {
    names.push_back(r.count == 1 ? r.first : str_cat(r.first, " .. ", r.last, " (", r.count, ", each)"));
    name_w = std::max(name_w, names.back().size());
  }
  std::ostringstream os;
  os << "placement at ZeRO stage " << p.stage << ", " << p.layers.size() << " layers, " << c
     << " B per compute element, " << p.accumulation_steps << " micro-batch(es) per step ("
     << (proven_optimal ? "optimal: no placement moves fewer bytes" : "greedy, not proven optimal") << "):\n";
  os << "  " << pad("layers", name_w) << "  optimizer  params  " << pad("device", 12) << pad("host", 12)
     << pad("nvme", 12) << "why\n";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const Row& r = rows[k];
    os << "  " << pad(names[k], name_w) << "  " << pad(r.optimizer, 9) << "  " << pad(r.params, 6) << "  "
       << pad(format_bytes(r.bytes[0]), 12) << pad(format_bytes(r.bytes[1]), 12) << pad(format_bytes(r.bytes[2]), 12)
       << r.why << "\n";
  }
  const bool any_nvme = std::any_of(layers.begin(), layers.end(), [](const LayerPlacement& l) {
    return l.optimizer == Tier::nvme || l.params == Tier::nvme;
  });
  std::uint64_t spares = 0;  // the spare files of the kinds placed on NVMe
  for (const bool opt : {false, true}) {
    if (std::any_of(layers.begin(), layers.end(),
                    [&](const LayerPlacement& l) { return (opt ? l.optimizer : l.params) == Tier::nvme; }))
      spares += opt ? p.nvme_state_spare_bytes : p.nvme_param_spare_bytes;
  }
  os << "tiers (model state, fixed parts included):\n";
  os << "  device  " << pad(format_bytes(tier_bytes[0]), 12) << "of " << pad(budget(p.device_budget), 12)
     << "(fixed: live window and persistent layers " << format_bytes(p.device_fixed_bytes) << ")\n";
  os << "  host    " << pad(format_bytes(tier_bytes[1]), 12) << "of " << pad(budget(p.host_budget), 12)
     << "(fixed: reduction scratch and gather staging " << format_bytes(p.host_fixed_bytes)
     << (any_nvme ? str_cat("; NVMe swap buffers ", format_bytes(p.nvme_buffer_bytes)) : std::string()) << ")\n";
  os << "  nvme    " << pad(format_bytes(tier_bytes[2]), 12) << "of "
     << (!p.nvme_available    ? std::string("nothing (no nvme_path configured)")
         : p.nvme_budget == 0 ? std::string("unlimited")
                              : budget(p.nvme_budget))
     << (spares > 0 ? str_cat(" (fixed: spare swap files ", format_bytes(spares), ")") : std::string()) << "\n";
  os << "moved per step: " << format_bytes(h2d_bytes) << " host-to-device, " << format_bytes(d2h_bytes)
     << " device-to-host, " << format_bytes(nvme_read_bytes) << " read from NVMe, " << format_bytes(nvme_write_bytes)
     << " written to NVMe; " << format_bytes(moved_bytes()) << " in all\n";
  return os.str();
}

}  // namespace strata::offload
