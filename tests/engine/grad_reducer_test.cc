// GradReducer (engine/grad_reducer.h) on its own, on the host device: the accumulators hold
// the exact fp32 sum of every micro-batch's gradients, inline and overlapped, on the device
// and in host RAM; across two Gloo ranks each rank holds its shard of the sum over ranks
// (stages 2-3) or the whole sum (0-1); a full device asks make_room before it refuses.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/grad_reducer.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "tests/engine/engine_support.h"
#include "tests/support/ranks.h"

using namespace strata;
using namespace strata::engine;

namespace {

std::vector<ParamSpec> two_layers() {
  std::vector<ParamSpec> p(3);
  p[0].name = "a.weight", p[0].shape = {3, 5}, p[0].layer = 0;
  p[1].name = "a.bias", p[1].shape = {7}, p[1].layer = 0;
  p[2].name = "b.weight", p[2].shape = {100}, p[2].layer = 1;
  return p;
}

// Both layers' accumulators on `tier` (with their optimizer state, as the shard map records it).
ShardMap accumulators_on(Tier tier) {
  ShardMap map({false, false});
  for (int li = 0; li < 2; ++li) map.place(li, tier, Tier::device);
  return map;
}

// The gradient a rank hands back for element i of a layer in micro-batch mb: small
// integers and halves, exact in bf16 and in every fp32 sum here.
float grad_value(int rank, int mb, std::size_t i) { return 0.5f * static_cast<float>((rank + 1) * (mb + 2) + i % 7); }

void fill(void* buf, DType t, std::size_t n, int rank, int mb) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = grad_value(rank, mb, i);
  convert(v.data(), DType::fp32, buf, t, n);
}

// The element this rank's accumulator holds at index j: for stages 0-1 the padded layer,
// above the rank's shard of each bucket in turn.
std::size_t layer_index_of(const Layout& lay, int li, int stage, int rank, std::size_t j) {
  if (stage <= 1) return j;
  const auto& L = lay.layers()[li];
  for (int bi : L.buckets) {
    const auto& b = lay.buckets()[bi];
    if (j < b.shard) return (b.flat_offset - L.flat_offset) + rank * b.shard + j;
    j -= b.shard;
  }
  throw std::logic_error("index past the shard");
}

std::size_t acc_len(const Layout& lay, int li, int stage) {
  if (stage <= 1) return lay.layers()[li].padded;
  std::size_t n = 0;
  for (int bi : lay.layers()[li].buckets) n += lay.buckets()[bi].shard;
  return n;
}

// Two micro-batches through every layer; returns the first mismatch, or "" when each
// accumulator holds the exact sum over ranks and micro-batches.
std::string run_two_micro_batches(comm::Communicator* comm, int rank, int world, int stage, bool overlap, Tier tier,
                                  DType cdt, IoStats& io) {
  auto dev = test::host_device(64 << 20);
  const Layout lay(two_layers(), world, 32);
  MemoryLedger ledger(*dev, 64 << 20, false);
  auto dev_stream = dev->create_stream();
  std::string bad;
  {
    const ShardMap map = accumulators_on(tier);
    const GradReducer::Context c{lay,  stage, overlap, *dev,   *dev_stream, comm,    nullptr,
                                 rank, world, cdt,     ledger, map,         nullptr, /*accumulation=*/2};
    GradReducer r(c);
    for (int li = 0; li < 2; ++li) r.add_layer(li);
    for (int mb = 0; mb < 2; ++mb) {
      for (int li = 1; li >= 0; --li) {  // backward order
        void* buf = r.buffer(li, [] { return false; });
        fill(buf, cdt, lay.layers()[li].padded, rank, mb);
        r.reduce(li, io);
      }
    }
    r.sync();
    dev_stream->synchronize();
    for (int li = 0; li < 2 && bad.empty(); ++li) {
      if (r.reductions(li) != 2) bad = "reductions " + std::to_string(r.reductions(li));
      if (r.acc_dtype(li) != DType::fp32) bad = "two micro-batches accumulate in fp32";
      const auto* acc = static_cast<const float*>(r.accumulator(li));
      for (std::size_t j = 0; j < acc_len(lay, li, stage) && bad.empty(); ++j) {
        const std::size_t i = layer_index_of(lay, li, stage, rank, j);
        float want = 0;
        for (int from = 0; from < world; ++from)
          for (int mb = 0; mb < 2; ++mb) want += grad_value(from, mb, i);
        if (acc[j] != want)
          bad = "layer " + std::to_string(li) + " element " + std::to_string(i) + ": " + std::to_string(acc[j]) +
                " != " + std::to_string(want);
      }
    }
    r.begin_step();
    if (bad.empty() && r.reductions(0) != 0) bad = "begin_step left the reduction count";
    r.zero();
    for (int li = 0; li < 2 && bad.empty(); ++li)
      for (std::size_t j = 0; j < acc_len(lay, li, stage); ++j)
        if (static_cast<const float*>(r.accumulator(li))[j] != 0.0f) bad = "zero() left a value";
  }
  if (bad.empty() && ledger.usage(Tier::device).used_bytes != 0) bad = "device bytes left after the reducer went";
  return bad;
}

}  // namespace

TEST_CASE("grad reducer: one rank accumulates the exact sum, inline and overlapped, on either tier",
          "[engine][grad_reducer]") {
  for (const bool overlap : {false, true}) {
    for (const Tier tier : {Tier::device, Tier::host}) {
      for (const DType cdt : {DType::fp32, DType::bf16}) {
        INFO("overlap " << overlap << ", accumulators on " << tier_name(tier) << ", " << dtype_name(cdt));
        IoStats io;
        CHECK(run_two_micro_batches(nullptr, 0, 1, 2, overlap, tier, cdt, io) == "");
        // Gradients whose accumulator is in host RAM cross the link, the whole padded layers.
        const Layout lay(two_layers(), 1, 32);
        const std::uint64_t expect =
            tier == Tier::host ? 2 * (lay.layers()[0].padded + lay.layers()[1].padded) * dtype_size(cdt) : 0;
        CHECK(io.d2h_bytes == expect);
      }
    }
  }
}

// One rank and one micro-batch: a host accumulator holds its single gradient in the compute
// dtype, at half the fp32 bytes, with the fp32 accumulator's bits once widened (0 + g: -0
// becomes +0; every other value, subnormals and infinities included, is g itself).
TEST_CASE("grad reducer: one gradient per step sits in the compute dtype in host RAM, bit for bit",
          "[engine][grad_reducer]") {
  const Layout lay(two_layers(), 1, 32);
  for (const DType cdt : {DType::bf16, DType::fp16}) {
    for (const Tier tier : {Tier::host, Tier::device}) {
      for (const bool overlap : {false, true}) {
        INFO(dtype_name(cdt) << " accumulators on " << tier_name(tier) << ", overlap " << overlap);
        auto dev = test::host_device(64 << 20);
        MemoryLedger ledger(*dev, 64 << 20, false);
        auto dev_stream = dev->create_stream();
        const ShardMap map = accumulators_on(tier);
        const GradReducer::Context c{lay, 2, overlap, *dev,   *dev_stream, nullptr, nullptr,
                                     0,   1, cdt,     ledger, map,         nullptr, 1};
        GradReducer r(c);
        for (int li = 0; li < 2; ++li) r.add_layer(li);
        const DType want_dt = tier == Tier::host ? cdt : DType::fp32;
        const std::size_t elems = lay.layers()[0].padded + lay.layers()[1].padded;
        CHECK(ledger.usage(tier).kind_used[static_cast<int>(Kind::grads)] == elems * dtype_size(want_dt));
        IoStats io;
        std::vector<std::vector<std::uint16_t>> sent(2);
        for (int li = 1; li >= 0; --li) {
          const std::size_t n = lay.layers()[li].padded;
          auto& bits = sent[li];
          bits.resize(n);
          for (std::size_t i = 0; i < n; ++i) bits[i] = static_cast<std::uint16_t>(0x9e37u * (i + 1) + 0x79b9u * li);
          bits[0] = 0x8000;                                // -0
          bits[1] = 0x0001;                                // the smallest subnormal
          bits[2] = cdt == DType::bf16 ? 0x7f80 : 0x7c00;  // +inf
          for (std::size_t i = 3; i < n; ++i)
            if (std::isnan(load_as_fp32(&bits[i], cdt, 0))) bits[i] &= 0x8fff;  // finite (NaN has no one bit pattern)
          void* buf = r.buffer(li, [] { return false; });
          std::memcpy(buf, bits.data(), n * 2);
          r.reduce(li, io);
        }
        r.sync();
        for (int li = 0; li < 2; ++li) {
          REQUIRE(r.acc_dtype(li) == want_dt);
          for (std::size_t i = 0; i < lay.layers()[li].padded; ++i) {
            const float fp32_acc = 0.0f + load_as_fp32(&sent[li][i], cdt, 0);
            const float got = load_as_fp32(r.accumulator(li), want_dt, i);
            std::uint32_t a = 0, b = 0;
            std::memcpy(&a, &fp32_acc, 4);
            std::memcpy(&b, &got, 4);
            if (a != b) FAIL("layer " << li << " element " << i << ": " << got << " != " << fp32_acc);
          }
        }
        r.zero();
        for (int li = 0; li < 2; ++li)
          for (std::size_t i = 0; i < lay.layers()[li].padded; ++i)
            if (load_as_fp32(r.accumulator(li), want_dt, i) != 0.0f) FAIL("zero() left a value");
      }
    }
  }
  // fp32 compute, two ranks or two micro-batches keep fp32 accumulators.
  CHECK(GradReducer::host_acc_dtype(DType::fp32, 1, 1) == DType::fp32);
  CHECK(GradReducer::host_acc_dtype(DType::bf16, 2, 1) == DType::fp32);
  CHECK(GradReducer::host_acc_dtype(DType::bf16, 1, 2) == DType::fp32);
  CHECK(GradReducer::host_acc_dtype(DType::fp16, 1, 1) == DType::fp16);
}

TEST_CASE("grad reducer: two ranks hold their shard of the sum (stages 2-3) or the whole sum (0-1)",
          "[engine][grad_reducer]") {
  for (const int stage : {1, 2}) {
    for (const bool overlap : {false, true}) {
      INFO("stage " << stage << ", overlap " << overlap);
      const auto outcomes = test::run_thread_ranks(2, [&](comm::Communicator& comm) {
        IoStats io;
        const std::string bad =
            run_two_micro_batches(&comm, comm.rank(), 2, stage, overlap, Tier::host, DType::bf16, io);
        STRATA_CHECK(bad.empty(), Errc::internal, "rank ", comm.rank(), ": ", bad);
      });
      CHECK_NOTHROW(test::rethrow_first(outcomes));
    }
  }
}

TEST_CASE("grad reducer: a full device asks make_room, then refuses naming the layer", "[engine][grad_reducer]") {
  const Layout lay(two_layers(), 1, 32);
  auto dev = test::host_device(1 << 20);
  MemoryLedger ledger(*dev, 64 << 20, false);
  auto dev_stream = dev->create_stream();
  const ShardMap map = accumulators_on(Tier::host);
  const GradReducer::Context c{lay, 2, false,       *dev,   *dev_stream, nullptr, nullptr,
                               0,   1, DType::fp32, ledger, map,         nullptr};
  GradReducer r(c);
  for (int li = 0; li < 2; ++li) r.add_layer(li);
  auto fill_device = [&] {  // what a prefetched or retained layer would hold
    ledger.reap();
    return ledger.allocate(Tier::device, Kind::buffers, dev->memory_stats().largest_free_bytes, "retained layers");
  };
  void* held = fill_device();
  int asked = 0;
  auto frees_held = [&] {
    ++asked;
    if (held == nullptr) return false;
    ledger.free(held);
    held = nullptr;
    return true;
  };
  void* buf = r.buffer(1, frees_held);
  CHECK(asked == 1);
  CHECK(buf != nullptr);
  CHECK(r.buffer(1, frees_held) == buf);  // asked again before reduce: the same buffer
  IoStats io;
  r.reduce(1, io);
  CHECK_THROWS_WITH(r.reduce(1, io), Catch::Contains("reduce_grads(1) without grad_buffers(1)"));
  held = fill_device();
  asked = 0;
  auto frees_nothing = [&] {
    ++asked;
    return false;
  };
  CHECK_THROWS_WITH(r.buffer(1, frees_nothing), Catch::Contains("layer 1 gradient buffer"));
  CHECK(asked == 1);
  ledger.free(held);
}
