// The NVMe parameter store on its own: chunked round trips (tensors larger than a buffer),
// commit/abort generations, a flipped byte (names tensor, file and block), a full device
// mid-write (the last committed bytes stay readable) and a budget below one buffer.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <functional>
#include <vector>

#include "offload/param_store.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
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
