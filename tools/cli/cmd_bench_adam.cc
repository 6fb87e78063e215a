// `strata bench adam`: the CPU optimizer step at the memory-bandwidth limit. Times the fused
// step on a shard of --params parameters filled with non-trivial data, and in the same run a
// streaming pass with exactly the step's traffic (optim/roofline.h) over the same buffers, so
// fraction_of_roofline says how close the step comes to what this machine's memory allows.
// Step and roofline alternate, and the fraction is the median of the per-iteration ratios:
// on a shared machine both halves of a pair see the same background load. With
// --out-of-place it also times the overlapped step's form (the state read from a second set of
// buffers, the stepped state written to the first: StepArgs::from) against what it replaces
// (copying the state over, then stepping in place), alternated the same way.
#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/grad_norm.h"
#include "optim/kernel_info.h"
#include "optim/lion.h"
#include "optim/roofline.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/core/units.h"
#include "tools/cli/bench_adam_device.h"
#include "tools/cli/command.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string params = "256M";
  std::string optimizer = "adamw";
  std::string grad_dtype = "fp32";
  std::string state_dtype = "fp32";
  std::string copy_out = "none";
  std::string device;
  int threads = 0;
  int iters = 7;
  bool json = false;
  bool out_of_place = false;
};

// Page-aligned buffer asking for transparent huge pages (fewer TLB misses on GBs of state).
struct HostArray {
  explicit HostArray(std::size_t bytes) : bytes_(bytes) {
    constexpr std::size_t kAlign = std::size_t{2} << 20;
    const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    ptr_ = std::aligned_alloc(kAlign, rounded);
    STRATA_CHECK(ptr_, Errc::out_of_budget, "bench adam: cannot allocate ", format_bytes(rounded),
                 " of host memory: lower --params");
    madvise(ptr_, rounded, MADV_HUGEPAGE);  // advisory; failure only costs speed
  }
  ~HostArray() { std::free(ptr_); }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

optim::UpdateRule parse_rule(const std::string& name) {
  if (name == "adamw" || name == "adam") return optim::UpdateRule::adam;
  if (name == "lion") return optim::UpdateRule::lion;
  if (name == "adagrad") return optim::UpdateRule::adagrad;
  STRATA_THROW(Errc::invalid_argument, "--optimizer '", name, "': use adamw, adam, lion or adagrad");
}

// --out-of-place: the state before the step in a second set of buffers, copied over then
// stepped in place, or stepped from there (StepArgs::from); both write the first set.
// Alternated; adds the medians to `j`.
void time_out_of_place(optim::StepArgs& a, optim::StateUse use, int iters, const std::function<void()>& step,
                       nlohmann::json& j) {
  const std::size_t n = a.n, sb = moment_bytes(a.state_format, n);
  HostArray from_master(n * 4);
  std::unique_ptr<HostArray> from_m, from_v;
  if (use.m) from_m = std::make_unique<HostArray>(sb);
  if (use.v) from_v = std::make_unique<HostArray>(sb);
  fill_uniform(from_master.get(), DType::fp32, n, 6, -0.05f, 0.05f);
  if (from_m) fill_moments(from_m->get(), a.state_format, Moment::first, n, 7, -1e-4f, 1e-4f);
  if (from_v) fill_moments(from_v->get(), a.state_format, Moment::second, n, 8, 0.0f, 1e-6f);
  const auto copy_over = [&] {
    std::memcpy(a.master, from_master.get(), n * 4);
    if (from_m) std::memcpy(a.m, from_m->get(), sb);
    if (from_v) std::memcpy(a.v, from_v->get(), sb);
  };
  const optim::StepArgs::Source src{from_master.as<float>(), from_m ? from_m->get() : nullptr,
                                    from_v ? from_v->get() : nullptr};
  std::vector<double> t_copy, t_oop, gain;
  for (int i = 0; i < iters; ++i) {
    t_copy.push_back(seconds_of([&] {
      copy_over();
      step();
    }));
    a.from = src;
    t_oop.push_back(seconds_of(step));
    a.from = {};
    gain.push_back(t_copy.back() / t_oop.back());
  }
  j["copy_then_step_ms"] = median(t_copy) * 1e3;
  j["out_of_place_ms"] = median(t_oop) * 1e3;
  j["out_of_place_speedup"] = median(gain);
}

// The CPU bench's figures as text, from its JSON.
void print_text(const Options& o, const nlohmann::json& j) {
  const auto num = [&](const char* key) { return j[key].get<double>(); };
  std::printf("%s step, %zu params, grad %s, state %s, copy-out %s, %d threads, %s kernels\n", o.optimizer.c_str(),
              j["params"].get<std::size_t>(), j["grad_dtype"].get<std::string>().c_str(),
              j["state_dtype"].get<std::string>().c_str(), j["copy_out"].get<std::string>().c_str(),
              j["threads"].get<int>(), j["isa"].get<std::string>().c_str());
  std::printf("bytes per param:    %g (read %g, written %g)\n", j["bytes_per_param"].get<double>(),
              j["bytes_read_per_param"].get<double>(), j["bytes_written_per_param"].get<double>());
  std::printf("step:               %8.2f ms  %6.3f Gparam/s  %6.2f GB/s   (median of %d)\n", num("step_ms"),
              num("gparams_per_s"), num("gbps"), o.iters);
  std::printf("roofline (stream):  %8.2f ms                   %6.2f GB/s\n", num("roofline_ms"), num("roofline_gbps"));
  std::printf("fraction of roofline: %.3f (median of paired ratios)\n", num("fraction_of_roofline"));
  std::printf("grad norm pass:     %6.2f GB/s read\n", num("grad_norm_gbps"));
  if (o.out_of_place)
    std::printf(
        "state from other buffers: copy then step %.2f ms, out of place %.2f ms: %.2fx (median of paired "
        "ratios)\n",
        num("copy_then_step_ms"), num("out_of_place_ms"), num("out_of_place_speedup"));
}

// --device: the step through optim::adam_step_async on that backend's stream.
int run_on_device(const Options& o, optim::UpdateRule rule, optim::StepArgs a, bool copy) {
  STRATA_CHECK(rule == optim::UpdateRule::adam, Errc::unsupported, "bench adam --device ", o.device, ": --optimizer ",
               o.optimizer, " has no device kernel (device steps exist for adam and adamw); drop --device");
  STRATA_CHECK(!o.out_of_place, Errc::unsupported, "bench adam --device ", o.device,
               ": --out-of-place times the CPU kernel only; drop one of them");
  optim::AdamConfig adam;
  adam.adamw_mode = o.optimizer != "adam";
  const nlohmann::json j = bench_adam_device(o.device, adam, a, copy, o.iters);
  if (o.json) {
    print_json(j.dump(2));
    return 0;
  }
  std::printf("%s step on %s, %zu params, grad %s, state %s, copy-out %s\n", o.optimizer.c_str(),
              j["device"].get<std::string>().c_str(), a.n, dtype_name(a.grad_dtype), moment_format_name(a.state_format),
              j["copy_out"].get<std::string>().c_str());
  std::printf("step:               %8.3f ms  %7.2f GB/s   (median of %d)\n", j["step_ms"].get<double>(),
              j["gbps"].get<double>(), o.iters);
  std::printf("roofline:           %8.3f ms  %7.2f GB/s   (%s)\n", j["roofline_ms"].get<double>(),
              j["roofline_gbps"].get<double>(), j["roofline"].get<std::string>().c_str());
  std::printf("fraction of roofline: %.3f (median of paired ratios)\n", j["fraction_of_roofline"].get<double>());
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--params", o->params, "Parameters in the shard (e.g. 256M, 1e9)");
  cmd.add_option("--optimizer", o->optimizer, "adamw|adam|lion|adagrad");
  cmd.add_option("--grad-dtype", o->grad_dtype, "Gradient dtype: fp32|bf16|fp16");
  cmd.add_option("--state-dtype", o->state_dtype,
                 "Optimizer moments: fp32|bf16|q8 (q8: 8-bit, a scale per 16 elements; AdamW/Adam)");
  cmd.add_option("--copy-out", o->copy_out, "16-bit parameter copy written in the same pass: none|bf16|fp16");
  cmd.add_option("--threads", o->threads, "Worker threads (0: all hardware threads)")->check(CLI::Range(0, 4096));
  cmd.add_option("--iters", o->iters, "Timed repetitions; figures are medians")->check(CLI::Range(1, 1000));
  cmd.add_flag("--out-of-place", o->out_of_place,
               "Also time the step reading its state from other buffers (the overlapped step's) against copying it "
               "over first");
  cmd.add_option("--device", o->device,
                 "Run the Adam/AdamW step on a device stream (host|cuda) against that device's copy roofline "
                 "(default: the CPU kernel on host memory)");
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] {
    const std::size_t n = parse_count(o->params, "--params");
    STRATA_CHECK(n > 0, Errc::invalid_argument, "--params must be > 0");
    const optim::UpdateRule rule = parse_rule(o->optimizer);
    const int threads =
        o->threads > 0 ? o->threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));

    optim::StepArgs a;
    a.n = n;
    a.grad_dtype = parse_dtype(o->grad_dtype);
    a.state_format = parse_moment_format(o->state_dtype);
    STRATA_CHECK(a.state_format != MomentFormat::q8 || n % moment_align(MomentFormat::q8) == 0, Errc::invalid_argument,
                 "--params ", n, " with --state-dtype q8: q8 steps whole blocks of ", moment_align(MomentFormat::q8),
                 " elements; give a multiple of ", moment_align(MomentFormat::q8));
    const bool copy = o->copy_out != "none";
    if (copy) a.copy_dtype = parse_dtype(o->copy_out);
    if (!o->device.empty()) return run_on_device(*o, rule, a, copy);
    const optim::StateUse use = optim::state_use(rule);
    HostArray master(n * 4), grad(n * dtype_size(a.grad_dtype));
    std::unique_ptr<HostArray> m, v, out;
    if (use.m) m = std::make_unique<HostArray>(moment_bytes(a.state_format, n));
    if (use.v) v = std::make_unique<HostArray>(moment_bytes(a.state_format, n));
    if (copy) out = std::make_unique<HostArray>(n * dtype_size(a.copy_dtype));
    a.master = master.as<float>();
    a.grad = grad.get();
    a.m = m ? m->get() : nullptr;
    a.v = v ? v->get() : nullptr;
    a.copy = out ? out->get() : nullptr;
    fill_uniform(a.master, DType::fp32, n, 1, -0.05f, 0.05f);
    fill_uniform(grad.get(), a.grad_dtype, n, 2, -1e-3f, 1e-3f);
    if (m) fill_moments(m->get(), a.state_format, Moment::first, n, 3, -1e-4f, 1e-4f);
    if (v) fill_moments(v->get(), a.state_format, Moment::second, n, 4, 0.0f, 1e-6f);
    if (out) fill_uniform(out->get(), a.copy_dtype, n, 5, 0.0f, 1.0f);
    a.grad_scale = 0.5f;  // as if clipping: exercises the fused multiply
    a.step = 100;

    optim::AdamConfig adam;
    adam.adamw_mode = o->optimizer != "adam";
    std::function<void()> step = [&] {
      switch (rule) {
        case optim::UpdateRule::adam:
          optim::adam_step(adam, a);
          break;
        case optim::UpdateRule::lion:
          optim::lion_step({}, a);
          break;
        case optim::UpdateRule::adagrad:
          optim::adagrad_step({}, a);
          break;
      }
      ++a.step;
    };
    const auto roofline = [&] { optim::roofline_pass(rule, a); };
    step();  // warm-up: every page touched by both kernels
    roofline();
    std::vector<double> t_step, t_roof, ratio, t_norm;
    for (int i = 0; i < o->iters; ++i) {
      t_step.push_back(seconds_of(step));
      t_roof.push_back(seconds_of(roofline));
      ratio.push_back(t_roof.back() / t_step.back());
      t_norm.push_back(seconds_of([&] { (void)optim::grad_norm_sq(a.grad, a.grad_dtype, n); }));
    }
    const optim::TrafficBytes traffic = optim::traffic_per_param(a, use);
    const double bpp = static_cast<double>(traffic.total());
    const double step_s = median(t_step), roof_s = median(t_roof);
    nlohmann::json j = {{"optimizer", o->optimizer},
                        {"params", n},
                        {"grad_dtype", dtype_name(a.grad_dtype)},
                        {"state_dtype", moment_format_name(a.state_format)},
                        {"copy_out", copy ? dtype_name(a.copy_dtype) : "none"},
                        {"threads", threads},
                        {"iters", o->iters},
                        {"isa", optim::kernel_isa()},
                        {"bytes_per_param", traffic.total()},
                        {"bytes_read_per_param", traffic.read},
                        {"bytes_written_per_param", traffic.written},
                        {"step_ms", step_s * 1e3},
                        {"gparams_per_s", static_cast<double>(n) / step_s / 1e9},
                        {"gbps", static_cast<double>(n) * bpp / step_s / 1e9},
                        {"roofline_ms", roof_s * 1e3},
                        {"roofline_gbps", static_cast<double>(n) * bpp / roof_s / 1e9},
                        {"fraction_of_roofline", median(ratio)},
                        {"grad_norm_gbps", static_cast<double>(n * dtype_size(a.grad_dtype)) / median(t_norm) / 1e9}};
    if (o->out_of_place) time_out_of_place(a, use, o->iters, step, j);
    if (o->json) {
      print_json(j.dump(2));
      return 0;
    }
    print_text(*o, j);
    return 0;
  };
}

const Registration reg("bench", "adam", "CPU optimizer step throughput against a same-traffic streaming roofline",
                       setup);

}  // namespace
}  // namespace strata::cli
