// OptimizerState (engine/optimizer_state.h) on its own, on the host device: a layer's
// master, exp_avg and exp_avg_sq written from host memory read back bit for bit on every
// tier (the device, host RAM, and its own swapper in real swap files), missing
// moments are written as zeros, resident arrays are handed out only off NVMe, and every
// byte goes back to the ledger with the state. bf16 moments (bf16.bf16_optimizer_states) take
// two bytes an element on every tier and read back as the fp32 values rounded to nearest even;
// q8 moments take 17 bytes per 16 elements and read back as their codes decode.
#include <algorithm>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/config.h"
#include "engine/optimizer_state.h"
#include "tests/engine/engine_support.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::engine;

TEST_CASE("optimizer state: a layer's state round-trips bitwise on every tier", "[engine][optimizer_state]") {
  std::vector<ParamSpec> specs(2);
  specs[0].name = "w", specs[0].shape = {9, 7}, specs[0].layer = 0;
  specs[1].name = "b", specs[1].shape = {41}, specs[1].layer = 1;
  test::TempDir dir("strata-optstate");
  for (const int stage : {0, 2})
    for (const MomentFormat moments : {MomentFormat::fp32, MomentFormat::bf16, MomentFormat::q8}) {
      INFO("stage " << stage << ", moments " << moment_format_name(moments));
      const Layout lay(specs, 1, 32);
      auto dev = test::host_device(8 << 20, 8 << 20);
      auto stream = dev->create_stream();
      MemoryLedger ledger(*dev, 64 << 20, false);
      EngineConfig cfg;
      cfg.zero.stage = stage;
      cfg.offload_optimizer.nvme_path = dir.path();
      cfg.optimizer.moment_format = moments;
      const auto held = [&](const std::vector<float>& x, Moment which) {  // what the state keeps of fp32 moments
        std::vector<std::byte> narrow(moment_bytes(moments, x.size()));
        std::vector<float> r(x.size());
        moments_from_fp32(x.data(), narrow.data(), moments, which, x.size());
        moments_to_fp32(narrow.data(), moments, which, r.data(), x.size());
        return r;
      };
      for (const Tier t : {Tier::device, Tier::host, Tier::nvme}) {
        INFO("tier " << tier_name(t));
        {
          NvmeHomes nvme({cfg, lay, 0, 4, *dev, ledger, nullptr});
          ShardMap map({false, false});
          map.place(0, t, Tier::device);
          map.place(1, Tier::nvme, Tier::device);  // layer 1 on NVMe either way
          OptimizerState st({cfg, lay, *stream, ledger, nvme, map, nullptr});
          st.open_swapper();
          st.add_layer(0);
          st.add_layer(1);
          CHECK(st.tier(0) == t);
          CHECK((st.resident(0).master != nullptr) == (t != Tier::nvme));
          CHECK(st.resident(1).master == nullptr);
          // Every layer written before the commit: NVMe writes go to the other generation and
          // become current together.
          std::vector<float> master[2], m[2], v[2];
          for (int li = 0; li < 2; ++li) {
            const std::size_t n = st.elems(li);
            CHECK(n == (stage == 0 ? lay.layers()[li].padded : lay.layer_shard(li)));
            master[li].resize(n), m[li].resize(n), v[li].resize(n);
            for (std::size_t i = 0; i < n; ++i) {
              master[li][i] = 0.1f * static_cast<float>(i) - 1.7f;
              m[li][i] = 1e-3f * static_cast<float>(i);
              v[li][i] = 3e-7f * static_cast<float>(i * i);
            }
            st.write(li, master[li].data(), m[li].data(), v[li].data());
          }
          st.commit_writes();
          if (t != Tier::nvme) {  // 4 bytes of master and two moments of the moment dtype per element
            CHECK(ledger.usage(t).kind_used[static_cast<std::size_t>(Kind::optimizer)] ==
                  st.elems(0) * 4 + 2 * moment_bytes(moments, st.elems(0)));
          }
          for (int li = 0; li < 2; ++li) {
            const std::size_t n = st.elems(li);
            std::vector<float> rm(n, -1), rmm(n, -1), rv(n, -1);
            st.read(li, rm.data(), rmm.data(), rv.data());
            CHECK(std::memcmp(rm.data(), master[li].data(), n * 4) == 0);
            CHECK(rmm == held(m[li], Moment::first));
            CHECK(rv == held(v[li], Moment::second));
            if (moments != MomentFormat::fp32) CHECK(rmm != m[li]);  // they were rounded
          }
          for (int li = 0; li < 2; ++li) st.write(li, master[li].data(), nullptr, nullptr);  // fresh moments
          st.commit_writes();
          for (int li = 0; li < 2; ++li) {
            std::vector<float> rmm(st.elems(li), -1.0f);
            st.read(li, nullptr, rmm.data(), nullptr);
            CHECK(std::all_of(rmm.begin(), rmm.end(), [](float x) { return x == 0.0f; }));
          }
        }
        CHECK(ledger.usage(Tier::device).used_bytes == 0);
        CHECK(ledger.usage(Tier::host).used_bytes == 0);
        CHECK(ledger.usage(Tier::nvme).used_bytes == 0);
      }
    }
}
