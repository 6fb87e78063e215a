// Pipeline stages under the CUDA rule, checked without a GPU: every stage's device is a
// guarded host device (device::DeviceOptions::guard_memory, memory protection keys), whose
// memory only stream work may touch; a CPU access from the executor's thread, the stage
// store's, the tied store's or a transport's faults (SIGSEGV) and ends the test. The
// executor stages transfers, the model's input and its loss through pinned memory with
// stream copies; the engine's stage store widens parameters and rounds gradients, and the
// tied store assembles and sums, as stream work (the GPT's tied embedding under the guard is
// tests/models/gpt_stage_test.cc's). The guarded runs must give the unguarded runs' bits,
// which are the plain data-parallel run's.
#include <catch2/catch.hpp>

#include <memory>

#include "pipeline/generators.h"
#include "tests/engine/pipeline_stage_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::test::pipe;
using engine::OffloadDevice;
using pipeline::Schedule;

namespace {

// Guarded and unguarded runs of `p` against the plain run, for every schedule at P = 2 and 4.
void check_guarded(const Placement& p, const std::string& dir) {
  const Plain plain = run_plain(p, 1, dir);
  for (int stages : {2, 4}) {
    for (const Schedule& s : schedules(stages)) {
      INFO("ZeRO " << p.zero << ", optimizer on " << name(p.opt) << ", parameters on " << name(p.par) << ", "
                   << dtype_name(p.compute) << ", " << s.kind << ", P=" << stages);
      CHECK(compare(run_pipelined(s, p, 1, dir, {.guard_memory = true}), plain.params) == "");
    }
  }
}

}  // namespace

TEST_CASE("pipelined stages never touch device memory from the CPU (guarded host device)", "[offload][pku]") {
  test::TempDir dir("strata-pipe");
  const Placement p = GENERATE(Placement{0}, Placement{1}, Placement{2}, Placement{3},
                               Placement{3, OffloadDevice::cpu, OffloadDevice::cpu},
                               Placement{3, OffloadDevice::cpu, OffloadDevice::cpu, true},
                               Placement{1, OffloadDevice::none, OffloadDevice::none, false, true, DType::fp16},
                               Placement{3, OffloadDevice::cpu, OffloadDevice::none, false, true, DType::bf16});
  check_guarded(p, dir.path());
}

TEST_CASE("pipelined stages with state on NVMe never touch device memory from the CPU (guarded)",
          "[offload][uring][pku]") {
  test::TempDir dir("strata-pipe");
  check_guarded({3, OffloadDevice::nvme, OffloadDevice::nvme}, dir.path());
}
