// The FP8 products' GPU side (models/gpt/detail/fp8_cuda.h) against the host simulation it
// stands for ([cuda]: skipped with the reason where no GPU is present): quantization gives
// the codes whose decoded values fp8::fake_quantize gives, with the tensor's amax; the
// cuBLASLt product of two quantized operands is the product of their dequantized values
// within 16 times the fp32 sum bound, in E4M3 x E4M3 (forward) and E5M2 x E4M3 (gradients).
// A product of two FP8 values is exact in fp32, but Hopper's FP8 tensor cores keep fewer
// than fp32's 24 bits in their running sums: on an H100 the worst element sat at 4.2 (E4M3)
// and 3.3 (E5M2 x E4M3) times the fp32 bound, so 16 times leaves room while a wrong scale or
// layout (errors of the operands' size) still fails.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "models/gpt/detail/fp8_cuda.h"
#include "models/gpt/fp8.h"
#include "runtime/core/dtype.h"
#include "runtime/device/device.h"

using namespace strata;
using namespace strata::model;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

float decode(std::uint8_t code, DType fmt) { return fmt == DType::fp8_e4m3 ? e4m3_to_fp32(code) : e5m2_to_fp32(code); }

struct Gpu {
  std::unique_ptr<device::Device> dev;
  std::unique_ptr<device::Stream> stream;
  Gpu() {
    device::DeviceOptions o;
    o.backend = device::Backend::cuda;
    dev = device::Device::create(o);
    stream = dev->create_stream();
  }
  device::DeviceBuffer upload(const void* src, std::size_t bytes) {
    device::DeviceBuffer b(*dev, bytes, "fp8 test");
    stream->copy_async(b.get(), src, bytes, device::CopyKind::host_to_device);
    stream->synchronize();
    return b;
  }
  template <class T> std::vector<T> download(const device::DeviceBuffer& b, std::size_t n) {
    std::vector<T> out(n);
    stream->copy_async(out.data(), b.get(), n * sizeof(T), device::CopyKind::device_to_host);
    stream->synchronize();
    return out;
  }
};

// Quantizes `x` on the GPU at `scale`; returns the codes and checks them and the amax.
std::vector<std::uint8_t> quantize_checked(Gpu& g, const std::vector<float>& x, DType fmt, float scale) {
  const float zero = 0.0f;
  auto in = g.upload(x.data(), x.size() * 4);
  auto s = g.upload(&scale, 4);
  auto amax = g.upload(&zero, 4);
  device::DeviceBuffer out(*g.dev, x.size(), "fp8 codes");
  detail::cuda_fp8_quantize(g.stream->native_handle(), in.as<float>(), out.get(), x.size(), fmt, s.as<float>(),
                            amax.as<float>());
  const auto codes = g.download<std::uint8_t>(out, x.size());
  std::vector<float> want(x.size());
  fp8::fake_quantize(x.data(), want.data(), x.size(), fmt, scale);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float got = decode(codes[i], fmt) / scale;
    if (!(got == want[i] || (std::isnan(got) && std::isnan(want[i])))) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(g.download<float>(amax, 1)[0] == fp8::amax_of(x.data(), x.size()));
  return codes;
}

}  // namespace

TEST_CASE("GPU fp8 quantization gives the host simulation's values and the amax", "[fp8][cuda]") {
  Gpu g;
  for (DType fmt : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    INFO(dtype_name(fmt));
    auto x = gaussian(1 << 16, 3, 1.0f);
    x.push_back(1e6f);   // saturates
    x.push_back(-1e6f);  // saturates
    x.push_back(1e-9f);  // underflows
    x.push_back(0.0f);
    for (float scale : {1.0f, 64.0f, 1.0f / 256}) quantize_checked(g, x, fmt, scale);
  }
}

TEST_CASE("GPU fake quantization, transposed codes, amax and scales give the host's values", "[fp8][cuda]") {
  Gpu g;
  const int rows = 200, cols = 72;  // not multiples of the 32 x 32 tiles
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  auto x = gaussian(n, 21, 2.0f);
  x[5] = 1e6f;                                       // saturates
  x[77] = -std::numeric_limits<float>::quiet_NaN();  // kept; the amax is NaN
  x[n - 1] = 1e-9f;                                  // underflows
  auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  for (DType fmt : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    INFO(dtype_name(fmt));
    const float scale = 16.0f, zero = 0.0f;
    std::vector<float> want(n);
    fp8::fake_quantize(x.data(), want.data(), n, fmt, scale);
    auto in = g.upload(x.data(), n * 4);
    auto s = g.upload(&scale, 4);
    auto a1 = g.upload(&zero, 4), a2 = g.upload(&zero, 4), a3 = g.upload(&zero, 4);
    device::DeviceBuffer fq(*g.dev, n * 4, "fake quantized"), codes(*g.dev, n, "transposed codes");
    void* st = g.stream->native_handle();
    detail::cuda_fp8_fake_quantize(st, in.as<float>(), fq.as<float>(), n, fmt, s.as<float>(), a1.as<float>());
    detail::cuda_fp8_quantize_transposed(st, in.as<float>(), rows, cols, codes.get(), fmt, s.as<float>(),
                                         a2.as<float>());
    detail::cuda_fp8_amax(st, in.as<float>(), n, a3.as<float>());
    const auto got = g.download<float>(fq, n);
    const auto t = g.download<std::uint8_t>(codes, n);
    std::size_t wrong_fake = 0, wrong_t = 0;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const std::size_t i = static_cast<std::size_t>(r) * cols + c;
        if (std::isnan(want[i]) ? !std::isnan(got[i]) : std::memcmp(&got[i], &want[i], 4) != 0) ++wrong_fake;
        if (!same(decode(t[static_cast<std::size_t>(c) * rows + r], fmt) / scale, want[i])) ++wrong_t;
      }
    }
    CHECK(wrong_fake == 0);
    CHECK(wrong_t == 0);
    for (auto* a : {&a1, &a2, &a3}) CHECK(std::isnan(g.download<float>(*a, 1)[0]));
  }
  // Without the NaN, the amax is the largest magnitude, bit for bit.
  x[77] = 0.5f;
  const float zero = 0.0f;
  auto in = g.upload(x.data(), n * 4);
  auto a = g.upload(&zero, 4);
  detail::cuda_fp8_amax(g.stream->native_handle(), in.as<float>(), n, a.as<float>());
  CHECK(g.download<float>(a, 1)[0] == fp8::amax_of(x.data(), n));
  // A scale and its exact inverse, written in stream order.
  device::DeviceBuffer pair(*g.dev, 8, "scale and inverse");
  detail::cuda_fp8_set_scale(g.stream->native_handle(), pair.as<float>(), pair.as<float>() + 1, 0.0078125f);
  const auto v = g.download<float>(pair, 2);
  CHECK(v[0] == 0.0078125f);
  CHECK(v[1] == 128.0f);
}

TEST_CASE("the cuBLASLt FP8 product is the fp32 product of the dequantized operands", "[fp8][cuda]") {
  Gpu g;
  void* lt = detail::fp8_lt_create();
  const int M = 256, N = 192, K = 384;
  struct Case {
    DType a, b;
  };
  for (const Case c : {Case{DType::fp8_e4m3, DType::fp8_e4m3}, Case{DType::fp8_e5m2, DType::fp8_e4m3}}) {
    INFO(dtype_name(c.a) << " x " << dtype_name(c.b));
    const auto a = gaussian(static_cast<std::size_t>(M) * K, 11, 0.5f),
               b = gaussian(static_cast<std::size_t>(N) * K, 12, 3.0f);
    const float sa = fp8::scale_for(fp8::amax_of(a.data(), a.size()), c.a, 0);
    const float sb = fp8::scale_for(fp8::amax_of(b.data(), b.size()), c.b, 0);
    const auto qa = quantize_checked(g, a, c.a, sa), qb = quantize_checked(g, b, c.b, sb);
    const float inv_a = 1.0f / sa, inv_b = 1.0f / sb, alpha = 0.75f;
    auto da = g.upload(qa.data(), qa.size()), db = g.upload(qb.data(), qb.size());
    auto ia = g.upload(&inv_a, 4), ib = g.upload(&inv_b, 4);
    device::DeviceBuffer dc(*g.dev, static_cast<std::size_t>(M) * N * 4, "fp8 product");
    device::DeviceBuffer ws(*g.dev, std::size_t{32} << 20, "cuBLASLt workspace");
    detail::cuda_fp8_gemm(lt, g.stream->native_handle(), M, N, K, da.get(), c.a, ia.as<float>(), db.get(), c.b,
                          ib.as<float>(), alpha, 0.0f, dc.as<float>(), ws.get(), ws.bytes());
    const auto got = g.download<float>(dc, static_cast<std::size_t>(M) * N);
    const double u = std::numeric_limits<float>::epsilon() / 2.0, gamma = (K + 1) * u / (1 - (K + 1) * u);
    double worst = 0;
    for (int m = 0; m < M; ++m) {
      for (int n = 0; n < N; ++n) {
        double s = 0, mag = 0;
        for (int k = 0; k < K; ++k) {
          const double p = static_cast<double>(decode(qa[static_cast<std::size_t>(m) * K + k], c.a) * inv_a) *
                           decode(qb[static_cast<std::size_t>(n) * K + k], c.b) * inv_b;
          s += p;
          mag += std::abs(p);
        }
        const double err = std::abs(got[static_cast<std::size_t>(m) * N + n] - alpha * s) / (gamma * alpha * mag);
        worst = std::max(worst, err);
      }
    }
    INFO("worst error: " << worst << " times the fp32 sum bound");
    CHECK(worst <= 16.0);
  }
  CHECK_THROWS_WITH(detail::cuda_fp8_gemm(lt, g.stream->native_handle(), 10, 16, 16, nullptr, DType::fp8_e4m3, nullptr,
                                          nullptr, DType::fp8_e4m3, nullptr, 1.0f, 0.0f, nullptr, nullptr, 0),
                    Catch::Contains("multiple of 16"));
  detail::fp8_lt_destroy(lt);
}

TEST_CASE("the FP8 GPU calls refuse what they cannot do, by name", "[fp8]") {
  // Built with CUDA, the argument checks come first, GPU or not; built without, the stub says so.
  CHECK_THROWS_WITH(detail::cuda_fp8_quantize(nullptr, nullptr, nullptr, 4, DType::fp16, nullptr, nullptr),
                    (Catch::Contains("fp16") && Catch::Contains("not fp8_e4m3 or fp8_e5m2")) ||
                        Catch::Contains("built without CUDA"));
  CHECK_THROWS_WITH(detail::cuda_fp8_gemm(nullptr, nullptr, 16, 16, 16, nullptr, DType::fp8_e5m2, nullptr, nullptr,
                                          DType::fp8_e5m2, nullptr, 1.0f, 0.0f, nullptr, nullptr, 0),
                    Catch::Contains("E5M2 x E5M2") || Catch::Contains("built without CUDA"));
}
