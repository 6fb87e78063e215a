// The process-rank side of the comm tests: a hidden test case that `run_process_ranks`
// launches N times through the real launcher; STRATA_TEST_SCENARIO picks what it does.
// Also the collective suite shared by thread and process ranks.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>

#include <catch2/catch.hpp>

#include "runtime/core/error.h"
#include "tests/runtime/comm/common.h"

namespace strata::test {
namespace {

// Small integers (times 1/4 for 16-bit types): every sum of up to 4 ranks is exact.
float value(int rank, std::size_t i, DType t) {
  const float v = static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 13) % 29 + 1);
  return t == DType::fp32 ? v : v * 0.25f;
}

void expect_equal(const std::vector<unsigned char>& buf, DType t, std::size_t i, float want, const char* op, int rank) {
  const float got = load_as_fp32(buf.data(), t, i);
  std::vector<unsigned char> rounded(4);
  store_from_fp32(rounded.data(), t, 0, want);
  const float want_t = load_as_fp32(rounded.data(), t, 0);
  if (got != want_t) {
    STRATA_THROW(Errc::internal, op, " on rank ", rank, " (", dtype_name(t), "): element ", i, " is ", got,
                 ", expected ", want_t);
  }
}

std::vector<unsigned char> make(DType t, std::size_t n, int rank, std::size_t offset = 0) {
  std::vector<unsigned char> b(std::max<std::size_t>(n, 1) * dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) store_from_fp32(b.data(), t, i, value(rank, offset + i, t));
  return b;
}

}  // namespace

void run_collective_suite(comm::Communicator& c, DType t) {
  const int n = c.world_size(), me = c.rank();
  const std::size_t es = dtype_size(t);
  const std::size_t per = 1003;  // not a multiple of anything convenient
  // all_gather
  {
    auto send = make(t, per, me);
    std::vector<unsigned char> recv(per * n * es);
    c.all_gather(send.data(), recv.data(), per, t);
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < per; ++i) expect_equal(recv, t, r * per + i, value(r, i, t), "all_gather", me);
  }
  // all_gather_v with uneven counts (rank r sends r*5+1 elements)
  {
    std::vector<std::size_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = static_cast<std::size_t>(r) * 5 + 1;
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    auto send = make(t, counts[me], me);
    std::vector<unsigned char> recv(total * es);
    c.all_gather_v(send.data(), recv.data(), counts, t);
    std::size_t off = 0;
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < counts[r]; ++i) expect_equal(recv, t, off + i, value(r, i, t), "all_gather_v", me);
      off += counts[r];
    }
  }
  // all_reduce sum / max / avg
  for (comm::ReduceOp op : {comm::ReduceOp::sum, comm::ReduceOp::max, comm::ReduceOp::avg}) {
    auto buf = make(t, per, me);
    c.all_reduce(buf.data(), per, t, op);
    for (std::size_t i = 0; i < per; ++i) {
      float s = 0, m = -1e30f;
      for (int r = 0; r < n; ++r) {
        s += value(r, i, t);
        m = std::max(m, value(r, i, t));
      }
      const float want = op == comm::ReduceOp::sum ? s : op == comm::ReduceOp::max ? m : s / static_cast<float>(n);
      expect_equal(buf, t, i, want, comm::reduce_op_name(op), me);
    }
  }
  // reduce_scatter (equal and uneven)
  {
    auto send = make(t, per * n, me);
    std::vector<unsigned char> recv(per * es);
    c.reduce_scatter(send.data(), recv.data(), per, t);
    for (std::size_t i = 0; i < per; ++i) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += value(r, me * per + i, t);
      expect_equal(recv, t, i, s, "reduce_scatter", me);
    }
    std::vector<std::size_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = static_cast<std::size_t>(n - r) * 3 + 2;
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    std::size_t mine = std::accumulate(counts.begin(), counts.begin() + me, std::size_t{0});
    auto sendv = make(t, total, me);
    std::vector<unsigned char> recvv(counts[me] * es);
    c.reduce_scatter_v(sendv.data(), recvv.data(), counts, t);
    for (std::size_t i = 0; i < counts[me]; ++i) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += value(r, mine + i, t);
      expect_equal(recvv, t, i, s, "reduce_scatter_v", me);
    }
  }
  // broadcast from every root
  for (int root = 0; root < n; ++root) {
    auto buf = make(t, per, me);
    c.broadcast(buf.data(), per, t, root);
    for (std::size_t i = 0; i < per; ++i) expect_equal(buf, t, i, value(root, i, t), "broadcast", me);
  }
  // send/recv around a ring, both directions posted before either waits
  if (n > 1) {
    auto out = make(t, per, me);
    std::vector<unsigned char> in(per * es);
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    auto r = c.recv_async(in.data(), in.size(), prev, 5);
    auto s = c.send_async(out.data(), out.size(), next, 5);
    s->wait();
    r->wait();
    for (std::size_t i = 0; i < per; ++i) expect_equal(in, t, i, value(prev, i, t), "recv", me);
  }
  c.barrier();
}

comm::LaunchResult run_process_ranks(int world, const std::string& scenario, int grace_ms) {
  comm::LaunchOptions o;
  o.nprocs = world;
  o.command = {"/proc/self/exe", "[.comm-worker]"};
  o.capture = true;
  o.prefix_output = true;
  o.only_rank_output = 999;  // keep the test log quiet; output is captured
  o.grace = std::chrono::milliseconds(grace_ms);
  o.env = {{"STRATA_TEST_SCENARIO", scenario}, {"STRATA_COMM_TIMEOUT_MS", "3000"}};
  return comm::launch_local(o);
}

}  // namespace strata::test

using namespace strata;

// Runs only when launched by run_process_ranks (hidden tag).
TEST_CASE("comm worker process", "[.comm-worker]") {
  const char* s = std::getenv("STRATA_TEST_SCENARIO");
  REQUIRE(s != nullptr);
  const std::string scenario = s;
  comm::CommOptions o;
  o.rendezvous = comm::rendezvous_from_env();
  auto c = comm::Communicator::create(o);
  if (scenario == "collectives") {
    for (DType t : {DType::fp32, DType::bf16, DType::fp16}) test::run_collective_suite(*c, t);
    std::printf("WORKER OK rank %d\n", c->rank());
  } else if (scenario == "die") {
    std::vector<float> x(1 << 16, 1.0f);
    c->all_reduce(x.data(), x.size(), DType::fp32);
    if (c->rank() == 1) raise(SIGKILL);  // dies between two collectives
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (int k = 0; k < 3; ++k) c->all_reduce(x.data(), x.size(), DType::fp32);
      std::printf("NO ERROR\n");
    } catch (const Error& e) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("CAUGHT after %.2f s: %s\n", secs, e.what());
    }
  }
  std::fflush(stdout);
}
