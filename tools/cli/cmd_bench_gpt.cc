// `strata bench gpt`: the GPT's compute against the GEMM it runs on, on the host device
// (oneDNN) or a CUDA device (cuBLAS, and cuBLASLt's FP8 kernels with --products fp8). Times the
// training pass (forward, backward, every gradient; GptPass over plain arrays, so no engine
// traffic is counted) on random tokens, and in the same run the device's own GEMM (in the
// products' precision; bf16 for fp8) on the block's three weight products (qkv, MLP up, MLP
// down) at the pass's row count. Reports tokens/s, model FLOP/s (config.h's accounting) and
// their fraction of the GEMM rate.
// Pass and GEMM alternate and the fraction is the median of the per-iteration ratios: on a
// shared machine both halves of a pair see the same background load. On CUDA each half ends
// with a wait for the stream, so the times are the GPU's. On the host a second yardstick
// follows: the library at its best on the same products (one oneDNN call each on all the
// threads, operands already converted: gemm.h's library_gemm_seconds), which the pass's own
// GEMM path (single-threaded panels, conversions included) is measured against too.
#include <tbb/global_control.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "models/gpt/array_access.h"
#include "models/gpt/gemm.h"
#include "models/gpt/kernels.h"
#include "models/gpt/pass.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/device/device.h"
#include "tools/cli/command.h"
#include "tools/cli/flags.h"
#include "train/model.h"

namespace strata::cli {

using namespace strata::train;  // the library these commands parse flags for
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  ModelOptions model;
  int micro = 8;
  int iters = 5;
  int threads = 0;
  std::string products = "fp32";
  std::string device = "host";
  bool json = false;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The block's weight products at N rows, one after the other, on the kernels' device:
// returns seconds (waiting for them) and FLOPs.
struct GemmSet {
  static std::uint64_t bytes(int rows, int width) {
    return (std::uint64_t{8} * static_cast<std::uint64_t>(rows) * width + std::uint64_t{16} * width * width) * 4;
  }
  GemmSet(device::Device& dev, model::GptKernels& kernels, model::ops::Products prec, int rows, int width)
      : k(kernels), p(prec), N(rows), C(width), mem(dev, bytes(rows, width), "bench gpt gemm operands") {
    const std::size_t na = static_cast<std::size_t>(rows) * 4 * width, nw = std::size_t{16} * width * width;
    a = mem.as<float>();
    w = a + na;
    out = w + nw;
    std::vector<float> init(std::max(na, nw), 0.01f);
    auto up = dev.create_stream();
    up->copy_async(a, init.data(), na * 4, device::CopyKind::host_to_device);
    up->copy_async(w, init.data(), nw * 4, device::CopyKind::host_to_device);
    up->synchronize();
  }
  double run() {
    const auto t0 = Clock::now();
    const int shapes[3][2] = {{C, 3 * C}, {C, 4 * C}, {4 * C, C}};  // {in, out}
    for (const auto& s : shapes) k.matmul_forward(out, a, w, nullptr, N, s[0], s[1], p, {});
    k.sync();
    return seconds_since(t0);
  }
  double flops() const { return 2.0 * N * (3.0 * C * C + 4.0 * C * C + 4.0 * C * C); }
  model::GptKernels& k;
  model::ops::Products p;
  int N, C;
  device::DeviceBuffer mem;
  float *a = nullptr, *w = nullptr, *out = nullptr;
};

int run(const Options& o) {
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
  const model::GptConfig cfg = gpt_config(o.model, false);
  const model::GptShape& s = cfg.shape;
  const int B = o.micro, T = cfg.seq_len;
  STRATA_CHECK(o.products == "fp32" || o.products == "bf16" || o.products == "fp16" || o.products == "fp8",
               Errc::invalid_argument, "--products ", o.products, ": use fp32, bf16, fp16 or fp8");
  STRATA_CHECK(o.device == "host" || o.device == "cuda", Errc::invalid_argument, "--device ", o.device,
               ": use host or cuda");
  const bool cuda = o.device == "cuda";
  const bool fp8 = o.products == "fp8";
  // On the host, bf16 products need the CPU's bf16 dot products (fp32 otherwise); fp16 runs on GPUs.
  STRATA_CHECK(cuda || o.products != "fp16", Errc::invalid_argument,
               "--products fp16 runs on --device cuda only: the host device's products are fp32 or bf16");
  model::ops::Products products = model::ops::Products::fp32, reference = model::ops::Products::fp32;
  if (o.products == "bf16" && (cuda || model::ops::bf16_products_available())) products = model::ops::Products::bf16;
  if (o.products == "fp16") products = model::ops::Products::fp16;
  reference = fp8 && (cuda || model::ops::bf16_products_available()) ? model::ops::Products::bf16 : products;
  model::fp8::Recipe recipe;
  recipe.enabled = fp8;

  auto params = model::ArrayAccess::by_layer(s, model::gpt_initial_params(s, o.model.seed));
  device::DeviceOptions dopt;
  dopt.backend = cuda ? device::Backend::cuda : device::Backend::host;
  dopt.budget_bytes = model::GptPass::device_bytes(s, B, T, cfg.remat, fp8, cuda) +
                      (cuda ? model::DeviceArrayAccess::bytes(s) : 0) + GemmSet::bytes(B * T, s.d_model) +
                      (std::uint64_t{1} << 20);
  auto dev = device::Device::create(dopt);
  model::GptPass pass(s, B, T, cfg.remat, *dev, products, recipe);
  model::ArrayAccess host_access(params);
  std::unique_ptr<model::DeviceArrayAccess> device_access;
  if (cuda) device_access = std::make_unique<model::DeviceArrayAccess>(*dev, pass.kernels(), params);
  model::LayerAccess& access = cuda ? static_cast<model::LayerAccess&>(*device_access) : host_access;
  std::mt19937 gen(static_cast<std::uint32_t>(o.model.seed));
  std::uniform_int_distribution<int> tok(0, s.vocab - 1);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  for (auto& t : in) t = tok(gen);
  for (auto& t : tg) t = tok(gen);
  GemmSet gemm(*dev, pass.kernels(), reference, B * T, s.d_model);
  auto train = [&] {
    pass.train(access, in.data(), tg.data(), B, T, 1.0f);
    pass.kernels().sync();
  };

  const double tokens = static_cast<double>(B) * T;
  const double model_flops = model::gpt_train_flops_per_token(s, T) * tokens;
  train();  // warm-up: first touch, BLAS buffers, and the FP8 scales' first amax
  if (pass.fp8() != nullptr) pass.fp8()->end_step();  // from here on, delayed scaling as in training
  gemm.run();
  std::vector<double> pass_s, gemm_rate, fraction;
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = Clock::now();
    train();
    pass_s.push_back(seconds_since(t0));
    gemm_rate.push_back(gemm.flops() / gemm.run());
    fraction.push_back(model_flops / pass_s.back() / gemm_rate.back());
  }
  const auto name = [](model::ops::Products p) {
    return p == model::ops::Products::bf16 ? "bf16" : p == model::ops::Products::fp16 ? "fp16" : "fp32";
  };
  // The GEMM reference runs the products' own precision; FP8's, the best the device has beside it.
  const char* prec = fp8 ? "fp8" : name(products);
  const char* ref = name(reference);
  const char* blas = cuda ? "cuBLAS" : model::ops::blas_name();
  const double sec = median(pass_s), rate = median(gemm_rate), frac = median(fraction);
  double library_rate = 0;  // host only: cuBLAS is already the library's best
  if (!cuda) {
    const int C = s.d_model, shapes[3][2] = {{C, 3 * C}, {C, 4 * C}, {4 * C, C}};  // {in, out}
    double seconds = 0;
    for (const auto& sh : shapes)
      seconds += model::ops::library_gemm_seconds(reference, B * T, sh[1], sh[0], threads, 5);
    library_rate = gemm.flops() / seconds;
  }
  nlohmann::json j = {{"layers", s.layers},
                      {"heads", s.heads},
                      {"d_model", s.d_model},
                      {"vocab", s.vocab},
                      {"seq_len", T},
                      {"micro_batch", B},
                      {"remat", model::remat_name(cfg.remat)},
                      {"parameters", model::gpt_parameter_count(s)},
                      {"device", o.device},
                      {"threads", threads},
                      {"blas", blas},
                      {"products", prec},
                      {"gemm_products", ref},
                      {"pass_s", sec},
                      {"tokens_per_s", tokens / sec},
                      {"model_flops_per_token", model::gpt_train_flops_per_token(s, T)},
                      {"model_flops_per_s", model_flops / sec},
                      {"gemm_flops_per_s", rate},
                      {"fraction_of_gemm", frac},
                      {"library_gemm_flops_per_s", library_rate},
                      {"fraction_of_library_gemm", library_rate > 0 ? model_flops / sec / library_rate : 0.0}};
  if (o.json) {
    print_json(j.dump(2));
    return 0;
  }
  std::printf(
      "gpt %d x %d (%d heads, vocab %d, %llu parameters), micro-batch %d x seq %d, remat %s, %s products on %s, "
      "%d threads\n",
      s.layers, s.d_model, s.heads, s.vocab, static_cast<unsigned long long>(model::gpt_parameter_count(s)), B, T,
      model::remat_name(cfg.remat), prec, o.device.c_str(), threads);
  std::printf("training pass  %8.1f ms  %10.0f tokens/s  %7.2f model GFLOP/s\n", sec * 1e3, tokens / sec,
              model_flops / sec / 1e9);
  std::printf("%-8s %s GEMM %5s     %10s            %7.2f GFLOP/s (the block's weight products, %d rows)\n", blas, ref,
              "", "", rate / 1e9, B * T);
  std::printf("fraction of GEMM  %.2f  (median of %d alternated iterations)\n", frac, o.iters);
  if (library_rate > 0) {
    std::printf("%-8s %s GEMM, one call on %d threads  %7.2f GFLOP/s (the library's best on the same products)\n", blas,
                ref, threads, library_rate / 1e9);
    std::printf("fraction of the library's GEMM  %.2f  (the pass); its own GEMM path %.2f\n",
                model_flops / sec / library_rate, rate / library_rate);
  }
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
                 "Precision of the weight products: fp32, bf16 (bf16 inputs, fp32 sums; fp32 where the CPU has no "
                 "bf16 dot products), fp16 (cuda) or fp8 (E4M3/E5M2 operands with delayed scaling)");
  cmd.add_option("--device", o->device, "Where the pass runs: host (default) or cuda");
  cmd.add_option("--seed", o->model.seed, "Seed for the weights and tokens");
  cmd.add_flag("--json", o->json, "Print JSON");
  return [o] { return run(*o); };
}

const Registration reg("bench", "gpt",
                       "The GPT's training pass on the host or a CUDA device: tokens/s, model FLOP/s, "
                       "fraction of the device's GEMM rate",
                       setup);

}  // namespace
}  // namespace strata::cli
