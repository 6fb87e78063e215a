// OptimizerSwapper on real files: every element stepped exactly once per step in sub-groups
// no larger than a buffer (a tensor larger than a buffer is chunked), the state (master and
// both moments) carried from step to step through the files, and the buffer budget.
#include <sys/resource.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "offload/optimizer_swapper.h"
#include "runtime/core/error.h"
#include "tests/support/child.h"
#include "tests/support/temp_dir.h"

using namespace strata;

namespace {

offload::SwapperOptions small_options(const std::string& dir, std::uint64_t sub_group, int buffers) {
  offload::SwapperOptions o;
  o.dir = dir;
  o.sub_group_elems = sub_group;
  o.buffer_count = buffers;
  o.queue_depth = 8;
  o.block_bytes = 16 << 10;
  return o;
}

std::vector<float> ramp(std::uint64_t n, float base) {
  std::vector<float> v(n);
  for (std::uint64_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

}  // namespace

TEST_CASE("the swapper steps every element once per step, chunking tensors larger than a buffer", "[offload][uring]") {
  test::TempDir dir("strata-offload");
  const int buffers = GENERATE(1, 2, 4);
  const std::vector<offload::SwapTensor> tensors = {{"layer 0", 10000}, {"layer 1", 37}, {"layer 2", 2500}};
  offload::OptimizerSwapper sw(small_options(dir.file("rank0"), 1024, buffers), tensors);
  CHECK(sw.buffer_elems() == 1024);
  CHECK(sw.buffer_count() == buffers);
  CHECK(sw.sub_groups() == 10u + 1u + 3u);
  for (std::size_t t = 0; t < tensors.size(); ++t) sw.write_state(t, ramp(tensors[t].elems, 1000.0f * t).data());
  sw.commit_written();

  for (int step = 1; step <= 3; ++step) {
    std::vector<std::vector<int>> seen(tensors.size());
    for (std::size_t t = 0; t < tensors.size(); ++t) seen[t].assign(tensors[t].elems, 0);
    std::size_t last_tensor = 0;
    std::uint64_t next_offset = 0;
    sw.step([&](const offload::SubGroup& g) {
      REQUIRE(g.elems >= 1);
      REQUIRE(g.elems <= sw.buffer_elems());
      if (g.tensor != last_tensor) next_offset = 0;
      CHECK(g.offset == next_offset);  // tensor then offset order
      next_offset = g.offset + g.elems;
      last_tensor = g.tensor;
      auto* m = static_cast<float*>(g.exp_avg);  // fp32 moments (the default)
      auto* v = static_cast<float*>(g.exp_avg_sq);
      for (std::uint64_t i = 0; i < g.elems; ++i) {
        const float x = 1000.0f * g.tensor + static_cast<float>(g.offset + i);
        // The moments written last step came back: exp_avg = step - 1, exp_avg_sq = x * (step - 1).
        if (m[i] != static_cast<float>(step - 1) || v[i] != x * static_cast<float>(step - 1)) {
          FAIL("moments of tensor " << g.tensor << " element " << g.offset + i << " not carried over");
        }
        g.master[i] += 1.0f;
        m[i] = static_cast<float>(step);
        v[i] = x * static_cast<float>(step);
        ++seen[g.tensor][g.offset + i];
      }
    });
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      CHECK(std::count(seen[t].begin(), seen[t].end(), 1) == static_cast<long>(tensors[t].elems));
    }
    CHECK(sw.stats().bytes_read == sw.state_bytes());
    CHECK(sw.stats().bytes_written == sw.state_bytes());
  }
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::vector<float> got(tensors[t].elems);
    sw.read_state(t, 0, got.size(), got.data());
    CHECK(got == ramp(tensors[t].elems, 1000.0f * t + 3.0f));
  }
  std::vector<float> part(700);
  sw.read_state(0, 900, part.size(), part.data());  // across a sub-group boundary
  const auto all = ramp(10000, 3.0f);
  CHECK(part == std::vector<float>(all.begin() + 900, all.begin() + 1600));
}

TEST_CASE("a sub-group never exceeds the largest tensor, so a huge sub_group_size costs no memory",
          "[offload][uring]") {
  test::TempDir dir("strata-offload");
  offload::OptimizerSwapper sw(small_options(dir.file("r"), 1000000000, 4), {{"a", 3000}, {"b", 5000}});
  CHECK(sw.buffer_elems() == 5000);
  CHECK(sw.buffer_bytes() == 61440);  // 5000 x 12 B rounded up to 4 KiB
  CHECK(sw.sub_groups() == 2);
}

TEST_CASE("a budget smaller than one buffer is refused, naming the minimum", "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  auto o = small_options(dir.file("r"), 1024, 4);
  const std::vector<offload::SwapTensor> tensors = {{"layer 5", 4096}};
  const std::uint64_t min = offload::OptimizerSwapper::min_budget_bytes(o, tensors);
  CHECK(min == 12288);
  o.budget_bytes = min - 1;
  try {
    offload::OptimizerSwapper sw(o, tensors);
    FAIL("a budget of " << o.budget_bytes << " B was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::out_of_budget);
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("at least 12.00 KiB (12288 B)") != std::string::npos);
    CHECK(m.find("sub_group_size") != std::string::npos);
  }
  o.budget_bytes = min * 5 / 2;  // two and a half buffers: two, and the pipeline still works
  offload::OptimizerSwapper sw(o, tensors);
  CHECK(sw.buffer_count() == 2);
}

TEST_CASE("swap files beyond the open-file limit: the soft limit is raised, a hard limit too small is refused",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  // 300 sub-groups: 600 files, two descriptors each.
  const std::vector<offload::SwapTensor> tensors = {{"layer 0", 300 * 100}};
  for (const rlim_t hard : {rlim_t{4096}, rlim_t{512}}) {
    INFO("hard limit " << hard);
    const std::string where = dir.file("h" + std::to_string(hard));
    const test::ChildResult child = test::run_in_child([&]() -> std::string {
      rlimit lim{256, hard};
      if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return "setup: setrlimit";
      try {
        offload::OptimizerSwapper sw(small_options(where, 100, 2), tensors);
        ::getrlimit(RLIMIT_NOFILE, &lim);
        return "created, soft limit " + std::to_string(lim.rlim_cur);
      } catch (const Error& e) {
        return std::string("refused: ") + errc_name(e.code()) + ": " + e.what();
      }
    });
    INFO(child.output);
    REQUIRE(child.exit_code == 0);
    if (hard == 4096) {
      CHECK_THAT(child.output, Catch::StartsWith("created, soft limit 1"));  // 1200 and more, under 4096
    } else {
      CHECK_THAT(child.output, Catch::StartsWith("refused: out of budget") && Catch::Contains("600 swap files") &&
                                   Catch::Contains("at most 512") && Catch::Contains("ulimit -n") &&
                                   Catch::Contains("sub_group_size"));
      CHECK(!std::filesystem::exists(where));  // nothing left behind
    }
  }
}

TEST_CASE("a swapper's footprint, computed without creating it, is what the swapper takes", "[offload][uring]") {
  test::TempDir dir("strata-offload");
  // Sub-groups of 1000 elements cut the first tensor into a short last one; the second budget
  // fits two of the four buffers asked for.
  for (std::uint64_t budget : {std::uint64_t{1} << 30, std::uint64_t{30000}}) {
    INFO("budget " << budget);
    auto o = small_options(dir.file("rank0"), 1000, 4);
    o.budget_bytes = budget;
    const std::vector<offload::SwapTensor> tensors{{"layer 0", 2500}, {"layer 1", 7}};
    const auto f = offload::OptimizerSwapper::footprint(o, tensors);
    offload::OptimizerSwapper sw(o, tensors);
    CHECK(f.buffer_bytes == sw.buffer_bytes());
    CHECK(f.buffer_count == sw.buffer_count());
    CHECK(f.file_bytes == sw.file_bytes());
    CHECK(f.buffer_count == (budget < (1u << 20) ? 2 : 4));
  }
}

TEST_CASE("a step is pulled a sub-group at a time, in order, and a deferred generation commits or is discarded",
          "[offload][uring]") {
  test::TempDir dir("strata-offload");
  const std::vector<offload::SwapTensor> tensors = {{"layer 0", 3000}, {"layer 1", 500}, {"layer 2", 2100}};
  offload::OptimizerSwapper sw(small_options(dir.file("rank0"), 1024, 4), tensors);
  for (std::size_t t = 0; t < tensors.size(); ++t) sw.write_state(t, ramp(tensors[t].elems, 1000.0f * t).data());
  sw.commit_written();
  auto add_one = [](const offload::SubGroup& g) {
    for (std::uint64_t i = 0; i < g.elems; ++i) g.master[i] += 1.0f;
  };
  auto master_of = [&](std::size_t t) {
    std::vector<float> m(tensors[t].elems);
    sw.read_state(t, 0, m.size(), m.data());
    return m;
  };

  offload::OptimizerSwapper::StepOrder order;
  order.tensors = {2, 0, 1};
  order.defer_commit = true;
  // peek() names each sub-group before its read is waited for; take() hands it out in the
  // order's tensors, each in offset order, first and last flagged.
  std::vector<std::size_t> firsts, lasts;
  std::vector<std::uint64_t> offsets;
  {
    auto step = sw.begin_step(order);
    CHECK_THROWS_AS(sw.begin_step(), Error);  // one step at a time
    CHECK_THROWS_AS(step.put(), Error);       // nothing taken yet
    float one = 0;
    CHECK_THROWS_AS(sw.read_state(0, 0, 1, &one), Error);  // the step owns the buffers
    CHECK_THROWS_AS(sw.write_state(0, ramp(3000, 0.0f).data()), Error);
    while (auto next = step.peek()) {
      if (next->first) firsts.push_back(next->tensor);
      const offload::SubGroup g = step.take();
      CHECK(g.tensor == next->tensor);
      offsets.push_back(g.offset);
      add_one(g);
      step.put();
      if (next->last) lasts.push_back(next->tensor);
    }
    CHECK_THROWS_AS(step.take(), Error);  // past the last
    step.finish();
  }
  CHECK(firsts == std::vector<std::size_t>{2, 0, 1});
  CHECK(lasts == std::vector<std::size_t>{2, 0, 1});
  CHECK(offsets == std::vector<std::uint64_t>{0, 1024, 2048, 0, 1024, 2048, 0});
  REQUIRE(sw.pending());
  CHECK(master_of(0) == ramp(3000, 0.0f));  // the old generation is still current
  CHECK_THROWS_AS(sw.step(add_one), Error);
  CHECK_THROWS_AS(sw.write_state(0, ramp(3000, 0.0f).data()), Error);

  sw.discard_pending();  // a rolled-back step: the old state stays
  CHECK(!sw.pending());
  CHECK(master_of(0) == ramp(3000, 0.0f));
  CHECK(master_of(2) == ramp(2100, 2000.0f));

  sw.step(add_one, order);
  sw.commit_pending();
  CHECK(master_of(0) == ramp(3000, 1.0f));
  CHECK(master_of(1) == ramp(500, 1001.0f));
  CHECK(master_of(2) == ramp(2100, 2001.0f));

  // A step given up halfway (the trainer abandoned it, a sub-group in hand) drains its I/O
  // and commits nothing, deferred or not.
  for (bool defer : {true, false}) {
    order.defer_commit = defer;
    {
      auto step = sw.begin_step(order);
      add_one(step.take());
      step.put();
      add_one(step.take());
    }
    CHECK(!sw.pending());
    CHECK(master_of(0) == ramp(3000, 1.0f));
    CHECK(master_of(2) == ramp(2100, 2001.0f));
  }
  sw.step(add_one);  // the swapper still works
  CHECK(master_of(2) == ramp(2100, 2002.0f));

  // Ascending order from the first tensor not yet begun: tensor 2 is under way (its reads
  // issued), then 0 and 1 come lowest first whatever the order said.
  order.tensors = {2, 1, 0};
  order.defer_commit = false;
  {
    auto step = sw.begin_step(order);
    firsts.clear();
    bool asked = false;
    while (auto next = step.peek()) {
      if (next->first) firsts.push_back(next->tensor);
      add_one(step.take());
      step.put();
      if (!asked) step.ascending_rest();
      asked = true;
    }
    step.finish();
  }
  CHECK(firsts == std::vector<std::size_t>{2, 0, 1});
  CHECK(master_of(1) == ramp(500, 1003.0f));

  order.tensors = {0, 0, 1};
  CHECK_THROWS_AS(sw.step(add_one, order), Error);
  CHECK_THROWS_AS(sw.begin_step(order), Error);
}

TEST_CASE("a scan reads the sub-groups it names, in order, and writes nothing", "[offload][uring]") {
  test::TempDir dir("strata-offload");
  const std::vector<offload::SwapTensor> tensors = {{"layer 0", 3000}, {"layer 1", 500}, {"layer 2", 2100}};
  const int buffers = GENERATE(1, 4);
  offload::OptimizerSwapper sw(small_options(dir.file("rank0"), 1024, buffers), tensors);
  for (std::size_t t = 0; t < tensors.size(); ++t) sw.write_state(t, ramp(tensors[t].elems, 1000.0f * t).data());
  sw.commit_written();
  const auto files = [&] {  // the current generation's files as they are on disk
    std::vector<std::string> paths;
    for (std::size_t t = 0; t < tensors.size(); ++t)
      for (const auto& f : sw.sealed_files(t)) paths.push_back(f.path);
    return paths;
  };
  const std::vector<std::string> before = files();
  const auto mtime = [](const std::string& p) { return std::filesystem::last_write_time(p); };
  std::vector<std::filesystem::file_time_type> times;
  for (const auto& p : before) times.push_back(mtime(p));

  offload::OptimizerSwapper::StepOrder scan;
  scan.tensors = {2, 0};  // a subset, in any order
  scan.read_only = true;
  std::vector<std::uint64_t> offsets;
  std::vector<std::size_t> lasts;
  {
    auto s = sw.begin_step(scan);
    CHECK_THROWS_AS(sw.begin_step(), Error);  // a scan is a step: one at a time
    while (auto next = s.peek()) {
      const offload::SubGroup g = s.take();
      for (std::uint64_t i = 0; i < g.elems; ++i) {  // the state as committed
        if (g.master[i] != 1000.0f * g.tensor + static_cast<float>(g.offset + i))
          FAIL("tensor " << g.tensor << " element " << g.offset + i << " read wrong");
        g.master[i] = -1.0f;  // changed in the buffer: never written
      }
      offsets.push_back(g.offset);
      s.put();
      if (next->last) lasts.push_back(next->tensor);
    }
    s.finish();
  }
  CHECK(offsets == std::vector<std::uint64_t>{0, 1024, 2048, 0, 1024, 2048});
  CHECK(lasts == std::vector<std::size_t>{2, 0});
  CHECK(sw.stats().bytes_read == (2100 + 3000) * 12u);
  CHECK(sw.stats().bytes_written == 0);
  CHECK(!sw.pending());
  CHECK(files() == before);  // no generation switched
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(mtime(before[i]) == times[i]);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::vector<float> m(tensors[t].elems);
    sw.read_state(t, 0, m.size(), m.data());
    CHECK(m == ramp(tensors[t].elems, 1000.0f * t));
  }
  // A scan given up halfway drains its reads; the swapper steps on.
  {
    auto s = sw.begin_step(scan);
    (void)s.take();
  }
  sw.step([](const offload::SubGroup& g) {
    for (std::uint64_t i = 0; i < g.elems; ++i) g.master[i] += 1.0f;
  });
  std::vector<float> m(500);
  sw.read_state(1, 0, 500, m.data());
  CHECK(m == ramp(500, 1001.0f));
}

TEST_CASE("a first-moment scan reads only the blocks holding exp_avg, at their place in the buffer",
          "[offload][uring]") {
  test::TempDir dir("strata-offload");
  // Sub-groups of 8192 elements: 96 KiB of payload in 16 KiB blocks, exp_avg in blocks 2-3;
  // the tensor's last sub-group (1000 elements) is one block.
  const std::vector<offload::SwapTensor> tensors = {{"layer 0", 2 * 8192 + 1000}};
  offload::OptimizerSwapper sw(small_options(dir.file("rank0"), 8192, 2), tensors);
  const std::uint64_t n = tensors[0].elems;
  sw.write_state(0, ramp(n, 0.0f).data(), ramp(n, 0.5f).data(), ramp(n, 0.25f).data());
  sw.commit_written();
  offload::OptimizerSwapper::StepOrder scan;
  scan.read_only = true;
  scan.first_moment_only = true;
  std::uint64_t seen = 0;
  {
    auto s = sw.begin_step(scan);
    while (s.peek()) {
      const offload::SubGroup g = s.take();
      const auto* m = static_cast<const float*>(g.exp_avg);
      for (std::uint64_t i = 0; i < g.elems; ++i)
        if (m[i] != 0.5f + static_cast<float>(g.offset + i))
          FAIL("exp_avg of element " << g.offset + i << " read wrong");
      seen += g.elems;
      s.put();
    }
    s.finish();
  }
  CHECK(seen == n);
  CHECK(sw.stats().bytes_read == 2 * (32u << 10) + 12u * 1000);
  CHECK(sw.stats().bytes_written == 0);
  offload::OptimizerSwapper::StepOrder not_a_scan;
  not_a_scan.first_moment_only = true;
  CHECK_THROWS_AS(sw.begin_step(not_a_scan), Error);
}
