// The schedule IR: for each pipeline stage, the ordered list of actions it runs in one
// training step. Stage s, chunk c holds virtual stage c*p + s (Megatron's interleaved
// placement; chunks = 1 is the plain pipeline), so a micro-batch's forward visits stages
// 0..p-1 once per chunk and its backward returns in reverse.
//
// Protocol. Generators (generators.h) build the compute order; add_communication() then
// puts a receive right before each action that consumes a remote input and a send right
// after each action whose output a remote stage needs, and an optimizer step at the end.
// validate() checks a schedule; simulate() times it; the executor runs it. Text and CSV
// forms round-trip exactly, so schedules can be saved, diffed and loaded.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pipeline/action.h"

namespace strata::pipeline {

struct Schedule {
  std::string kind;                          // generator name ("1f1b", ...) or "custom"
  int stages = 1;                            // p
  int micro_batches = 1;                     // m
  int chunks = 1;                            // v: model chunks per stage
  std::vector<std::vector<Action>> actions;  // [stage] -> ordered actions

  int virtual_stages() const noexcept { return stages * chunks; }
  int virtual_stage(int stage, int chunk) const noexcept { return chunk * stages + stage; }
  int stage_of(int virtual_stage) const noexcept { return virtual_stage % stages; }
  int chunk_of(int virtual_stage) const noexcept { return virtual_stage / stages; }
  std::size_t compute_count() const;  // F, B, W and BW actions over all stages
};

// Compute-only orders (one list per stage, F/B/W/BW only) -> a full schedule: recv before
// consumers, send after producers (peers filled in), OPT appended on every stage.
Schedule add_communication(std::string kind, int stages, int micro_batches, int chunks,
                           const std::vector<std::vector<Action>>& compute);

// Drops comm and OPT actions: what generators produce, what pictures draw.
std::vector<std::vector<Action>> compute_order(const Schedule& s);

// Text form:
//   strata-schedule v1 kind=1f1b stages=2 micro=2 chunks=1
//   stage 0: F0 SA0>1 F1 SA1>1 RG0<1 BW0 RG1<1 BW1 OPT
//   stage 1: RA0<0 F0 BW0 SG0>0 ...
std::string to_text(const Schedule& s);
// CSV form, one action per line: stage,index,action,kind,micro,chunk,peer.
std::string to_csv(const Schedule& s);
// Reads either form (told apart by the first line); throws Errc::invalid_argument naming
// the line. The result is parsed, not validated: call validate() before trusting it.
Schedule parse_schedule(std::string_view text);

}  // namespace strata::pipeline
