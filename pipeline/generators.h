// Schedule generators (docs/design.md, "pipeline"): GPipe fill-drain, 1F1B, interleaved 1F1B
// (Megatron's v chunks per stage), the Zero Bubble paper's handcrafted ZB-H1 and ZB-H2, and
// its automatic scheduler, which fills bubbles with W passes under a per-stage activation
// memory limit. Every generator returns a complete, valid schedule (communication and the
// optimizer step included). Inputs a schedule cannot honour are Errc::invalid_argument
// naming the input and what would work.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/costs.h"
#include "pipeline/schedule.h"

namespace strata::pipeline {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, zb_auto };
const char* schedule_kind_name(ScheduleKind k) noexcept;  // "gpipe", "1f1b", ...
ScheduleKind parse_schedule_kind(std::string_view text);  // throws listing the kinds

// All forwards, then all full backwards. Any m; keeps m micro-batches of activations on
// every stage. Backwards run in micro-batch order (the GPipe paper draws them reversed;
// the bubble is the same), so weight gradients accumulate in order with nothing held back.
// generate() refuses schedules with more stage x micro-batch x chunk cells than this.
constexpr std::uint64_t kMaxScheduleCells = std::uint64_t{1} << 20;

Schedule gpipe(int stages, int micro_batches);
// One forward one backward (PipeDream-flush): stage r warms up with min(p-r-1, m) forwards.
// Any m; stage r keeps at most min(p-r, m) micro-batches of activations.
Schedule one_f_one_b(int stages, int micro_batches);
// Interleaved 1F1B with v chunks per stage; needs m >= p and m % p == 0.
Schedule interleaved_1f1b(int stages, int micro_batches, int chunks);
// ZB-H1: 1F1B's order with B/W split, stage r deferring its W's by r micro-batches, so
// every stage keeps at most p micro-batches (1F1B's peak). Needs m >= p.
Schedule zb_h1(int stages, int micro_batches);
// ZB-H2: 2(p-1-r)+1 warm-up forwards and W's deferred by 2r: about 2p-1 micro-batches of
// activations, no bubble once m >= 2p-1 (uniform times). Needs m >= p.
Schedule zb_h2(int stages, int micro_batches);

struct AutoOptions {
  int stages = 1;
  int micro_batches = 1;
  Costs costs;
  // Per stage (or one value for all), in micro-batches of that stage's activations;
  // empty: p (1F1B's peak). Values below 1 are an error.
  std::vector<double> memory_limit;
  bool local_search = true;        // refine the best candidate by moving actions
  int search_evaluations = 20000;  // simulator runs the refinement may spend (fewer on big schedules)
  bool seed_handcrafted = true;    // also consider ZB-H1/ZB-H2/1F1B where they fit
};

struct AutoReport {
  std::string winner;             // "heuristic(...)", "zb-h1+search", ...
  double heuristic_makespan = 0;  // best of the heuristic alone
  double makespan = 0;            // of the returned schedule
  int evaluations = 0;
  int stuck_variants = 0;  // heuristic variants that made no progress (a bug; 0)
};

// The automatic zero-bubble scheduler. A greedy list scheduler following the paper's
// heuristic (as many warm-up F's as memory allows or a capped number, then 1F-1B with W's
// filling gaps and recycling memory, leftover W's at the end) is run over a grid of its
// binary choices; the best, together with the handcrafted schedules that fit the memory
// limit, seeds a local search that moves single actions while the simulated makespan
// drops. The result never exceeds the memory limit.
Schedule zb_auto(const AutoOptions& options, AutoReport* report = nullptr);

// Exhaustive search for tiny cases (about p * m <= 9; refused above 3 million orders): the
// minimum makespan over every per-stage interleaving of in-order F, B and W passes within
// the memory limit. For measuring the heuristic against an optimum.
Schedule zb_exact(const AutoOptions& options, double* makespan = nullptr);

struct GenerateOptions {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int stages = 1;
  int micro_batches = 1;
  int chunks = 1;                    // interleaved only
  Costs costs;                       // zb-auto only
  std::vector<double> memory_limit;  // zb-auto only (see AutoOptions)
};
Schedule generate(const GenerateOptions& options, AutoReport* report = nullptr);

}  // namespace strata::pipeline
