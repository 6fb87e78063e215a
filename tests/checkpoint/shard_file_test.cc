// Shard files: what is written reads back from any range across chunks, a flipped byte or a
// truncated file is named (file, chunk, the tensor being read), and a full disk fails the
// write naming the file.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>

#include "checkpoint/shard_file.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/moment_format.h"
#include "tests/support/error_of.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/temp_dir.h"

namespace strata::checkpoint {
namespace {
using test::error_of;

// One rank's file holding a 1000-element tensor "t": master, then exp_avg, then exp_avg_sq,
// each the ramp s*10000 + i, in 1 KiB chunks.
Manifest write_ramp(const std::string& dir) {
  Manifest m;
  m.chunk_bytes = 1024;
  m.tensors = {{"t", {10, 100}, 1000, {}}};
  ShardWriter w(dir + "/rank00000.bin", m.chunk_bytes);
  for (int s = 0; s < kStates; ++s) {
    std::vector<float> v(1000);
    std::iota(v.begin(), v.end(), s * 10000.0f);
    // Two segments per state, appended in pieces of odd sizes.
    const auto off = w.append(v.data(), 333 * 4);
    w.append(v.data() + 333, 267 * 4);
    const auto off2 = w.append(v.data() + 600, 400 * 4);
    m.tensors[0].states[s] = {{0, off, 0, 600}, {0, off2, 600, 400}};
  }
  m.files.push_back(w.finish("rank00000.bin", 0));
  return parse_manifest(to_json(m), "test");
}

void flip(const std::string& path, std::size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x20;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

TEST_CASE("shard files read back any range across chunks and segments", "[checkpoint]") {
  test::TempDir dir("ckpt-shard");
  const Manifest m = write_ramp(dir.path());
  REQUIRE(m.files[0].bytes == 12000);
  REQUIRE(m.files[0].xxh3.size() == 12);
  ShardReader r(dir.path(), m);
  std::vector<float> got(700);
  r.read_tensor(m.tensors[0], State::exp_avg, 250, 700, got.data());  // spans both segments
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == 10000.0f + 250 + static_cast<float>(i));
  r.read_tensor(m.tensors[0], State::exp_avg_sq, 999, 1, got.data());
  CHECK(got[0] == 20999.0f);
  r.verify_all();
}

TEST_CASE("q8 moments are stored as blocks with lanes, version 5, tensors sharing the blocks they straddle",
          "[checkpoint]") {
  // One layer's flat buffer of 64 elements (4 blocks): tensor "a" at [0, 20), "b" at [20, 50),
  // padding after; block 1 holds the end of a and the start of b, and both point at it.
  test::TempDir dir("ckpt-shard");
  Manifest m;
  m.chunk_bytes = 40;  // blocks cross chunks
  m.moment_dtype = "q8";
  m.tensors = {{"a", {4, 5}, 20, {}}, {"b", {30}, 30, {}}};
  ShardWriter w(dir.file("rank00000.bin"), m.chunk_bytes);
  std::vector<float> flat(64, 0.0f), master(64);
  for (std::size_t i = 0; i < 50; ++i) flat[i] = std::ldexp(static_cast<float>(i % 7) - 3.0f, -static_cast<int>(i % 9));
  std::iota(master.begin(), master.end(), 0.0f);
  m.tensors[0].states[0] = {{0, w.append(master.data(), 80), 0, 20}};
  m.tensors[1].states[0] = {{0, w.append(master.data() + 20, 120), 0, 30}};
  std::vector<std::vector<float>> want(kStates);
  for (int s = 1; s < kStates; ++s) {
    const Moment which = s == 1 ? Moment::first : Moment::second;
    std::vector<float> values = flat;
    if (which == Moment::second)
      for (float& x : values) x *= x;
    std::vector<std::uint8_t> coded(moment_bytes(MomentFormat::q8, 64));
    moments_from_fp32(values.data(), coded.data(), MomentFormat::q8, which, 64);
    want[s].resize(64);
    moments_to_fp32(coded.data(), MomentFormat::q8, which, want[s].data(), 64);
    const std::uint64_t off = w.append(coded.data(), coded.size());
    m.tensors[0].states[s] = {{0, off, 0, 20}};
    m.tensors[1].states[s] = {{0, off + 17, 0, 30, 4}};
  }
  m.files.push_back(w.finish("rank00000.bin", 0));
  const std::string text = to_json(m);
  CHECK(text.find("\"version\": 5") != std::string::npos);
  const Manifest back = parse_manifest(text, "test");
  REQUIRE(back.tensors[1].states[2][0].lane == 4);
  CHECK(back.segment_bytes(State::exp_avg, back.tensors[1].states[1][0]) == 3 * 17);  // lanes 4 to 33
  ShardReader r(dir.path(), back);
  for (int s = 1; s < kStates; ++s) {
    std::vector<float> a(20), b(30), part(11);
    r.read_tensor(back.tensors[0], static_cast<State>(s), 0, 20, a.data());
    r.read_tensor(back.tensors[1], static_cast<State>(s), 0, 30, b.data());
    r.read_tensor(back.tensors[1], static_cast<State>(s), 9, 11, part.data());  // lanes 13 to 23: two blocks
    for (std::size_t i = 0; i < 20; ++i) REQUIRE(a[i] == want[s][i]);
    for (std::size_t i = 0; i < 30; ++i) REQUIRE(b[i] == want[s][20 + i]);
    for (std::size_t i = 0; i < 11; ++i) REQUIRE(part[i] == want[s][29 + i]);
  }
  std::vector<float> b(30);
  r.read_tensor(back.tensors[1], State::master, 0, 30, b.data());
  CHECK(b[29] == 49.0f);
  r.verify_all();
  // A lane out of a block, a lane on the fp32 master and blocks past the file's end are damage.
  const auto damaged = [&](const std::function<void(Manifest&)>& edit) {
    Manifest d = back;
    edit(d);
    return error_of([&] { parse_manifest(to_json(d), "test"); });
  };
  CHECK_THAT(damaged([](Manifest& d) { d.tensors[1].states[1][0].lane = 16; }), Catch::Contains("lane 16 (0 to 15)"));
  CHECK_THAT(damaged([](Manifest& d) { d.tensors[1].states[0][0].lane = 3; }),
             Catch::Contains("only q8 blocks have lanes"));
  CHECK_THAT(damaged([](Manifest& d) { d.tensors[1].states[2][0].file_offset = d.files[0].bytes - 17; }),
             Catch::Contains("has a segment outside rank00000.bin"));
  // A lane that pushes the last element into a block the file does not have (16 elements
  // from lane 1 of a one-block file): the byte count must not wrap around and let it in.
  Manifest one;
  one.moment_dtype = "q8";
  one.files = {{"master.bin", 0, 64, {0}}, {"moments.bin", 0, 17, {0}}};
  one.tensors = {{"t", {16}, 16, {}}};
  one.tensors[0].states[0] = {{0, 0, 0, 16}};
  for (int s = 1; s < kStates; ++s) one.tensors[0].states[s] = {{1, 0, 0, 16, 1}};  // 34 bytes of a 17-byte file
  CHECK_THAT(error_of([&] { parse_manifest(to_json(one), "test"); }),
             Catch::Contains("has a segment outside moments.bin"));
  for (int s = 1; s < kStates; ++s) one.tensors[0].states[s] = {{1, 0, 0, 16, 0}};  // one whole block: in the file
  CHECK_NOTHROW(parse_manifest(to_json(one), "test"));
}

TEST_CASE("version 4's q8 moments, exp_avg and sqrt(exp_avg_sq) in bf16, still read back squared", "[checkpoint]") {
  test::TempDir dir("ckpt-shard");
  Manifest m;
  m.chunk_bytes = 1024;
  m.moment_dtype = "q8";
  m.q8_as_bf16 = true;
  m.tensors = {{"t", {100}, 100, {}}};
  ShardWriter w(dir.file("rank00000.bin"), m.chunk_bytes);
  std::vector<float> master(100, 1.0f);
  m.tensors[0].states[0] = {{0, w.append(master.data(), 400), 0, 100}};
  std::vector<std::uint16_t> roots(100);  // what a q8 square root may be: 5 significant bits
  for (std::size_t i = 0; i < roots.size(); ++i) roots[i] = fp32_to_bf16(std::ldexp(17.0f + float(i % 15), -30));
  for (int s = 1; s < kStates; ++s) m.tensors[0].states[s] = {{0, w.append(roots.data(), 200), 0, 100}};
  m.files.push_back(w.finish("rank00000.bin", 0));
  const std::string text = to_json(m);
  CHECK(text.find("\"version\": 4") != std::string::npos);
  const Manifest back = parse_manifest(text, "test");
  ShardReader r(dir.path(), back);
  std::vector<float> sq(100), avg(100);
  r.read_tensor(back.tensors[0], State::exp_avg_sq, 0, 100, sq.data());
  r.read_tensor(back.tensors[0], State::exp_avg, 0, 100, avg.data());
  for (std::size_t i = 0; i < sq.size(); ++i) {
    const float root = bf16_to_fp32(roots[i]);
    REQUIRE(avg[i] == root);        // exp_avg as it is
    REQUIRE(sq[i] == root * root);  // exp_avg_sq squared back, exactly
  }
  std::string as_v3 = text;
  as_v3.replace(as_v3.find("\"version\": 4"), 12, "\"version\": 3");
  CHECK_THAT(error_of([&] { parse_manifest(as_v3, "test"); }),
             Catch::Contains("is format version 3 but has 'moment_dtype' q8 (version 5)"));
  CHECK_FALSE(back.blocks(State::exp_avg));
  CHECK(back.q8_as_bf16);
}

TEST_CASE("bf16 moments are stored in two bytes, written as version 3 and read back widened", "[checkpoint]") {
  test::TempDir dir("ckpt-shard");
  Manifest m;
  m.chunk_bytes = 1024;
  m.moment_dtype = "bf16";
  m.tensors = {{"t", {1000}, 1000, {}}};
  ShardWriter w(dir.file("rank00000.bin"), m.chunk_bytes);
  std::vector<float> master(1000);
  std::iota(master.begin(), master.end(), 0.5f);
  m.tensors[0].states[0] = {{0, w.append(master.data(), 4000), 0, 1000}};
  for (int s = 1; s < kStates; ++s) {
    std::vector<std::uint16_t> moment(1000);
    for (std::size_t i = 0; i < moment.size(); ++i) moment[i] = fp32_to_bf16(static_cast<float>(s * 1000 + i));
    m.tensors[0].states[s] = {{0, w.append(moment.data(), 2000), 0, 1000}};
  }
  m.files.push_back(w.finish("rank00000.bin", 0));
  const std::string text = to_json(m);
  CHECK(text.find("\"version\": 3") != std::string::npos);
  CHECK(text.find("\"moment_dtype\": \"bf16\"") != std::string::npos);
  const Manifest back = parse_manifest(text, "test");
  REQUIRE(back.files[0].bytes == 8000);
  ShardReader r(dir.path(), back);
  std::vector<float> got(1000);
  r.read_tensor(back.tensors[0], State::exp_avg_sq, 0, 1000, got.data());
  for (std::size_t i = 0; i < got.size(); ++i)
    REQUIRE(got[i] == bf16_to_fp32(fp32_to_bf16(static_cast<float>(2000 + i))));
  r.read_tensor(back.tensors[0], State::master, 0, 1000, got.data());
  CHECK(got == master);
  // Read as fp32 (a version-2 reader's view), the same segments would run past the file: refused.
  std::string as_v2 = text;
  as_v2.replace(as_v2.find("\"version\": 3"), 12, "\"version\": 2");
  CHECK_THAT(error_of([&] { parse_manifest(as_v2, "test"); }),
             Catch::Contains("is format version 2 but has 'moment_dtype' bf16 (version 3)"));
  std::string fp8 = text;
  fp8.replace(fp8.find("\"bf16\""), 6, "\"fp8\"");
  CHECK_THAT(error_of([&] { parse_manifest(fp8, "test"); }),
             Catch::Contains("'moment_dtype' is 'fp8' but must be fp32, bf16 or q8"));
}

TEST_CASE("a flipped byte is named by file, chunk and tensor; a truncated file by its sizes", "[checkpoint]") {
  test::TempDir dir("ckpt-shard");
  const Manifest m = write_ramp(dir.path());
  flip(dir.file("rank00000.bin"), 4000 + 17);  // chunk 3 (bytes 3072-4096): master's end, exp_avg's start
  ShardReader r(dir.path(), m);
  std::vector<float> got(1000);
  r.read_tensor(m.tensors[0], State::master, 0, 700, got.data());  // chunks 0-2: untouched, reads
  CHECK_THAT(error_of([&] { r.read_tensor(m.tensors[0], State::exp_avg, 0, 10, got.data()); }),
             Catch::Contains("rank00000.bin chunk 3 (bytes 3072-4096) fails its XXH3 checksum while reading tensor "
                             "'t' (exp_avg); the chunk holds 't' (master), 't' (exp_avg)"));
  CHECK_THAT(error_of([&] { ShardReader(dir.path(), m).verify_all(); }), Catch::Contains("chunk 3"));

  test::TempDir dir2("ckpt-shard");
  const Manifest m2 = write_ramp(dir2.path());
  std::filesystem::resize_file(dir2.file("rank00000.bin"), 5000);
  ShardReader r2(dir2.path(), m2);
  CHECK_THAT(error_of([&] { r2.read_tensor(m2.tensors[0], State::master, 0, 1, got.data()); }),
             Catch::Contains("shard file rank00000.bin holds 5000 bytes but the manifest says 12000"));
}

TEST_CASE("a full disk fails the shard write naming the file", "[checkpoint]") {
  test::TempDir dir("ckpt-shard");
  std::vector<char> data(8192, 'x');
  const std::string msg = error_of([&] {
    test::FileSizeLimit limit(4096);
    ShardWriter w(dir.file("rank00003.bin"), 1024);
    w.append(data.data(), data.size());
    w.finish("rank00003.bin", 3);
  });
  CHECK_THAT(msg,
             Catch::Contains("checkpoint shard '" + dir.file("rank00003.bin") + "': writing 1.00 KiB at byte 4096"));
  CHECK_THAT(msg, Catch::Contains("a full disk?"));
}

TEST_CASE("file contents are copied whole whatever the descriptors' offsets, in the kernel or through a buffer",
          "[checkpoint][regression]") {
  // Before: the copy started at the input's own offset, which sizing the file had left at
  // its end, so copy_file_range copied nothing and the save failed as "filesystem full".
  test::TempDir dir("ckpt-copy");
  std::string data(3 * 1048576 + 12345, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 % 251);
  std::vector<std::string> sources = {dir.file("src")};
  const std::string shm = "/dev/shm/strata-ckpt-copy-" + std::to_string(::getpid());
  if (std::filesystem::is_directory("/dev/shm")) sources.push_back(shm);  // another filesystem: the buffer path
  for (const auto& src : sources) {
    INFO(src);
    { std::ofstream(src, std::ios::binary) << data; }
    const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
    const int out = ::open(dir.file("dst").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(in >= 0);
    REQUIRE(out >= 0);
    ::lseek(in, 0, SEEK_END);  // as a size probe leaves it
    std::uint64_t done = 0;
    CHECK(checkpoint::copy_file_contents(in, out, data.size(), done) == 0);
    CHECK(done == data.size());
    ::close(in);
    ::close(out);
    std::ifstream back(dir.file("dst"), std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(back), std::istreambuf_iterator<char>()) == data);
    std::filesystem::remove(src);
  }
}

}  // namespace
}  // namespace strata::checkpoint
