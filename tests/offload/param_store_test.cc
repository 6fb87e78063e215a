// The NVMe parameter store on its own: chunked round trips (tensors larger than a buffer),
// commit/abort generations, a flipped byte (names tensor, file and block), a full device
// mid-write (the last committed bytes stay readable) and a budget below one buffer; and its
// queued requests on the host device: they run in submission order on the store's own thread
// (write, commit, then a read of the same tensor sees the write), a read scatters into the
// caller's pieces, a device stream waits on a ticket, a write hands its buffer back to the
// ledger, a blocking call waits for what was queued before it, and a failure is sticky.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <functional>
#include <vector>

#include "offload/ledger.h"
#include "offload/param_store.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/host_device.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using test::error_of;

namespace {

offload::ParamStoreOptions options_in(const std::string& dir) {
  offload::ParamStoreOptions o;
  o.dir = dir;
  o.chunk_bytes = 8192;  // two 4 KiB checksum blocks per chunk
  o.buffer_count = 2;
  o.queue_depth = 8;
  o.block_bytes = 4096;
  return o;
}

offload::ParamStoreOptions queued(offload::ParamStoreOptions o, device::Device& dev) {
  o.device = &dev;
  return o;
}

std::vector<char> pattern(std::size_t n, int seed) {
  std::vector<char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + static_cast<std::size_t>(seed) * 7) & 0xff);
  return v;
}

std::vector<char> read_all(offload::ParamStore& s, std::size_t t, std::size_t n) {
  std::vector<char> out(n, 0);
  std::uint64_t expect = 0;
  s.read(t, [&](std::uint64_t off, const void* data, std::uint64_t bytes) {
    CHECK(off == expect);  // chunks arrive in offset order
    expect = off + bytes;
    std::memcpy(out.data() + off, data, bytes);
  });
  CHECK(expect == n);
  return out;
}

}  // namespace

TEST_CASE("parameter shards larger than a buffer round-trip in chunks, and only committed writes are read",
          "[offload][uring][param-store]") {
  test::TempDir dir("strata-params");
  // 20001 bytes: three chunks of 8 KiB, the last one partial; 100 bytes: one partial chunk.
  offload::ParamStore s(options_in(dir.file("rank0/params")), {{"layer 0", 20001}, {"layer 1", 100}});
  CHECK(s.chunks() == 4);
  CHECK(s.buffer_bytes() == 8192);
  const auto a0 = pattern(20001, 1), a1 = pattern(100, 2);
  s.write(0, a0.data());
  s.write(1, a1.data());
  s.commit();
  CHECK(read_all(s, 0, 20001) == a0);
  CHECK(read_all(s, 1, 100) == a1);
  const auto b0 = pattern(20001, 3);
  s.write(0, b0.data());
  CHECK(read_all(s, 0, 20001) == a0);  // not committed yet
  s.abort();
  CHECK(read_all(s, 0, 20001) == a0);
  s.write(0, b0.data());
  s.commit();
  CHECK(read_all(s, 0, 20001) == b0);
  CHECK(read_all(s, 1, 100) == a1);  // untouched by the commit
  const auto st = s.stats();
  CHECK(st.bytes_written == 20001 * 3 + 100);
  CHECK(st.bytes_read == 20001 * 4 + 100 * 2);
}

TEST_CASE("a flipped byte in a parameter swap file names the tensor, the file and the block",
          "[offload][uring][param-store][negative]") {
  test::TempDir dir("strata-params");
  offload::ParamStore s(options_in(dir.file("rank0")), {{"layer 5", 20000}});
  const auto a = pattern(20000, 1);
  s.write(0, a.data());
  s.commit();
  const std::string file = s.file_of(0, 9000);  // chunk 1: bytes [8192, 16384)
  REQUIRE(file.find("layer_5.params.c1") != std::string::npos);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192 + 4096 + 3);  // header, checksum table, then block 1
    f.put('\x5a');
  }
  const std::string m = error_of([&] { (void)read_all(s, 0, 20000); });
  INFO(m);
  CHECK(m.find("parameter shard of layer 5") != std::string::npos);
  CHECK(m.find("chunk 1") != std::string::npos);
  CHECK(m.find(file) != std::string::npos);
  CHECK(m.find("block 1 of") != std::string::npos);
  CHECK(m.find("checksum mismatch") != std::string::npos);
}

TEST_CASE("a full device fails a parameter write and keeps the last committed shard",
          "[offload][uring][param-store][negative]") {
  test::TempDir dir("strata-params");
  offload::ParamStore s(options_in(dir.file("rank0")), {{"layer 0", 20000}});
  const auto a = pattern(20000, 1), b = pattern(20000, 2);
  s.write(0, a.data());
  s.commit();
  std::string m;
  {
    test::FileSizeLimit limit(8192);  // every data write starts past the header and table
    m = error_of([&] { s.write(0, b.data()); });
  }
  INFO(m);
  CHECK(m.find("EFBIG") != std::string::npos);
  CHECK(m.find("parameter shard of layer 0") != std::string::npos);
  s.commit();  // nothing complete to commit
  CHECK(read_all(s, 0, 20000) == a);
  s.write(0, b.data());
  s.commit();
  CHECK(read_all(s, 0, 20000) == b);
}

TEST_CASE("a host budget below one parameter buffer is refused, naming the minimum and the key",
          "[offload][uring][param-store][negative]") {
  test::TempDir dir("strata-params");
  auto o = options_in(dir.file("rank0"));
  o.budget_bytes = 4096;
  const std::string m = error_of([&] { offload::ParamStore s(o, {{"layer 0", 20000}}); });
  INFO(m);
  CHECK(m.find("at least 8.00 KiB (8192 B)") != std::string::npos);
  CHECK(m.find("offload_param.buffer_size") != std::string::npos);
  CHECK(m.find("memory_budget.host") != std::string::npos);
}

TEST_CASE("a store's footprint, computed without creating it, is what the store takes", "[offload][uring]") {
  test::TempDir dir("strata-offload");
  for (std::uint64_t budget : {std::uint64_t{1} << 30, std::uint64_t{20000}}) {
    INFO("budget " << budget);
    auto o = options_in(dir.file("rank0"));
    o.budget_bytes = budget;  // the second fits two of the three buffers asked for
    o.buffer_count = 3;
    const std::vector<offload::ParamTensor> tensors{{"layer 0", 20000}, {"layer 1", 100}, {"layer 2", 8192}};
    const auto f = offload::ParamStore::footprint(o, tensors);
    offload::ParamStore s(o, tensors);
    CHECK(f.buffer_bytes == s.buffer_bytes());
    CHECK(f.buffer_count == s.buffer_count());
    CHECK(f.file_bytes == s.file_bytes());
    CHECK(f.buffer_count == (budget < 30000 ? 2 : 3));
  }
}

TEST_CASE("parameter store: queued write, commit and read run in order and scatter into pieces",
          "[offload][uring][param-store]") {
  test::TempDir dir("strata-params");
  auto dev = test::small_host_device();
  offload::MemoryLedger ledger(*dev, 1 << 20, false);
  offload::ParamStore s(queued(options_in(dir.file("rank0")), *dev), {{"layer 0", 20001}, {"layer 1", 100}});
  const auto a = pattern(20001, 1), b = pattern(20001, 2);
  s.write(0, a.data());
  s.commit();

  // b in a ledger buffer: the write hands it back once written, and the ledger's use drops.
  const std::uint64_t used = ledger.usage(offload::Tier::host).used_bytes;
  void* staged = ledger.allocate(offload::Tier::host, offload::Kind::buffers, b.size(), "test staging");
  std::memcpy(staged, b.data(), b.size());
  CHECK(ledger.usage(offload::Tier::host).used_bytes > used);
  // Three pieces across chunk boundaries, in the order the tensor's bytes run.
  std::vector<char> p0(5000), p1(9000), p2(20001 - 14000);
  std::vector<char> before(20001);
  const auto r0 = s.read_async(0, {{before.data(), before.size()}});
  const auto w = s.write_async(0, staged, &ledger);
  const auto c = s.commit_async();
  const auto r1 = s.read_async(0, {{p0.data(), p0.size()}, {p1.data(), p1.size()}, {p2.data(), p2.size()}});
  CHECK(r0 < w);
  CHECK(w < c);
  CHECK(c < r1);
  // A device stream waits on the read; a host function after the wait sees its bytes.
  auto stream = dev->create_stream();
  s.wait_on(*stream, r1);
  bool seen = false;
  stream->launch_host([&] { seen = std::memcmp(p2.data(), b.data() + 14000, p2.size()) == 0; });
  stream->synchronize();
  CHECK(seen);
  s.wait(r1);
  CHECK(s.succeeded(r1));
  CHECK(before == a);  // the read queued before the write saw the committed bytes
  std::vector<char> after(p0);
  after.insert(after.end(), p1.begin(), p1.end());
  after.insert(after.end(), p2.begin(), p2.end());
  CHECK(after == b);
  ledger.reap();
  CHECK(ledger.usage(offload::Tier::host).used_bytes == used);

  // Pieces that do not cover the tensor exactly are refused at once.
  CHECK_THROWS_AS(s.read_async(1, {{p0.data(), 99}}), Error);

  // A blocking call waits for the requests queued before it: no wait() in between.
  const auto c2 = pattern(100, 3);
  s.write_async(1, c2.data());
  s.commit_async(1);
  std::vector<char> back(100);
  s.read(1, [&](std::uint64_t off, const void* data, std::uint64_t n) { std::memcpy(back.data() + off, data, n); });
  CHECK(back == c2);
  s.synchronize();
}

TEST_CASE("parameter store: a failed queued request is sticky, its buffer still goes back",
          "[offload][uring][param-store][negative]") {
  test::TempDir dir("strata-params");
  auto dev = test::small_host_device();
  offload::MemoryLedger ledger(*dev, 1 << 20, false);
  offload::ParamStore s(queued(options_in(dir.file("rank0")), *dev), {{"layer 5", 20000}});
  const auto a = pattern(20000, 1);
  s.write(0, a.data());
  s.commit();
  const std::string file = s.file_of(0, 9000);  // chunk 1
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192 + 4096 + 3);  // header, checksum table, then block 1
    f.put('\x5a');
  }
  std::vector<char> into(20000);
  const auto r = s.read_async(0, {{into.data(), into.size()}});
  void* staged = ledger.allocate(offload::Tier::host, offload::Kind::buffers, a.size(), "test staging");
  std::memcpy(staged, a.data(), a.size());
  const auto w = s.write_async(0, staged, &ledger);  // skipped: the read before it failed
  const auto c = s.commit_async();
  s.wait(c);
  CHECK_FALSE(s.succeeded(r));
  CHECK_FALSE(s.succeeded(w));
  ledger.reap();
  CHECK(ledger.usage(offload::Tier::host).used_bytes == 0);  // the skipped write's staging went back
  const std::string m = error_of([&] { s.synchronize(); });
  INFO(m);
  CHECK(m.find("parameter shard of layer 5") != std::string::npos);
  CHECK(m.find(file) != std::string::npos);
  CHECK(m.find("checksum mismatch") != std::string::npos);
  // The skipped write and commit changed nothing: the flipped file is still the current one.
  CHECK(s.file_of(0, 9000) == file);
}

TEST_CASE("parameter store: queued requests need a device", "[offload][uring][param-store][negative]") {
  test::TempDir dir("strata-params");
  auto dev = test::small_host_device();
  auto o = queued(options_in(dir.file("rank0")), *dev);
  o.device = nullptr;
  offload::ParamStore s(o, {{"layer 0", 100}});
  std::vector<char> into(100);
  CHECK_THROWS_AS(s.read_async(0, {{into.data(), into.size()}}), Error);
  CHECK_THROWS_AS(s.commit_async(), Error);
  s.synchronize();  // nothing queued: returns
}
