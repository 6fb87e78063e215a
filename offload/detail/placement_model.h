// The placement problem in item form (built in placement_model.cc), shared by the planner
// (placement.cc), its exact search (placement_search.cc), the refusal message
// (placement_refusal.cc) and explain() (placement_explain.cc): every movable piece of state
// is an Item with, per place, the bytes it takes on each tier and the bytes it moves.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "offload/placement.h"

namespace strata::offload::detail {

constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();
constexpr int kDevice = 0, kHost = 1, kNvme = 2;
enum Flow { kH2d = 0, kD2h = 1, kNvmeRead = 2, kNvmeWrite = 3 };

inline std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) { return a > kUnlimited - b ? kUnlimited : a + b; }

struct Item {
  std::size_t layer = 0;
  bool optimizer = false;                               // else params
  bool fixed = false;                                   // one allowed place, by configuration
  std::uint8_t allowed = 0;                             // bit per place
  std::array<std::array<std::uint64_t, 3>, 3> bytes{};  // [place][tier]
  std::array<std::array<std::uint64_t, 4>, 3> flow{};   // [place][Flow], per step
  std::array<std::uint64_t, 3> moved{};                 // [place], sum of flow
  bool can(int place) const { return (allowed >> place) & 1u; }
};

// Fixed bytes per tier and every item; caps are the budgets (kUnlimited for an unlimited
// NVMe, 0 for an absent one). The immovable state of stages 0-2 is folded into base.
struct Model {
  std::vector<Item> items;
  std::array<std::uint64_t, 3> base{};       // fixed parts incl. immovable state
  std::array<std::uint64_t, 3> immovable{};  // the state part of base (for messages)
  std::array<std::uint64_t, 3> cap{};
  std::uint64_t buffer = 0;               // host bytes once anything is on NVMe
  std::array<std::uint64_t, 2> spare{};   // NVMe bytes once any item of a kind is there ([optimizer]: 1, params: 0)
  std::vector<int> opt_item, param_item;  // per layer: item index or -1
  bool device_gathers = false;            // PlacementProblem::device_gathers
};

// Validates (throws Errc::invalid_argument) and builds.
Model build_model(const PlacementProblem& p);

// An assignment of places with its tier usage, maintained incrementally.
struct State {
  std::vector<int> place;  // per item, -1 = unplaced
  std::array<std::uint64_t, 3> used{};
  std::size_t on_nvme = 0;
  std::array<std::size_t, 2> on_nvme_of{};  // of them, items of each kind ([optimizer])
  std::uint64_t moved = 0;
};

State empty_state(const Model& m);
bool fits(const Model& m, const State& s, std::size_t item, int place);
void put(const Model& m, State& s, std::size_t item, int place);
void take(const Model& m, State& s, std::size_t item);
bool complete(const Model& m, const State& s);  // every item placed, every tier within its cap

// Steps 1-7 of the protocol in placement.h; `optimal` when the search finished. The state
// is incomplete (complete() is false) when nothing was found that fits.
struct Outcome {
  State state;
  bool optimal = false;
};
Outcome solve(const Model& m, std::uint64_t nodes);

// The smallest cap of `tier` for which solve() finds a placement, the others as in m.
std::optional<std::uint64_t> min_cap(Model m, int tier, std::uint64_t nodes);

const char* config_value(Tier p);                                        // the config's word: "none", "cpu", "nvme"
std::string refusal_message(const PlacementProblem& p, const Model& m);  // placement_refusal.cc

// Branch and bound (step 6 of the protocol). Replaces `best` when it finds a complete
// placement that moves fewer bytes (or any when `best` is incomplete). Returns true if the
// search finished within `node_limit`, so that `best` is optimal (or nothing fits).
bool search_placement(const Model& m, State& best, std::uint64_t node_limit);

}  // namespace strata::offload::detail
