// The GPT's activation memory on the host device: the attention keeps row statistics (linear
// in T) rather than T x T probabilities, so doubling the sequence at the same micro-batch at
// most doubles the measured device peak (plus slack for the fixed parts), where the
// probabilities alone would have quadrupled; and the head holds its logits in row chunks
// (head_chunk_rows), with the loss and gradients of one product over all rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "models/gpt/array_access.h"
#include "models/gpt/config.h"
#include "models/gpt/pass.h"
#include "runtime/device/device.h"
#include "tests/support/fp32_bound.h"

using namespace strata;
using namespace strata::model;

namespace {

// The device peak of one training pass of a one-block GPT at sequence length T, micro-batch 1.
std::uint64_t pass_peak(int T) {
  const GptShape shape{1, 4, 64, 2048, 256};
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(T)), targets(tokens.size());
  std::mt19937_64 rng(7);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % 256);
  for (auto& t : targets) t = static_cast<std::int32_t>(rng() % 256);
  device::DeviceOptions o;
  o.budget_bytes = GptPass::device_bytes(shape, 1, T, Remat::never) + (1 << 20);
  auto dev = device::Device::create(o);
  {
    auto params = ArrayAccess::by_layer(shape, gpt_initial_params(shape, 5, false));
    ArrayAccess access(params);
    GptPass pass(shape, 1, T, Remat::never, *dev, ops::Products::fp32, {}, false);
    pass.train(access, tokens.data(), targets.data(), 1, T, 1.0f);
  }
  return dev->memory_stats().peak_bytes;
}

}  // namespace

TEST_CASE("the host GPT's device peak at seq 2048 is at most 2.2x that at seq 1024", "[gpt][memory]") {
  const std::uint64_t at1k = pass_peak(1024), at2k = pass_peak(2048);
  INFO("device peak: " << at1k << " bytes at seq 1024, " << at2k << " at seq 2048");
  CHECK(at2k <= 2.2 * static_cast<double>(at1k));
  // The probabilities alone (4 heads x T^2 floats) would be more than the whole peak now.
  CHECK(at2k < std::uint64_t{4} * 2048 * 2048 * sizeof(float));
  // CUDA keeps them: its sizing still counts them.
  const GptShape shape{1, 4, 64, 2048, 256};
  CHECK(GptPass::device_bytes(shape, 1, 2048, Remat::never, false, true) >
        std::uint64_t{4} * 2048 * 2048 * sizeof(float));
}

TEST_CASE("the head in row chunks gives the loss and gradients of the whole micro-batch at once", "[gpt][memory]") {
  // A 16,384-entry vocabulary: 256 rows a chunk, so a 4 x 256 micro-batch takes four chunks
  // and one sequence alone one; the four sequences' passes summed are the batch's pass.
  const GptShape shape{1, 2, 32, 256, 16384};
  const int B = 4, T = 256;
  REQUIRE(head_chunk_rows(static_cast<std::size_t>(B) * T, B, shape.vocab, false) == 256);
  REQUIRE(head_chunk_rows(static_cast<std::size_t>(B) * T, B, shape.vocab, true) == 1024);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T), targets(tokens.size());
  std::mt19937_64 rng(11);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % 16384);
  for (auto& t : targets) t = static_cast<std::int32_t>(rng() % 16384);
  device::DeviceOptions o;
  o.budget_bytes = GptPass::device_bytes(shape, B, T, Remat::never) + (1 << 20);
  auto dev = device::Device::create(o);
  // The logits buffer is a chunk's: well under the whole batch's 64 MiB of logits.
  CHECK(GptPass::device_bytes(shape, B, T, Remat::never) < std::uint64_t{32} << 20);
  auto params = ArrayAccess::by_layer(shape, gpt_initial_params(shape, 5, false));
  ArrayAccess batch_access(params);
  double batch_loss = 0;
  {
    GptPass pass(shape, B, T, Remat::never, *dev, ops::Products::fp32, {}, false);
    batch_loss = pass.train(batch_access, tokens.data(), targets.data(), B, T, 1.0f);
  }
  const auto batch = batch_access.all_grads();
  double loss = 0;
  std::vector<std::vector<double>> sum(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) sum[i].assign(batch[i].data.size(), 0.0);
  for (int s = 0; s < B; ++s) {  // one sequence: its mean loss's gradient is B times its share
    ArrayAccess one(params);
    GptPass pass(shape, 1, T, Remat::never, *dev, ops::Products::fp32, {}, false);
    const std::size_t at = static_cast<std::size_t>(s) * T;
    loss += pass.train(one, tokens.data() + at, targets.data() + at, 1, T, 1.0f / B);
    const auto g = one.all_grads();
    for (std::size_t i = 0; i < g.size(); ++i)
      for (std::size_t j = 0; j < g[i].data.size(); ++j) sum[i][j] += g[i].data[j];
  }
  CHECK(std::abs(batch_loss - loss) <= 1e-5 * std::abs(loss));
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const double d = strata::test::normwise_difference(batch[i].data, sum[i]);
    INFO(batch[i].name << ": normwise difference " << d);
    CHECK(d <= 1e-4);  // fp32 sums of up to 1,024 rows, reordered
  }
}
