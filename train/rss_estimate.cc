// The parts of a train rank's process RSS that are not the engine's (see rss_estimate.h).
#include "train/rss_estimate.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "models/gpt/array_access.h"
#include "models/gpt/gemm.h"
#include "models/gpt/pass.h"
#include "runtime/core/host_memory.h"
#include "runtime/device/device.h"

namespace strata::train {
namespace {

// Every TBB worker allocates and touches a little, as the engine's kernels do: the threads
// start and each gets its malloc arena.
void warm_tbb() {
  tbb::parallel_for(tbb::blocked_range<int>(0, 1024, 1), [](const tbb::blocked_range<int>&) {
    void* p = std::malloc(4096);
    std::memset(p, 1, 4096);
    std::free(p);
  });
}

// One training pass of a one-block GPT of the run's width, sequence, vocabulary and product
// precision (micro-batch 1) over plain arrays on a host device: the code the GPT runs is
// paged in, oneDNN generates its kernels for these shapes and starts its pool, and the
// threads' arenas take their share. Everything it allocates is freed before the RSS is read.
void warm_gpt(const ModelOptions& o, const engine::EngineConfig& config) {
  ModelOptions one = o;
  one.layers = 1;
  const model::GptConfig cfg = gpt_config(one, config);
  const model::GptShape& s = cfg.shape;
  const int T = cfg.seq_len;
  auto params = model::ArrayAccess::by_layer(s, model::gpt_initial_params(s, o.seed));
  model::ArrayAccess access(params);
  device::DeviceOptions dopt;
  dopt.backend = device::Backend::host;
  dopt.budget_bytes = model::GptPass::device_bytes(s, 1, T, cfg.remat, cfg.fp8.enabled) + (std::uint64_t{1} << 20);
  auto dev = device::Device::create(dopt);
  const bool bf16 = engine::compute_dtype_of(config) == DType::bf16 && model::ops::bf16_products_available();
  model::GptPass pass(s, 1, T, cfg.remat, *dev, bf16 ? model::ops::Products::bf16 : model::ops::Products::fp32,
                      cfg.fp8);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t) tokens[static_cast<std::size_t>(t)] = t % s.vocab;
  pass.train(access, tokens.data(), tokens.data(), 1, T, 1.0f);
}

std::uint64_t data_bytes(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return 0;
  std::error_code ec;
  std::uint64_t bytes = 0;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(path, ec))
      if (e.is_regular_file(ec)) bytes += e.file_size(ec);
  } else {
    bytes = fs::file_size(path, ec);
    if (ec) bytes = 0;
  }
  return 2 * bytes;  // a byte of text is one 2-byte token; token files hold fewer
}

}  // namespace

std::uint64_t measure_runtime_rss(const ModelOptions& o, const engine::EngineConfig& config) {
  const std::uint64_t before = process_rss_bytes();
  warm_tbb();
  if (o.model == "gpt") warm_gpt(o, config);
  const std::uint64_t after = process_rss_bytes();
  return after > before ? after - before : 0;
}

std::uint64_t trainer_host_bytes(const ModelOptions& o, const engine::EngineConfig& config) {
  const auto B = static_cast<std::uint64_t>(std::max<std::int64_t>(1, config.train_micro_batch_size_per_gpu));
  if (o.model == "mlp") {
    const model::MlpConfig m = mlp_config(o);
    const auto H = static_cast<std::uint64_t>(m.hidden), L = static_cast<std::uint64_t>(m.layers);
    // teacher, a layer's fp32 W and dW; activations of every layer, and six B x H
    // vectors of the micro-batch (input, target, output, its gradient, dz, din)
    return 4 * (3 * H * H + (L + 1) * B * H + 6 * B * H + 2 * H);
  }
  const model::GptConfig c = gpt_config(o, config);
  // tokens, and a micro-batch's inputs and targets (4 bytes each)
  return data_bytes(o.data) + 2 * B * static_cast<std::uint64_t>(c.seq_len) * 4;
}

}  // namespace strata::train
