// The demo MLP (models/mlp.h) on the engine, on a CUDA device ([cuda]: skipped with the
// reason where no GPU is present): its forward and backward run with cuBLAS SGEMMs and small
// kernels on its own stream, and the run must agree with the same run on the host device
// (fp32 host loops) to float tolerance.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/engine.h"
#include "models/mlp.h"
#include "tests/engine/engine_support.h"

using namespace strata;

namespace {

struct Run {
  std::vector<float> params;
  std::vector<double> losses;
};

// Ten steps of the demo MLP (3 layers of 32, seed 7) on one rank of `backend`.
Run train(const engine::EngineConfig& config, device::Backend backend) {
  device::DeviceOptions d;
  d.backend = backend;
  d.budget_bytes = std::uint64_t{256} << 20;
  auto dev = device::Device::create(d);
  engine::EngineOptions eo;
  eo.config = config;
  eo.device = dev.get();
  eo.seed = 7;
  engine::Engine engine(eo);
  model::Mlp mlp(engine, {3, 32, 0, 7});
  engine.setup();
  Run out;
  for (int s = 0; s < 10; ++s) out.losses.push_back(mlp.train_step(s).loss);
  out.params = engine.full_parameters();
  return out;
}

}  // namespace

TEST_CASE("the GPU run agrees with the host-device run to float tolerance", "[zero][cuda]") {
  const int stage = GENERATE(0, 3);
  CAPTURE(stage);
  const auto config = test::mlp_config(stage, 1, DType::fp32, /*micro=*/8, /*accum=*/2);
  const Run gpu = train(config, device::Backend::cuda);
  const Run host = train(config, device::Backend::host);
  REQUIRE(gpu.params.size() == host.params.size());
  // Only the order of the fp32 sums (cuBLAS against the host loops, over H = 32 inputs and
  // B = 8 samples) and tanh's last bit differ. Most elements then stay within a few ulp
  // plus lr * (H + B) * eps * 3 layers * 10 (Adam's 1/(1-beta1)) per step; an element whose
  // gradient is near zero (sums that cancel) may take Adam's first steps with the other
  // sign, moving it by up to 2 lr a step: a few of those are allowed, not more than 1%.
  const double eps = std::numeric_limits<float>::epsilon(), lr = 1e-3;
  const double per_step = lr * (32 + 8) * eps * 3 * 10;
  std::size_t outliers = 0;
  double worst = 0;
  for (std::size_t i = 0; i < gpu.params.size(); ++i) {
    const double d = std::fabs(double(gpu.params[i]) - host.params[i]);
    const double ulp = std::fabs(double(host.params[i])) * eps;
    outliers += d > 8 * ulp + 10 * per_step;
    worst = std::max(worst, d);
  }
  INFO("outliers " << outliers << " of " << gpu.params.size() << ", largest difference " << worst);
  CHECK(outliers * 100 <= gpu.params.size());
  CHECK(worst <= 2 * lr * 10);
  for (std::size_t s = 0; s < host.losses.size(); ++s) {
    INFO("step " << s);
    CHECK(gpu.losses[s] == Approx(host.losses[s]).epsilon(1e-4));
  }
}
