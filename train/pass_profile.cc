// The training pass timed in process (see pass_profile.h).
#include "train/pass_profile.h"

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "models/gpt/array_access.h"
#include "models/gpt/gemm.h"
#include "models/gpt/pass.h"
#include "models/llama/llama.h"
#include "models/llama/pass.h"
#include "runtime/core/error.h"
#include "runtime/core/stats.h"
#include "runtime/device/device.h"
#include "train/llama.h"

namespace strata::train {
namespace {

template <class Train> double median_seconds(int iters, Train&& train) {
  train();  // warm-up: first touch, BLAS buffers
  std::vector<double> s;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    train();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(s);
}

std::vector<std::int32_t> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  std::mt19937 gen(static_cast<std::uint32_t>(seed));
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = tok(gen);
  return t;
}

}  // namespace

double profile_pass(const ModelOptions& m, int micro, const std::string& remat, const std::string& products,
                    int iters) {
  STRATA_CHECK(micro >= 1 && iters >= 1, Errc::invalid_argument, "profile_pass: micro-batch ", micro, " and ", iters,
               " iterations must be at least 1");
  STRATA_CHECK(products == "fp32" || products == "bf16", Errc::invalid_argument, "profile_pass: products '", products,
               "': use fp32 or bf16");
  const auto p = products == "bf16" && model::ops::bf16_products_available() ? model::ops::Products::bf16
                                                                             : model::ops::Products::fp32;
  ModelOptions o = m;
  o.remat = remat;
  device::DeviceOptions dopt;
  dopt.backend = device::Backend::host;
  if (is_hf_model_dir(o.model)) {
    const model::LlamaConfig cfg = llama_config(o, false);
    const model::LlamaShape& s = cfg.shape;
    const int B = micro, T = cfg.seq_len;
    auto params = model::llama_initial_params(s, o.seed);
    dopt.budget_bytes = model::LlamaPass::device_bytes(s, B, T, cfg.remat) + (std::uint64_t{1} << 20);
    auto dev = device::Device::create(dopt);
    model::LlamaPass pass(s, B, T, cfg.remat, *dev, p);
    model::ArrayAccess access(params);
    const auto in = random_tokens(static_cast<std::size_t>(B) * T, s.vocab, o.seed),
               tg = random_tokens(in.size(), s.vocab, o.seed + 1);
    return median_seconds(iters, [&] { pass.train(access, in.data(), tg.data(), B, T, 1.0f); });
  }
  STRATA_CHECK(o.model == "gpt", Errc::invalid_argument, "profile_pass: model '", o.model,
               "' has no pass to time: give gpt or a Hugging Face directory");
  const model::GptConfig cfg = gpt_config(o, false);
  const model::GptShape& s = cfg.shape;
  const int B = micro, T = cfg.seq_len;
  auto params = model::ArrayAccess::by_layer(s, model::gpt_initial_params(s, o.seed));
  dopt.budget_bytes = model::GptPass::device_bytes(s, B, T, cfg.remat, false, false) + (std::uint64_t{1} << 20);
  auto dev = device::Device::create(dopt);
  model::GptPass pass(s, B, T, cfg.remat, *dev, p, model::fp8::Recipe{});
  model::ArrayAccess access(params);
  const auto in = random_tokens(static_cast<std::size_t>(B) * T, s.vocab, o.seed),
             tg = random_tokens(in.size(), s.vocab, o.seed + 1);
  return median_seconds(iters, [&] {
    pass.train(access, in.data(), tg.data(), B, T, 1.0f);
    pass.kernels().sync();
  });
}

}  // namespace strata::train
