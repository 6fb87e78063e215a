// Bitwise reproducibility: every optimizer and the norm pass give the same bytes for any
// thread count (TBB arenas of 1..8) and any block size, including misaligned shards that
// exercise the padded head, the streaming-store interior and the padded tail in parallel;
// an out-of-place step (StepArgs::from) gives the in-place step's bytes.
#include <catch2/catch.hpp>

#include <tbb/task_arena.h>

#include <algorithm>
#include <random>
#include <vector>

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/grad_norm.h"
#include "optim/lion.h"
#include "tests/optim/shard.h"

using namespace strata;
using namespace strata::test;

namespace {

constexpr std::size_t kN = (std::size_t{1} << 20) + 37;  // above the parallel threshold, ragged
constexpr std::size_t kOffset = 3;                       // misaligns every buffer

optim::StepArgs offset_args(TestShard& sh, std::int64_t step) {
  optim::StepArgs a = sh.args(step, 0.75f);
  const std::size_t es = a.state_format == MomentFormat::bf16 ? 2 : 4;
  a.master += kOffset;
  a.grad = static_cast<const unsigned char*>(a.grad) + kOffset * dtype_size(a.grad_dtype);
  a.m = static_cast<unsigned char*>(a.m) + kOffset * es;
  a.v = static_cast<unsigned char*>(a.v) + kOffset * es;
  a.copy = static_cast<unsigned char*>(a.copy) + kOffset * dtype_size(a.copy_dtype);
  a.n = kN - kOffset;
  return a;
}

void run(int rule, const optim::StepArgs& a, std::size_t block) {
  optim::StepOptions o;
  o.block_elems = block;
  optim::AdamConfig adam;
  adam.adamw_mode = rule != 1;
  adam.weight_decay = 0.1f;
  switch (rule) {
    case 0:
    case 1:
      optim::adam_step(adam, a, o);
      break;
    case 2:
      optim::lion_step({}, a, o);
      break;
    default:
      optim::adagrad_step({}, a, o);
      break;
  }
}

}  // namespace

TEST_CASE("optimizer results are bitwise identical for any thread count and block size", "[optim]") {
  const int rule = GENERATE(0, 1, 2, 3);  // AdamW, Adam (L2), Lion, Adagrad
  const DType grad = GENERATE(DType::fp32, DType::bf16);
  const DType state = GENERATE(DType::fp32, DType::bf16);
  CAPTURE(rule, dtype_name(grad), dtype_name(state));
  TestShard base(kN, {grad, state, true, DType::bf16});
  std::mt19937 rng(41);
  base.fill_params(rng);
  base.fill_grads(rng);
  TestShard reference = base;
  tbb::task_arena serial(1);
  serial.execute([&] { run(rule, offset_args(reference, 2), kN); });
  const auto want = reference.snapshot();
  for (int threads : {1, 2, 3, 8}) {
    for (std::size_t block : {std::size_t{1000}, std::size_t{4099}, std::size_t{1} << 15, std::size_t{1} << 21}) {
      TestShard sh = base;
      tbb::task_arena arena(threads);
      arena.execute([&] { run(rule, offset_args(sh, 2), block); });
      INFO("threads " << threads << " block " << block);
      CHECK(sh.snapshot() == want);
    }
  }
}

// The overlapped step's form: the state read from one set of buffers, the stepped state
// written to another (StepArgs::from), block by block.
TEST_CASE("an out-of-place step gives the in-place step's bytes and leaves its source as it was", "[optim]") {
  const int rule = GENERATE(0, 1, 2, 3);  // AdamW, Adam (L2), Lion, Adagrad
  const DType state = GENERATE(DType::fp32, DType::bf16);
  CAPTURE(rule, dtype_name(state));
  TestShard base(kN, {DType::bf16, state, true, DType::bf16});
  std::mt19937 rng(47);
  base.fill_params(rng);
  base.fill_grads(rng);
  TestShard reference = base;
  run(rule, offset_args(reference, 2), std::size_t{1} << 15);
  const auto source = base.snapshot();
  const optim::StepArgs in = offset_args(base, 2);
  for (std::size_t block : {std::size_t{4099}, std::size_t{1} << 15, std::size_t{1} << 21}) {
    TestShard out = base;                         // the destination: the same gradient, other state
    for (std::size_t i = kOffset; i < kN; ++i) {  // the stepped elements
      out.set_p(i, 7.0f);
      if (rule != 3) out.set_m(i, -3.0f);
      if (rule != 2) out.set_v(i, 5.0f);
    }
    optim::StepArgs a = offset_args(out, 2);
    a.from = {in.master, in.m, in.v};
    run(rule, a, block);
    INFO("block " << block);
    const auto got = out.snapshot(), want = reference.snapshot();
    const auto diff = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
    INFO("first differing byte " << (diff.first - got.begin()) << " of " << got.size());
    CHECK((got == want));
    CHECK((base.snapshot() == source));
  }
}

TEST_CASE("the gradient norm is bitwise identical for any thread count", "[optim]") {
  const DType grad = GENERATE(DType::fp32, DType::bf16, DType::fp16);
  TestShard sh(kN, {grad, DType::fp32, false, DType::bf16});
  std::mt19937 rng(43);
  sh.fill_grads(rng, 1e-8, 1e3);
  const void* g = sh.args(1).grad;
  double want = 0;
  tbb::task_arena(1).execute([&] { want = optim::grad_norm_sq(g, grad, kN).sumsq; });
  for (int threads : {2, 3, 5, 8}) {
    double got = 0;
    tbb::task_arena(threads).execute([&] { got = optim::grad_norm_sq(g, grad, kN).sumsq; });
    CHECK(got == want);
  }
}
