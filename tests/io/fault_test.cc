// Faults on real files, each ending in a clear error (path, offset, length, errno text)
// and no damage to data outside the failed request: end of file, a file size limit
// (EFBIG), a full filesystem (ENOSPC), a directory the user cannot write (EACCES), and
// filesystems without O_DIRECT (buffered fallback with one warning naming the path).
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "io/aligned.h"
#include "io/engine.h"
#include "io/swap_file.h"
#include "tests/io/io_test_util.h"
#include "tests/support/child.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::test;

namespace {

// Drops to an unprivileged uid/gid (root bypasses permission bits); no-op for non-root.
std::string drop_privileges() {
  if (geteuid() != 0) return {};
  if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) {
    return std::string("cannot drop to uid 65534: ") + std::strerror(errno);
  }
  return {};
}

}  // namespace

TEST_CASE("reading past the end of a file fails naming the path, offset and length", "[uring][negative]") {
  TempDir dir;
  auto engine = make_engine();
  auto file = open_file(engine, dir.file("short"));
  io::AlignedBuffer buf(64 << 10);
  fill_pattern(buf.data(), 10000, 3);
  REQUIRE(engine.write(file, 0, buf.data(), 10000).wait().ok());
  const io::IoResult r = engine.read(file, 0, buf.data(), 64 << 10).wait();
  CHECK(r.err == -ENODATA);
  CHECK_THAT(r.message, Catch::Contains(dir.file("short")) && Catch::Contains("offset") && Catch::Contains("length") &&
                            Catch::Contains("end of file"));
  CHECK(first_mismatch(buf.data(), 10000, 3) == -1);  // what exists was read
}

TEST_CASE("requests on a closed file fail with EBADF instead of crashing", "[uring][negative]") {
  auto engine = make_engine();
  io::File none;
  char b[16];
  const io::IoResult r = engine.read(none, 0, b, sizeof b).wait();
  CHECK(r.err == -EBADF);
  CHECK_THAT(r.message, Catch::Contains("not open"));
  CHECK(engine.write(none, 0, b, 0).wait().err == -EBADF);
}

TEST_CASE("a write past the file size limit fails with EFBIG and earlier data survives", "[uring][negative]") {
  TempDir dir;
  io::EngineOptions o;
  o.block_bytes = 64 << 10;
  auto engine = make_engine(o);
  auto file = open_file(engine, dir.file("big"));
  constexpr std::uint64_t kMiB = 1 << 20;
  // The limit cuts a 64 KiB piece after 12 KiB: the kernel writes those (a short write),
  // the engine resubmits the remainder, and that fails with EFBIG.
  constexpr std::uint64_t kLimit = kMiB + kMiB / 2 + 12288;
  io::AlignedBuffer buf(kMiB);
  fill_pattern(buf.data(), kMiB, 1);
  REQUIRE(engine.write(file, 0, buf.data(), kMiB).wait().ok());
  io::IoResult r;
  {
    FileSizeLimit limit(kLimit);
    fill_pattern(buf.data(), kMiB, 2, kMiB);
    r = engine.write(file, kMiB, buf.data(), kMiB).wait();
  }
  CHECK(r.err == -EFBIG);
  CHECK_THAT(r.message, Catch::Contains(dir.file("big")) && Catch::Contains("EFBIG") &&
                            Catch::Contains("at offset " + std::to_string(kLimit)) && Catch::Contains("ulimit -f"));
  CHECK(engine.stats().short_transfers >= 1);
  auto size = file.size();
  REQUIRE(size.ok());
  CHECK(*size == kLimit);  // stopped exactly at the limit
  REQUIRE(engine.read(file, 0, buf.data(), kMiB).wait().ok());
  CHECK(first_mismatch(buf.data(), kMiB, 1) == -1);
  REQUIRE(engine.read(file, kMiB, buf.data(), kLimit - kMiB).wait().ok());
  CHECK(first_mismatch(buf.data(), kLimit - kMiB, 2, kMiB) == -1);

  // A swap file that cannot reach its size is refused at creation.
  {
    FileSizeLimit limit(kMiB);
    io::SwapSpec spec;
    spec.element_count = kMiB;  // 4 MiB of fp32
    spec.block_bytes = 64 << 10;
    auto swap = io::SwapFile::create(engine, dir.file("swap"), spec);
    CHECK_FALSE(swap.ok());
    CHECK(swap.status().err() == -EFBIG);
    CHECK_THAT(swap.status().message(), Catch::Contains(dir.file("swap")));
  }
}

TEST_CASE("a full filesystem fails with ENOSPC naming the file, and earlier data survives",
          "[uring][mount][negative]") {
  TempDir dir;
  const ChildResult child = run_in_child([&]() -> std::string {
    if (std::string why = enter_private_mount_namespace(); !why.empty()) return "setup: " + why;
    if (mount("strata-full", dir.path().c_str(), "tmpfs", 0, "size=1m") != 0) {
      return std::string("setup: mount tmpfs: ") + std::strerror(errno);
    }
    auto engine = io::Engine::create();
    if (!engine) return "setup: " + engine.status().message();
    auto file = engine->open(dir.file("full"), io::OpenOptions{io::Access::read_write, true});
    if (!file) return "setup: " + file.status().message();
    io::AlignedBuffer buf(2 << 20);
    fill_pattern(buf.data(), 512 << 10, 1);
    if (!engine->write(*file, 0, buf.data(), 512 << 10).wait().ok()) return "setup: first write failed";
    fill_pattern(buf.data(), 2 << 20, 2, 512 << 10);
    const io::IoResult r = engine->write(*file, 512 << 10, buf.data(), 2 << 20).wait();
    std::memset(buf.data(), 0, 512 << 10);
    const bool intact =
        engine->read(*file, 0, buf.data(), 512 << 10).wait().ok() && first_mismatch(buf.data(), 512 << 10, 1) == -1;
    return "err=" + std::to_string(r.err) + " intact=" + std::to_string(intact) + " message=" + r.message;
  });
  INFO(child.output);
  REQUIRE(child.exit_code == 0);
  CHECK_THAT(child.output, Catch::StartsWith("err=" + std::to_string(-ENOSPC) + " intact=1"));
  CHECK_THAT(child.output, Catch::Contains(dir.file("full")) && Catch::Contains("ENOSPC") &&
                               Catch::Contains("offset") && Catch::Contains("free space"));
}

TEST_CASE("a directory the user cannot write is refused with EACCES naming the path", "[uring][negative]") {
  TempDir dir;
  const std::string ro = dir.file("read-only");
  REQUIRE(mkdir(ro.c_str(), 0555) == 0);
  REQUIRE(chmod(dir.path().c_str(), 0755) == 0);  // mkdtemp makes 0700: let the child in
  const ChildResult child = run_in_child([&]() -> std::string {
    if (std::string why = drop_privileges(); !why.empty()) return "setup: " + why;
    auto engine = io::Engine::create();
    if (!engine) return "setup: " + engine.status().message();
    io::SwapSpec spec;
    spec.element_count = 1000;
    auto swap = io::SwapFile::create(*engine, ro + "/params.swap", spec);
    if (swap.ok()) return "created a swap file in a read-only directory";
    return "err=" + std::to_string(swap.status().err()) + " message=" + swap.status().message();
  });
  INFO(child.output);
  REQUIRE(child.exit_code == 0);
  CHECK_THAT(child.output, Catch::StartsWith("err=" + std::to_string(-EACCES)));
  CHECK_THAT(child.output,
             Catch::Contains(ro + "/params.swap") && Catch::Contains("EACCES") && Catch::Contains("writ"));
  CHECK_FALSE(std::filesystem::exists(ro + "/params.swap"));
}

TEST_CASE("a filesystem without O_DIRECT falls back to buffered I/O with one warning naming the path",
          "[uring][mount]") {
  TempDir dir;
  // ramfs has no direct I/O at all (tmpfs gained it in Linux 6.6).
  const ChildResult child = run_in_child([&]() -> std::string {
    if (std::string why = enter_private_mount_namespace(); !why.empty()) return "setup: " + why;
    if (mount("strata-ramfs", dir.path().c_str(), "ramfs", 0, nullptr) != 0) {
      return std::string("setup: mount ramfs: ") + std::strerror(errno);
    }
    WarningCatcher warnings;
    auto engine = io::Engine::create();
    if (!engine) return "setup: " + engine.status().message();
    const std::string path = dir.file("swap");
    auto file = engine->open(path, io::OpenOptions{io::Access::read_write, true});
    if (!file) return "open failed: " + file.status().message();
    auto again = engine->open(path, io::OpenOptions{io::Access::read_write, true});
    if (!again) return "second open failed: " + again.status().message();
    constexpr std::uint64_t kBytes = (1 << 20) + 333;
    io::AlignedBuffer src(kBytes), dst(kBytes);
    fill_pattern(src.data(), kBytes, 4);
    if (!engine->write(*file, 0, src.data(), kBytes).wait().ok()) return "write failed";
    if (!engine->read(*again, 0, dst.data(), kBytes).wait().ok()) return "read failed";
    const bool same = first_mismatch(dst.data(), kBytes, 4) == -1;
    return "direct=" + std::to_string(file->direct()) + " same=" + std::to_string(same) +
           " warnings=" + std::to_string(warnings.messages().size()) + " text=" + warnings.joined();
  });
  INFO(child.output);
  REQUIRE(child.exit_code == 0);
  CHECK_THAT(child.output, Catch::StartsWith("direct=0 same=1 warnings=1 "));
  CHECK_THAT(child.output, Catch::Contains(dir.file("swap")) && Catch::Contains("O_DIRECT"));
}

TEST_CASE("files on /dev/shm work with or without O_DIRECT, warning when it is refused", "[uring]") {
  if (!std::filesystem::is_directory("/dev/shm")) {
    WARN("no /dev/shm here; nothing to check");
    return;
  }
  char templ[] = "/dev/shm/strata-io-XXXXXX";
  REQUIRE(mkdtemp(templ) != nullptr);
  const std::string path = std::string(templ) + "/f";
  {
    WarningCatcher warnings;
    auto engine = make_engine();
    auto file = open_file(engine, path);
    constexpr std::uint64_t kBytes = 200001;
    io::AlignedBuffer src(kBytes), dst(kBytes);
    fill_pattern(src.data(), kBytes, 6);
    CHECK(engine.write(file, 0, src.data(), kBytes).wait().ok());
    CHECK(engine.read(file, 0, dst.data(), kBytes).wait().ok());
    CHECK(first_mismatch(dst.data(), kBytes, 6) == -1);
    INFO("direct on /dev/shm: " << file.direct() << "; warnings: " << warnings.joined());
    if (file.direct()) {
      CHECK(warnings.messages().empty());  // tmpfs takes O_DIRECT since Linux 6.6
    } else {
      REQUIRE(warnings.messages().size() == 1);
      CHECK_THAT(warnings.messages()[0], Catch::Contains(path) && Catch::Contains("O_DIRECT"));
    }
  }
  std::filesystem::remove_all(templ);
}
