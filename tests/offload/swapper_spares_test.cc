// The swapper with fewer spare files than sub-groups (offload_optimizer.spare_sub_groups): the
// files it makes and their bytes, the same state as two generations step for step, early
// commits only when a length's spares are all in use (so a step that fits its spares is still
// all or nothing), a deferred step that waits for the caller's decision, files that mix two
// states refused by name until a load replaces them, and a checkpoint's links left intact.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "offload/optimizer_swapper.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using test::error_of;

namespace {

offload::SwapperOptions options_in(const std::string& dir, std::uint64_t spares) {
  offload::SwapperOptions o;
  o.dir = dir;
  o.sub_group_elems = 2048;
  o.buffer_count = 3;
  o.queue_depth = 8;
  o.block_bytes = 4096;  // several checksum blocks per sub-group
  o.spare_sub_groups = spares;
  return o;
}

// An update whose result depends on the state it reads, so a sub-group stepped from the wrong
// file or skipped shows.
void update(const offload::SubGroup& g) {
  auto* m = static_cast<float*>(g.exp_avg);
  auto* v = static_cast<float*>(g.exp_avg_sq);
  for (std::uint64_t i = 0; i < g.elems; ++i) {
    m[i] = 0.5f * m[i] + g.master[i];
    v[i] += static_cast<float>(g.offset + i) * 0.25f;
    g.master[i] = 0.75f * g.master[i] - 0.125f * m[i] + 1.0f;
  }
}

struct State {
  std::vector<float> master, m, v;
  bool operator==(const State&) const = default;
};

State read_all(offload::OptimizerSwapper& sw, std::size_t t, std::uint64_t n) {
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  sw.read_state(t, 0, n, s.master.data(), s.m.data(), s.v.data());
  return s;
}

std::vector<float> ramp(std::uint64_t n, float base) {
  std::vector<float> v(n);
  for (std::uint64_t i = 0; i < n; ++i) v[i] = base + 0.5f * static_cast<float>(i % 97);
  return v;
}

std::uint64_t bytes_on_disk(const std::string& dir, std::uint64_t* files) {
  std::uint64_t n = 0;
  *files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    n += e.file_size();
    ++*files;
  }
  return n;
}

std::string bytes_of(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void flip_a_byte(const std::string& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8192 + 4096 + 17);  // past the header and the checksum table: block 1 of the payload
  f.put('\x5a');
}

}  // namespace

TEST_CASE("spare files: the state once plus n spares per sub-group length, as computed and as made",
          "[offload][uring][spares]") {
  test::TempDir dir("strata-spares");
  // Sub-group lengths: 2048, 2048, 904 | 300 | 2048, 452: four lengths, three of one of them.
  const std::vector<offload::SwapTensor> tensors = {{"layer 0", 5000}, {"layer 1", 300}, {"layer 2", 2500}};
  for (const std::uint64_t spares : {0, 1, 2, 5}) {
    INFO("spare_sub_groups " << spares);
    const auto o = options_in(dir.file("rank" + std::to_string(spares)), spares);
    const auto f = offload::OptimizerSwapper::footprint(o, tensors);
    // 6 sub-groups; spares per length: min(n, sub-groups of that length), all of them for n = 0.
    const std::uint64_t want = spares == 0 ? 12 : 6 + std::min<std::uint64_t>(spares, 3) + 3;
    CHECK(f.file_count == want);
    offload::OptimizerSwapper sw(o, tensors);
    std::uint64_t files = 0;
    CHECK(bytes_on_disk(o.dir, &files) == f.file_bytes);
    CHECK(files == want);
    CHECK(sw.file_bytes() == f.file_bytes);
    CHECK(sw.all_files().size() == want);
  }
}

TEST_CASE("spare files: every count of spares steps to the bits of two generations", "[offload][uring][spares]") {
  test::TempDir dir("strata-spares");
  const std::vector<offload::SwapTensor> tensors = {{"layer 0", 7000}, {"layer 1", 300}, {"layer 2", 4096}};
  std::vector<std::vector<State>> runs;  // per spares: each tensor's state after the steps
  for (const std::uint64_t spares : {0, 1, 2}) {
    offload::OptimizerSwapper sw(options_in(dir.file("rank" + std::to_string(spares)), spares), tensors);
    for (std::size_t t = 0; t < tensors.size(); ++t) sw.write_state(t, ramp(tensors[t].elems, 3.0f * t).data());
    sw.commit_written();
    for (int s = 0; s < 3; ++s) sw.step(update);
    // A deferred step that the caller drops once it is decided against, and one it keeps.
    for (const bool keep : {false, true}) {
      offload::OptimizerSwapper::StepOrder order;
      order.defer_commit = true;
      auto step = sw.begin_step(order);
      while (step.peek()) {
        if (!step.room()) {
          REQUIRE(keep);  // only the kept step is let past a length whose spares are all lent
          step.allow_commit();
        }
        update(step.take());
        step.put();
        if (!keep && spares != 0) break;  // undone before its spares ran out: nothing committed
      }
      if (keep) {
        step.finish();
        sw.commit_pending();
      }
    }
    std::vector<State> got;
    for (std::size_t t = 0; t < tensors.size(); ++t) got.push_back(read_all(sw, t, tensors[t].elems));
    runs.push_back(std::move(got));
  }
  CHECK(runs[1] == runs[0]);
  CHECK(runs[2] == runs[0]);
}

TEST_CASE(
    "spare files: a step that fits its spares fails as a whole; one that commits early leaves files that are "
    "refused until a load",
    "[offload][uring][spares][negative]") {
  test::TempDir dir("strata-spares");
  SECTION("enough spares: a full device mid-step keeps the last good state") {
    // Two sub-groups of 2048 and one of 904: two spares cover every length.
    offload::OptimizerSwapper sw(options_in(dir.file("rank0"), 2), {{"layer 0", 5000}});
    sw.write_state(0, ramp(5000, 1.0f).data());
    sw.commit_written();
    sw.step(update);
    const State good = read_all(sw, 0, 5000);
    std::string m;
    {
      test::FileSizeLimit limit(8192);  // every write of swap data fails
      m = error_of([&] { sw.step(update); });
    }
    INFO(m);
    CHECK(m.find("EFBIG") != std::string::npos);
    CHECK(read_all(sw, 0, 5000) == good);
    sw.step(update);  // and the next step works
    // A damaged last sub-group fails the step after the first two were written (queued or
    // landed): with a spare for each, none of them committed.
    const State before = read_all(sw, 0, 5000);
    flip_a_byte(sw.file_of(0, 4500));
    CHECK(error_of([&] { sw.step(update); }).find("checksum mismatch") != std::string::npos);
    State head = read_all(sw, 0, 4096), want = before;
    for (auto* v : {&want.master, &want.m, &want.v}) v->resize(4096);
    CHECK(head == want);
    CHECK(error_of([&] { sw.step(update); }).find("mixes two states") == std::string::npos);
  }
  SECTION("one spare for three sub-groups of a length: a failure after the first commit") {
    offload::OptimizerSwapper sw(options_in(dir.file("rank0"), 1), {{"layer 0", 6144}});
    offload::OptimizerSwapper ref(options_in(dir.file("ref"), 0), {{"layer 0", 6144}});
    for (auto* s : {&sw, &ref}) {
      s->write_state(0, ramp(6144, 1.0f).data());
      s->commit_written();
    }
    // Sub-group 2's committed file is damaged: the step has committed sub-group 0 to make room
    // for sub-group 1 by the time it reads it.
    flip_a_byte(sw.file_of(0, 5000));
    const std::string failed = error_of([&] { sw.step(update); });
    CHECK(failed.find("checksum mismatch") != std::string::npos);
    for (const auto& refused : {error_of([&] { sw.step(update); }), error_of([&] { (void)read_all(sw, 0, 6144); }),
                                error_of([&] { (void)sw.sealed_files(0); })}) {
      INFO(refused);
      CHECK(refused.find("mixes two states") != std::string::npos);
      CHECK(refused.find("after 1 of its 3 sub-groups") != std::string::npos);
      CHECK(refused.find("checksum mismatch") != std::string::npos);  // why
      CHECK(refused.find("offload_optimizer.spare_sub_groups = 1") != std::string::npos);
      CHECK(refused.find("resume from the last checkpoint") != std::string::npos);
    }
    // A load replaces the whole state: the swapper is whole again and steps as the reference.
    sw.write_state(0, ramp(6144, 1.0f).data());
    sw.commit_written();
    for (int s = 0; s < 2; ++s) {
      sw.step(update);
      ref.step(update);
    }
    CHECK(read_all(sw, 0, 6144) == read_all(ref, 0, 6144));
  }
  SECTION("a deferred step may not commit early until allowed, and undoing one that did leaves mixed files") {
    offload::OptimizerSwapper sw(options_in(dir.file("rank0"), 1), {{"layer 0", 6144}});
    offload::OptimizerSwapper ref(options_in(dir.file("ref"), 0), {{"layer 0", 6144}});
    for (auto* s : {&sw, &ref}) {
      s->write_state(0, ramp(6144, 1.0f).data());
      s->commit_written();
    }
    offload::OptimizerSwapper::StepOrder order;
    order.defer_commit = true;
    {
      auto step = sw.begin_step(order);
      REQUIRE(step.peek());
      CHECK(step.room());
      update(step.take());
      step.put();
      REQUIRE(step.peek());
      CHECK_FALSE(step.room());  // the one spare holds sub-group 0's undecided state
      update(step.take());
      CHECK(error_of([&] { step.put(); }).find("allow_commit") != std::string::npos);
      step.allow_commit();  // refused before anything changed: once allowed, the step goes on
      step.put();
      while (step.peek()) {
        update(step.take());
        step.put();
      }
      step.finish();
    }
    sw.commit_pending();
    ref.step(update);
    CHECK(read_all(sw, 0, 6144) == read_all(ref, 0, 6144));
    const State before = read_all(sw, 0, 6144);
    auto step = sw.begin_step(order);
    while (step.peek()) {
      if (!step.room()) step.allow_commit();
      update(step.take());
      step.put();
    }
    step.finish();
    CHECK(read_all(sw, 0, 6144) != before);  // sub-groups committed early are read as they are now
    sw.discard_pending();
    CHECK(error_of([&] { sw.step(update); }).find("a step that had begun to commit was undone") != std::string::npos);
  }
  SECTION("a step given up after it began to commit leaves mixed files") {
    offload::OptimizerSwapper sw(options_in(dir.file("rank0"), 1), {{"layer 0", 6144}});
    sw.write_state(0, ramp(6144, 1.0f).data());
    sw.commit_written();
    {
      auto step = sw.begin_step();
      for (int k = 0; k < 2; ++k) {  // sub-group 1's put() commits sub-group 0 to free a spare
        REQUIRE(step.peek());
        update(step.take());
        step.put();
      }
    }  // the caller gives the step up (an update threw, say)
    const std::string m = error_of([&] { (void)read_all(sw, 0, 6144); });
    CHECK(m.find("mixes two states: a step ended before it was complete (given up) after 1 of its 3") !=
          std::string::npos);
  }
}

TEST_CASE("spare files: a checkpoint's hard links keep their bytes while spares rotate through them",
          "[offload][uring][spares]") {
  test::TempDir dir("strata-spares");
  offload::OptimizerSwapper sw(options_in(dir.file("rank0"), 1), {{"layer 0", 6144}, {"layer 1", 300}});
  sw.write_state(0, ramp(6144, 1.0f).data());
  sw.write_state(1, ramp(300, 2.0f).data());
  sw.commit_written();
  sw.step(update);
  std::vector<std::string> paths, linked, before;
  for (std::size_t t = 0; t < 2; ++t) {
    for (const auto& f : sw.sealed_files(t)) {
      paths.push_back(f.path);
      linked.push_back(f.path + ".ckpt");
      std::filesystem::create_hard_link(f.path, linked.back());
      before.push_back(bytes_of(f.path));
    }
  }
  for (int s = 0; s < 4; ++s) sw.step(update);  // every linked file becomes a spare and is written again
  std::size_t rewritten = 0;
  for (std::size_t i = 0; i < linked.size(); ++i) {
    CHECK(bytes_of(linked[i]) == before[i]);
    rewritten += bytes_of(paths[i]) != before[i] ? 1 : 0;  // a new inode under the old path
  }
  CHECK(rewritten == linked.size());
}
