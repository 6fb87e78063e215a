// `strata info`: what this machine offers Strata: device backends, io_uring (probed at run
// time), the SIMD instruction set, TBB concurrency, Gloo and NCCL, and the memlock limit.
#include <gloo/config.h>
#include <tbb/info.h>

#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <xsimd/xsimd.hpp>

#include "io/probe.h"
#include "runtime/core/units.h"
#include "runtime/device/device.h"
#include "runtime/device/pinned.h"
#include "tools/cli/command.h"

#ifdef STRATA_HAVE_NCCL
#include <nccl.h>
#endif

namespace strata::cli {
namespace {

std::string best_runtime_simd() {
  const auto a = xsimd::available_architectures();
  if (a.avx512bw) return "avx512bw";
  if (a.avx512dq) return "avx512dq";
  if (a.avx512f) return "avx512f";
  if (a.fma3_avx2) return "fma3<avx2>";
  if (a.avx2) return "avx2";
  if (a.avx) return "avx";
  if (a.sse4_2) return "sse4.2";
  if (a.neon64) return "neon64";
  if (a.sse2) return "sse2";
  return "none";
}

nlohmann::json gather_info() {
  using nlohmann::json;
  json j;
  j["version"] = "0.1.0";
  json backends = json::array();
  backends.push_back(
      {{"name", "host"}, {"available", true}, {"detail", "emulated GPU (capped arena, worker streams)"}});
  const auto inv = device::cuda_inventory();
  json cuda = {{"name", "cuda"}, {"built", inv.built_with_cuda}, {"available", !inv.devices.empty()}};
  if (inv.built_with_cuda) {
    cuda["runtime_version"] = inv.runtime_version;
    cuda["driver_version"] = inv.driver_version;
  }
  if (!inv.why.empty()) cuda["detail"] = inv.why;
  json gpus = json::array();
  for (const auto& d : inv.devices) {
    gpus.push_back({{"ordinal", d.ordinal},
                    {"name", d.name},
                    {"total_bytes", d.total_bytes},
                    {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)}});
  }
  cuda["devices"] = gpus;
  backends.push_back(cuda);
  j["backends"] = backends;

  const auto uring = io::probe_uring();
  j["io_uring"] = {{"available", uring.available}, {"kernel", uring.kernel}, {"opcodes", uring.opcodes}};
  if (!uring.available) j["io_uring"]["detail"] = uring.why;

  j["simd"] = {{"compiled", xsimd::default_arch::name()}, {"cpu_best", best_runtime_simd()}};
  j["tbb"] = {{"default_concurrency", tbb::info::default_concurrency()},
              {"hardware_threads", std::thread::hardware_concurrency()}};
#ifdef GLOO_HAVE_TRANSPORT_TCP
  const bool gloo_tcp = true;
#else
  const bool gloo_tcp = false;
#endif
  j["gloo"] = {{"available", true}, {"transport_tcp", gloo_tcp}};
#ifdef STRATA_HAVE_NCCL
  int nv = 0;
  const bool nccl_ok = ncclGetVersion(&nv) == ncclSuccess;
  j["nccl"] = {{"built", true}, {"version", nccl_ok ? nv : 0}, {"usable", nccl_ok && !inv.devices.empty()}};
  if (inv.devices.empty()) j["nccl"]["detail"] = "no GPU: NCCL ranks need one";
#else
  j["nccl"] = {{"built", false}, {"usable", false}, {"detail", "built without NCCL"}};
#endif
  const auto lim = device::memlock_limit_bytes();
  j["memlock_limit_bytes"] = lim == std::numeric_limits<std::uint64_t>::max() ? json("unlimited") : json(lim);
  return j;
}

void print_text(const nlohmann::json& j) {
  std::printf("strata %s\n", j["version"].get<std::string>().c_str());
  std::printf("  device backends:\n");
  std::printf("    host    available (emulated GPU: capped arena in RAM, worker-thread streams)\n");
  const auto& cuda = j["backends"][1];
  if (!cuda["built"].get<bool>()) {
    std::printf("    cuda    not built (%s)\n", cuda.value("detail", "").c_str());
  } else if (cuda["devices"].empty()) {
    std::printf("    cuda    built (runtime %d), %s\n", cuda["runtime_version"].get<int>(),
                cuda.value("detail", "").c_str());
  } else {
    for (const auto& d : cuda["devices"]) {
      std::printf("    cuda:%d  %s, %s, sm_%s\n", d["ordinal"].get<int>(), d["name"].get<std::string>().c_str(),
                  format_bytes(d["total_bytes"].get<std::uint64_t>()).c_str(),
                  d["compute_capability"].get<std::string>().c_str());
    }
  }
  const auto& u = j["io_uring"];
  if (u["available"].get<bool>()) {
    std::string ops;
    for (const auto& o : u["opcodes"]) ops += (ops.empty() ? "" : " ") + o.get<std::string>();
    std::printf("  io_uring: available (kernel %s; ops: %s)\n", u["kernel"].get<std::string>().c_str(), ops.c_str());
  } else {
    std::printf("  io_uring: NOT available (%s; kernel %s)\n", u["detail"].get<std::string>().c_str(),
                u["kernel"].get<std::string>().c_str());
  }
  std::printf("  SIMD: compiled for %s; CPU offers %s\n", j["simd"]["compiled"].get<std::string>().c_str(),
              j["simd"]["cpu_best"].get<std::string>().c_str());
  std::printf("  TBB: %d worker threads (hardware %u)\n", j["tbb"]["default_concurrency"].get<int>(),
              j["tbb"]["hardware_threads"].get<unsigned>());
  std::printf("  Gloo: available (tcp transport: %s)\n", j["gloo"]["transport_tcp"].get<bool>() ? "yes" : "no");
  const auto& n = j["nccl"];
  if (n["built"].get<bool>()) {
    const int v = n["version"].get<int>();
    std::printf("  NCCL: %d.%d.%d%s\n", v / 10000, (v / 100) % 100, v % 100,
                n["usable"].get<bool>() ? "" : (" (" + n.value("detail", "") + ")").c_str());
  } else {
    std::printf("  NCCL: not built\n");
  }
  const auto& m = j["memlock_limit_bytes"];
  std::printf("  memlock limit: %s%s\n", m.is_string() ? "unlimited" : format_bytes(m.get<std::uint64_t>()).c_str(),
              m.is_string() ? "" : " (pinned buffers above it fall back to pageable memory; raise with ulimit -l)");
}

Action setup(CLI::App& cmd) {
  auto json_out = std::make_shared<bool>(false);
  cmd.add_flag("--json", *json_out, "Print JSON");
  return [json_out] {
    const auto j = gather_info();
    if (*json_out)
      print_json(j.dump(2));
    else
      print_text(j);
    return 0;
  };
}

const Registration reg("", "info", "What this machine offers: backends, io_uring, SIMD, TBB, Gloo, NCCL, memlock",
                       setup);

}  // namespace
}  // namespace strata::cli
