// `strata bench comm -n N`: all_gather, reduce_scatter and all_reduce bandwidth over sizes
// in nccl-tests' terms (algbw = bytes / time; busbw = algbw x (n-1)/n for all_gather and
// reduce_scatter, x 2(n-1)/n for all_reduce), each result checked against the exact
// expected values. Run without STRATA_RANK it launches N local ranks of itself and prints
// rank 0's report.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/launch.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "tools/cli/command.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int nprocs = 2;
  std::string min_size = "4KiB";
  std::string max_size = "16MiB";
  int iters = 5;
  std::string backend = "gloo";
  bool json = false;
};

// Values rank r contributes at element i: small integers, so every sum is exact in fp32.
float value(int rank, std::size_t i) { return static_cast<float>((i % 97) + 3 * rank + 1); }

nlohmann::json run_rank(const Options& o) {
  comm::CommOptions co;
  co.backend = o.backend == "nccl" ? comm::Backend::nccl : comm::Backend::gloo;
  co.rendezvous = comm::rendezvous_from_env();
  auto c = comm::Communicator::create(co);
  const int n = c->world_size(), me = c->rank();
  nlohmann::json rows = nlohmann::json::array();
  const std::size_t lo = parse_bytes(o.min_size, "--min-size"), hi = parse_bytes(o.max_size, "--max-size");
  for (std::size_t bytes = lo; bytes <= hi; bytes *= 4) {
    const std::size_t total = bytes / sizeof(float) / n * n;  // divisible by n
    const std::size_t per = total / n;
    std::vector<float> full(total), part(per), expect_sum(total);
    for (std::size_t i = 0; i < total; ++i) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += value(r, i);
      expect_sum[i] = s;
    }
    auto timed = [&](auto&& op) {
      std::vector<double> t;
      for (int k = 0; k < o.iters; ++k) {
        c->barrier();
        const auto t0 = Clock::now();
        op();
        t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      return median(t);
    };
    bool ok = true;
    // all_gather: rank r's slice holds value(r, i).
    for (std::size_t i = 0; i < per; ++i) part[i] = value(me, i);
    const double ag = timed([&] { c->all_gather(part.data(), full.data(), per, DType::fp32); });
    for (std::size_t i = 0; i < total && ok; ++i) ok = full[i] == value(static_cast<int>(i / per), i % per);
    // reduce_scatter of full buffers, each rank keeps its slice of the sum.
    const double rs = timed([&] {
      for (std::size_t i = 0; i < total; ++i) full[i] = value(me, i);
      c->reduce_scatter(full.data(), part.data(), per, DType::fp32, comm::ReduceOp::sum);
    });
    for (std::size_t i = 0; i < per && ok; ++i) ok = part[i] == expect_sum[me * per + i];
    const double ar = timed([&] {
      for (std::size_t i = 0; i < total; ++i) full[i] = value(me, i);
      c->all_reduce(full.data(), total, DType::fp32, comm::ReduceOp::sum);
    });
    for (std::size_t i = 0; i < total && ok; ++i) ok = full[i] == expect_sum[i];
    const double b = static_cast<double>(total * sizeof(float));
    const double f1 = static_cast<double>(n - 1) / n, f2 = 2.0 * (n - 1) / n;
    rows.push_back(
        {{"bytes", total * sizeof(float)},
         {"all_gather", {{"time_us", ag * 1e6}, {"algbw_gbps", b / ag / 1e9}, {"busbw_gbps", b / ag / 1e9 * f1}}},
         {"reduce_scatter", {{"time_us", rs * 1e6}, {"algbw_gbps", b / rs / 1e9}, {"busbw_gbps", b / rs / 1e9 * f1}}},
         {"all_reduce", {{"time_us", ar * 1e6}, {"algbw_gbps", b / ar / 1e9}, {"busbw_gbps", b / ar / 1e9 * f2}}},
         {"correct", ok}});
    STRATA_CHECK(ok, Errc::comm, "bench comm: wrong collective result at ", total * sizeof(float), " B on rank ", me);
  }
  return {{"world_size", n}, {"backend", o.backend}, {"iters", o.iters}, {"sizes", rows}};
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("-n,--nprocs", o->nprocs, "Ranks to launch")->check(CLI::Range(1, 64));
  cmd.add_option("--min-size", o->min_size, "Smallest message (bytes)");
  cmd.add_option("--max-size", o->max_size, "Largest message (bytes); sizes grow x4");
  cmd.add_option("--iters", o->iters, "Repetitions per size (median)")->check(CLI::Range(1, 1000));
  cmd.add_option("--backend", o->backend, "gloo|nccl")->check(CLI::IsMember({"gloo", "nccl"}));
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] {
    if (std::getenv("STRATA_RANK") == nullptr) {
      comm::LaunchOptions lo;
      lo.nprocs = o->nprocs;
      lo.command = {"/proc/self/exe", "bench",     "comm",
                    "--min-size",     o->min_size, "--max-size",
                    o->max_size,      "--iters",   std::to_string(o->iters),
                    "--backend",      o->backend};
      if (o->json) lo.command.push_back("--json");
      lo.prefix_output = false;
      lo.only_rank_output = 0;
      const auto r = comm::launch_local(lo);
      if (r.exit_code != 0) std::fprintf(stderr, "strata bench comm: %s\n", r.summary.c_str());
      return r.exit_code;
    }
    const auto j = run_rank(*o);
    if (std::atoi(std::getenv("STRATA_RANK")) != 0) return 0;
    if (o->json) {
      print_json(j.dump(2));
      return 0;
    }
    std::printf("%s, %d ranks, median of %d (busbw in nccl-tests terms; every result verified)\n", o->backend.c_str(),
                j["world_size"].get<int>(), o->iters);
    std::printf("%12s  %-26s  %-26s  %-26s\n", "bytes", "all_gather us / busbw GB/s", "reduce_scatter us / busbw",
                "all_reduce us / busbw");
    for (const auto& row : j["sizes"]) {
      auto cell = [&](const char* k) {
        char b[64];
        std::snprintf(b, sizeof b, "%10.1f / %6.3f", row[k]["time_us"].get<double>(),
                      row[k]["busbw_gbps"].get<double>());
        return std::string(b);
      };
      std::printf("%12llu  %-26s  %-26s  %-26s\n", static_cast<unsigned long long>(row["bytes"].get<std::uint64_t>()),
                  cell("all_gather").c_str(), cell("reduce_scatter").c_str(), cell("all_reduce").c_str());
    }
    return 0;
  };
}

const Registration reg("bench", "comm", "Collective bandwidth over sizes (launches N local ranks)", setup);

}  // namespace
}  // namespace strata::cli
