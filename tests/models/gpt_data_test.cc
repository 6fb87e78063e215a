// The GPT's data (models/gpt/data.h): the formats it reads, the errors bad files get, and the
// batch order (per rank, independent of how the global batch is split).
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "models/gpt/data.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"
#include "tokenizer/token_file.h"

using namespace strata;
using strata::test::error_of;

namespace {

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string llmc(const std::vector<std::uint16_t>& tokens, int count_in_header) {
  std::string b(1024, '\0');
  const std::int32_t h[3] = {20240520, 1, count_in_header};
  std::memcpy(b.data(), h, sizeof h);
  b.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return b;
}

// Strata's version 2: the same header, uint32 tokens.
std::string llmc32(const std::vector<std::uint32_t>& tokens, int count_in_header) {
  std::string b(1024, '\0');
  const std::int32_t h[3] = {20240520, 2, count_in_header};
  std::memcpy(b.data(), h, sizeof h);
  b.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  return b;
}

std::vector<std::uint32_t> all(const model::TokenData& d) {
  std::vector<std::uint32_t> t(d.size());
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = d[i];
  return t;
}

}  // namespace

TEST_CASE("text files, directories and llm.c token files load as tokens", "[gpt][data]") {
  test::TempDir dir("strata-gpt-data");
  write(dir.file("a.txt"), "hello");
  auto d = model::TokenData::load(dir.file("a.txt"), 256);
  CHECK(all(d) == std::vector<std::uint32_t>{'h', 'e', 'l', 'l', 'o'});
  CHECK_FALSE(d.wide());
  write(dir.file("b.txt"), " world");
  write(dir.file("c.dat"), std::string("\x01\x00\x02", 3));  // binary: skipped in a directory
  d = model::TokenData::load(dir.path(), 256, "auto", true);
  CHECK(d.size() == 11);
  CHECK(d[5] == ' ');
  write(dir.file("t.bin"), llmc({1, 50000, 3}, 3));
  d = model::TokenData::load(dir.file("t.bin"), 50257);
  CHECK(all(d) == std::vector<std::uint32_t>{1, 50000, 3});
  CHECK_FALSE(d.wide());  // uint16 files stay 2 bytes a token
}

TEST_CASE("bad data files are refused naming the file and what is wrong", "[gpt][data][negative]") {
  test::TempDir dir("strata-gpt-data");
  write(dir.file("empty.txt"), "");
  auto e = error_of([&] { model::TokenData::load(dir.file("empty.txt"), 256); });
  CHECK_THAT(e, Catch::Contains("empty.txt") && Catch::Contains("holds no tokens"));
  e = error_of([&] { model::TokenData::load(dir.file("missing.txt"), 256); });
  CHECK_THAT(e, Catch::Contains("missing.txt") && Catch::Contains("does not exist"));
  write(dir.file("trunc.bin"), llmc({1, 2, 3}, 4));
  e = error_of([&] { model::TokenData::load(dir.file("trunc.bin"), 256); });
  CHECK_THAT(e, Catch::Contains("trunc.bin") && Catch::Contains("truncated"));
  write(dir.file("big.bin"), llmc({1, 300, 3}, 3));
  e = error_of([&] { model::TokenData::load(dir.file("big.bin"), 256); });
  CHECK_THAT(e,
             Catch::Contains("big.bin") && Catch::Contains("token 1 is 300") && Catch::Contains("vocabulary of 256"));
  // [regression] A token file whose magic is wrong was trained as bytes without a word.
  std::string wrong = llmc({1, 2, 3}, 3);
  wrong[0] ^= 0x01;
  write(dir.file("wrong-magic.bin"), wrong);
  e = error_of([&] { model::TokenData::load(dir.file("wrong-magic.bin"), 256); });
  CHECK_THAT(e, Catch::Contains("wrong-magic.bin") && Catch::Contains("no llm.c token header") &&
                    Catch::Contains("--data-format bytes"));
  write(dir.file("short.txt"), std::string(100, 'x'));
  const auto d = model::TokenData::load(dir.file("short.txt"), 256);
  e = error_of([&] { model::Batcher(d, dir.file("short.txt"), 128, 0.1, 0); });
  CHECK_THAT(e, Catch::Contains("short.txt") && Catch::Contains("too short") && Catch::Contains("needs 129"));
}

TEST_CASE("a step's global batch is the same however it is split over ranks and micro-batches", "[gpt][data]") {
  std::string text;
  for (int i = 0; i < 5000; ++i) text.push_back(static_cast<char>('a' + (i * 7919) % 26));
  test::TempDir dir("strata-gpt-data");
  write(dir.file("t.txt"), text);
  const auto d = model::TokenData::load(dir.file("t.txt"), 256);
  model::Batcher b(d, "t.txt", 16, 0.1, 3);
  const int T = 16, micro = 2;
  // world 1, 2 micro-batches of 2  ==  world 2, 1 micro-batch each  (train_batch 4)
  std::vector<std::int32_t> one(4 * T), two(4 * T), tg(4 * T);
  b.train_batch(5, 4, 0, 1, 0, micro, one.data(), tg.data());
  b.train_batch(5, 4, 1, 1, 0, micro, one.data() + 2 * T, tg.data());
  b.train_batch(5, 4, 0, 2, 0, micro, two.data(), tg.data());
  b.train_batch(5, 4, 0, 2, 1, micro, two.data() + 2 * T, tg.data());
  CHECK(one == two);
  std::vector<std::int32_t> r0(2 * T), r1(2 * T);
  b.train_batch(5, 4, 0, 2, 0, micro, r0.data(), tg.data());
  b.train_batch(5, 4, 0, 2, 1, micro, r1.data(), tg.data());
  CHECK(r0 != r1);  // ranks see different sequences
  // targets are the inputs shifted by one
  std::vector<std::int32_t> in(2 * T), t2(2 * T);
  b.train_batch(0, 2, 0, 1, 0, micro, in.data(), t2.data());
  for (int i = 0; i + 1 < T; ++i) CHECK(t2[i] == in[i + 1]);
  // validation batches come from the held-out tail
  b.val_batch(0, micro, in.data(), t2.data());
  CHECK(b.val_tokens() == 500);
}

TEST_CASE("--data that is a FIFO or a device is refused by name instead of blocking or growing without bound",
          "[gpt][data][negative][regression]") {
  test::TempDir dir("strata-gpt-data");
  // A FIFO with no writer: the ifstream's open waited forever for one.
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  auto e = error_of([&] { model::TokenData::load(dir.file("fifo"), 256); });
  CHECK_THAT(e, Catch::Contains("--data '" + dir.file("fifo") + "' is a FIFO, not a regular file"));
  // A link to /dev/zero: the read grew until memory ran out.
  REQUIRE(::symlink("/dev/zero", dir.file("zero").c_str()) == 0);
  e = error_of([&] { model::TokenData::load(dir.file("zero"), 256); });
  CHECK_THAT(e, Catch::Contains("--data '" + dir.file("zero") + "' is a character device, not a regular file"));
}

TEST_CASE("a --data directory reads its regular files and skips FIFOs, devices and subdirectories",
          "[gpt][data][regression]") {
  test::TempDir dir("strata-gpt-data");
  write(dir.file("a.txt"), "hello");
  write(dir.file("c.txt"), " world");
  REQUIRE(::mkfifo(dir.file("b.fifo").c_str(), 0600) == 0);
  REQUIRE(::symlink("/dev/zero", dir.file("b.zero").c_str()) == 0);
  REQUIRE(::symlink(dir.file("gone").c_str(), dir.file("b.broken").c_str()) == 0);
  REQUIRE(::mkdir(dir.file("b.sub").c_str(), 0700) == 0);
  REQUIRE(::symlink(dir.file("a.txt").c_str(), dir.file("d.link").c_str()) == 0);  // a.txt again: read once
  const auto d = model::TokenData::load(dir.path(), 256, "auto", true);
  const auto t = all(d);
  const std::string text(t.begin(), t.end());
  CHECK(text == "hello world");
  CHECK_THAT(d.description(), Catch::Contains("from 2 files"));
}

TEST_CASE("version 2 token files hold uint32 ids above 65535 and batch them unchanged", "[gpt][data][boundary]") {
  test::TempDir dir("strata-gpt-data");
  const std::vector<std::uint32_t> ids = {0, 65535, 65536, 128255, 7, 100000, 3, 128000, 1, 2, 99999};
  write(dir.file("wide.bin"), llmc32(ids, static_cast<int>(ids.size())));
  const auto d = model::TokenData::load(dir.file("wide.bin"), 128256);
  CHECK(d.wide());
  CHECK(all(d) == ids);
  // Batches carry the wide ids: inputs are the file's tokens from some offset, targets one on.
  model::Batcher b(d, "wide.bin", 4, 0.0, 11);
  std::vector<std::int32_t> in(4), tg(4);
  b.train_batch(0, 1, 0, 1, 0, 1, in.data(), tg.data());
  const auto at = std::find(ids.begin(), ids.end(), static_cast<std::uint32_t>(in[0]));
  REQUIRE(at != ids.end());
  const auto first = static_cast<std::size_t>(at - ids.begin());
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(static_cast<std::uint32_t>(in[i]) == ids[first + i]);
    CHECK(static_cast<std::uint32_t>(tg[i]) == ids[first + i + 1]);
  }
  // Headerless u32, and a directory mixing a uint16 and a uint32 file (widened in order).
  write(dir.file("raw.u32"), std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
  CHECK(all(model::TokenData::load(dir.file("raw.u32"), 128256, "u32")) == ids);
  test::TempDir mixed("strata-gpt-data");
  write(mixed.file("a.bin"), llmc({5, 60000}, 2));
  write(mixed.file("b.bin"), llmc32({70000, 6}, 2));
  const auto m = model::TokenData::load(mixed.path(), 128256);
  CHECK(m.wide());
  CHECK(all(m) == std::vector<std::uint32_t>{5, 60000, 70000, 6});
}

// What `strata tokenize` writes (tokenizer/token_file.h), version 1 and 2, is what --data reads.
TEST_CASE("token files the tokenizer writes load unchanged", "[gpt][data]") {
  test::TempDir dir("strata-gpt-data");
  const std::vector<std::uint32_t> small = {1, 65535, 3}, wide = {1, 65536, 128255};
  CHECK(tokenizer::write_token_file(dir.file("v1.bin"), small, 65536) == 1);
  CHECK(tokenizer::write_token_file(dir.file("v2.bin"), wide, 128256) == 2);
  CHECK(all(model::TokenData::load(dir.file("v1.bin"), 128256)) == small);
  const auto d = model::TokenData::load(dir.file("v2.bin"), 128256);
  CHECK(d.wide());
  CHECK(all(d) == wide);
}

TEST_CASE("bad version 2 token files are refused naming the file", "[gpt][data][negative]") {
  test::TempDir dir("strata-gpt-data");
  // A v2 header with a v1 payload size (2 bytes a token): the size does not match.
  std::string wrong = llmc32({1, 2, 3, 4}, 4);
  wrong.resize(1024 + 8);
  write(dir.file("v2-short.bin"), wrong);
  auto e = error_of([&] { model::TokenData::load(dir.file("v2-short.bin"), 1000); });
  CHECK_THAT(e, Catch::Contains("v2-short.bin") && Catch::Contains("uint32") && Catch::Contains("truncated"));
  write(dir.file("v2-big.bin"), llmc32({1, 128256, 3}, 3));
  e = error_of([&] { model::TokenData::load(dir.file("v2-big.bin"), 128256); });
  CHECK_THAT(e, Catch::Contains("v2-big.bin") && Catch::Contains("token 1 is 128256") &&
                    Catch::Contains("vocabulary of 128256"));
  std::string v3 = llmc32({1}, 1);
  v3[4] = 3;
  write(dir.file("v3.bin"), v3);
  e = error_of([&] { model::TokenData::load(dir.file("v3.bin"), 1000); });
  CHECK_THAT(e, Catch::Contains("v3.bin") && Catch::Contains("version 3"));
  write(dir.file("odd.u32"), std::string(6, '\1'));
  e = error_of([&] { model::TokenData::load(dir.file("odd.u32"), 1000, "u32"); });
  CHECK_THAT(e, Catch::Contains("odd.u32") && Catch::Contains("not a multiple of 4"));
}
