// The initial values (the registered initialisers) are written by the first call that needs
// them, not by setup(): a run that starts from given weights (init_weights) or from a
// checkpoint (load_checkpoint) never draws or stores them. Checked here: such a run trains
// bit for bit as one that wrote them first; it writes its state to NVMe once, not twice
// (/proc/self/io); and an init_weights that fails leaves the initial values, which then train
// as if init_weights had never been called.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "runtime/core/error.h"
#include "tests/engine/engine_support.h"
#include "tests/engine/param_offload_support.h"
#include "tests/support/same_bits.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

using engine::OffloadDevice;

// Bytes this process has caused to be written to storage (every thread, the I/O workers
// included); 0 where the kernel does not account them.
std::uint64_t storage_writes() {
  std::ifstream in("/proc/self/io");
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "write_bytes:") return value;
  }
  return 0;
}

// Given weights: a smooth function of the tensor's name and the element, unlike any initialiser.
void given(const std::string& name, std::uint64_t elem, std::uint64_t n, float* out) {
  const float phase = static_cast<float>(name.size()) + static_cast<float>(name.back());
  for (std::uint64_t i = 0; i < n; ++i) out[i] = 0.05f * std::sin(phase + 0.37f * static_cast<float>(elem + i));
}

using test::same_bits;

struct Placement {
  int stage;
  OffloadDevice opt, par;
  bool persistent = false;  // stage 3: every layer kept whole on the device, as stages 0-2 keep them
};

engine::EngineConfig config_for(const Placement& p, const std::string& dir) {
  auto c = test::stage3_config(1);
  // One swap file per layer and few parameter chunks: what is tested is which bytes are
  // written, not how they are cut (stage3_config's 100-element sub-groups made this file
  // open, fallocate and write thousands of files, 42 s of the suite).
  c.zero.sub_group_size = 1 << 20;
  c.offload_param.buffer_size = 1 << 14;
  c.zero.stage = p.stage;
  if (p.persistent) c.zero.stage3_param_persistence_threshold = 1 << 20;
  test::place(c, p.opt, p.par, dir);
  return c;
}

constexpr int kHidden = 128;

}  // namespace

TEST_CASE(
    "init_weights and load_checkpoint right after setup never write the initial values, bit for bit as if they had",
    "[engine][offload][uring]") {
  test::TempDir dir("strata-first-values");
  const Placement placements[] = {{0, OffloadDevice::none, OffloadDevice::none},
                                  {2, OffloadDevice::cpu, OffloadDevice::none},
                                  {3, OffloadDevice::nvme, OffloadDevice::nvme},
                                  {3, OffloadDevice::cpu, OffloadDevice::nvme},
                                  {3, OffloadDevice::nvme, OffloadDevice::none, true}};
  for (const auto& p : placements) {
    INFO("stage " << p.stage << ", optimizer " << static_cast<int>(p.opt) << ", parameters "
                  << static_cast<int>(p.par));
    const auto c = config_for(p, dir.path() + "/swap");
    const std::string ckpt = dir.path() + "/ckpt-" + std::to_string(p.stage) + std::to_string(static_cast<int>(p.opt));
    // Given weights, straight after setup(), against the same after layer_parameters(), which
    // needs the initial values and so writes them first.
    std::vector<float> straight, written_first;
    std::uint64_t straight_bytes = 0, written_first_bytes = 0;
    for (const bool write_first : {false, true}) {
      const std::uint64_t before = storage_writes();
      test::MlpRank r(c, kHidden);
      if (write_first) (void)r.engine->layer_parameters(r.engine->layer_ids().front());
      r.engine->init_weights(given);
      (write_first ? written_first_bytes : straight_bytes) = storage_writes() - before;
      const auto loaded = r.engine->full_parameters();
      r.train(0, 4);
      (write_first ? written_first : straight) = r.engine->full_parameters();
      if (!write_first) {
        std::vector<float> want(loaded.size());
        given(r.engine->layout().params().front().name, 0, 1, want.data());
        CHECK(loaded.front() == want.front());  // the given weights (fp32 masters), not the initialiser's
        r.engine->save_checkpoint(ckpt);
      }
    }
    CHECK(same_bits(straight, written_first));
    // The state goes to NVMe once instead of twice: skipping the initial values saves about
    // their payload (fp32 master and moments, bf16 parameters). Writing them twice saved
    // nothing; half the payload is the bound, since the kernel's count of this process's
    // writes came out 3% short of it in one CI run (one swap file a layer, so no 4 KiB
    // rounding adds a margin).
    const std::uint64_t payload =
        straight.size() * ((p.opt == OffloadDevice::nvme ? 12 : 0) + (p.par == OffloadDevice::nvme ? 2 : 0));
    if (payload > 0 && written_first_bytes > 0) {  // 0: the kernel does not count this file system's writes
      CHECK(straight_bytes < written_first_bytes);
      CHECK(written_first_bytes - straight_bytes >= payload / 2);
    }

    // The same for a checkpoint loaded straight after setup().
    std::vector<float> resumed[2];
    for (const bool write_first : {false, true}) {
      test::MlpRank r(c, kHidden);
      if (write_first) (void)r.engine->layer_parameters(r.engine->layer_ids().front());
      r.engine->load_checkpoint(ckpt);
      r.train(4, 7);
      resumed[write_first] = r.engine->full_parameters();
    }
    CHECK(same_bits(resumed[0], resumed[1]));
  }
}

TEST_CASE(
    "an init_weights that fails leaves the initial values, still unwritten, and they train as if it was never called",
    "[engine][offload][uring]") {
  test::TempDir dir("strata-first-values-fail");
  for (const auto& p : {Placement{3, OffloadDevice::nvme, OffloadDevice::nvme},
                        Placement{1, OffloadDevice::cpu, OffloadDevice::none}}) {
    INFO("stage " << p.stage);
    const auto c = config_for(p, dir.path() + "/swap");
    std::vector<float> plain, after_failure;
    {
      test::MlpRank r(c, kHidden);
      r.train(0, 3);
      plain = r.engine->full_parameters();
    }
    {
      test::MlpRank r(c, kHidden);
      std::uint64_t asked = 0;
      // A reader that fails halfway through (a truncated file, a non-finite value).
      const auto failing = [&](const std::string& name, std::uint64_t elem, std::uint64_t n, float* out) {
        if (++asked == 3) throw Error(Errc::invalid_argument, "the test's weights end here");
        given(name, elem, n, out);
      };
      CHECK_THROWS_WITH(r.engine->init_weights(failing), Catch::Contains("the test's weights end here"));
      r.train(0, 3);
      after_failure = r.engine->full_parameters();
    }
    CHECK(same_bits(plain, after_failure));
  }
}

TEST_CASE(
    "an init_weights that fails while writing is refused for training until one succeeds, which trains as if alone",
    "[engine][offload][uring]") {
  test::TempDir dir("strata-first-values-mixed");
  const auto c = config_for({3, OffloadDevice::nvme, OffloadDevice::nvme}, dir.path() + "/swap");
  std::uint64_t calls = 0;  // the reader's calls in both passes (read-only check, then write)
  std::vector<float> alone;
  {
    test::MlpRank r(c, kHidden);
    r.engine->init_weights([&](const std::string& name, std::uint64_t elem, std::uint64_t n, float* out) {
      ++calls;
      given(name, elem, n, out);
    });
    r.train(0, 4);
    alone = r.engine->full_parameters();
  }
  REQUIRE(calls % 2 == 0);
  test::MlpRank r(c, kHidden);
  std::uint64_t asked = 0;
  const auto failing_late = [&](const std::string& name, std::uint64_t elem, std::uint64_t n, float* out) {
    if (++asked == calls / 2 + 2) throw Error(Errc::io, "the test's device fails here");
    given(name, elem, n, out);
  };
  CHECK_THROWS_WITH(r.engine->init_weights(failing_late), Catch::Contains("partly loaded"));
  CHECK_THROWS_WITH(r.engine->begin_step(), Catch::Contains("partly loaded"));
  r.engine->init_weights(given);
  r.train(0, 4);
  CHECK(same_bits(alone, r.engine->full_parameters()));
}
