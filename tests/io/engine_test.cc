// The io_uring engine on real files under /var/tmp (a disk: O_DIRECT works): round trips
// of any size and alignment, queue depths 1..128, batching, fixed files and buffers,
// SQPOLL, callbacks and multi-waits, and many concurrent requests.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "io/aligned.h"
#include "io/engine.h"
#include "tests/io/io_test_util.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::test;

namespace {

constexpr std::uint32_t kBlock = 64 << 10;

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return static_cast<std::uint64_t>(st.st_size);
}

}  // namespace

TEST_CASE("regions of any size round-trip through a direct file, tail included", "[uring][boundary]") {
  const std::uint64_t bytes =
      GENERATE(1, 511, 4095, 4096, 4097, 65535, kBlock - 1, kBlock, kBlock + 1, 3 * kBlock + 4097 + 123);
  CAPTURE(bytes);
  TempDir dir;
  io::EngineOptions o;
  o.block_bytes = kBlock;
  o.queue_depth = 4;
  auto engine = make_engine(o);
  auto file = open_file(engine, dir.file("f"));
  INFO("direct: " << file.direct());
  io::AlignedBuffer src(bytes), dst(bytes);
  fill_pattern(src.data(), bytes, 7);
  const io::IoResult& w = engine.write(file, 0, src.data(), bytes).wait();
  INFO(w.message);
  REQUIRE(w.ok());
  CHECK(w.bytes == bytes);
  CHECK(file_size(dir.file("f")) == bytes);  // nothing written past the region
  const io::IoResult& r = engine.read(file, 0, dst.data(), bytes).wait();
  INFO(r.message);
  REQUIRE(r.ok());
  CHECK(r.bytes == bytes);
  CHECK(first_mismatch(dst.data(), bytes, 7) == -1);
}

TEST_CASE("unaligned offsets and buffers round-trip without touching neighbouring bytes", "[uring][boundary]") {
  TempDir dir;
  auto engine = make_engine();
  auto file = open_file(engine, dir.file("f"));
  constexpr std::uint64_t kFile = 256 << 10;
  io::AlignedBuffer base(kFile);
  fill_pattern(base.data(), kFile, 1);
  REQUIRE(engine.write(file, 0, base.data(), kFile).wait().ok());

  struct Region {
    std::uint64_t offset, bytes, buf_shift;
  };
  const Region regions[] = {{1, 100, 0},       {4095, 2, 3},        {8192, 4096 * 3 + 5, 1},
                            {40000, 70001, 0}, {131072, 65536, 17}, {kFile - 3, 3, 0}};
  io::AlignedBuffer scratch(kFile + 4096);
  for (const Region& g : regions) {
    std::byte* p = scratch.data() + g.buf_shift;
    fill_pattern(p, g.bytes, 2, g.offset);
    const io::IoResult& w = engine.write(file, g.offset, p, g.bytes).wait();
    INFO(w.message);
    REQUIRE(w.ok());
  }
  io::AlignedBuffer all(kFile);
  REQUIRE(engine.read(file, 0, all.data(), kFile).wait().ok());
  for (std::uint64_t pos = 0; pos < kFile; ++pos) {
    bool in_region = false;
    for (const Region& g : regions) in_region |= pos >= g.offset && pos < g.offset + g.bytes;
    const std::byte want = pattern_byte(in_region ? 2 : 1, pos);
    if (all.data()[pos] != want) FAIL("byte " << pos << " differs (in a written region: " << in_region << ")");
  }
  // Reads at unaligned offsets into unaligned buffers.
  for (const Region& g : regions) {
    std::byte* p = scratch.data() + g.buf_shift + 1;
    REQUIRE(engine.read(file, g.offset, p, g.bytes).wait().ok());
    CHECK(first_mismatch(p, g.bytes, 2, g.offset) == -1);
  }
}

TEST_CASE("queue depths from 1 to 128 keep exactly that many pieces in flight", "[uring]") {
  const unsigned qd = GENERATE(1u, 2u, 3u, 8u, 32u, 64u, 128u);
  CAPTURE(qd);
  TempDir dir;
  io::EngineOptions o;
  o.queue_depth = qd;
  o.block_bytes = 4096;
  o.submit_batch = 4;
  auto engine = make_engine(o);
  auto file = open_file(engine, dir.file("f"));
  const std::uint64_t bytes = 2ull * qd * 4096 + 777;  // two rounds of pieces and a tail
  io::AlignedBuffer src(bytes), dst(bytes);
  fill_pattern(src.data(), bytes, qd);
  REQUIRE(engine.write(file, 0, src.data(), bytes).wait().ok());
  REQUIRE(engine.read(file, 0, dst.data(), bytes).wait().ok());
  CHECK(first_mismatch(dst.data(), bytes, qd) == -1);
  const io::EngineStats s = engine.stats();
  CHECK(s.max_in_flight == qd);
  CHECK(s.pieces >= 2 * (2ull * qd + 1));
}

TEST_CASE("submission batches from 1 to the queue depth move the same data", "[uring]") {
  const unsigned batch = GENERATE(1u, 3u, 16u, 64u);
  CAPTURE(batch);
  TempDir dir;
  io::EngineOptions o;
  o.queue_depth = 16;
  o.block_bytes = 8192;
  o.submit_batch = batch;
  auto engine = make_engine(o);
  auto file = open_file(engine, dir.file("f"));
  const std::uint64_t bytes = 100 * 8192 + 5;
  io::AlignedBuffer src(bytes), dst(bytes);
  fill_pattern(src.data(), bytes, batch);
  REQUIRE(engine.write(file, 0, src.data(), bytes).wait().ok());
  REQUIRE(engine.read(file, 0, dst.data(), bytes).wait().ok());
  CHECK(first_mismatch(dst.data(), bytes, batch) == -1);
  const io::EngineStats s = engine.stats();
  // batch 1 submits every piece on its own; larger batches need fewer calls than pieces.
  if (batch == 1)
    CHECK(s.submit_calls >= s.pieces);
  else
    CHECK(s.submit_calls < s.pieces);
}

TEST_CASE("many concurrent requests from several threads each get their own data", "[uring][stress]") {
  TempDir dir;
  io::EngineOptions o;
  o.queue_depth = 32;
  o.block_bytes = 16 << 10;
  auto engine = make_engine(o);
  auto file = open_file(engine, dir.file("f"));
  constexpr int kThreads = 4, kPerThread = 64;
  constexpr std::uint64_t kSlot = 96 << 10;  // each request owns a slot of the file
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<io::AlignedBuffer> bufs;
      std::vector<std::uint64_t> sizes;
      std::vector<io::IoFuture> futures;
      for (int i = 0; i < kPerThread; ++i) {
        const std::uint64_t n = 1 + rng() % kSlot;
        const std::uint64_t off = static_cast<std::uint64_t>(t * kPerThread + i) * kSlot;
        bufs.emplace_back(n);
        sizes.push_back(n);
        fill_pattern(bufs.back().data(), n, 100 + t, off);
        futures.push_back(engine.write(file, off, bufs.back().data(), n));
      }
      if (!io::wait_all(futures).ok()) ++failures;
      futures.clear();
      for (int i = 0; i < kPerThread; ++i) {
        std::memset(bufs[i].data(), 0, sizes[i]);
        const std::uint64_t off = static_cast<std::uint64_t>(t * kPerThread + i) * kSlot;
        futures.push_back(engine.read(file, off, bufs[i].data(), sizes[i]));
      }
      // Take completions in whatever order they come.
      std::vector<bool> seen(kPerThread, false);
      for (int done = 0; done < kPerThread; ++done) {
        std::vector<io::IoFuture> pending;
        std::vector<int> index;
        for (int i = 0; i < kPerThread; ++i) {
          if (!seen[i]) {
            pending.push_back(futures[i]);
            index.push_back(i);
          }
        }
        const int k = io::wait_any(pending);
        const int i = index[static_cast<std::size_t>(k)];
        seen[i] = true;
        const std::uint64_t off = static_cast<std::uint64_t>(t * kPerThread + i) * kSlot;
        if (!futures[i].wait().ok() || first_mismatch(bufs[i].data(), sizes[i], 100 + t, off) != -1) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(engine.stats().requests == 2u * kThreads * kPerThread);
  CHECK(engine.stats().failed_requests == 0);
}

TEST_CASE("callbacks run once per request on the io thread and may submit more I/O", "[uring]") {
  TempDir dir;
  auto engine = make_engine();
  auto file = open_file(engine, dir.file("f"));
  constexpr std::uint64_t kBytes = 300000;
  io::AlignedBuffer src(kBytes), dst(kBytes);
  fill_pattern(src.data(), kBytes, 5);
  std::promise<io::IoResult> read_done;
  std::atomic<int> calls{0};
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> on_other_thread{false};
  engine.write(file, 0, src.data(), kBytes, [&](const io::IoResult& w) {
    ++calls;
    on_other_thread = std::this_thread::get_id() != caller;
    if (!w.ok()) {
      read_done.set_value(w);
      return;
    }
    engine.read(file, 0, dst.data(), kBytes, [&](const io::IoResult& r) {
      ++calls;
      read_done.set_value(r);
    });
  });
  const io::IoResult r = read_done.get_future().get();
  INFO(r.message);
  REQUIRE(r.ok());
  CHECK(calls == 2);
  CHECK(on_other_thread);
  CHECK(first_mismatch(dst.data(), kBytes, 5) == -1);
}

TEST_CASE("wait_any, wait_all and poll see completions across requests", "[uring][interface]") {
  TempDir dir;
  auto engine = make_engine();
  auto file = open_file(engine, dir.file("f"));
  constexpr int kN = 8;
  constexpr std::uint64_t kBytes = 128 << 10;
  io::AlignedBuffer buf(kN * kBytes);
  fill_pattern(buf.data(), kN * kBytes, 9);
  std::vector<io::IoFuture> fs;
  for (int i = 0; i < kN; ++i) fs.push_back(engine.write(file, i * kBytes, buf.data() + i * kBytes, kBytes));
  const int first = io::wait_any(fs);
  REQUIRE(first >= 0);
  CHECK(fs[static_cast<std::size_t>(first)].ready());
  const io::IoResult all = io::wait_all(fs);
  CHECK(all.ok());
  CHECK(all.bytes == kN * kBytes);
  CHECK(io::poll(fs).size() == static_cast<std::size_t>(kN));
  CHECK(io::wait_any({}, std::chrono::milliseconds(1)) == -1);
  io::IoFuture invalid;
  CHECK_FALSE(invalid.ready());
  CHECK(invalid.wait().err == -EINVAL);
}

TEST_CASE("registered buffers and files are used for I/O, and I/O works after unregistering", "[uring]") {
  TempDir dir;
  auto engine = make_engine();
  auto file = open_file(engine, dir.file("f"));
  CHECK(file.registered());
  constexpr std::uint64_t kBytes = 3 << 20;
  io::AlignedBuffer buf(kBytes);
  fill_pattern(buf.data(), kBytes, 11);
  const int slot = engine.register_buffer(buf.data(), kBytes);
  INFO("register_buffer: " << io::errno_text(slot));
  REQUIRE(slot >= 0);
  REQUIRE(engine.write(file, 0, buf.data(), kBytes).wait().ok());
  // A sub-range of a registered buffer is fixed too.
  REQUIRE(engine.read(file, 4096, buf.data() + 4096, kBytes - 8192).wait().ok());
  const io::EngineStats s = engine.stats();
  CHECK(s.fixed_buffer_pieces >= 6);
  CHECK(s.fixed_file_pieces >= 6);
  engine.unregister_buffer(slot);
  std::memset(buf.data(), 0, kBytes);
  REQUIRE(engine.read(file, 0, buf.data(), kBytes).wait().ok());
  CHECK(engine.stats().fixed_buffer_pieces == s.fixed_buffer_pieces);
  CHECK(first_mismatch(buf.data(), kBytes, 11) == -1);
}

TEST_CASE("an SQPOLL engine moves the same data", "[uring]") {
  TempDir dir;
  io::EngineOptions o;
  o.sqpoll = true;
  o.block_bytes = 64 << 10;
  WarningCatcher warnings;  // SQPOLL may be refused (old kernels, no privilege): then a warning
  auto engine = make_engine(o);
  INFO("sqpoll in use: " << engine.sqpoll() << "; warnings: " << warnings.joined());
  auto file = open_file(engine, dir.file("f"));
  constexpr std::uint64_t kBytes = (1 << 20) + 12345;
  io::AlignedBuffer src(kBytes), dst(kBytes);
  fill_pattern(src.data(), kBytes, 13);
  REQUIRE(engine.write(file, 0, src.data(), kBytes).wait().ok());
  REQUIRE(engine.read(file, 0, dst.data(), kBytes).wait().ok());
  CHECK(first_mismatch(dst.data(), kBytes, 13) == -1);
  CHECK((engine.sqpoll() || !warnings.messages().empty()));
}

TEST_CASE("destroying an engine waits for its queued requests, and files may outlive it", "[uring]") {
  TempDir dir;
  constexpr std::uint64_t kBytes = 4 << 20;
  io::AlignedBuffer src(kBytes);
  fill_pattern(src.data(), kBytes, 17);
  std::vector<io::IoFuture> fs;
  io::File survivor;
  {
    io::EngineOptions o;
    o.block_bytes = 256 << 10;
    o.queue_depth = 2;
    auto engine = make_engine(o);
    survivor = open_file(engine, dir.file("f"));
    for (int i = 0; i < 4; ++i) fs.push_back(engine.write(survivor, i * kBytes, src.data(), kBytes));
  }
  for (const auto& f : fs) CHECK(f.ready());
  CHECK(io::wait_all(fs).ok());
  auto size = survivor.size();
  REQUIRE(size.ok());
  CHECK(*size == 4 * kBytes);
}

TEST_CASE("closing a file while its I/O is in flight is safe", "[uring]") {
  TempDir dir;
  auto engine = make_engine();
  constexpr std::uint64_t kBytes = 8 << 20;
  io::AlignedBuffer src(kBytes), dst(kBytes);
  fill_pattern(src.data(), kBytes, 19);
  io::IoFuture w;
  {
    auto file = open_file(engine, dir.file("f"));
    w = engine.write(file, 0, src.data(), kBytes);
    file.close();
    CHECK_FALSE(file.valid());
  }
  REQUIRE(w.wait().ok());
  auto again = open_file(engine, dir.file("f"), false);
  REQUIRE(engine.read(again, 0, dst.data(), kBytes).wait().ok());
  CHECK(first_mismatch(dst.data(), kBytes, 19) == -1);
}

TEST_CASE("invalid engine options are refused naming the option", "[negative]") {
  auto message = [](io::EngineOptions o) {
    auto e = io::Engine::create(o);
    CHECK_FALSE(e.ok());
    CHECK(e.status().err() == -EINVAL);
    return e.status().message();
  };
  io::EngineOptions o;
  o.queue_depth = 0;
  CHECK_THAT(message(o), Catch::Contains("queue_depth 0"));
  o = {};
  o.queue_depth = 5000;
  CHECK_THAT(message(o), Catch::Contains("queue_depth 5000"));
  o = {};
  o.block_bytes = 1000;
  CHECK_THAT(message(o), Catch::Contains("block_bytes 1000"));
  o = {};
  o.submit_batch = 0;
  CHECK_THAT(message(o), Catch::Contains("submit_batch"));
}

TEST_CASE("signals arriving during I/O interrupt waits but never the transfers", "[uring][stress]") {
  struct sigaction sa {
  }, old{};
  sa.sa_handler = [](int) {};  // no SA_RESTART: interrupted system calls return EINTR
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
  TempDir dir;
  io::EngineOptions o;
  o.block_bytes = 64 << 10;
  o.queue_depth = 8;
  auto engine = make_engine(o);
  auto file = open_file(engine, dir.file("f"));
  constexpr std::uint64_t kBytes = 16 << 20;
  io::AlignedBuffer src(kBytes), dst(kBytes);
  fill_pattern(src.data(), kBytes, 23);
  std::atomic<bool> stop{false};
  std::thread pest([&] {
    // Every thread of the process, the io thread included, gets signals.
    while (!stop) {
      if (DIR* d = opendir("/proc/self/task")) {
        while (dirent* e = readdir(d)) {
          if (e->d_name[0] != '.') syscall(SYS_tgkill, getpid(), std::atoi(e->d_name), SIGUSR1);
        }
        closedir(d);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  bool all_ok = true;
  for (int round = 0; round < 4 && all_ok; ++round) {
    std::memset(dst.data(), 0, kBytes);
    all_ok = engine.write(file, 0, src.data(), kBytes).wait().ok() &&
             engine.read(file, 0, dst.data(), kBytes).wait().ok() && first_mismatch(dst.data(), kBytes, 23) == -1;
  }
  stop = true;
  pest.join();
  sigaction(SIGUSR1, &old, nullptr);
  INFO("interrupted io_uring_enter calls: " << engine.stats().interrupted_calls);
  CHECK(all_ok);
}

TEST_CASE("files beyond the fixed-file slots use plain descriptors after one warning", "[uring][boundary]") {
  TempDir dir;
  io::EngineOptions o;
  o.max_files = 2;
  WarningCatcher warnings;
  auto engine = make_engine(o);
  std::vector<io::File> files;
  for (int i = 0; i < 4; ++i) files.push_back(open_file(engine, dir.file("f" + std::to_string(i))));
  CHECK(files[0].registered());
  CHECK(files[1].registered());
  CHECK_FALSE(files[2].registered());
  CHECK_FALSE(files[3].registered());
  io::AlignedBuffer buf(8192);
  for (int i = 0; i < 4; ++i) {
    fill_pattern(buf.data(), 8192, 40 + i);
    REQUIRE(engine.write(files[i], 0, buf.data(), 8192).wait().ok());
  }
  for (int i = 0; i < 4; ++i) {
    REQUIRE(engine.read(files[i], 0, buf.data(), 8192).wait().ok());
    CHECK(first_mismatch(buf.data(), 8192, 40 + i) == -1);
  }
  CHECK_THAT(warnings.joined(), Catch::Contains("fixed-file slots") && Catch::Contains("max_files"));
  files[0].close();  // frees a slot for the next file
  CHECK(open_file(engine, dir.file("g")).registered());
}

TEST_CASE("a callback of a request that completes at once may queue more I/O without stalling", "[uring][regression]") {
  // Regression: requests queued by a callback run from the inbox step (zero-length or
  // invalid requests complete there) rang no doorbell, and the io thread went to sleep
  // with them queued.
  TempDir dir;
  auto engine = make_engine();
  auto file = open_file(engine, dir.file("f"));
  io::AlignedBuffer buf(4096);
  fill_pattern(buf.data(), 4096, 60);
  auto done = std::make_shared<std::promise<io::IoResult>>();
  auto result = done->get_future();
  engine.write(file, 0, buf.data(), 0, [&, done](const io::IoResult& empty) {
    if (!empty.ok()) {
      done->set_value(empty);
      return;
    }
    engine.write(file, 0, buf.data(), 4096, [done](const io::IoResult& r) { done->set_value(r); });
  });
  REQUIRE(result.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(result.get().ok());
}
