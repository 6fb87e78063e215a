// Nothing leaks: after engines, files, pools and swap files are created, used, made to
// fail and destroyed, the process has the same open descriptors and threads as before.
// (Memory is checked by the AddressSanitizer stage of scripts/test.sh.)
#include <dirent.h>
#include <sys/stat.h>

#include <filesystem>

#include "io/aligned.h"
#include "io/buffer_pool.h"
#include "io/swap_file.h"
#include "tests/io/io_test_util.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::test;

namespace {

std::size_t count_entries(const char* dir) {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

void exercise(const TempDir& dir) {
  io::EngineOptions o;
  o.block_bytes = 64 << 10;
  auto engine = make_engine(o);
  auto pool_result = io::BufferPool::create(&engine, io::PoolOptions{256 << 10, 2});
  REQUIRE(pool_result.ok());
  auto buf = pool_result->acquire();
  fill_pattern(buf.data(), buf.bytes(), 1);
  auto file = open_file(engine, dir.file("plain"));
  REQUIRE(engine.write(file, 0, buf.data(), buf.bytes()).wait().ok());
  CHECK(engine.read(file, 0, buf.data(), buf.bytes() * 2).wait().err == -ENODATA);  // failed request
  CHECK_FALSE(engine.open(dir.file("missing/dir/f"), io::OpenOptions{io::Access::read_write, true}).ok());
  io::SwapSpec spec;
  spec.element_count = 100000;
  spec.block_bytes = 64 << 10;
  {
    auto swap = io::SwapFile::create(engine, dir.file("s.swap"), spec);
    REQUIRE(swap.ok());
    io::AlignedBuffer data(swap->layout().payload_bytes);
    REQUIRE(swap->swap_out(data.data()).wait().ok());
    REQUIRE(swap->swap_in(data.data()).wait().ok());
  }
  std::filesystem::resize_file(dir.file("s.swap"), 5000);
  CHECK_FALSE(io::SwapFile::open(engine, dir.file("s.swap")).ok());  // refused: truncated
  auto survivor = open_file(engine, dir.file("survivor"));
  // file, survivor and the pool outlive the engine only until the end of this scope;
  // destroy the engine first to check that order too.
  engine = make_engine(o);
}

}  // namespace

TEST_CASE("engines, files, pools and swap files release every descriptor and thread", "[uring][regression]") {
  TempDir dir;
  exercise(dir);  // warm-up: lazily opened library descriptors (if any) are counted before
  const std::size_t fds = count_entries("/proc/self/fd");
  const std::size_t threads = count_entries("/proc/self/task");
  for (int i = 0; i < 3; ++i) exercise(dir);
  CHECK(count_entries("/proc/self/fd") == fds);
  CHECK(count_entries("/proc/self/task") == threads);
}
