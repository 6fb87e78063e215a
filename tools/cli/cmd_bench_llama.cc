// `strata bench llama --model DIR`: a Llama-family decoder's training pass on the host device
// (models/llama/pass.h over plain arrays holding the model's initial values, so no engine
// traffic is counted) on random tokens, and in the same run oneDNN's GEMM on the block's
// weight products at the pass's row count (q, k, v, o, gate, up, down). Reports tokens/s,
// model FLOP/s (config.h's accounting) and their fraction of the GEMM rate, alternating pass
// and GEMM and taking medians, as `strata bench gpt` does, then the library at its best on the
// same product sizes (gemm.h's library_gemm_seconds). DIR needs config.json only.
// `strata plan --model DIR` profiles the pass through it.
#include <tbb/global_control.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "models/gpt/array_access.h"
#include "models/gpt/gemm.h"
#include "models/llama/llama.h"
#include "models/llama/ops.h"
#include "models/llama/pass.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/device/device.h"
#include "tools/cli/command.h"
#include "train/llama.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  ModelOptions model;
  int micro = 4;
  int iters = 5;
  int threads = 0;
  std::string products = "fp32";
  bool json = false;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The block's seven weight products at N rows, {in, out} each.
std::vector<std::pair<int, int>> products_of(const model::LlamaShape& s) {
  const int C = s.hidden, Q = s.heads * s.head_dim, KV = s.kv_heads * s.head_dim, I = s.intermediate;
  return {{C, Q}, {C, KV}, {C, KV}, {Q, C}, {C, I}, {C, I}, {I, C}};
}

int run(const Options& o) {
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
  STRATA_CHECK(is_hf_model_dir(o.model.model), Errc::invalid_argument, "--model ", o.model.model,
               ": give a directory holding a Hugging Face config.json");
  const model::LlamaConfig cfg = llama_config(o.model, false);
  const model::LlamaShape& s = cfg.shape;
  const int B = o.micro, T = cfg.seq_len;
  STRATA_CHECK(o.products == "fp32" || o.products == "bf16", Errc::invalid_argument, "--products ", o.products,
               ": use fp32 or bf16");
  const model::ops::Products products = o.products == "bf16" && model::ops::bf16_products_available()
                                            ? model::ops::Products::bf16
                                            : model::ops::Products::fp32;
  auto params = model::llama_initial_params(s, o.model.seed);
  device::DeviceOptions dopt;
  dopt.backend = device::Backend::host;
  dopt.budget_bytes = model::LlamaPass::device_bytes(s, B, T, cfg.remat) + (std::uint64_t{1} << 20);
  auto dev = device::Device::create(dopt);
  model::LlamaPass pass(s, B, T, cfg.remat, *dev, products);
  model::ArrayAccess access(params);
  std::mt19937 gen(static_cast<std::uint32_t>(o.model.seed));
  std::uniform_int_distribution<int> tok(0, s.vocab - 1);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  for (auto& t : in) t = tok(gen);
  for (auto& t : tg) t = tok(gen);
  // GEMM operands: the widest input and output of the block's products.
  const int N = B * T, wide = std::max({s.hidden, s.intermediate, s.heads * s.head_dim});
  std::vector<float> a(static_cast<std::size_t>(N) * wide, 0.01f), w(static_cast<std::size_t>(wide) * wide, 0.01f),
      out(a.size());
  double gemm_flops = 0;
  for (auto [ic, oc] : products_of(s)) gemm_flops += 2.0 * N * ic * oc;
  auto gemm = [&] {
    const auto t0 = Clock::now();
    for (auto [ic, oc] : products_of(s))
      model::llama::linear_forward(out.data(), a.data(), w.data(), nullptr, N, ic, oc, products);
    return seconds_since(t0);
  };
  const double tokens = static_cast<double>(B) * T;
  const double model_flops = model::llama_train_flops_per_token(s, T) * tokens;
  pass.train(access, in.data(), tg.data(), B, T, 1.0f);  // warm-up
  gemm();
  std::vector<double> pass_s, gemm_rate, fraction;
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = Clock::now();
    pass.train(access, in.data(), tg.data(), B, T, 1.0f);
    pass_s.push_back(seconds_since(t0));
    gemm_rate.push_back(gemm_flops / gemm());
    fraction.push_back(model_flops / pass_s.back() / gemm_rate.back());
  }
  const char* prec = products == model::ops::Products::bf16 ? "bf16" : "fp32";
  const double sec = median(pass_s), rate = median(gemm_rate), frac = median(fraction);
  // The library at its best on the same product sizes: one oneDNN call each on all threads.
  double library_seconds = 0;
  for (auto [ic, oc] : products_of(s))
    library_seconds += model::ops::library_gemm_seconds(products, N, oc, ic, threads, 5);
  const double library_rate = gemm_flops / library_seconds;
  nlohmann::json j = {{"model", model::describe(s)},
                      {"seq_len", T},
                      {"micro_batch", B},
                      {"remat", model::remat_name(cfg.remat)},
                      {"parameters", model::llama_parameter_count(s)},
                      {"threads", threads},
                      {"blas", model::ops::blas_name()},
                      {"products", prec},
                      {"pass_s", sec},
                      {"tokens_per_s", tokens / sec},
                      {"model_flops_per_token", model::llama_train_flops_per_token(s, T)},
                      {"model_flops_per_s", model_flops / sec},
                      {"gemm_flops_per_s", rate},
                      {"fraction_of_gemm", frac},
                      {"library_gemm_flops_per_s", library_rate},
                      {"fraction_of_library_gemm", model_flops / sec / library_rate}};
  if (o.json) {
    print_json(j.dump(2));
    return 0;
  }
  std::printf("%s, micro-batch %d x seq %d, remat %s, %s products, %d threads\n", model::describe(s).c_str(), B, T,
              model::remat_name(cfg.remat), prec, threads);
  std::printf("training pass  %8.1f ms  %10.0f tokens/s  %7.2f model GFLOP/s\n", sec * 1e3, tokens / sec,
              model_flops / sec / 1e9);
  std::printf("%-8s %s GEMM  %7.2f GFLOP/s (the block's weight products, %d rows)\n", model::ops::blas_name(), prec,
              rate / 1e9, N);
  std::printf("fraction of GEMM  %.2f  (median of %d alternated iterations)\n", frac, o.iters);
  std::printf("%-8s %s GEMM, one call on %d threads  %7.2f GFLOP/s (the library's best on the same products)\n",
              model::ops::blas_name(), prec, threads, library_rate / 1e9);
  std::printf("fraction of the library's GEMM  %.2f  (the pass); its own GEMM path %.2f\n",
              model_flops / sec / library_rate, rate / library_rate);
  return 0;
}

Action setup(CLI::App& cmd) {
  auto o = std::make_shared<Options>();
  cmd.add_option("--model", o->model.model, "Directory holding a Hugging Face config.json")->required();
  cmd.add_option("--seq-len", o->model.seq_len, "Sequence length (default min(max_position_embeddings, 2048))")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--remat", o->model.remat, "never (default), except_last or always");
  cmd.add_option("--micro-batch", o->micro, "Sequences per pass (default 4)")->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--iters", o->iters, "Timed iterations (default 5; the median is reported)")
      ->check(CLI::Range(1, 1000));
  cmd.add_option("--threads", o->threads, "Threads for TBB and the BLAS (0: all hardware threads)")
      ->check(CLI::Range(0, 4096));
  cmd.add_option("--products", o->products, "Precision of the weight products: fp32 or bf16");
  cmd.add_option("--seed", o->model.seed, "Seed for the weights and tokens");
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] { return run(*o); };
}

const Registration reg("bench", "llama",
                       "A Llama-family decoder's training pass on the host: tokens/s, model FLOP/s, fraction of the "
                       "GEMM rate",
                       setup);

}  // namespace
}  // namespace strata::cli
