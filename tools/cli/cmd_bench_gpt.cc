// `strata bench gpt`: the GPT's host-device compute against the BLAS it runs on. Times the
// training pass (forward, backward, every gradient; GptPass over plain arrays, so no engine
// traffic is counted) on random tokens, and in the same run the BLAS's own GEMM (fp32, or bf16
// with --products bf16) on the block's three weight products (qkv, MLP up, MLP down) at the
// pass's row count. Reports tokens/s, model FLOP/s (config.h's accounting) and their fraction
// of the GEMM rate.
// Pass and SGEMM alternate and the fraction is the median of the per-iteration ratios: on a
// shared machine both halves of a pair see the same background load.
#include <tbb/global_control.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "models/gpt/array_access.h"
#include "models/gpt/gemm.h"
#include "models/gpt/pass.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/device/device.h"
#include "tools/cli/command.h"
#include "tools/cli/train_model.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  ModelOptions model;
  int micro = 8;
  int iters = 5;
  int threads = 0;
  std::string products = "fp32";
  bool json = false;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The block's weight products at N rows, one after the other: returns seconds and FLOPs.
struct GemmSet {
  GemmSet(model::ops::Products prec, int rows, int width)
      : p(prec),
        N(rows),
        C(width),
        a(static_cast<std::size_t>(rows) * 4 * width, 0.01f),
        w(std::size_t{16} * width * width, 0.02f),
        out(static_cast<std::size_t>(rows) * 4 * width) {}
  double run() {
    const auto t0 = Clock::now();
    const int shapes[3][2] = {{C, 3 * C}, {C, 4 * C}, {4 * C, C}};  // {in, out}
    for (const auto& s : shapes) {
      model::ops::gemm(p, false, false, N, s[1], s[0], 1.0f, a.data(), s[0], w.data(), s[1], 0.0f, out.data(), s[1]);
    }
    return seconds_since(t0);
  }
  double flops() const { return 2.0 * N * (3.0 * C * C + 4.0 * C * C + 4.0 * C * C); }
  model::ops::Products p;
  int N, C;
  std::vector<float> a, w, out;
};

int run(const Options& o) {
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
  const model::GptConfig cfg = gpt_config(o.model, false);
  const model::GptShape& s = cfg.shape;
  const int B = o.micro, T = cfg.seq_len;

  auto params = model::ArrayAccess::by_layer(s, model::gpt_initial_params(s, o.model.seed));
  model::ArrayAccess access(params);
  device::DeviceOptions dopt;
  dopt.backend = device::Backend::host;
  dopt.budget_bytes = model::GptPass::device_bytes(s, B, T, cfg.remat) + (std::uint64_t{1} << 20);
  auto dev = device::Device::create(dopt);
  STRATA_CHECK(o.products == "fp32" || o.products == "bf16", Errc::invalid_argument, "--products ", o.products,
               ": use fp32 or bf16");
  const bool bf16 = o.products == "bf16" && model::ops::bf16_products_available();
  const auto products = bf16 ? model::ops::Products::bf16 : model::ops::Products::fp32;
  model::GptPass pass(s, B, T, cfg.remat, *dev, products);
  std::mt19937 gen(static_cast<std::uint32_t>(o.model.seed));
  std::uniform_int_distribution<int> tok(0, s.vocab - 1);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  for (auto& t : in) t = tok(gen);
  for (auto& t : tg) t = tok(gen);
  GemmSet gemm(products, B * T, s.d_model);

  const double tokens = static_cast<double>(B) * T;
  const double model_flops = model::gpt_train_flops_per_token(s, T) * tokens;
  pass.train(access, in.data(), tg.data(), B, T, 1.0f);  // warm-up: first touch, BLAS buffers
  gemm.run();
  std::vector<double> pass_s, gemm_rate, fraction;
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = Clock::now();
    pass.train(access, in.data(), tg.data(), B, T, 1.0f);
    pass_s.push_back(seconds_since(t0));
    gemm_rate.push_back(gemm.flops() / gemm.run());
    fraction.push_back(model_flops / pass_s.back() / gemm_rate.back());
  }
  const double sec = median(pass_s), rate = median(gemm_rate), frac = median(fraction);
  nlohmann::json j = {{"layers", s.layers},
                      {"heads", s.heads},
                      {"d_model", s.d_model},
                      {"vocab", s.vocab},
                      {"seq_len", T},
                      {"micro_batch", B},
                      {"remat", model::remat_name(cfg.remat)},
                      {"parameters", model::gpt_parameter_count(s)},
                      {"threads", threads},
                      {"blas", model::ops::blas_name()},
                      {"products", bf16 ? "bf16" : "fp32"},
                      {"pass_s", sec},
                      {"tokens_per_s", tokens / sec},
                      {"model_flops_per_token", model::gpt_train_flops_per_token(s, T)},
                      {"model_flops_per_s", model_flops / sec},
                      {"gemm_flops_per_s", rate},
                      {"fraction_of_gemm", frac}};
  if (o.json) {
    print_json(j.dump(2));
    return 0;
  }
  std::printf(
      "gpt %d x %d (%d heads, vocab %d, %llu parameters), micro-batch %d x seq %d, remat %s, %s products, "
      "%d threads\n",
      s.layers, s.d_model, s.heads, s.vocab, static_cast<unsigned long long>(model::gpt_parameter_count(s)), B, T,
      model::remat_name(cfg.remat), bf16 ? "bf16" : "fp32", threads);
  std::printf("training pass  %8.1f ms  %10.0f tokens/s  %7.2f model GFLOP/s\n", sec * 1e3, tokens / sec,
              model_flops / sec / 1e9);
  std::printf("%-8s %s GEMM %5s     %10s            %7.2f GFLOP/s (the block's weight products, %d rows)\n",
              model::ops::blas_name(), bf16 ? "bf16" : "fp32", "", "", rate / 1e9, B * T);
  std::printf("fraction of GEMM  %.2f  (median of %d alternated iterations)\n", frac, o.iters);
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  o->model.model = "gpt";
  cmd.add_option("--layers", o->model.layers, "GPT blocks (default: the preset's)")->check(CLI::Range(1, 100000));
  add_gpt_shape_options(cmd, o->model);
  cmd.add_option("--micro-batch", o->micro, "Sequences per pass (default 8)")->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--iters", o->iters, "Timed iterations (default 5; the median is reported)")
      ->check(CLI::Range(1, 1000));
  cmd.add_option("--threads", o->threads, "Threads for TBB and the BLAS (0: all hardware threads)")
      ->check(CLI::Range(0, 4096));
  cmd.add_option("--products", o->products,
                 "Precision of the weight products: fp32 or bf16 (bf16 inputs, fp32 sums; "
                 "fp32 where the CPU has no bf16 dot products)");
  cmd.add_option("--seed", o->model.seed, "Seed for the weights and tokens");
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] { return run(*o); };
}

const Registration reg("bench", "gpt",
                       "The GPT's training pass on the host device: tokens/s, model FLOP/s, "
                       "fraction of the BLAS's SGEMM rate",
                       setup);

}  // namespace
}  // namespace strata::cli
