// q8 moments (runtime/core/q8_codec.h): the block codec's bounds and its fixed point, the
// unbiased rounding, the moment arrays' sizes and conversions, and Adam stepping q8 moments
// as the fp32 kernel does on the decoded moments, the same bits for any threads, block size
// or in/out of place, and still following a gradient whose scale falls 1000-fold (which
// rounding to nearest cannot: its exp_avg_sq would not decay), with exp_avg_sq unbiased over
// thousands of steps at beta2 = 0.999; on a GPU ([cuda]) the CUDA
// kernel codes the blocks as the CPU kernel does.
#include <tbb/task_arena.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "optim/adam.h"
#include "optim/detail/q8_simd.h"
#include "optim/device_step.h"
#include "optim/lion.h"
#include "runtime/core/moment_format.h"
#include "runtime/core/q8_codec.h"
#include "runtime/device/device.h"

using namespace strata;
using Catch::Matchers::Contains;

namespace {

constexpr int kB = q8::kBlockElems;

// A block of signed first moments or non-negative second moments spread over four decades
// below a random scale between 1e-8 and 1, with some zeros.
std::vector<float> random_block(std::mt19937& rng, bool second) {
  std::uniform_real_distribution<double> u(0, 1);
  const double base = std::pow(10.0, -8 + 8 * u(rng));
  std::vector<float> x(kB);
  for (auto& e : x) {
    const double mag = u(rng) < 0.1 ? 0.0 : base * std::pow(10.0, -4 * u(rng));
    e = static_cast<float>(second ? mag * mag : (u(rng) < 0.5 ? -mag : mag));
  }
  return x;
}

// One code step at t (a magnitude in scale units) for `man` mantissa bits.
double step_at(double t, int man) {
  const int k = t > 0 ? std::max(static_cast<int>(std::floor(std::log2(t))), -6) : -6;
  return std::ldexp(1.0, k - man);
}

}  // namespace

TEST_CASE("q8 blocks code every value within one step and decoded blocks code back to their values", "[q8]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 4000; ++trial) {
    const bool second = trial % 2 == 1;
    const auto x = random_block(rng, second);
    std::uint8_t code[q8::kBlockBytes], again[q8::kBlockBytes];
    q8::encode_block(x.data(), code, second, static_cast<std::uint32_t>(trial));
    float y[kB];
    q8::decode_block(code, y, second);
    double amax = 0;
    for (float e : x) amax = std::max(amax, second ? std::sqrt(double(e)) : std::fabs(double(e)));
    if (code[0] == 0) {
      REQUIRE(amax < std::ldexp(1.0, second ? -50 : -100));
      continue;
    }
    const double scale = std::ldexp(1.0, code[0] - 127);
    INFO("trial " << trial << " amax " << amax << " scale " << scale);
    // The largest magnitude sits in [128, 240] ([128, 248]), or just below 128 at the next scale.
    REQUIRE(amax / scale >= (second ? 124 : 120));
    REQUIRE(amax / scale <= (second ? 248 : 240));
    for (int i = 0; i < kB; ++i) {
      const double xi = second ? std::sqrt(double(x[i])) : double(x[i]);
      const double yi = second ? std::sqrt(double(y[i])) : double(y[i]);
      INFO("element " << i << ": " << x[i] << " -> " << y[i]);
      CHECK(std::fabs(yi - xi) < step_at(std::fabs(xi) / scale, second ? 4 : 3) * scale);
      if (second && x[i] > 0) CHECK(y[i] > 0);  // never divides by eps alone
      if (x[i] == 0) CHECK(y[i] == 0);
    }
    // Whatever the salt, a decoded block codes back to the same values (the same bytes, but
    // for a block at the next scale whose largest value can sit at the first).
    q8::encode_block(y, again, second, static_cast<std::uint32_t>(trial * 31 + 5));
    float z[kB];
    q8::decode_block(again, z, second);
    REQUIRE(std::memcmp(y, z, sizeof y) == 0);
    if (again[0] == code[0]) REQUIRE(std::memcmp(code, again, sizeof code) == 0);
  }
}

TEST_CASE("the CPU kernels' vector codec codes and decodes blocks as the scalar codec does", "[q8]") {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(0, 1);
  for (int trial = 0; trial < 20000; ++trial) {
    const bool second = trial % 2 == 1;
    auto x = random_block(rng, second);
    if (trial % 7 == 0) x[trial % kB] = -0.0f;                                // signed zero
    if (trial % 11 == 0) x[3] = second ? 1e-38f * u(rng) : -1e-38f * u(rng);  // fp32 subnormal
    if (trial % 13 == 0) std::fill(x.begin(), x.end(), 0.0f);                 // a zero block
    if (trial % 17 == 0) x[5] = (second ? x[5] * 1e20f : x[5] * 1e10f);       // one large element
    std::uint8_t a[q8::kBlockBytes], b[q8::kBlockBytes];
    q8::encode_block(x.data(), a, second, static_cast<std::uint32_t>(trial));
    alignas(64) float xa[kB];  // the vector codec's lanes are 64-byte aligned
    std::copy(x.begin(), x.end(), xa);
    if (second)
      optim::detail::q8simd::encode<true>(xa, b, static_cast<std::uint32_t>(trial));
    else
      optim::detail::q8simd::encode<false>(xa, b, static_cast<std::uint32_t>(trial));
    INFO("trial " << trial);
    REQUIRE(std::memcmp(a, b, sizeof a) == 0);
    // Decoding any codes (not only what the coder writes) agrees too, under any finite scale.
    for (auto& c : a) c = static_cast<std::uint8_t>(rng());
    a[0] = static_cast<std::uint8_t>(1 + rng() % 254);
    alignas(64) float ya[kB], yb[kB];
    q8::decode_block(a, ya, second);
    if (second)
      optim::detail::q8simd::decode<true>(a, yb);
    else
      optim::detail::q8simd::decode<false>(a, yb);
    REQUIRE(std::memcmp(ya, yb, sizeof ya) == 0);
  }
}

TEST_CASE("q8 rounding is unbiased: a value's mean over steps is the value (exp_avg_sq's, not its root's)", "[q8]") {
  for (bool second : {false, true}) {
    // 1.3 steps above a code (m) or a square root between codes (v), beside a block maximum.
    float x[kB] = {};
    x[0] = second ? 200.0f * 200.0f : 200.0f;
    x[1] = second ? 37.3f * 37.3f : -37.3f;
    x[2] = second ? 0.0123f * 0.0123f : 0.0123f;  // subnormal codes
    constexpr int kSalts = 40000;
    double sum[3] = {};
    for (int s = 0; s < kSalts; ++s) {
      std::uint8_t code[q8::kBlockBytes];
      float y[kB];
      q8::encode_block(x, code, second, static_cast<std::uint32_t>(s));
      q8::decode_block(code, y, second);
      for (int i = 0; i < 3; ++i) sum[i] += double(y[i]);  // exp_avg_sq: the stored value (the square)
    }
    for (int i = 0; i < 3; ++i) {
      const double want = double(x[i]);
      // Each draw lies on one of the two codes around the value, one step apart (for
      // exp_avg_sq the step between the squares of neighbouring roots): the mean's standard
      // error is below step / (2 sqrt(draws)); six of them is the bound.
      const double w = second ? std::sqrt(want) : std::fabs(want);
      const double root_step = step_at(w, second ? 4 : 3);  // scale 1: x[0] in [128, 256)
      const double step = second ? 2 * w * root_step + root_step * root_step : root_step;
      INFO((second ? "exp_avg_sq" : "exp_avg") << " element " << i);
      CHECK(std::fabs(sum[i] / kSalts - want) < 6 * step / (2 * std::sqrt(double(kSalts))));
    }
  }
}

TEST_CASE("q8 moment arrays: sizes, cuts and conversions through fp32", "[q8]") {
  CHECK(moment_bytes(MomentFormat::q8, 32) == 34);
  CHECK(moment_bytes(MomentFormat::q8, 37) == 51);  // a partial block takes a whole one
  CHECK(moment_offset(MomentFormat::q8, 48) == 51);
  CHECK_THROWS_WITH(moment_offset(MomentFormat::q8, 40), Contains("inside a block of 16"));
  CHECK(moment_bytes(MomentFormat::bf16, 5) == 10);
  CHECK(parse_moment_format("q8") == MomentFormat::q8);
  CHECK_THROWS_WITH(parse_moment_format("int8"), Contains("use fp32, bf16 or q8"));
  std::mt19937 rng(3);
  std::vector<float> x(37);
  for (auto& e : x) e = std::uniform_real_distribution<float>(-1e-3f, 1e-3f)(rng);
  std::vector<std::uint8_t> q(moment_bytes(MomentFormat::q8, x.size())), q2(q.size());
  std::vector<float> y(x.size());
  moments_from_fp32(x.data(), q.data(), MomentFormat::q8, Moment::first, x.size());
  moments_to_fp32(q.data(), MomentFormat::q8, Moment::first, y.data(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(y[i] - x[i]) <= std::fabs(x[i]) / 8 + 1e-9);
  moments_from_fp32(y.data(), q2.data(), MomentFormat::q8, Moment::first, y.size());
  std::vector<float> z(y.size());
  moments_to_fp32(q2.data(), MomentFormat::q8, Moment::first, z.data(), z.size());
  CHECK(z == y);  // decoded values code back to themselves
  std::vector<float> part(5);
  moments_range_to_fp32(q.data(), MomentFormat::q8, Moment::first, 14, 5, part.data());  // across a block edge
  CHECK(part == std::vector<float>(y.begin() + 14, y.begin() + 19));
}

namespace {

struct Q8Shard {
  std::vector<float> master, grad;
  std::vector<std::uint8_t> m, v;
  std::vector<std::uint16_t> copy;
  explicit Q8Shard(std::size_t n, unsigned seed) : master(n), grad(n), copy(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> mf(n), vf(n);
    for (std::size_t i = 0; i < n; ++i) {
      master[i] = 0.02f * nd(rng);
      grad[i] = 1e-3f * nd(rng) * (1 + static_cast<float>(i % 97));
      mf[i] = 1e-4f * nd(rng) * (1 + static_cast<float>(i % 13));
      vf[i] = mf[i] * mf[i] * (1.0f + std::fabs(nd(rng)));
    }
    m.resize(moment_bytes(MomentFormat::q8, n));
    v.resize(m.size());
    moments_from_fp32(mf.data(), m.data(), MomentFormat::q8, Moment::first, n);
    moments_from_fp32(vf.data(), v.data(), MomentFormat::q8, Moment::second, n);
  }
  optim::StepArgs args(std::int64_t step) {
    optim::StepArgs a;
    a.master = master.data();
    a.grad = grad.data();
    a.m = m.data();
    a.v = v.data();
    a.state_format = MomentFormat::q8;
    a.copy = copy.data();
    a.n = master.size();
    a.step = step;
    a.grad_scale = 0.5f;
    return a;
  }
};

}  // namespace

TEST_CASE("Adam on q8 moments is the fp32 kernel on the decoded moments, coded with the step as salt", "[q8]") {
  constexpr std::size_t n = 16 * 5003;  // above the parallel threshold
  for (bool adamw : {true, false}) {
    for (std::int64_t step : {1, 9}) {
      INFO((adamw ? "AdamW" : "Adam with L2") << ", step " << step);
      optim::AdamConfig c;
      c.adamw_mode = adamw;
      Q8Shard q(n, 11);
      std::vector<float> mf(n), vf(n), master = q.master;
      std::vector<std::uint16_t> copy(n);
      moments_to_fp32(q.m.data(), MomentFormat::q8, Moment::first, mf.data(), n);
      moments_to_fp32(q.v.data(), MomentFormat::q8, Moment::second, vf.data(), n);
      optim::StepArgs f = q.args(step);
      f.master = master.data();
      f.m = mf.data();
      f.v = vf.data();
      f.copy = copy.data();
      f.state_format = MomentFormat::fp32;
      optim::adam_step(c, f);
      optim::adam_step(c, q.args(step));
      CHECK(std::memcmp(master.data(), q.master.data(), n * 4) == 0);
      CHECK(copy == q.copy);
      std::vector<std::uint8_t> want_m(q.m.size()), want_v(q.v.size());
      for (std::size_t b = 0; b < n / kB; ++b) {
        q8::encode_block(mf.data() + b * kB, want_m.data() + b * q8::kBlockBytes, false,
                         static_cast<std::uint32_t>(step));
        q8::encode_block(vf.data() + b * kB, want_v.data() + b * q8::kBlockBytes, true,
                         static_cast<std::uint32_t>(step));
      }
      CHECK(want_m == q.m);
      CHECK(want_v == q.v);
    }
  }
}

TEST_CASE("Adam on q8 moments: the same bits for any thread count and block size, in place or not", "[q8]") {
  constexpr std::size_t n = 16 * 9001;
  Q8Shard one(n, 5), two(n, 5), oop(n, 5);
  tbb::task_arena(1).execute([&] { optim::adam_step({}, one.args(3), {16}); });
  tbb::task_arena(2).execute([&] { optim::adam_step({}, two.args(3), {1u << 15}); });
  Q8Shard dst(n, 99);  // different bits everywhere: every byte must be written
  optim::StepArgs a = dst.args(3);
  a.grad = oop.grad.data();
  a.from.master = oop.master.data();
  a.from.m = oop.m.data();
  a.from.v = oop.v.data();
  optim::adam_step({}, a, {1000});
  for (const Q8Shard* s : {&two, &dst}) {
    CHECK(s->master == one.master);
    CHECK(s->m == one.m);
    CHECK(s->v == one.v);
    CHECK(s->copy == one.copy);
  }
  CHECK(oop.m == Q8Shard(n, 5).m);  // the source is untouched
}

TEST_CASE("q8 moments are for Adam: other optimizers and ragged shards are refused", "[q8]") {
  Q8Shard q(32, 1);
  CHECK_THROWS_WITH(optim::lion_step({}, q.args(1)), Contains("q8 optimizer state is not supported"));
  optim::StepArgs a = q.args(1);
  a.n = 24;
  CHECK_THROWS_WITH(optim::adam_step({}, a), Contains("whole blocks of 16"));
}

namespace {

// One in-place Adam step of fp32 master p and gradient g with moments m, v of format f.
void adam_in_place(const optim::AdamConfig& c, MomentFormat f, std::vector<float>& p, const std::vector<float>& g,
                   void* m, void* v, std::int64_t step) {
  optim::StepArgs a;
  a.master = p.data();
  a.grad = g.data();
  a.m = m;
  a.v = v;
  a.state_format = f;
  a.n = p.size();
  a.step = step;
  optim::adam_step(c, a);
}

}  // namespace

TEST_CASE("q8 exp_avg_sq keeps the mean of g^2 at beta2 = 0.999 over thousands of steps", "[q8]") {
  // Gradients of unit variance and lr 0 (the parameters stay put): exp_avg_sq's mean over the
  // shard is that of fp32 moments up to sampling. Coding its square root without bias would
  // add the rounding's variance each step, a bias that beta2 = 0.999 compounds to about 1.5x.
  constexpr std::size_t n = 16 * 512;
  auto run = [&](MomentFormat f) {
    std::vector<float> p(n, 0.0f), g(n), v(n);
    std::vector<std::uint8_t> m8(moment_bytes(f, n)), v8(m8.size());
    optim::AdamConfig c;
    c.lr = 0.0f;
    std::mt19937 r(8);
    std::normal_distribution<float> z(0.0f, 1.0f);
    for (int step = 1; step <= 3000; ++step) {
      for (auto& x : g) x = z(r);
      adam_in_place(c, f, p, g, m8.data(), v8.data(), step);
    }
    moments_to_fp32(v8.data(), f, Moment::second, v.data(), n);
    double sum = 0;
    for (float x : v) sum += x;
    return sum / n;
  };
  const double fp32 = run(MomentFormat::fp32), q8 = run(MomentFormat::q8);
  INFO("mean exp_avg_sq: fp32 " << fp32 << ", q8 " << q8);
  // fp32: 1 - 0.999^3000 = 0.95 of E[g^2]; the shard's mean of 8192 such averages (each of
  // about 1000 effective samples) varies by well under 1%.
  CHECK(std::fabs(q8 / fp32 - 1) < 0.02);
}

TEST_CASE("q8 Adam follows a gradient whose scale falls 1000-fold as fp32 Adam does", "[q8]") {
  // Minimise sum (p - target)^2 / 2 under gradient noise: 200 steps at noise 10, then the
  // target moves by 0.5 and the noise falls to 0.01. Adam's steps are lr x m / sqrt(v): only
  // a v that decays (beta2 = 0.99: by e in 100 steps) lets them regain their size after the
  // fall. An 8-bit v rounded to nearest never decays (1% a step is below half a code) and
  // leaves the parameters about halfway (steps of lr x 0.5 / 10), which this test catches.
  constexpr std::size_t n = 16 * 256;
  constexpr float kLr = 0.01f;
  std::vector<float> target(n);
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& t : target) t = nd(rng);
  auto run = [&](MomentFormat f) {
    std::vector<float> p(target), g(n);  // starts at the optimum of phase 1
    std::vector<std::uint8_t> m(moment_bytes(f, n)), v(m.size());
    optim::AdamConfig c;
    c.lr = kLr;
    c.beta2 = 0.99f;
    c.weight_decay = 0.0f;
    std::mt19937 r(4);
    std::normal_distribution<float> z(0.0f, 1.0f);
    for (int step = 1; step <= 800; ++step) {
      const float sigma = step <= 200 ? 10.0f : 0.01f;
      const float shift = step <= 200 ? 0.0f : 0.5f;
      for (std::size_t i = 0; i < n; ++i) g[i] = p[i] - (target[i] + shift) + sigma * z(r);
      adam_in_place(c, f, p, g, m.data(), v.data(), step);
    }
    double err = 0;
    for (std::size_t i = 0; i < n; ++i) err += std::pow(double(p[i]) - (target[i] + 0.5), 2);
    return std::sqrt(err / n);
  };
  const double fp32 = run(MomentFormat::fp32), q8 = run(MomentFormat::q8);
  INFO("rms distance to the moved target: fp32 moments " << fp32 << ", q8 moments " << q8);
  // Near the optimum Adam jitters by about lr a step whatever its state: two of those is the
  // room q8's coding noise gets beside the fp32 run.
  CHECK(q8 < fp32 + 2 * kLr);
}

TEST_CASE("the CUDA Adam kernel steps q8 moments as the CPU kernel does", "[optim][q8][cuda]") {
  // Lockstep from one state: the fp32 arithmetic is the same correctly rounded operations in
  // the same order on both sides, and the codec is the same code, so the bytes should match;
  // an fp32 result an ulp apart would still pick its own dither, so the test allows a block in
  // a hundred to differ, by at most one code step an element.
  device::DeviceOptions o;
  o.backend = device::Backend::cuda;
  o.budget_bytes = std::uint64_t{256} << 20;
  auto dev = device::Device::create(o);
  auto stream = dev->create_stream();
  constexpr std::size_t n = 16 * 4099;
  Q8Shard cpu(n, 61), gpu(n, 61);
  auto upload = [&](const auto& v, const char* what) {
    device::DeviceBuffer b(*dev, v.size() * sizeof(v[0]), what);
    stream->copy_async(b.get(), v.data(), b.bytes(), device::CopyKind::host_to_device);
    return b;
  };
  device::DeviceBuffer master = upload(gpu.master, "master"), grad = upload(gpu.grad, "grad"), m = upload(gpu.m, "m"),
                       v = upload(gpu.v, "v"), copy = upload(gpu.copy, "copy");
  optim::StepArgs a = gpu.args(5);
  a.master = master.as<float>();
  a.grad = grad.get();
  a.m = m.get();
  a.v = v.get();
  a.copy = copy.get();
  optim::adam_step_async(*stream, {}, a);
  auto download = [&](auto& host, const device::DeviceBuffer& b) {
    stream->copy_async(host.data(), b.get(), b.bytes(), device::CopyKind::device_to_host);
  };
  download(gpu.master, master);
  download(gpu.m, m);
  download(gpu.v, v);
  download(gpu.copy, copy);
  stream->synchronize();
  optim::adam_step({}, cpu.args(5));
  for (std::size_t i = 0; i < n; ++i)
    REQUIRE(std::fabs(gpu.master[i] - cpu.master[i]) <= 1e-6f * std::fabs(cpu.master[i]) + 1e-12f);
  for (bool second : {false, true}) {
    const auto& g = second ? gpu.v : gpu.m;
    const auto& c = second ? cpu.v : cpu.m;
    std::size_t differ = 0;
    for (std::size_t b = 0; b < n / kB; ++b) {
      const std::uint8_t* gb = g.data() + b * q8::kBlockBytes;
      const std::uint8_t* cb = c.data() + b * q8::kBlockBytes;
      if (std::memcmp(gb, cb, q8::kBlockBytes) == 0) continue;
      ++differ;
      REQUIRE(gb[0] == cb[0]);  // the same scale
      for (int i = 1; i <= kB; ++i) REQUIRE(std::abs(int(gb[i] & 0x7f) - int(cb[i] & 0x7f)) <= 1);
    }
    INFO((second ? "exp_avg_sq" : "exp_avg") << ": " << differ << " of " << n / kB << " blocks differ");
    CHECK(differ * 100 <= n / kB);
  }
}
