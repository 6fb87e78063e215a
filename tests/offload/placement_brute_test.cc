// The placement planner against exhaustive search on random 3-4 layer problems. The search
// and the cost model here are written from the model in placement.h, not from the planner's
// code, so they check both the accounting and the choices. A third of the problems have spare
// swap files (NVMe bytes taken once any item of their kind is there). Measured (seeds fixed):
// on 3-4 layers the planner as configured finds a placement whenever one exists and always the
// optimum; greedy alone (search_nodes = 0) misses 3 of 1454 that fit and is at worst 1.23x the
// optimum (mean 1.001x); on 16 layers the default search is within 1.001x of a completed
// search and greedy alone within 1.05x.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>

#include "offload/placement.h"
#include "runtime/core/error.h"

using namespace strata;
using offload::LayerPlacement;
using offload::PlacementProblem;
using offload::Tier;

namespace {

struct Eval {
  bool fits = false;
  std::array<std::uint64_t, 3> tier{};
  std::uint64_t h2d = 0, d2h = 0, read = 0, write = 0;
  std::uint64_t moved() const { return h2d + d2h + read + write; }
};

Eval evaluate(const PlacementProblem& p, const std::vector<LayerPlacement>& lp) {
  Eval e;
  const std::uint64_t c = p.compute_bytes, A = static_cast<std::uint64_t>(p.accumulation_steps);
  e.tier[0] = p.device_fixed_bytes;
  e.tier[1] = p.host_fixed_bytes;
  bool nvme = false, opt_nvme = false, params_nvme = false;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const std::uint64_t E = p.layers[i].shard_elems, P = p.layers[i].padded_elems;
    const std::uint64_t G = static_cast<std::uint64_t>(p.layers[i].gathers_per_step);
    const Tier o = p.stage == 0 ? Tier::device : lp[i].optimizer;
    e.tier[static_cast<int>(o)] += 12 * E;
    e.tier[o == Tier::device ? 0 : 1] += p.stage >= 2 ? 4 * E : 4 * P;
    if (o != Tier::device) e.d2h += A * P * c, e.h2d += c * E;
    if (o == Tier::nvme) e.read += 12 * E, e.write += 12 * E, nvme = opt_nvme = true;
    if (p.stage < 3) {
      e.tier[0] += c * P;
      continue;
    }
    const Tier q = lp[i].params;
    e.tier[static_cast<int>(q)] += c * E;
    if (p.device_gathers) {
      // Only the shard crosses the link (none from the device); the layer is gathered there.
      if (q != Tier::device) e.h2d += G * c * E;
    } else {
      e.h2d += G * c * P;
      if (q == Tier::device) e.d2h += G * c * E;
    }
    if (q == Tier::nvme) e.read += G * c * E, e.write += c * E, nvme = params_nvme = true;
  }
  if (nvme) e.tier[1] += p.nvme_buffer_bytes;
  if (opt_nvme) e.tier[2] += p.nvme_state_spare_bytes;
  if (params_nvme) e.tier[2] += p.nvme_param_spare_bytes;
  e.fits = e.tier[0] <= p.device_budget && e.tier[1] <= p.host_budget &&
           (!nvme || (p.nvme_available && (p.nvme_budget == 0 || e.tier[2] <= p.nvme_budget)));
  return e;
}

std::vector<Tier> places(const PlacementProblem& p, const std::optional<Tier>& fixed) {
  if (fixed) return {*fixed};
  if (p.nvme_available) return {Tier::device, Tier::host, Tier::nvme};
  return {Tier::device, Tier::host};
}

// The fewest bytes moved over every placement that fits, if any fits.
std::optional<std::uint64_t> brute_force(const PlacementProblem& p) {
  const auto opt = p.stage >= 1 ? places(p, p.optimizer_fixed) : std::vector<Tier>{Tier::device};
  const auto par = p.stage == 3 ? places(p, p.params_fixed) : std::vector<Tier>{Tier::device};
  const std::size_t per_layer = opt.size() * par.size(), n = p.layers.size();
  std::size_t total = 1;
  for (std::size_t i = 0; i < n; ++i) total *= per_layer;
  std::optional<std::uint64_t> best;
  std::vector<LayerPlacement> lp(n);
  for (std::size_t code = 0; code < total; ++code) {
    std::size_t x = code;
    for (std::size_t i = 0; i < n; ++i, x /= per_layer) lp[i] = {opt[x % per_layer / par.size()], par[x % par.size()]};
    const Eval e = evaluate(p, lp);
    if (e.fits && (!best || e.moved() < *best)) best = e.moved();
  }
  return best;
}

PlacementProblem random_problem(std::mt19937_64& rng, std::uint64_t n_layers = 0) {
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  PlacementProblem p;
  p.stage = static_cast<int>(pick(0, 9) < 7 ? 3 : pick(0, 2));
  const std::uint64_t layers = n_layers ? n_layers : pick(3, 4);
  p.compute_bytes = pick(0, 1) ? 2 : 4;
  p.accumulation_steps = static_cast<int>(pick(1, 4));
  const std::uint64_t ranks = pick(1, 4);
  for (std::size_t i = 0; i < layers; ++i) {
    const std::uint64_t E = pick(1, 1000);
    const std::uint64_t P = p.stage == 0 ? E : E * ranks + pick(0, 7);
    p.layers.push_back({"layer " + std::to_string(i), E, P, static_cast<int>(pick(0, 3))});
  }
  p.nvme_available = pick(0, 1) == 1;
  p.nvme_buffer_bytes = pick(0, 2000);
  p.device_fixed_bytes = pick(0, 2000);
  p.host_fixed_bytes = pick(0, 2000);
  if (pick(0, 9) == 0 && p.stage >= 1) p.optimizer_fixed = static_cast<Tier>(pick(0, p.nvme_available ? 2 : 1));
  if (pick(0, 9) == 0 && p.stage == 3) p.params_fixed = static_cast<Tier>(pick(0, p.nvme_available ? 2 : 1));
  // Budgets: the fixed part plus a random share of everything, so many problems are tight.
  std::uint64_t state = 0;
  for (const auto& l : p.layers) state += 16 * l.padded_elems + p.compute_bytes * l.padded_elems;
  p.device_budget = p.device_fixed_bytes + state * pick(0, 100) / 100;
  p.host_budget = p.host_fixed_bytes + state * pick(0, 100) / 100 + (pick(0, 1) ? p.nvme_buffer_bytes : 0);
  p.nvme_budget = pick(0, 1) ? 0 : state * pick(1, 100) / 100;
  // Spare swap files in about a third of the problems, drawn from the problem's own numbers so
  // that the random stream (and so every other problem) stays as it was.
  if (p.layers[0].shard_elems % 3 == 0) p.nvme_state_spare_bytes = 12 * p.layers[1].shard_elems;
  if (p.layers[1].shard_elems % 3 == 0) p.nvme_param_spare_bytes = p.compute_bytes * p.layers[0].shard_elems;
  return p;
}

struct Tally {
  int problems = 0, feasible = 0, missed = 0, optimal = 0;
  double worst = 1.0, sum = 0.0;
};

}  // namespace

TEST_CASE("the planner finds the optimum whenever any placement fits (exhaustive search, 2000 problems)",
          "[placement][brute]") {
  std::mt19937_64 rng(20240611);
  Tally full, greedy;
  for (int seed = 0; seed < 2000; ++seed) {
    PlacementProblem p = random_problem(rng);
    const auto best = brute_force(p);
    INFO("problem " << seed << ", stage " << p.stage << ", optimum " << (best ? std::to_string(*best) : "none"));
    for (std::uint64_t nodes : {std::uint64_t{200000}, std::uint64_t{0}}) {
      p.search_nodes = nodes;
      Tally& t = nodes ? full : greedy;
      ++t.problems;
      std::optional<offload::Placement> r;
      try {
        r = offload::plan_placement(p);
      } catch (const Error& e) {
        REQUIRE(e.code() == Errc::out_of_budget);
      }
      if (!best) {
        CHECK_FALSE(r.has_value());  // nothing fits: nothing may be claimed to
        continue;
      }
      ++t.feasible;
      if (!r) {
        ++t.missed;
        continue;
      }
      const Eval e = evaluate(p, r->layers);
      REQUIRE(e.fits);
      CHECK(r->tier_bytes == e.tier);
      CHECK(r->h2d_bytes == e.h2d);
      CHECK(r->d2h_bytes == e.d2h);
      CHECK(r->nvme_read_bytes == e.read);
      CHECK(r->nvme_write_bytes == e.write);
      REQUIRE(e.moved() >= *best);
      t.optimal += e.moved() == *best;
      const double ratio = *best == 0 ? (e.moved() == 0 ? 1.0 : 1e9) : static_cast<double>(e.moved()) / *best;
      t.worst = std::max(t.worst, ratio);
      t.sum += ratio;
    }
  }
  std::printf("[placement][brute] planner: %d problems, %d fit, %d missed, %d optimal, worst %.4fx of optimum\n",
              full.problems, full.feasible, full.missed, full.optimal, full.worst);
  std::printf("[placement][brute] greedy only: %d missed of %d that fit, %d optimal, worst %.4fx, mean %.4fx\n",
              greedy.missed, greedy.feasible, greedy.optimal, greedy.worst,
              greedy.sum / std::max(1, greedy.feasible - greedy.missed));
  CHECK(full.missed == 0);
  CHECK(full.optimal == full.feasible);
  // Greedy alone, measured: 3 of 1454 missed (tight partitions: the optimum leaves a few
  // hundred bytes free on some tier), 1423 optimal, worst 1.2245x, mean 1.0012x. The seed is
  // fixed, so these are exact; a change to the greedy passes that makes them worse fails here.
  CHECK(greedy.missed <= 3);
  CHECK(greedy.optimal >= 1423);
  CHECK(greedy.worst <= 1.23);
}

TEST_CASE("with gathers on the device the planner still finds the optimum (exhaustive search, 600 problems)",
          "[placement][brute]") {
  std::mt19937_64 rng(424242);
  int feasible = 0, optimal = 0, device_params = 0;
  for (int seed = 0; seed < 600; ++seed) {
    PlacementProblem p = random_problem(rng);
    p.device_gathers = true;
    const auto best = brute_force(p);
    INFO("problem " << seed << ", stage " << p.stage << ", optimum " << (best ? std::to_string(*best) : "none"));
    std::optional<offload::Placement> r;
    try {
      r = offload::plan_placement(p);
    } catch (const Error& e) {
      REQUIRE(e.code() == Errc::out_of_budget);
    }
    if (!best) {
      CHECK_FALSE(r.has_value());
      continue;
    }
    ++feasible;
    REQUIRE(r.has_value());
    const Eval e = evaluate(p, r->layers);
    REQUIRE(e.fits);
    CHECK(r->h2d_bytes == e.h2d);
    CHECK(r->d2h_bytes == e.d2h);
    CHECK(e.moved() >= *best);
    optimal += e.moved() == *best;
    for (const auto& l : r->layers) device_params += p.stage == 3 && l.params == Tier::device;
  }
  std::printf("[placement][brute] device gathers: %d fit, %d optimal, %d layers' params on the device\n", feasible,
              optimal, device_params);
  CHECK(optimal == feasible);
  CHECK(device_params > 0);
}

TEST_CASE("the named minimum budgets are exact: they fit and one byte less does not (exhaustive search)",
          "[placement][brute][boundary]") {
  std::mt19937_64 rng(77);
  int checked = 0;
  for (int seed = 0; seed < 300; ++seed) {
    PlacementProblem p = random_problem(rng);
    if (brute_force(p)) continue;  // only refused problems
    for (Tier tier : {Tier::device, Tier::host, Tier::nvme}) {
      const auto least = offload::min_budget_bytes(p, tier);
      if (!least) continue;
      INFO("problem " << seed << ", tier " << offload::tier_name(tier) << ", minimum " << *least);
      PlacementProblem at = p;
      (tier == Tier::device ? at.device_budget : tier == Tier::host ? at.host_budget : at.nvme_budget) = *least;
      CHECK(brute_force(at).has_value());
      CHECK_NOTHROW(offload::plan_placement(at));
      if (*least > (tier == Tier::nvme ? 1u : 0u)) {
        (tier == Tier::device ? at.device_budget : tier == Tier::host ? at.host_budget : at.nvme_budget) = *least - 1;
        CHECK_FALSE(brute_force(at).has_value());
      }
      ++checked;
    }
  }
  CHECK(checked > 50);
}

// Too large for exhaustive search (up to 3^32 placements): the reference is the planner
// with 10^7 search nodes, kept only where that search completed (proven optimal).
TEST_CASE("on 16-layer problems the default search and greedy alone stay near a completed search",
          "[placement][brute]") {
  std::mt19937_64 rng(99);
  Tally full, greedy;
  int proven = 0, exact_runs = 0;
  for (int seed = 0; seed < 100; ++seed) {
    PlacementProblem p = random_problem(rng, 16);
    p.search_nodes = 10000000;
    std::optional<offload::Placement> exact;
    try {
      exact = offload::plan_placement(p);
    } catch (const Error& e) {
      REQUIRE(e.code() == Errc::out_of_budget);
    }
    if (!exact) continue;
    ++exact_runs;
    if (!exact->proven_optimal) continue;
    for (std::uint64_t nodes : {std::uint64_t{200000}, std::uint64_t{0}}) {
      p.search_nodes = nodes;
      Tally& t = nodes ? full : greedy;
      ++t.feasible;
      try {
        const auto r = offload::plan_placement(p);
        REQUIRE(evaluate(p, r.layers).fits);
        proven += nodes && r.proven_optimal;
        const double ratio =
            exact->moved_bytes() == 0 ? 1.0 : static_cast<double>(r.moved_bytes()) / exact->moved_bytes();
        t.optimal += r.moved_bytes() == exact->moved_bytes();
        t.worst = std::max(t.worst, ratio);
        t.sum += ratio;
      } catch (const Error& e) {
        REQUIRE(e.code() == Errc::out_of_budget);
        ++t.missed;
      }
    }
  }
  std::printf(
      "[placement][brute] 16 layers: %d fit, %d proven optimal by a full search; default search: %d missed, %d optimal "
      "(%d proven), worst %.4fx, mean %.4fx; greedy only: %d missed, %d optimal, worst %.4fx, mean %.4fx\n",
      exact_runs, full.feasible, full.missed, full.optimal, proven, full.worst,
      full.sum / std::max(1, full.feasible - full.missed), greedy.missed, greedy.optimal, greedy.worst,
      greedy.sum / std::max(1, greedy.feasible - greedy.missed));
  // Measured: 68 fit, all 68 proven; default search 67 optimal (66 proven), worst 1.0007x;
  // greedy alone 44 optimal, worst 1.043x, mean 1.0023x, none missed.
  CHECK(full.feasible >= 68);
  CHECK(full.missed == 0);
  CHECK(full.optimal >= 67);
  CHECK(full.worst <= 1.001);
  CHECK(greedy.missed == 0);
  CHECK(greedy.optimal >= 44);
  CHECK(greedy.worst <= 1.05);
}
