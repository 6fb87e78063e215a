// The NVMe parameter store with spare files shared per chunk length (offload_param.spare_chunks):
// the files it makes are those its footprint counts; every spare count round-trips the same
// bytes, blocking and queued; a dropped write that had begun to commit (its length's spares
// in use) leaves exactly the tensors it touched stale, refused on read with a message naming
// why, and a whole write and a commit make them whole; a write that fits its spares is
// dropped whole; a write that fails after an early commit (its source found damaged) leaves
// its tensor stale too.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "offload/param_store.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/host_device.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using test::error_of;

namespace {

offload::ParamStoreOptions spare_options(const std::string& dir, std::uint64_t spares) {
  offload::ParamStoreOptions o;
  o.dir = dir;
  o.chunk_bytes = 8192;  // two 4 KiB checksum blocks per chunk
  o.buffer_count = 2;
  o.queue_depth = 8;
  o.block_bytes = 4096;
  o.spares = spares;
  return o;
}

std::vector<char> bytes_of(std::size_t n, int seed) {
  std::vector<char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 29 + static_cast<std::size_t>(seed) * 13) & 0xff);
  return v;
}

std::vector<char> read_back(offload::ParamStore& s, std::size_t t, std::size_t n) {
  std::vector<char> out(n, 0);
  s.read(t,
         [&](std::uint64_t off, const void* data, std::uint64_t bytes) { std::memcpy(out.data() + off, data, bytes); });
  return out;
}

// Three layers of 20000 bytes: chunks of 8192, 8192 and 3616 bytes each (two lengths).
constexpr std::size_t kLayers = 3, kBytes = 20000;
std::vector<offload::ParamTensor> three_layers() {
  return {{"layer 0", kBytes}, {"layer 1", kBytes}, {"layer 2", kBytes}};
}

void write_all(offload::ParamStore& s, int seed) {
  for (std::size_t t = 0; t < kLayers; ++t) s.write(t, bytes_of(kBytes, seed + static_cast<int>(t)).data());
}

}  // namespace

TEST_CASE("parameter store spares: the files are those the footprint counts, and every count round-trips",
          "[offload][uring][param-store][spares]") {
  const std::uint64_t spares = GENERATE(0, 1, 2, 6);
  INFO("spares " << spares);
  test::TempDir dir("strata-param-spares");
  const auto o = spare_options(dir.file("rank0"), spares);
  const auto f = offload::ParamStore::footprint(o, three_layers());
  // 9 chunks, each with its ".a" file; spares per length: 6 of 8192 bytes and 3 of 3616.
  const std::uint64_t expect_files =
      spares == 0 ? 18 : 9 + std::min<std::uint64_t>(spares, 6) + std::min<std::uint64_t>(spares, 3);
  CHECK(f.file_count == expect_files);
  auto dev = test::small_host_device();
  auto qo = o;
  qo.device = dev.get();
  offload::ParamStore s(qo, three_layers());
  CHECK(s.file_bytes() == f.file_bytes);
  std::uint64_t on_disk = 0, count = 0;
  for (const auto& e : std::filesystem::directory_iterator(o.dir)) {
    on_disk += e.file_size();
    ++count;
  }
  CHECK(count == f.file_count);
  CHECK(on_disk == f.file_bytes);

  for (int round = 0; round < 3; ++round) {  // blocking, queued, then blocking again over rotated spares
    const int seed = 10 * round;
    if (round == 1) {
      std::vector<std::vector<char>> src;
      for (std::size_t t = 0; t < kLayers; ++t) src.push_back(bytes_of(kBytes, seed + static_cast<int>(t)));
      for (std::size_t t = 0; t < kLayers; ++t) (void)s.write_async(t, src[t].data());
      s.wait(s.commit_async());
      s.synchronize();
    } else {
      write_all(s, seed);
      s.commit();
    }
    for (std::size_t t = 0; t < kLayers; ++t) {
      CHECK_FALSE(s.stale(t));
      CHECK(read_back(s, t, kBytes) == bytes_of(kBytes, seed + static_cast<int>(t)));
    }
  }
}

TEST_CASE("parameter store spares: a dropped write that had begun to commit leaves its tensors stale until rewritten",
          "[offload][uring][param-store][spares][negative]") {
  const std::uint64_t spares = GENERATE(1, 2, 6);
  INFO("spares " << spares);
  test::TempDir dir("strata-param-spares");
  offload::ParamStore s(spare_options(dir.file("rank0"), spares), three_layers());
  write_all(s, 1);
  s.commit();
  write_all(s, 7);
  s.abort();
  std::size_t stale = 0;
  for (std::size_t t = 0; t < kLayers; ++t) {
    INFO("layer " << t);
    if (!s.stale(t)) {
      CHECK(read_back(s, t, kBytes) == bytes_of(kBytes, 1 + static_cast<int>(t)));  // the last commit, whole
      continue;
    }
    ++stale;
    const std::string m = error_of([&] { (void)read_back(s, t, kBytes); });
    INFO(m);
    CHECK(m.find("parameter shard of layer " + std::to_string(t)) != std::string::npos);
    CHECK(m.find("mixes two states") != std::string::npos);
    CHECK(m.find("offload_param.spare_chunks") != std::string::npos);
    CHECK(m.find("resume from the last checkpoint") != std::string::npos);
  }
  // Six chunks of one length share the spares: with 6 the write fits and is dropped whole.
  // With 1 spare, each chunk but a layer's last commits its predecessor: every layer is stale;
  // with 2, the first two layers are committed in part by the next ones' writes.
  CHECK(stale == (spares == 1 ? 3 : spares == 2 ? 2 : 0));
  for (std::size_t t = 0; t < kLayers; ++t) {
    if (!s.stale(t)) continue;
    s.write(t, bytes_of(kBytes, 1 + static_cast<int>(t)).data());
    CHECK(s.stale(t));  // until committed
    s.commit(t);
    CHECK_FALSE(s.stale(t));
  }
  for (std::size_t t = 0; t < kLayers; ++t) CHECK(read_back(s, t, kBytes) == bytes_of(kBytes, 1 + static_cast<int>(t)));
  // And it steps on: a new write over the rotated spares.
  write_all(s, 20);
  s.commit();
  for (std::size_t t = 0; t < kLayers; ++t)
    CHECK(read_back(s, t, kBytes) == bytes_of(kBytes, 20 + static_cast<int>(t)));
}

TEST_CASE("parameter store spares: a copy that fails after an early commit leaves its tensor stale",
          "[offload][uring][param-store][spares][negative]") {
  test::TempDir dir("strata-param-spares");
  // The source: one layer, two generations, its last chunk's file damaged after a commit.
  offload::ParamStore src(spare_options(dir.file("src"), 0), {{"layer 9", kBytes}});
  src.write(0, bytes_of(kBytes, 3).data());
  src.commit();
  {
    std::fstream f(src.file_of(0, 17000), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192 + 3);  // header and checksum table, then its first block
    f.put('\x5a');
  }
  offload::ParamStore s(spare_options(dir.file("dst"), 1), {{"layer 0", kBytes}});
  s.write(0, bytes_of(kBytes, 1).data());
  s.commit();
  // Chunk 0 lands in the one spare; chunk 1 commits it early to get one; the source's third
  // chunk then fails its checksum.
  const std::string copy_error = error_of([&] { s.write_from(0, src, 0); });
  INFO(copy_error);
  CHECK(copy_error.find("checksum mismatch") != std::string::npos);
  CHECK(s.stale(0));
  CHECK(error_of([&] { (void)read_back(s, 0, kBytes); }).find("mixes two states") != std::string::npos);
  s.write(0, bytes_of(kBytes, 4).data());
  s.commit();
  CHECK(read_back(s, 0, kBytes) == bytes_of(kBytes, 4));
}
