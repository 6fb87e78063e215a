// Every collective on exactly representable inputs, asserting ==: world sizes 1-4 with
// ranks as threads and 2-4 as processes (through the real launcher), fp32/bf16/fp16,
// uneven counts; bitwise-identical results run after run; the stream-ordered form.
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/device/device.h"
#include "tests/runtime/comm/common.h"
#include "tests/support/ranks.h"

using namespace strata;

TEST_CASE("every collective is exact at world sizes 1 to 4 with thread ranks", "[comm]") {
  const int world = GENERATE(1, 2, 3, 4);
  const DType t = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  INFO("world " << world << " " << dtype_name(t));
  CHECK_NOTHROW(test::rethrow_first(
      test::run_thread_ranks(world, [t](comm::Communicator& c) { test::run_collective_suite(c, t); })));
}

TEST_CASE("every collective is exact at world sizes 2 to 4 with process ranks", "[comm][process]") {
  const int world = GENERATE(2, 3, 4);
  const auto r = test::run_process_ranks(world, "collectives");
  INFO(r.summary);
  for (const auto& e : r.ranks) INFO("rank " << e.rank << ": " << e.output);
  REQUIRE(r.exit_code == 0);
  for (const auto& e : r.ranks) CHECK_THAT(e.output, Catch::Contains("WORKER OK rank " + std::to_string(e.rank)));
}

TEST_CASE("16-bit sums accumulate in fp32 and round once", "[comm]") {
  // bf16 values whose pairwise bf16 sums would round, but whose fp32 sum is exact.
  const int world = 4;
  std::vector<std::vector<std::uint16_t>> result(world);
  test::rethrow_first(test::run_thread_ranks(world, [&](comm::Communicator& c) {
    std::vector<std::uint16_t> x(257);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = fp32_to_bf16(1.0f + static_cast<float>(c.rank() * 64 + i % 64) / 128.0f);
    c.all_reduce(x.data(), x.size(), DType::bf16);
    result[c.rank()] = x;
  }));
  for (std::size_t i = 0; i < 257; ++i) {
    float exact = 0;
    for (int r = 0; r < world; ++r)
      exact += bf16_to_fp32(fp32_to_bf16(1.0f + static_cast<float>(r * 64 + i % 64) / 128.0f));
    for (int r = 0; r < world; ++r) REQUIRE(result[r][i] == fp32_to_bf16(exact));
  }
}

TEST_CASE("results do not depend on timing: the same inputs give the same bits run after run", "[comm]") {
  // Gloo's ring splits the buffer by its length, so equal lengths give equal sum orders:
  // all-reduce and reduce-scatter of the same (padded) buffer agree bit for bit.
  const int world = 3;
  constexpr std::size_t kLen = 99999;
  auto run = [&] {
    std::vector<std::vector<float>> out(world);
    test::rethrow_first(test::run_thread_ranks(world, [&](comm::Communicator& c) {
      std::mt19937 rng(1234 + c.rank());
      std::normal_distribution<float> d(0.0f, 1e3f);
      std::vector<float> x(kLen), rs(kLen / 3);
      for (auto& v : x) v = d(rng);
      std::vector<float> y = x;
      c.all_reduce(x.data(), x.size(), DType::fp32);
      c.reduce_scatter(y.data(), rs.data(), rs.size(), DType::fp32);
      x.insert(x.end(), rs.begin(), rs.end());
      out[c.rank()] = x;
    }));
    return out;
  };
  const auto a = run(), b = run();
  for (int r = 0; r < world; ++r) {
    REQUIRE(a[r].size() == b[r].size());
    CHECK(std::memcmp(a[r].data(), b[r].data(), a[r].size() * 4) == 0);
  }
  // Every rank holds the same all-reduce result, and reduce-scatter slices are its slices.
  for (int r = 1; r < world; ++r) CHECK(std::memcmp(a[0].data(), a[r].data(), kLen * 4) == 0);
  for (int r = 0; r < world; ++r) {
    CHECK(std::memcmp(a[r].data() + kLen, a[0].data() + r * (kLen / 3), (kLen / 3) * 4) == 0);
  }
}

TEST_CASE("stream-ordered collectives run when the stream reaches them", "[comm]") {
  const int world = 2;
  std::vector<std::vector<float>> seen(world);
  test::rethrow_first(test::run_thread_ranks(world, [&](comm::Communicator& c) {
    auto dev = device::Device::create({});
    auto s = dev->create_stream();
    std::vector<float> x(4096, 0.0f);
    // The buffer is filled by earlier stream work; the collective must see the fill.
    s->launch_host([&x, r = c.rank()] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      for (auto& v : x) v = static_cast<float>(r + 1);
    });
    c.all_reduce(x.data(), x.size(), DType::fp32, comm::ReduceOp::sum, *s);
    c.barrier();  // issued after the stream op: queued behind it on every rank
    s->launch_host([&seen, &x, r = c.rank()] { seen[r] = x; });
    s->synchronize();
  }));
  for (int r = 0; r < world; ++r) {
    REQUIRE(seen[r].size() == 4096);
    CHECK(seen[r][0] == 3.0f);
    CHECK(seen[r][4095] == 3.0f);
  }
}
