// Pipeline stages under the CUDA rule, checked without a GPU: every stage's device is a
// guarded host device (device::DeviceOptions::guard_memory, memory protection keys), whose
// memory only stream work may touch; a CPU access from the executor's thread, the stage
// store's, the tied store's or a transport's faults (SIGSEGV) and ends the test. The
// executor stages transfers, the model's input and its loss through pinned memory with
// stream copies; the engine's stage store widens parameters and rounds gradients, and the
// tied store assembles and sums, as stream work. The
// guarded runs must give the unguarded runs' bits, which are the plain data-parallel run's.
#include <catch2/catch.hpp>

#include <memory>

#include "models/gpt/pipeline_layers.h"
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

// The GPT, whose LM head reads the token embedding (a tied weight across stages): the tied
// store's buffers are device memory it fills with copies and stream work. Guarded runs give
// the unguarded runs' bits (which tests/models/gpt_pipeline_test.cc holds to the
// sequential loop's), plain and unit-scaled, fp32 and bf16, with the ends on two stages and
// (one stage, interleaved) on one; so does a forward-only pass after the steps (validation,
// and sampling's shorter rows in the trained model's buffers), whose logits cross to the
// host through the executor's staging buffer.
TEST_CASE("a pipelined GPT and its tied embedding never touch device memory from the CPU (guarded)", "[offload][pku]") {
  test::TempDir dir("strata-pipe");
  const SmallGpt small = small_gpt(dir.path(), GENERATE(false, true));
  const model::GptConfig& c = small.config;
  const auto& batcher = small.batcher;
  const ModelOf gpt = small.model_of(2);
  for (const Schedule& s : {pipeline::one_f_one_b(2, kMicro), pipeline::zb_h1(4, kMicro),
                            pipeline::interleaved_1f1b(2, kMicro, 2), pipeline::gpipe(1, kMicro)}) {
    for (DType compute : {DType::fp32, DType::bf16}) {
      Placement p{3, OffloadDevice::cpu, OffloadDevice::none};
      p.compute = compute;
      INFO(s.kind << ", P=" << s.stages << ", " << dtype_name(compute) << (c.unit_scaled ? ", unit-scaled" : ""));
      // After the steps, a forward-only pass: at the trained rows in fp32, at fewer (2 sequences
      // of 5 tokens, as sampling's shorter rows) in bf16.
      const ModelOf pass = [&](int) {
        return model::gpt_pipeline_model(c, 2, kMicro, batcher, 0, 1, model::ops::Products::fp32, 5).model;
      };
      std::map<int, std::vector<float>> want, got;
      PipelinedOptions o{.model_of = gpt, .forward_outputs = &want};
      if (compute == DType::bf16) o.forward_model_of = pass;
      const Params plain = run_pipelined(s, p, 1, dir.path(), o);
      o.guard_memory = true;
      o.forward_outputs = &got;
      o.compute_threads = s.stages == 2 ? 2 : 0;  // a stage's own threads: ignored where guarded
      CHECK(compare(run_pipelined(s, p, 1, dir.path(), o), plain) == "");
      REQUIRE(want.size() == static_cast<std::size_t>(kMicro));
      CHECK(want.begin()->second.size() == (compute == DType::bf16 ? 10u : 16u) * 256u);  // rows x vocabulary
      CHECK(got == want);
    }
  }
}
