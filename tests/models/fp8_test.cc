// Simulated FP8 (models/gpt/fp8.h, fp8_products.h): quantization against a reference built
// from the formats' value sets (every E4M3 and E5M2 value, every rounding tie, saturation),
// power-of-two scales, the amax history, block scaling, and the GPT's FP8 products against
// the fp32 products of the quantized operands.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "models/gpt/fp8.h"
#include "models/gpt/fp8_products.h"
#include "models/gpt/ops.h"

using namespace strata;
using namespace strata::model;

namespace {

// The non-negative finite values of a format, ascending, with their codes (decoded by the
// scalar decoder, which dtype tests check bit pattern by bit pattern).
struct Value {
  double v;
  int code;
};
std::vector<Value> finite_values(DType fmt) {
  std::vector<Value> out;
  for (int code = 0; code < 0x80; ++code) {
    const float v = fmt == DType::fp8_e4m3 ? e4m3_to_fp32(static_cast<std::uint8_t>(code))
                                           : e5m2_to_fp32(static_cast<std::uint8_t>(code));
    if (std::isfinite(v)) out.push_back({v, code});
  }
  return out;
}

// Reference: the nearest value of the set, a tie to the even code, saturation at the largest.
double reference(const std::vector<Value>& values, double x) {
  const double a = std::fabs(x);
  if (a >= values.back().v) return std::copysign(values.back().v, x);
  std::size_t hi = 1;
  while (values[hi].v < a) ++hi;
  const Value& lo = values[hi - 1];
  const Value& up = values[hi];
  double r;
  if (a - lo.v < up.v - a) {
    r = lo.v;
  } else if (a - lo.v > up.v - a) {
    r = up.v;
  } else {
    r = lo.code % 2 == 0 ? lo.v : up.v;
  }
  return std::copysign(r, x);
}

float quantized(float x, DType fmt, float scale) {
  float out = 0.0f;
  fp8::fake_quantize(&x, &out, 1, fmt, scale);
  return out;
}

}  // namespace

TEST_CASE("fp8 quantization matches the reference on every value and rounding tie of both formats", "[fp8]") {
  const DType fmt = GENERATE(DType::fp8_e4m3, DType::fp8_e5m2);
  const float scale = GENERATE(1.0f, 0x1p-12f, 0x1p9f);
  CAPTURE(dtype_name(fmt), scale);
  const auto values = finite_values(fmt);
  REQUIRE(values.size() == (fmt == DType::fp8_e4m3 ? 127u : 124u));
  std::vector<float> inputs;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto v = static_cast<float>(values[i].v);
    inputs.push_back(v);  // every value
    if (i + 1 < values.size()) {
      const auto mid = static_cast<float>((values[i].v + values[i + 1].v) / 2);  // every tie (exact in fp32)
      inputs.push_back(mid);
      inputs.push_back(std::nextafter(mid, 0.0f));
      inputs.push_back(std::nextafter(mid, 1e30f));
    }
  }
  inputs.push_back(static_cast<float>(values.back().v) * 1.0625f);  // above the largest: saturates
  inputs.push_back(1e30f);
  std::size_t checked = 0;
  for (float x : inputs) {
    for (float s : {x, -x}) {
      const float in = s / scale;  // exact: scale is a power of two
      const auto want = static_cast<float>(reference(values, static_cast<double>(in) * scale) / scale);
      const float got = quantized(in, fmt, scale);
      INFO("input " << in << " (" << s << " at scale 1)");
      REQUIRE(got == want);
      REQUIRE(std::signbit(got) == std::signbit(want));
      ++checked;
    }
  }
  CHECK(checked > 900);
  CHECK(std::isnan(quantized(std::numeric_limits<float>::quiet_NaN(), fmt, scale)));
  // The buffer form across chunk edges and threads agrees with the one-value form.
  std::vector<float> many(3 * 4096 + 17), out(many.size());
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = inputs[i % inputs.size()] / scale;
  fp8::fake_quantize(many.data(), out.data(), many.size(), fmt, scale);
  for (std::size_t i = 0; i < many.size(); ++i) REQUIRE(out[i] == quantized(many[i], fmt, scale));
}

TEST_CASE("fp8 scales are the largest power of two that keeps the amax inside the format", "[fp8]") {
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> log_amax(-30, 30);
  for (DType fmt : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (int margin : {0, 2}) {
      const double limit = std::ldexp(static_cast<double>(dtype_info(fmt).max_finite), -margin);
      for (int i = 0; i < 2000; ++i) {
        const auto amax = static_cast<float>(std::exp2(log_amax(gen)));
        const float s = fp8::scale_for(amax, fmt, margin);
        int e = 0;
        REQUIRE(std::frexp(s, &e) == 0.5f);  // a power of two
        REQUIRE(static_cast<double>(amax) * s <= limit);
        REQUIRE(static_cast<double>(amax) * 2 * s > limit);
      }
    }
    // Exactly the format's maximum keeps scale 1; nothing to scale gives 1.
    CHECK(fp8::scale_for(dtype_info(fmt).max_finite, fmt, 0) == 1.0f);
    CHECK(fp8::scale_for(0.0f, fmt, 0) == 1.0f);
    CHECK(fp8::scale_for(std::numeric_limits<float>::infinity(), fmt, 0) == 1.0f);
    CHECK(fp8::scale_for(std::numeric_limits<float>::quiet_NaN(), fmt, 0) == 1.0f);
  }
}

TEST_CASE("the amax history: current scaling until a step ends, then the window's max or its newest", "[fp8]") {
  fp8::Recipe r;
  r.amax_history_len = 3;
  const DType f = DType::fp8_e4m3;  // max 448
  fp8::AmaxHistory h;
  CHECK(h.scale(r, f, 7.0f) == fp8::scale_for(7.0f, f, 0));  // empty: the tensor's own amax
  h.record(2.0f);
  h.record(5.0f);                                                // a second micro-batch: the step keeps the max
  h.record(std::numeric_limits<float>::infinity());              // an overflowing micro-batch is not recorded
  CHECK(h.scale(r, f, 100.0f) == fp8::scale_for(100.0f, f, 0));  // still current scaling inside the step
  h.roll(r.amax_history_len);
  REQUIRE(h.history().size() == 1);
  CHECK(h.history().front() == 5.0f);
  CHECK(h.scale(r, f, 100.0f) == 64.0f);  // from 5: 448 / 5 = 89.6 -> 64
  for (float a : {1.0f, 0.5f, 0.25f}) {
    h.record(a);
    h.roll(r.amax_history_len);
  }
  REQUIRE(h.history().size() == 3);  // 5 fell out of the window
  CHECK(h.history().front() == 0.25f);
  CHECK(h.scale(r, f, 0.0f) == 256.0f);  // max of {1, 0.5, 0.25}: 448 -> 256
  r.amax_compute = fp8::AmaxCompute::most_recent;
  CHECK(h.scale(r, f, 0.0f) == 1024.0f);  // 0.25: 1792 -> 1024
  h.roll(r.amax_history_len);             // a step without the tensor leaves it as it was
  CHECK(h.history().size() == 3);
  CHECK(h.history().front() == 0.25f);
}

TEST_CASE("block scaling scales each tile by its own amax, so a small block does not underflow", "[fp8]") {
  const int rows = 200, cols = 300;  // edge blocks are partial
  std::vector<float> m(static_cast<std::size_t>(rows) * cols);
  std::mt19937 gen(9);
  std::normal_distribution<float> nd;
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) m[static_cast<std::size_t>(i) * cols + j] = nd(gen) * ((j / 128) % 2 ? 1e-8f : 1e3f);
  }
  for (int block_rows : {1, 128}) {
    std::vector<float> out(m.size());
    const DType f = DType::fp8_e5m2;
    fp8::fake_quantize_blocks(m.data(), cols, out.data(), cols, rows, cols, block_rows, 128, f, 0);
    for (int r0 = 0; r0 < rows; r0 += block_rows) {
      for (int c0 = 0; c0 < cols; c0 += 128) {
        const int r1 = std::min(rows, r0 + block_rows), w = std::min(cols, c0 + 128) - c0;
        float amax = 0.0f;
        for (int i = r0; i < r1; ++i)
          for (int j = c0; j < c0 + w; ++j) amax = std::max(amax, std::fabs(m[static_cast<std::size_t>(i) * cols + j]));
        const float s = fp8::scale_for(amax, f, 0);
        for (int i = r0; i < r1; ++i) {
          for (int j = c0; j < c0 + w; ++j) {
            const std::size_t k = static_cast<std::size_t>(i) * cols + j;
            REQUIRE(out[k] == quantized(m[k], f, s));
            if (m[k] != 0.0f) REQUIRE(std::fabs(out[k] - m[k]) <= 0.126f * std::fabs(m[k]) + amax * 0x1p-16f);
          }
        }
      }
    }
  }
  // One scale for the whole tensor flushes the 1e-8 columns to zero in E5M2.
  std::vector<float> whole(m.size());
  fp8::fake_quantize(m.data(), whole.data(), m.size(), DType::fp8_e5m2,
                     fp8::scale_for(fp8::amax_of(m.data(), m.size()), DType::fp8_e5m2, 0));
  CHECK(whole[128] == 0.0f);
}

TEST_CASE("the GPT's FP8 products are the fp32 products of the quantized operands", "[fp8]") {
  GptShape s;
  s.layers = 1;
  s.d_model = 64;
  s.vocab = 96;
  const int N = 24, IC = 64, OC = 192;
  const auto n = Fp8Products::scratch_floats(s, N);
  std::vector<float> sx(n.x), sw(n.w), sg(n.g);
  fp8::Recipe r;
  r.enabled = true;
  Fp8Products fp(r, s, {sx.data(), sw.data(), sg.data()});
  std::mt19937 gen(3);
  std::normal_distribution<float> nd;
  auto fill = [&](std::size_t k, float sd) {
    std::vector<float> v(k);
    for (auto& x : v) x = nd(gen) * sd;
    return v;
  };
  const auto x = fill(static_cast<std::size_t>(N) * IC, 1.0f), W = fill(static_cast<std::size_t>(IC) * OC, 0.05f),
             b = fill(OC, 0.1f), dout = fill(static_cast<std::size_t>(N) * OC, 1e-4f);
  auto q = [](const std::vector<float>& v, DType f) {
    std::vector<float> o(v.size());
    fp8::fake_quantize(v.data(), o.data(), v.size(), f, fp8::scale_for(fp8::amax_of(v.data(), v.size()), f, 0));
    return o;
  };
  const auto qx = q(x, DType::fp8_e4m3), qW = q(W, DType::fp8_e4m3), qg = q(dout, DType::fp8_e5m2);

  fp.set_recording(true);
  std::vector<float> out(static_cast<std::size_t>(N) * OC), want(out.size());
  fp.forward(2, out.data(), x.data(), W.data(), b.data(), N, IC, OC);
  ops::matmul_forward(want.data(), qx.data(), qW.data(), b.data(), N, IC, OC);
  CHECK(out == want);
  std::vector<float> dx(x.size()), dW(W.size(), 0.0f), db(OC, 0.0f), wdx(x.size()), wdW(W.size(), 0.0f), wdb(OC, 0.0f);
  fp.backward(2, dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), N, IC, OC, false);
  ops::matmul_backward(wdx.data(), wdW.data(), nullptr, qg.data(), qx.data(), qW.data(), N, IC, OC, false);
  ops::bias_backward(wdb.data(), dout.data(), N, OC);  // from the unquantized gradient
  CHECK(dx == wdx);
  CHECK(dW == wdW);
  CHECK(db == wdb);
  // Quantization changed the operands (the test would pass vacuously otherwise).
  CHECK(qg != dout);
  CHECK(qx != x);

  // The step ends: site 2 has one amax per operand, the others none.
  fp.end_step();
  CHECK(fp.site(2).x.history().front() == fp8::amax_of(x.data(), x.size()));
  CHECK(fp.site(2).w.history().front() == fp8::amax_of(W.data(), W.size()));
  CHECK(fp.site(2).g.history().front() == fp8::amax_of(dout.data(), dout.size()));
  CHECK(fp.site(0).x.history().empty());
  // Evaluation records nothing.
  fp.set_recording(false);
  fp.forward(2, out.data(), x.data(), W.data(), b.data(), N, IC, OC);
  CHECK(fp.step_amax()[6] == -1.0f);  // site 2's x: unused this step
  fp.end_step();
  CHECK(fp.site(2).x.history().size() == 1);

  // A reduced amax (the max over ranks) is what enters the history; the histories round-trip.
  std::vector<float> amax(static_cast<std::size_t>(3 * Fp8Products::site_count(s)), -1.0f);
  amax[6] = 42.0f;
  fp.end_step(amax);
  CHECK(fp.site(2).x.history().front() == 42.0f);
  const auto saved = fp.histories();
  Fp8Products other(r, s, {sx.data(), sw.data(), sg.data()});
  other.restore(saved);
  CHECK(other.histories() == saved);
  CHECK(other.site(2).x.history().size() == 2);
  auto wrong = saved;
  wrong.pop_back();
  CHECK_THROWS_WITH(other.restore(wrong),
                    Catch::Contains("14 amax histories, but this model has 15") && Catch::Contains("another shape"));
  wrong = saved;
  wrong[0] = {std::numeric_limits<float>::quiet_NaN()};
  CHECK_THROWS_WITH(other.restore(wrong), Catch::Contains("not an amax"));
}
