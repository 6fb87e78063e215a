// The GPT's activation memory on the host device against sequence length: the attention keeps
// row statistics (linear in T) rather than T x T probabilities, so doubling the sequence at
// the same micro-batch at most doubles the measured device peak (plus slack for the fixed
// parts), where the probabilities alone would have quadrupled.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "models/gpt/array_access.h"
#include "models/gpt/config.h"
#include "models/gpt/pass.h"
#include "runtime/device/device.h"

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
