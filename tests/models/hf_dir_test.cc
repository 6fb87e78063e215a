// Hugging Face model directories (models/hf/): HfDirWriter's output read back by HfModelDir
// and, independently, by nlohmann::json and the plain safetensors reader (the index's
// total_size and weight_map, config.json's torch_dtype, the shard plan), fp32 bit for bit and
// bf16 rounded to nearest even against a reference on the bits; the writer's output rule and
// its cleanup; and every refusal of a damaged directory (a missing shard, a weight_map that
// disagrees with the shards, a tensor in two shards, a wrong total_size, a shard path
// leaving the directory, no config.json), plus check()'s one message naming the missing,
// extra, mis-shaped and mis-typed tensors.
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "models/hf/dir_writer.h"
#include "models/hf/format.h"
#include "models/hf/model_dir.h"
#include "runtime/core/error.h"
#include "tests/support/error_of.h"
#include "tests/support/randn.h"
#include "tests/support/temp_dir.h"

using namespace strata;
using namespace strata::model;
using strata::test::error_of;

namespace {

const std::string kConfig = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "torch_dtype": "float32"})";

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void spit(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

// Writes `tensors` with values from randn in pieces of `piece` values (crossing tensors and
// shards); returns the values in order.
std::vector<float> write_dir(const std::string& out, const HfDirWriter::Tensors& tensors, DType dtype,
                             std::uint64_t max_shard_bytes, std::uint64_t piece = 7) {
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += numel(t.second);
  const auto values = strata::test::randn(total, 42);
  HfDirWriter w(out, kConfig, tensors, dtype, max_shard_bytes);
  for (std::uint64_t at = 0; at < total; at += piece) w.write(values.data() + at, std::min(piece, total - at));
  w.finish();
  return values;
}

// A safetensors file written by hand: any dtype, the data zeros.
struct RawTensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t esize;
};
void raw_safetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  std::uint64_t off = 0;
  for (const auto& t : tensors) {
    const std::uint64_t b = numel(t.shape) * t.esize;
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + b}}};
    off += b;
  }
  std::string text = h.dump();
  while (text.size() % 8) text.push_back(' ');
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  spit(path, file + text + std::string(off, '\0'));
}

// bf16 by round-to-nearest-even on the bits (finite inputs), as a float.
float bf16_reference(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// A three-shard directory: with a 64-byte limit in fp32, a (48 B) + b (16 B) fill shard 1,
// c (128 B, over the limit) is alone in shard 2, d (8 B) + e (4 B) share shard 3.
const HfDirWriter::Tensors kSharded = {{"a", {3, 4}}, {"b", {4}}, {"c", {32}}, {"d", {2}}, {"e", {}}};

}  // namespace

TEST_CASE("shards are planned as transformers plans them, in tensor order", "[models][hf][interface]") {
  using hf::plan_shards;
  CHECK(plan_shards({48, 16, 128, 8, 4}, 64) == std::vector<std::size_t>{0, 0, 1, 2, 2});
  CHECK(plan_shards({10, 10, 10}, 1000) == std::vector<std::size_t>{0, 0, 0});
  CHECK(plan_shards({100, 1, 100}, 50) == std::vector<std::size_t>{0, 1, 2});  // large ones alone
  CHECK(plan_shards({30, 30, 30}, 60) == std::vector<std::size_t>{0, 0, 1});   // exactly full
  CHECK(plan_shards({}, 1).empty());
  CHECK(hf::shard_file_name(1, 3) == "model-00002-of-00003.safetensors");
}

TEST_CASE("shard size limits are read as Hugging Face writes them", "[models][hf][interface]") {
  using hf::parse_shard_bytes;
  CHECK(parse_shard_bytes("5GB") == 5'000'000'000u);
  CHECK(parse_shard_bytes("500MB") == 500'000'000u);
  CHECK(parse_shard_bytes("2GiB") == (std::uint64_t{2} << 30));
  CHECK(parse_shard_bytes("100KB") == 100'000u);
  CHECK(parse_shard_bytes("1000000") == 1'000'000u);
  CHECK_THAT(error_of([] { parse_shard_bytes("5Gb"); }), Catch::Contains("reads as bits"));
  CHECK_THAT(error_of([] { parse_shard_bytes("500mb"); }), Catch::Contains("--max-shard-size '500mb'"));
  CHECK_THAT(error_of([] { parse_shard_bytes("0"); }), Catch::Contains("is 0 bytes"));
  CHECK_THAT(error_of([] { parse_shard_bytes("5XB"); }), Catch::Contains("unknown unit"));
}

TEST_CASE("a sharded directory round-trips fp32 bit for bit with its index and config", "[models][hf][interface]") {
  strata::test::TempDir tmp("strata-hf-test");
  const std::string out = tmp.file("model");
  const auto values = write_dir(out, kSharded, DType::fp32, 64);
  CHECK_FALSE(exists(out + ".tmp"));
  // The index, read as plain JSON.
  const auto index = nlohmann::json::parse(slurp(out + "/model.safetensors.index.json"));
  CHECK(index["metadata"]["total_size"] == (12 + 4 + 32 + 2 + 1) * 4);
  const std::string s1 = "model-00001-of-00003.safetensors", s2 = "model-00002-of-00003.safetensors",
                    s3 = "model-00003-of-00003.safetensors";
  CHECK(index["weight_map"] == nlohmann::json{{"a", s1}, {"b", s1}, {"c", s2}, {"d", s3}, {"e", s3}});
  CHECK_FALSE(exists(out + "/model.safetensors"));
  // Each shard, read alone, holds its tensors.
  CHECK(SafetensorsReader(out + "/" + s1).tensors().size() == 2);
  CHECK(SafetensorsReader(out + "/" + s2).tensors().size() == 1);
  CHECK(SafetensorsReader(out + "/" + s3).metadata().at("format") == "pt");
  const auto config = nlohmann::json::parse(slurp(out + "/config.json"));
  CHECK(config["torch_dtype"] == "float32");
  CHECK(config["hidden_size"] == 8);
  // Back through HfModelDir, bit for bit, and only the bytes asked for are read.
  HfModelDir dir(out);
  CHECK(dir.has_weights());
  CHECK(dir.shard_files() == std::vector<std::string>{s1, s2, s3});
  CHECK(dir.config()["architectures"][0] == "LlamaForCausalLM");
  CHECK(nlohmann::json::parse(dir.config_text()) == config);
  CHECK(dir.shard_of("c") == s2);
  std::uint64_t at = 0;
  for (const auto& [name, shape] : kSharded) {
    const TensorInfo* t = dir.find(name);
    REQUIRE(t != nullptr);
    CHECK(t->shape == shape);
    CHECK(t->dtype == DType::fp32);
    std::vector<float> back(t->numel);
    dir.read(name, 0, t->numel, back.data());
    CHECK(std::memcmp(back.data(), values.data() + at, back.size() * 4) == 0);
    at += t->numel;
  }
  CHECK(dir.bytes_read() == at * 4);
  float two[2];
  dir.read("c", 5, 2, two);
  CHECK(dir.bytes_read() == at * 4 + 8);
  CHECK(two[1] == values[16 + 6]);
  CHECK_NOTHROW(dir.check({{"a", {3, 4}}, {"b", {4}}, {"c", {32}}, {"d", {2}}, {"e", {}}}));
}

TEST_CASE("a directory that fits one shard is model.safetensors without an index", "[models][hf][boundary]") {
  strata::test::TempDir tmp("strata-hf-test");
  const std::string out = tmp.file("model");
  const auto values = write_dir(out, kSharded, DType::fp32, 5'000'000'000ull, 1000);
  CHECK(exists(out + "/model.safetensors"));
  CHECK_FALSE(exists(out + "/model.safetensors.index.json"));
  HfModelDir dir(out);
  CHECK(dir.shard_files() == std::vector<std::string>{"model.safetensors"});
  CHECK(dir.total_bytes() == values.size() * 4);
  std::vector<float> a(12);
  dir.read("a", 0, 12, a.data());
  CHECK(std::memcmp(a.data(), values.data(), 48) == 0);
}

TEST_CASE("bf16 directories hold each value rounded to nearest even", "[models][hf][interface]") {
  strata::test::TempDir tmp("strata-hf-test");
  const std::string out = tmp.file("model");
  // Ties (1 + 2^-8 lies halfway between 1 and 1 + 2^-7; 1 + 3*2^-8 between 1 + 2^-7 and
  // 1 + 2^-6) go to the even neighbour; the rest are random.
  std::vector<float> values = strata::test::randn(40, 7);
  values[0] = 1.0f + 1.0f / 256;
  values[1] = 1.0f + 3.0f / 256;
  HfDirWriter w(out, kConfig, {{"x", {8, 5}}}, DType::bf16, 16);
  w.write(values.data(), values.size());
  w.finish();
  CHECK(nlohmann::json::parse(slurp(out + "/config.json"))["torch_dtype"] == "bfloat16");
  HfModelDir dir(out);
  REQUIRE(dir.find("x") != nullptr);
  CHECK(dir.find("x")->dtype == DType::bf16);
  std::vector<float> back(40);
  dir.read("x", 0, 40, back.data());
  CHECK(back[0] == 1.0f);
  CHECK(back[1] == 1.0f + 4.0f / 256);
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO("element " << i << " = " << values[i]);
    CHECK(back[i] == bf16_reference(values[i]));
  }
  CHECK(dir.bytes_read() == 80);
  // A tensor larger than the limit: one shard of its own, so a single file.
  CHECK(dir.shard_files() == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("the writer refuses an output that is not new and leaves nothing when unfinished", "[models][hf][negative]") {
  strata::test::TempDir tmp("strata-hf-test");
  const std::string out = tmp.file("model");
  ::mkdir(out.c_str(), 0755);
  spit(out + "/weights.bin", "mine");
  CHECK_THAT(error_of([&] { write_dir(out, kSharded, DType::fp32, 64); }),
             Catch::Contains("'" + out + "' exists and is not empty (it holds 'weights.bin')"));
  CHECK(slurp(out + "/weights.bin") == "mine");
  CHECK_FALSE(exists(out + ".tmp"));
  ::unlink((out + "/weights.bin").c_str());
  // A link to an empty directory would fail the rename at the end: refused at the start.
  ::mkdir(tmp.file("empty").c_str(), 0755);
  ::symlink(tmp.file("empty").c_str(), tmp.file("link").c_str());
  CHECK_THAT(error_of([&] { write_dir(tmp.file("link"), kSharded, DType::fp32, 64); }),
             Catch::Contains("exists and is a symbolic link"));
  CHECK_FALSE(exists(tmp.file("link.tmp")));
  // An empty directory is taken (the rename replaces it).
  CHECK_NOTHROW(write_dir(out, kSharded, DType::fp32, 64));
  CHECK(exists(out + "/model-00003-of-00003.safetensors"));
  // Unfinished: part of the values, then the writer goes; nothing stays.
  const std::string out2 = tmp.file("partial");
  {
    HfDirWriter w(out2, kConfig, kSharded, DType::fp32, 64);
    const auto v = strata::test::randn(20, 1);
    w.write(v.data(), v.size());  // shard 1 done, shard 2 begun
    CHECK(exists(out2 + ".tmp/model-00001-of-00003.safetensors"));
    CHECK_THAT(error_of([&] { w.finish(); }), Catch::Contains("tensor 'c' was not written whole (4 of its values"));
  }
  CHECK_FALSE(exists(out2));
  CHECK_FALSE(exists(out2 + ".tmp"));
  // A killed writer's leftover OUT.tmp is removed; a directory of other files is not.
  ::mkdir((out2 + ".tmp").c_str(), 0755);
  spit(out2 + ".tmp/model-00001-of-00003.safetensors.tmp", "half");
  CHECK_NOTHROW(write_dir(out2, kSharded, DType::fp32, 64));
  CHECK_FALSE(exists(out2 + ".tmp"));
  const std::string out3 = tmp.file("other");
  ::mkdir((out3 + ".tmp").c_str(), 0755);
  spit(out3 + ".tmp/notes.txt", "keep");
  CHECK_THAT(error_of([&] { write_dir(out3, kSharded, DType::fp32, 64); }),
             Catch::Contains("holds 'notes.txt', which an interrupted export does not leave"));
  CHECK(slurp(out3 + ".tmp/notes.txt") == "keep");
  CHECK_THAT(error_of([&] { write_dir(tmp.file("none/model"), kSharded, DType::fp32, 64); }),
             Catch::Contains("does not exist"));
  CHECK_THAT(error_of([&] { HfDirWriter(tmp.file("x"), "[1]", kSharded, DType::fp32, 64); }),
             Catch::Contains("is a JSON array, not an object"));
  CHECK_FALSE(exists(tmp.file("x.tmp")));
}

TEST_CASE("damaged Hugging Face directories are refused naming the file and the tensor", "[models][hf][negative]") {
  strata::test::TempDir tmp("strata-hf-test");
  const std::string s1 = "model-00001-of-00003.safetensors", s2 = "model-00002-of-00003.safetensors";
  int n = 0;
  // A fresh three-shard directory whose index is edited by `edit`; the error opening it.
  const auto opened_with = [&](const std::function<void(nlohmann::json&, const std::string&)>& edit) {
    const std::string out = tmp.file("m" + std::to_string(n++));
    write_dir(out, kSharded, DType::fp32, 64);
    auto index = nlohmann::json::parse(slurp(out + "/model.safetensors.index.json"));
    edit(index, out);
    spit(out + "/model.safetensors.index.json", index.dump());
    return error_of([&] { HfModelDir d(out); });
  };
  CHECK(opened_with([](nlohmann::json&, const std::string&) {}).empty());
  CHECK_THAT(opened_with([&](nlohmann::json&, const std::string& d) { ::unlink((d + "/" + s2).c_str()); }),
             Catch::Contains("/" + s2 +
                             "', the shard that model.safetensors.index.json names for 1 tensor (such as "
                             "'c'), is missing"));
  CHECK_THAT(opened_with([&](nlohmann::json& i, const std::string&) { i["weight_map"]["b"] = s2; }),
             Catch::Contains("weight_map puts tensor 'b' in '" + s2 + "', but it lies in '" + s1 + "'"));
  CHECK_THAT(opened_with([&](nlohmann::json& i, const std::string&) { i["weight_map"].erase("d"); }),
             Catch::Contains("holds tensor 'd', which model.safetensors.index.json's weight_map does not list"));
  CHECK_THAT(opened_with([&](nlohmann::json& i, const std::string&) { i["weight_map"]["ghost"] = s1; }),
             Catch::Contains("weight_map puts tensor 'ghost' in '" + s1 + "', which does not hold it"));
  CHECK_THAT(opened_with([](nlohmann::json& i, const std::string&) { i["metadata"]["total_size"] = 205; }),
             Catch::Contains("metadata.total_size is 205 bytes, but the 3 shards' tensors hold 204"));
  CHECK(opened_with([](nlohmann::json& i, const std::string&) { i["metadata"]["total_size"] = 204.0; }).empty());
  CHECK(opened_with([](nlohmann::json& i, const std::string&) { i.erase("metadata"); }).empty());
  for (const nlohmann::json& bad :
       {nlohmann::json(-1), nlohmann::json(1e30), nlohmann::json(204.5), nlohmann::json("204")}) {
    CHECK_THAT(opened_with([&](nlohmann::json& i, const std::string&) { i["metadata"]["total_size"] = bad; }),
               Catch::Contains("metadata.total_size is " + bad.dump() + ", not a byte count"));
  }
  // A name with a control byte is shown escaped, on one line.
  CHECK_THAT(opened_with([](nlohmann::json& i, const std::string&) { i["weight_map"]["e"] = "../x\n.safetensors"; }),
             Catch::Contains("in '../x\\x0a.safetensors', which is not a file inside"));
  CHECK_THAT(opened_with([](nlohmann::json& i, const std::string&) { i["weight_map"]["e"] = "../model.safetensors"; }),
             Catch::Contains("puts tensor 'e' in '../model.safetensors', which is not a file inside the model"));
  CHECK_THAT(opened_with([](nlohmann::json& i, const std::string&) { i["weight_map"]["e"] = "/etc/passwd"; }),
             Catch::Contains("which is not a file inside the model directory"));
  CHECK_THAT(opened_with([](nlohmann::json& i, const std::string&) { i.erase("weight_map"); }),
             Catch::Contains("has no weight_map object"));
  CHECK_THAT(opened_with([](nlohmann::json&, const std::string& d) { ::unlink((d + "/config.json").c_str()); }),
             Catch::Contains("has no config.json"));
  CHECK_THAT(opened_with([](nlohmann::json&, const std::string& d) { spit(d + "/model.safetensors", ""); }),
             Catch::Contains("holds both model.safetensors and model.safetensors.index.json"));
  // One tensor in two shards (and each shard's map entry pointing at one of them).
  const std::string dup = tmp.file("dup");
  ::mkdir(dup.c_str(), 0755);
  spit(dup + "/config.json", kConfig);
  write_safetensors(dup + "/" + s1, {{"a", {1}, {1}}, {"b", {1}, {2}}});
  write_safetensors(dup + "/" + s2, {{"b", {1}, {3}}, {"c", {1}, {4}}});
  spit(dup + "/model.safetensors.index.json", nlohmann::json{{"weight_map", {{"a", s1}, {"b", s1}, {"c", s2}}}}.dump());
  CHECK_THAT(error_of([&] { HfModelDir d(dup); }),
             Catch::Contains("tensor 'b' is in both '" + s1 + "' and '" + s2 + "'"));
}

TEST_CASE("a directory with config.json alone opens without weights", "[models][hf][boundary]") {
  strata::test::TempDir tmp("strata-hf-test");
  spit(tmp.file("config.json"), kConfig);
  HfModelDir dir(tmp.path());
  CHECK_FALSE(dir.has_weights());
  CHECK(dir.tensors().empty());
  CHECK(dir.config()["hidden_size"] == 8);
  CHECK_THAT(error_of([&] { dir.check({{"a", {2}}}); }), Catch::Contains("1 missing (the model registers them): 'a'"));
  spit(tmp.file("pytorch_model.bin"), "pickle");
  CHECK_THAT(error_of([&] { HfModelDir d(tmp.path()); }),
             Catch::Contains("holds its weights as pytorch_model.bin (PyTorch's pickle format), which Strata does not "
                             "read"));
  ::unlink(tmp.file("pytorch_model.bin").c_str());
  spit(tmp.file("config.json"), "{\"broken\": ");
  CHECK_THAT(error_of([&] { HfModelDir d(tmp.path()); }), Catch::Contains("config.json' is not JSON"));
}

TEST_CASE("check names every missing, extra, mis-shaped and mis-typed tensor in one message",
          "[models][hf][negative]") {
  strata::test::TempDir tmp("strata-hf-test");
  spit(tmp.file("config.json"), kConfig);
  raw_safetensors(tmp.file("model.safetensors"), {{"w", "F32", {3, 2}, 4},
                                                  {"ok", "BF16", {4}, 2},
                                                  {"ids", "I64", {5}, 8},
                                                  {"scale", "F8_E4M3", {2}, 1},
                                                  {"x1", "F32", {1}, 4},
                                                  {"x2", "F16", {1}, 2}});
  HfModelDir dir(tmp.path());
  CHECK(dir.tensors().size() == 4);
  REQUIRE(dir.other_tensors().size() == 2);
  CHECK(dir.other_tensors()[0].dtype == "I64");
  CHECK(dir.total_bytes() == 24 + 8 + 40 + 2 + 4 + 2);
  CHECK(dir.find("ids") == nullptr);
  CHECK_THAT(error_of([&] {
               float v;
               dir.read("ids", 0, 1, &v);
             }),
             Catch::Contains("tensor 'ids' is I64; Strata reads F32, BF16 and F16"));
  hf::WantedTensors wanted = {{"w", {2, 3}}, {"ok", {4}}, {"ids", {5}}};
  for (int i = 0; i < 7; ++i) wanted.push_back({"gone" + std::to_string(i), {1}});
  const auto c = dir.compare(wanted);
  CHECK(c.missing.size() == 7);
  CHECK(c.extra == std::vector<std::string>{"scale", "x1", "x2"});
  REQUIRE(c.misshaped.size() == 1);
  CHECK(c.misshaped[0].found == std::vector<std::int64_t>{3, 2});
  REQUIRE(c.mistyped.size() == 1);
  CHECK(c.mistyped[0].name == "ids");
  const std::string msg = error_of([&] { dir.check(wanted); });
  CHECK_THAT(msg, Catch::Contains("'" + tmp.path() + "' does not hold this model's weights"));
  CHECK_THAT(msg, Catch::Contains("7 missing (the model registers them): 'gone0', 'gone1', 'gone2', 'gone3', "
                                  "'gone4' (and 2 more)"));
  CHECK_THAT(msg, Catch::Contains("3 extra (the model does not register them): 'scale', 'x1', 'x2'"));
  CHECK_THAT(msg, Catch::Contains("1 mis-shaped: 'w' (expected [2, 3], found [3, 2])"));
  CHECK_THAT(msg, Catch::Contains("1 mis-typed (Strata reads F32, BF16 and F16): 'ids' (I64)"));
  CHECK_THAT(msg, Catch::Contains("Check that the directory is a checkpoint of this model"));
  // Every name and shape right: the dtypes alone are refused.
  const std::string typed = error_of([&] {
    dir.check({{"w", {3, 2}}, {"ok", {4}}, {"ids", {5}}, {"scale", {2}}, {"x1", {1}}, {"x2", {1}}});
  });
  CHECK_THAT(typed, Catch::Contains("2 mis-typed (Strata reads F32, BF16 and F16): 'ids' (I64), 'scale' (F8_E4M3)"));
  CHECK_THAT(typed, !Catch::Contains("missing") && !Catch::Contains("extra") && !Catch::Contains("mis-shaped"));
}
