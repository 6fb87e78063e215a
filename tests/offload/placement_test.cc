// The placement planner (offload/placement.h) on small cases worked out by hand: where
// each item goes, the bytes per tier and moved per step, the DeepSpeed static form, the
// refusal naming the smallest budget of each short tier (accepted; one byte less refused),
// invalid problems, and explain(). Exhaustive-search comparisons: placement_brute_test.cc.
#include "offload/placement.h"

#include <catch2/catch.hpp>
#include <string>

#include "runtime/core/error.h"
#include "runtime/core/units.h"

using namespace strata;
using offload::PlacementProblem;
using offload::Tier;

namespace {

// Two stage-3 layers, c = 2, A = 1, G = 2. Per item (bytes held; bytes moved per step):
//   optimizer 0 (E=100, P=200): device/host 1200 + 400 accumulator; nvme 1200 + 400 on host.
//     moved: device 0; host h2d 200 + d2h 400 = 600; nvme 600 + read 1200 + write 1200 = 3000.
//   params 0: 200 B. moved: device h2d 800 + d2h 400; host h2d 800; nvme h2d 800 + read 400 + write 200.
//   optimizer 1 (E=50, P=100): 600 + 200; moved host 100 + 200 = 300; nvme 300 + 1200 = 1500.
//   params 1: 100 B. moved: device 400 + 200; host 400; nvme 400 + 200 + 100.
PlacementProblem two_layers() {
  PlacementProblem p;
  p.stage = 3;
  p.compute_bytes = 2;
  p.layers = {{"layer 0", 100, 200, 2}, {"layer 1", 50, 100, 2}};
  p.device_budget = 10000;
  p.host_budget = 10000;
  return p;
}

std::string refusal(const PlacementProblem& p, Errc want = Errc::out_of_budget) {
  try {
    (void)offload::plan_placement(p);
  } catch (const Error& e) {
    CHECK(e.code() == want);
    return e.what();
  }
  FAIL("plan_placement accepted a problem it should refuse");
  return {};
}

bool accepted(PlacementProblem p, Tier tier, std::uint64_t budget) {
  (tier == Tier::device ? p.device_budget : tier == Tier::host ? p.host_budget : p.nvme_budget) = budget;
  try {
    (void)offload::plan_placement(p);
    return true;
  } catch (const Error& e) {
    if (e.code() != Errc::out_of_budget) throw;
    return false;
  }
}

// The planner takes `budget` and refuses one byte less, and min_budget_bytes says so.
void check_minimum(const PlacementProblem& p, Tier tier, std::uint64_t budget) {
  CHECK(accepted(p, tier, budget));
  CHECK_FALSE(accepted(p, tier, budget - 1));
  CHECK(offload::min_budget_bytes(p, tier) == budget);
}

}  // namespace

TEST_CASE("with room everywhere, optimizer state stays on the device and parameter shards on the host", "[placement]") {
  const auto r = offload::plan_placement(two_layers());
  REQUIRE(r.layers.size() == 2);
  for (const auto& l : r.layers) {
    CHECK(l.optimizer == Tier::device);
    CHECK(l.params == Tier::host);  // a device shard would also cross d2h at every gather
  }
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{2400, 300, 0});
  CHECK(r.h2d_bytes == 1200);
  CHECK(r.d2h_bytes == 0);
  CHECK(r.moved_bytes() == 1200);
  CHECK(r.proven_optimal);
}

TEST_CASE("evaluate_placement costs a given placement as the planner would, budgets and fixed forms aside",
          "[placement]") {
  auto p = two_layers();
  const auto planned = offload::plan_placement(p);
  const auto same = offload::evaluate_placement(p, planned.layers);
  CHECK(same.tier_bytes == planned.tier_bytes);
  CHECK(same.h2d_bytes == planned.h2d_bytes);
  CHECK(same.d2h_bytes == planned.d2h_bytes);
  CHECK(same.moved_bytes() == planned.moved_bytes());
  // Everything on NVMe, by hand (the comment at two_layers): optimizer 0 moves 600 over the
  // link and 1200 each way on NVMe, optimizer 1 300 and 600; params 800 + 400 h2d, 400 + 200
  // read and 200 + 100 written. Held: the accumulators on the host, state and shards on NVMe.
  p.device_budget = 0;          // budgets do not apply
  p.params_fixed = Tier::host;  // nor do fixed forms
  const auto nvme = offload::evaluate_placement(p, {{Tier::nvme, Tier::nvme}, {Tier::nvme, Tier::nvme}});
  CHECK(nvme.h2d_bytes == 200 + 100 + 800 + 400);
  CHECK(nvme.d2h_bytes == 400 + 200);
  CHECK(nvme.nvme_read_bytes == 1200 + 600 + 400 + 200);
  CHECK(nvme.nvme_write_bytes == 1200 + 600 + 200 + 100);
  CHECK(nvme.tier_bytes == std::array<std::uint64_t, 3>{0, 400 + 200, 1200 + 600 + 200 + 100});
  CHECK(nvme.layers[1].params == Tier::nvme);
  CHECK_THROWS_AS(offload::evaluate_placement(p, {{Tier::host, Tier::host}}), Error);  // one place for two layers
}

TEST_CASE("a frozen layer places its parameters only: no optimizer state, accumulator or gradient traffic",
          "[placement][frozen]") {
  auto p = two_layers();
  p.layers[0].frozen = true;
  const auto r = offload::plan_placement(p);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{600 + 200, 200 + 100, 0});  // layer 1's state; both shards
  CHECK(r.h2d_bytes == 1200);                                                    // the gathers alone
  CHECK(r.explain(p).find("frozen: no gradient or optimizer state") != std::string::npos);
  // Everything on NVMe (by hand, as above without optimizer 0): layer 0 moves its gathers only,
  // and its shards are never written back.
  const auto nvme = offload::evaluate_placement(p, {{Tier::nvme, Tier::nvme}, {Tier::nvme, Tier::nvme}});
  CHECK(nvme.h2d_bytes == 100 + 800 + 400);
  CHECK(nvme.d2h_bytes == 200);
  CHECK(nvme.nvme_read_bytes == 600 + 400 + 200);
  CHECK(nvme.nvme_write_bytes == 600 + 100);
  CHECK(nvme.tier_bytes == std::array<std::uint64_t, 3>{0, 200, 600 + 200 + 100});
  // Stage 0 keeps a trainable layer's state on the device; a frozen one's parameters only.
  p.stage = 0;
  p.layers = {{"layer 0", 200, 200, 2, true}, {"layer 1", 100, 100, 2}};
  const auto s0 = offload::plan_placement(p);
  CHECK(s0.tier_bytes[0] == 2 * 200 + (16 + 2) * 100);
}

TEST_CASE("a device budget with room for one optimizer keeps the one that saves more traffic", "[placement]") {
  auto p = two_layers();
  p.device_fixed_bytes = 1000;
  p.device_budget = 2600;  // 1600 free: optimizer 0 (saves 600) or optimizer 1 (saves 300), not both
  p.host_fixed_bytes = 100;
  const auto r = offload::plan_placement(p);
  CHECK(r.layers[0].optimizer == Tier::device);
  CHECK(r.layers[1].optimizer == Tier::host);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{2600, 100 + 800 + 300, 0});
  CHECK(r.h2d_bytes == 100 + 800 + 400);
  CHECK(r.d2h_bytes == 200);
  CHECK(r.moved_bytes() == 1500);
}

// Two layers whose host has room for the NVMe swap buffers, one optimizer's accumulator and
// both parameter shards, and the device for one optimizer.
PlacementProblem full_host() {
  auto p = two_layers();
  p.device_fixed_bytes = 1000;
  p.device_budget = 2600;
  p.nvme_available = true;
  p.nvme_buffer_bytes = 64;
  p.host_fixed_bytes = 100;
  p.host_budget = 100 + 64 + 200 + 300;  // buffers, optimizer 1's accumulator, both shards
  return p;
}

TEST_CASE("a full host sends optimizer state to NVMe and pays for the swap buffers once", "[placement]") {
  const auto p = full_host();
  const auto r = offload::plan_placement(p);
  CHECK(r.layers[0].optimizer == Tier::device);
  CHECK(r.layers[1].optimizer == Tier::nvme);
  CHECK(r.layers[0].params == Tier::host);
  CHECK(r.layers[1].params == Tier::host);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{2600, 664, 600});
  CHECK(r.h2d_bytes == 100 + 1200);
  CHECK(r.d2h_bytes == 200);
  CHECK(r.nvme_read_bytes == 600);
  CHECK(r.nvme_write_bytes == 600);
  CHECK(r.moved_bytes() == 2700);
}

TEST_CASE("spare swap files take their bytes on NVMe once their kind is there, and the NVMe minimum counts them",
          "[placement][boundary]") {
  auto p = full_host();  // the case above: optimizer 1 on NVMe (600 B), both shards on the host
  p.nvme_state_spare_bytes = 100;
  p.nvme_param_spare_bytes = 50;  // no shard on NVMe: not taken
  const auto r = offload::plan_placement(p);
  CHECK(r.layers[1].optimizer == Tier::nvme);
  CHECK(r.layers[0].params == Tier::host);
  CHECK(r.layers[1].params == Tier::host);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{2600, 664, 600 + 100});
  CHECK_THAT(r.explain(p), Catch::Contains("(fixed: spare swap files 100 B)"));
  check_minimum(p, Tier::nvme, 700);
  // Both kinds there: each kind's spares once, however many of its items.
  const auto both = offload::evaluate_placement(p, {{Tier::nvme, Tier::nvme}, {Tier::nvme, Tier::nvme}});
  CHECK(both.tier_bytes[2] == 1200 + 600 + 200 + 100 + 100 + 50);
  // A budget the state fits once but not with its spares: the refusal's NVMe floor names them.
  p.optimizer_fixed = Tier::nvme;
  p.host_budget = 10000;
  p.nvme_budget = 1800 + 99;
  const std::string msg = refusal(p);
  CHECK_THAT(msg, Catch::Contains("spare files (offload_optimizer.spare_sub_groups) 100 B"));
  CHECK_THAT(msg, Catch::Contains("Raise memory_budget.nvme to at least 1900 B"));
}

TEST_CASE(
    "optimizer state scanned before its step (Muon's) reads exp_avg again and holds 4 bytes an element on the host",
    "[placement]") {
  auto p = full_host();  // the case above, where optimizer 1 went to NVMe
  p.layers[1].nvme_scan = true;
  // That placement now holds the scan's result (4 x 50 B) on the host and reads exp_avg again.
  const auto e = offload::evaluate_placement(p, {{Tier::device, Tier::host}, {Tier::nvme, Tier::host}});
  CHECK(e.tier_bytes == std::array<std::uint64_t, 3>{2600, 664 + 200, 600});
  CHECK(e.nvme_read_bytes == 600 + 4 * 50);
  CHECK(e.nvme_write_bytes == 600);
  // So it no longer fits the host budget: whatever the planner does instead stays within it.
  const auto tight = offload::plan_placement(p);
  CHECK(tight.tier_bytes[1] <= p.host_budget);
  CHECK(tight.layers[0].params == Tier::nvme);  // room for the scan's result: a shard goes to NVMe
  p.host_budget += 4 * 50;
  const auto r = offload::plan_placement(p);
  CHECK(r.layers[1].optimizer == Tier::nvme);
  CHECK(r.tier_bytes == e.tier_bytes);
}

TEST_CASE("the DeepSpeed static form forces every layer to the configured place", "[placement]") {
  auto p = two_layers();
  p.nvme_available = true;
  p.nvme_buffer_bytes = 64;
  p.optimizer_fixed = Tier::host;
  p.params_fixed = Tier::nvme;
  const auto r = offload::plan_placement(p);
  for (const auto& l : r.layers) {
    CHECK(l.optimizer == Tier::host);
    CHECK(l.params == Tier::nvme);
  }
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{0, 1600 + 800 + 64, 300});
  CHECK(r.h2d_bytes == 200 + 100 + 800 + 400);
  CHECK(r.d2h_bytes == 400 + 200);
  CHECK(r.nvme_read_bytes == 400 + 200);
  CHECK(r.nvme_write_bytes == 200 + 100);
}

TEST_CASE("host accumulators of one gradient per step take the compute bytes, device ones fp32", "[placement]") {
  auto p = two_layers();
  p.nvme_available = true;
  p.nvme_buffer_bytes = 64;
  p.host_accumulator_bytes = 2;
  p.optimizer_fixed = Tier::nvme;
  p.params_fixed = Tier::nvme;
  auto r = offload::plan_placement(p);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{0, 2 * (100 + 50) + 64, 1800 + 300});
  p.host_budget = 2 * (100 + 50) + 64;  // the narrow accumulators and the buffers, not fp32 accumulators
  CHECK(accepted(p, Tier::host, p.host_budget));
  p.host_accumulator_bytes = 4;
  CHECK_FALSE(accepted(p, Tier::host, 2 * (100 + 50) + 64));
  p.optimizer_fixed = Tier::device;  // on the device the accumulator stays fp32 whatever the host's bytes
  p.host_accumulator_bytes = 2;
  p.host_budget = 10000;
  r = offload::plan_placement(p);
  CHECK(r.tier_bytes[0] == 1200 + 400 + 600 + 200);
  p.host_accumulator_bytes = 3;
  CHECK_THAT(refusal(p, Errc::invalid_argument), Catch::Contains("host_accumulator_bytes = 3"));
}

TEST_CASE("below stage 3 params stay on the device and stage 1 accumulates whole padded gradients", "[placement]") {
  PlacementProblem p;
  p.compute_bytes = 2;
  p.accumulation_steps = 4;
  p.layers = {{"layer 0", 100, 200, 2}};
  p.device_budget = 400 + 1600;  // params c*P, then 12E + 4E: fits at stage 2, not stage 1 (12E + 4P)
  p.host_budget = 10000;
  p.stage = 2;
  auto r = offload::plan_placement(p);
  CHECK(r.layers[0].optimizer == Tier::device);
  CHECK(r.layers[0].params == Tier::device);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{2000, 0, 0});
  CHECK(r.moved_bytes() == 0);
  p.stage = 1;
  r = offload::plan_placement(p);
  CHECK(r.layers[0].optimizer == Tier::host);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{400, 2000, 0});
  CHECK(r.h2d_bytes == 200);      // c*E updated params
  CHECK(r.d2h_bytes == 4 * 400);  // A*P*c gradients
}

TEST_CASE("stage 0 keeps everything on the device and moves nothing", "[placement]") {
  PlacementProblem p;
  p.stage = 0;
  p.layers = {{"layer 0", 100, 100, 2}, {"layer 1", 10, 10, 2}};
  p.device_fixed_bytes = 5;
  p.device_budget = 5 + 18 * 110;  // 12P + 4P + cP per layer
  const auto r = offload::plan_placement(p);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{5 + 18 * 110, 0, 0});
  CHECK(r.moved_bytes() == 0);
  check_minimum(p, Tier::device, 5 + 18 * 110);
  p.device_budget = 5 + 18 * 110 - 1;
  CHECK_THAT(refusal(p), Catch::Contains("optimizer state and parameters at ZeRO stage 0 1.93 KiB"));
}

TEST_CASE("a device below its fixed part is refused with the device minimum", "[placement][negative][boundary]") {
  auto p = two_layers();
  p.device_fixed_bytes = 40ull << 20;
  p.device_budget = 32ull << 20;
  p.nvme_available = true;
  const std::string msg = refusal(p);
  CHECK_THAT(msg, Catch::Contains(
                      "memory_budget.device = 32.00 MiB is too small for this model at ZeRO stage 3: the "
                      "device needs at least 40.00 MiB (41943040 B) with everything else offloaded (live "
                      "window and persistent layers 40.00 MiB). Raise memory_budget.device to at least 40.00 MiB."));
  CHECK_THAT(msg, !Catch::Contains("memory_budget.host"));
  check_minimum(p, Tier::device, 40ull << 20);
}

TEST_CASE("a device budget the trainer holds part of is named as what is left, and the raise includes the part",
          "[placement][negative][boundary]") {
  auto p = two_layers();
  p.device_fixed_bytes = 40ull << 20;
  p.device_budget = 32ull << 20;  // of 80 MiB: the trainer's activations hold 48
  p.device_held = 48ull << 20;
  p.nvme_available = true;
  CHECK_THAT(refusal(p), Catch::Contains("memory_budget.device = 32.00 MiB (what is left of it after the 48.00 MiB the "
                                         "trainer holds) is too small for this model at ZeRO stage 3") &&
                             Catch::Contains("Raise memory_budget.device to at least 88.00 MiB."));
}

TEST_CASE("a short host names the host minimum, the device alternative and the nvme_path",
          "[placement][negative][boundary]") {
  auto p = two_layers();
  p.device_fixed_bytes = 1000;
  p.device_budget = 2600;
  p.host_fixed_bytes = 100;
  p.host_budget = 1199;  // optimizer 1 and both shards need 1100 besides the fixed 100
  const std::string msg = refusal(p);
  // Budgets that are no whole number of hundredths of their unit are shown as bytes too,
  // and minimums rounded up, so that the value to type is never below the true one.
  CHECK_THAT(msg, Catch::Contains("memory_budget.host = 1199 B (1.17 KiB) is too small for this model at ZeRO stage 3 "
                                  "with memory_budget.device = 2600 B (2.54 KiB): the host needs at least 1.18 KiB "
                                  "(1200 B). Raise memory_budget.host to at least 1200 B."));
  // The fix leads, in a sentence under 200 characters.
  CHECK(msg.rfind("no placement of the model state fits the memory budgets: raise memory_budget.host to at least "
                  "1200 B",
                  0) == 0);
  CHECK(msg.find(". ") < 200);
  // The host then holds optimizer 1 and shard 0 (1000 B of 1099 free): the rest, 1700 B, on the device.
  CHECK_THAT(msg, Catch::Contains("the device needs at least 2.64 KiB (2700 B)"));
  // With an NVMe the cheapest fix moves shard 1 there (300 B more traffic than on the host).
  CHECK_THAT(msg, Catch::Contains("set offload_param.nvme_path so that parameters can move to NVMe"));
  check_minimum(p, Tier::host, 1200);
  check_minimum(p, Tier::device, 2700);
}

TEST_CASE("a short NVMe budget names the NVMe minimum", "[placement][negative][boundary]") {
  auto p = two_layers();
  p.device_fixed_bytes = 1000;
  p.device_budget = 2600;
  p.nvme_available = true;
  p.nvme_buffer_bytes = 64;
  p.host_fixed_bytes = 100;
  p.host_budget = 664;
  p.nvme_budget = 599;  // optimizer 1 needs 600 there
  const std::string msg = refusal(p);
  CHECK_THAT(msg, Catch::Contains("memory_budget.nvme = 599 B is too small for this model at ZeRO stage 3 with "
                                  "memory_budget.device = 2600 B (2.54 KiB) and memory_budget.host = 664 B: the NVMe "
                                  "needs at least 600 B (600 B). Raise memory_budget.nvme to at least 600 B."));
  CHECK_THAT(msg, Catch::Contains("the host needs at least 964 B (964 B)"));        // both shards to NVMe
  CHECK_THAT(msg, Catch::Contains("the device needs at least 3.33 KiB (3400 B)"));  // both optimizers on device
  check_minimum(p, Tier::nvme, 600);
  check_minimum(p, Tier::host, 964);
  check_minimum(p, Tier::device, 3400);
}

TEST_CASE("places the stage or the configuration forbid are invalid arguments naming the key",
          "[placement][negative]") {
  auto p = two_layers();
  p.optimizer_fixed = Tier::nvme;
  CHECK_THAT(refusal(p, Errc::invalid_argument), Catch::Contains("offload_optimizer.nvme_path"));
  p.optimizer_fixed.reset();
  p.params_fixed = Tier::nvme;
  CHECK_THAT(refusal(p, Errc::invalid_argument), Catch::Contains("offload_param.nvme_path"));
  p.params_fixed = Tier::host;
  p.stage = 2;
  CHECK_THAT(refusal(p, Errc::invalid_argument),
             Catch::Contains("offload_param.device = \"cpu\" needs zero_optimization.stage = 3"));
  p.params_fixed.reset();
  p.stage = 4;
  CHECK_THAT(refusal(p, Errc::invalid_argument), Catch::Contains("zero_optimization.stage = 4"));
  p.stage = 3;
  p.layers[1].shard_elems = 101;
  CHECK_THAT(refusal(p, Errc::invalid_argument), Catch::Contains("layer 1: shard of 101 elements"));
}

TEST_CASE("explain names every layer and tier, the reasons and the bytes moved", "[placement]") {
  auto p = two_layers();
  p.layers.push_back({"layer 2", 30, 60, 1});
  p.device_fixed_bytes = 1000;
  p.device_budget = 2600;
  p.nvme_available = true;
  p.host_fixed_bytes = 100;
  p.host_budget = 100 + 200 + 120 + 300 + 60 + 360;  // optimizer 2 fits on the host, optimizer 1 does not
  const auto r = offload::plan_placement(p);
  const std::string text = r.explain(p);
  INFO(text);
  for (const char* s :
       {"layer 0", "layer 1", "layer 2", "\n  device ", "\n  host ", "\n  nvme ", "optimizer device: budget left",
        "optimizer nvme: device and host full", "host: device full, keeps NVMe traffic down",
        "params host: fewest bytes moved", "moved per step: ", "in all"}) {
    CHECK_THAT(text, Catch::Contains(s));
  }
}

TEST_CASE("explain groups runs of identical layers", "[placement]") {
  PlacementProblem p;
  for (int i = 0; i < 8; ++i) p.layers.push_back({"layer " + std::to_string(i), 10, 20, 2});
  p.device_budget = 1 << 20;
  p.host_budget = 1 << 20;
  const std::string text = offload::plan_placement(p).explain(p);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("layer 0 .. layer 7 (8, each)"));
  CHECK_THAT(text, !Catch::Contains("layer 3"));
}

TEST_CASE("device and host budgets of UINT64_MAX (not set) are unlimited", "[placement][boundary]") {
  auto p = two_layers();
  p.device_budget = p.host_budget = ~std::uint64_t{0};
  p.device_fixed_bytes = 1ull << 40;
  const auto r = offload::plan_placement(p);
  CHECK(r.tier_bytes == std::array<std::uint64_t, 3>{(1ull << 40) + 2400, 300, 0});
  CHECK_THAT(r.explain(p), Catch::Contains("of unlimited"));
  // The minimums are about fitting at all, not about keeping this placement's traffic.
  CHECK(offload::min_budget_bytes(p, Tier::device) == 1ull << 40);  // everything else on the host
  CHECK(offload::min_budget_bytes(p, Tier::host) == 0);             // shards on the device
}

TEST_CASE("explain's stage-0 rows count the state's bytes as the model does (bf16 moments: 8)", "[placement]") {
  PlacementProblem p;
  p.stage = 0;
  p.state_bytes = 8;
  p.layers.push_back({"layer 0", 100, 100, 1});
  p.device_budget = p.host_budget = 1 << 20;
  const auto r = offload::plan_placement(p);
  REQUIRE(r.tier_bytes[0] == (8 + 4 + 2) * 100);  // state, accumulator and bf16 parameters, all on the device
  const std::string text = r.explain(p);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("layer 0") && Catch::Contains(strata::format_bytes(1400)));
  CHECK_THAT(text, !Catch::Contains(strata::format_bytes(1800)));  // 16 bytes of state and accumulator an element
}
