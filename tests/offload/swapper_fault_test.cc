// The swapper's faults: a flipped byte in a swap file (the error names the tensor, the file
// and the block), a full device mid-step (RLIMIT_FSIZE: the step fails, the last good state
// stays readable and the next step works), and swap directories that cannot be created.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "offload/optimizer_swapper.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using test::error_of;

namespace {

offload::SwapperOptions options_in(const std::string& dir) {
  offload::SwapperOptions o;
  o.dir = dir;
  o.sub_group_elems = 2048;
  o.buffer_count = 3;
  o.queue_depth = 8;
  o.block_bytes = 4096;  // several checksum blocks per sub-group
  return o;
}

void add_one(const offload::SubGroup& g) {
  for (std::uint64_t i = 0; i < g.elems; ++i) g.master[i] += 1.0f;
}

}  // namespace

TEST_CASE("a flipped byte in a swap file fails the step naming the tensor, the file and the block",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  offload::OptimizerSwapper sw(options_in(dir.file("rank0")), {{"layer 7", 5000}});
  std::vector<float> init(5000, 0.5f);
  sw.write_state(0, init.data());
  sw.commit_written();
  // Element 3000 is in sub-group 1 (elements [2048, 4096)): its file holds 3 x 2048 floats
  // in 4 KiB blocks after a 4 KiB header and a 4 KiB checksum table; corrupt block 2.
  const std::string file = sw.file_of(0, 3000);
  REQUIRE(!file.empty());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192 + 2 * 4096 + 17);
    f.put('\x5a');
  }
  Errc code = Errc::internal;
  std::string m;
  try {
    sw.step(add_one);
  } catch (const Error& e) {
    code = e.code();
    m = e.what();
  }
  INFO(m);
  CHECK(code == Errc::corrupt);
  CHECK(m.find("layer 7") != std::string::npos);
  CHECK(m.find("sub-group 1") != std::string::npos);
  CHECK(m.find(file) != std::string::npos);
  CHECK(m.find("block 2 of") != std::string::npos);
  CHECK(m.find("checksum mismatch") != std::string::npos);
}

TEST_CASE("a full device fails the step with a clear error and keeps the last good state",
          "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  offload::OptimizerSwapper sw(options_in(dir.file("rank0")), {{"layer 0", 5000}, {"layer 1", 300}});
  std::vector<float> a(5000, 1.0f), b(300, 10.0f);
  sw.write_state(0, a.data());
  sw.write_state(1, b.data());
  sw.commit_written();
  sw.step(add_one);  // last good state: 2 and 11
  std::string m;
  {
    // Writes of swap data start at offset 8192: every write-back of this step fails (EFBIG),
    // while the reads still work.
    test::FileSizeLimit limit(8192);
    m = error_of([&] { sw.step(add_one); });
  }
  INFO(m);
  CHECK(m.find("EFBIG") != std::string::npos);
  CHECK(m.find("file size limit") != std::string::npos);
  CHECK(m.find("on the NVMe tier") != std::string::npos);
  std::vector<float> got0(5000), got1(300);
  sw.read_state(0, 0, 5000, got0.data());
  sw.read_state(1, 0, 300, got1.data());
  CHECK(got0 == std::vector<float>(5000, 2.0f));
  CHECK(got1 == std::vector<float>(300, 11.0f));
  sw.step(add_one);  // the device has room again
  sw.read_state(0, 0, 5000, got0.data());
  CHECK(got0 == std::vector<float>(5000, 3.0f));
}

TEST_CASE("a linked generation whose replacement cannot be made leaves the swapper usable and the link's bytes",
          "[offload][uring][negative][regression]") {
  // Before: the old file was closed and unlinked before its replacement was made, so a full
  // filesystem left a null file behind and the next step or load crashed.
  test::TempDir dir("strata-offload");
  offload::OptimizerSwapper sw(options_in(dir.file("rank0")), {{"layer 0", 5000}});
  std::vector<float> a(5000, 1.0f);
  sw.write_state(0, a.data());
  sw.commit_written();
  // A checkpoint links the current generation (as a save does), then a step writes the other.
  std::vector<std::string> linked;
  for (const auto& f : sw.sealed_files(0)) {
    linked.push_back(f.path + ".ckpt");
    std::filesystem::create_hard_link(f.path, linked.back());
  }
  auto bytes_of = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  std::vector<std::string> before;
  for (const auto& l : linked) before.push_back(bytes_of(l));
  sw.step(add_one);  // 2, into the unlinked generation
  std::string m;
  {
    test::FileSizeLimit limit(8192);  // the linked generation's replacement cannot be reserved
    m = error_of([&] { sw.step(add_one); });
  }
  INFO(m);
  CHECK(m.find("a checkpoint hard-linked this file") != std::string::npos);
  for (std::size_t i = 0; i < linked.size(); ++i) CHECK(bytes_of(linked[i]) == before[i]);
  std::vector<float> got(5000);
  sw.read_state(0, 0, 5000, got.data());
  CHECK(got == std::vector<float>(5000, 2.0f));  // the last good state
  sw.step(add_one);                              // with room again: the replacement is made and the step lands
  sw.write_state(0, got.data());                 // and a load's write goes to the other generation
  sw.commit_written();
  sw.read_state(0, 0, 5000, got.data());
  CHECK(got == std::vector<float>(5000, 2.0f));
  for (std::size_t i = 0; i < linked.size(); ++i) CHECK(bytes_of(linked[i]) == before[i]);
}

TEST_CASE("a swap directory that cannot be created is refused at setup, naming the key", "[offload][uring][negative]") {
  test::TempDir dir("strata-offload");
  { std::ofstream(dir.file("plain-file")) << "not a directory"; }
  // Root ignores permission bits: a file standing where a directory is expected, and /proc,
  // refuse even root.
  for (const std::string& bad : {dir.file("plain-file") + "/rank0", std::string("/proc/strata-offload-test/rank0")}) {
    const std::string m = error_of([&] { offload::OptimizerSwapper sw(options_in(bad), {{"layer 0", 100}}); });
    INFO(bad << ": " << m);
    CHECK(m.find("offload_optimizer.nvme_path") != std::string::npos);
    CHECK(m.find(bad) != std::string::npos);
  }
}
