// The tokenizer library's pieces (tokenizer/): GPT-2's byte map, the BPE merge loop against a
// naive GPT-2 bpe() written here, pre-tokenizer splits, the errors bad tokenizer files get
// (naming the file and the key), and the token file writer read back by the format's description.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/token_file.h"
#include "tokenizer/tokenizer.h"

using namespace strata;
using namespace strata::tokenizer;
using nlohmann::json;
using strata::test::error_of;

namespace {

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A byte-level tokenizer.json: the 256 bytes, then one entry per merge in order.
json tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_unicode(std::string(1, static_cast<char>(b)))] = b;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    const auto ua = bytes_to_unicode(a), ub = bytes_to_unicode(b);
    if (!vocab.contains(ua + ub)) vocab[ua + ub] = vocab.size();
    m.push_back(ua + " " + ub);
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}}};
}

// GPT-2's bpe() as its encoder.py writes it: rescan for the lowest-ranked pair, merge all of
// its occurrences left to right, repeat.
std::vector<std::string> naive_bpe(const std::string& word,
                                   const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> parts;
  for (const char c : word) parts.emplace_back(1, c);
  for (;;) {
    int best = -1;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = ranks.find({parts[i], parts[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) best = it->second;
    }
    if (best < 0) return parts;
    std::vector<std::string> out;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const auto it = i + 1 < parts.size() ? ranks.find({parts[i], parts[i + 1]}) : ranks.end();
      if (it != ranks.end() && it->second == best) {
        out.push_back(parts[i] + parts[i + 1]);
        ++i;
      } else {
        out.push_back(parts[i]);
      }
    }
    parts = out;
  }
}

}  // namespace

TEST_CASE("GPT-2's byte map spells each byte as one distinct printable code point and back", "[tokenizer]") {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = byte_to_char()[static_cast<std::size_t>(b)];
    seen.insert(c);
    // Printable ASCII and Latin-1 bytes keep their code point; the others move above U+00FF.
    const bool printable = (b > 0x20 && b < 0x7F) || (b >= 0xA1 && b != 0xAD);
    CHECK((c == static_cast<char32_t>(b)) == printable);
    CHECK(c <= 0x143);
  }
  CHECK(seen.size() == 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  REQUIRE(unicode_to_bytes(bytes_to_unicode(all), back));
  CHECK(back == all);
  CHECK_FALSE(unicode_to_bytes("\xe2\x82\xac", back));  // U+20AC is outside the map
  CHECK_FALSE(unicode_to_bytes("\xc3", back));          // truncated UTF-8
}

TEST_CASE("the BPE merge loop gives GPT-2's bpe() for random words and merge tables", "[tokenizer]") {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    // Random merges over 'a'..'d' and what they build, in rank order.
    std::vector<std::string> tokens = {"a", "b", "c", "d"};
    std::vector<std::pair<std::string, std::string>> merges;
    std::map<std::pair<std::string, std::string>, int> ranks;
    for (int k = 0; k < 25; ++k) {
      const auto& x = tokens[rng() % tokens.size()];
      const auto& y = tokens[rng() % tokens.size()];
      if (ranks.count({x, y}) || x.size() + y.size() > 6) continue;
      ranks[{x, y}] = static_cast<int>(merges.size());
      merges.emplace_back(x, y);
      if (std::find(tokens.begin(), tokens.end(), x + y) == tokens.end()) tokens.push_back(x + y);
    }
    std::unordered_map<std::string, std::uint32_t> vocab;
    for (int b = 0; b < 256; ++b) vocab[std::string(1, static_cast<char>(b))] = static_cast<std::uint32_t>(b);
    for (const auto& t : tokens) vocab.emplace(t, static_cast<std::uint32_t>(vocab.size()));
    const BytePairModel model(vocab, merges, false, "test");
    for (int w = 0; w < 50; ++w) {
      std::string word;
      for (std::size_t n = 1 + rng() % 12; n > 0; --n) word.push_back(static_cast<char>('a' + rng() % 4));
      std::vector<std::uint32_t> got;
      model.encode(word, got);
      std::vector<std::uint32_t> want;
      for (const auto& p : naive_bpe(word, ranks)) want.push_back(vocab.at(p));
      INFO("word " << word);
      CHECK(got == want);
    }
  }
}

TEST_CASE("ignore_merges takes a word that is a vocabulary entry as it is", "[tokenizer]") {
  std::unordered_map<std::string, std::uint32_t> vocab;
  for (int b = 0; b < 256; ++b) vocab[std::string(1, static_cast<char>(b))] = static_cast<std::uint32_t>(b);
  vocab["ab"] = 256;
  vocab["abc"] = 257;  // no merge builds it
  const std::vector<std::pair<std::string, std::string>> merges = {{"a", "b"}};
  std::vector<std::uint32_t> plain, ignoring;
  BytePairModel(vocab, merges, false, "test").encode("abc", plain);
  BytePairModel(vocab, merges, true, "test").encode("abc", ignoring);
  CHECK(plain == std::vector<std::uint32_t>{256, 'c'});
  CHECK(ignoring == std::vector<std::uint32_t>{257});
}

TEST_CASE("pre-tokenizers cut text into pieces that concatenate back to it", "[tokenizer]") {
  const json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const auto pre = PreTokenizer::from_json(gpt2, "test");
  const std::string text = "Hello  world, it's 2026!\n\n  \xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac";
  std::vector<std::string> pieces;
  pre.split(text, [&](std::string_view p) { pieces.emplace_back(p); });
  std::string joined;
  for (const auto& p : pieces) joined += p;
  CHECK(joined == text);
  CHECK(pieces[0] == "Hello");
  CHECK(std::find(pieces.begin(), pieces.end(), "'s") != pieces.end());
  CHECK(std::find(pieces.begin(), pieces.end(), " 2026") != pieces.end());
  // Removed drops the matches; add_prefix_space puts one space before text lacking it.
  const json removed = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}}}};
  pieces.clear();
  PreTokenizer::from_json(removed, "test").split("a-b- c", [&](std::string_view p) { pieces.emplace_back(p); });
  CHECK(pieces == std::vector<std::string>{" a", " b", " c"});
}

TEST_CASE("bad tokenizer files are refused naming the file and the key", "[tokenizer][negative]") {
  test::TempDir dir("strata-tokenizer");
  auto e = error_of([&] { Tokenizer::open(dir.file("missing.json")); });
  CHECK_THAT(e, Catch::Contains("missing.json") && Catch::Contains("does not exist"));
  write(dir.file("bad.json"), "{\"model\": {\"type\": \"BPE\",");
  e = error_of([&] { Tokenizer::open(dir.file("bad.json")); });
  CHECK_THAT(e, Catch::Contains("bad.json") && Catch::Contains("not valid JSON"));
  const auto refused = [&](const std::string& name, const json& j) {
    write(dir.file(name), j.dump());
    return error_of([&] { Tokenizer::open(dir.file(name)); });
  };
  json j = tiny_tokenizer({{"a", "b"}});
  j["model"]["type"] = "WordPiece";
  CHECK_THAT(refused("wordpiece.json", j),
             Catch::Contains("wordpiece.json") && Catch::Contains("model.type") && Catch::Contains("WordPiece"));
  j = tiny_tokenizer({{"a", "b"}});
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  CHECK_THAT(refused("lower.json", j),
             Catch::Contains("lower.json") &&
                 Catch::Contains("normalizer.normalizers[1].type \"Lowercase\" is not implemented"));
  j = tiny_tokenizer({{"a", "b"}});
  j["model"].erase("vocab");
  CHECK_THAT(refused("novocab.json", j), Catch::Contains("novocab.json") && Catch::Contains("vocab"));
  j = tiny_tokenizer({{"a", "b"}});
  j["model"]["merges"].push_back("a \xc4\x80\xc4\x80");  // a merge whose right part is not a token
  CHECK_THAT(refused("merge.json", j),
             Catch::Contains("merge.json") && Catch::Contains("model.merges[1]") && Catch::Contains("right part"));
  j = tiny_tokenizer({{"a", "b"}});
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  CHECK_THAT(refused("meta.json", j),
             Catch::Contains("meta.json") && Catch::Contains("pre_tokenizer.type") && Catch::Contains("Metaspace"));
  j = tiny_tokenizer({{"a", "b"}});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  CHECK_THAT(refused("regex.json", j), Catch::Contains("regex.json") && Catch::Contains("pre_tokenizer.pattern.Regex"));
  j = tiny_tokenizer({{"a", "b"}});
  j["added_tokens"] = {{{"id", 300}, {"content", "<s>"}, {"lstrip", true}}};
  CHECK_THAT(refused("lstrip.json", j), Catch::Contains("lstrip.json") && Catch::Contains("added_tokens[0].lstrip"));
  j = tiny_tokenizer({{"a", "b"}});
  j["added_tokens"] = {{{"id", 4294967296ull}, {"content", "<s>"}}};  // would wrap to 0 as uint32
  CHECK_THAT(refused("huge.json", j), Catch::Contains("huge.json") && Catch::Contains("added_tokens[0].id"));
  // Names from the file are escaped: every refusal is one line.
  j = tiny_tokenizer({{"a", "b"}});
  j["model"]["type"] = "Word\nPiece";
  e = refused("newline.json", j);
  CHECK_THAT(e, Catch::Contains("model.type \"Word\\x0aPiece\""));
  CHECK(e.find('\n') == std::string::npos);
  write(dir.file("deep.json"), std::string(100, '[') + std::string(100, ']'));
  e = error_of([&] { Tokenizer::open(dir.file("deep.json")); });
  CHECK_THAT(e, Catch::Contains("deep.json") && Catch::Contains("nests deeper than"));
  write(dir.file("garbage.model"), "not a protobuf");
  e = error_of([&] { Tokenizer::open(dir.file("garbage.model")); });
  CHECK_THAT(e, Catch::Contains("garbage.model") && Catch::Contains("not a SentencePiece model"));
}

TEST_CASE("a tiny tokenizer.json encodes, decodes and refuses unknown ids", "[tokenizer]") {
  test::TempDir dir("strata-tokenizer");
  json j = tiny_tokenizer({{"h", "e"}, {"he", "l"}, {" ", "w"}});
  j["added_tokens"] = {{{"id", 70000}, {"content", "<|end|>"}, {"special", true}}};
  write(dir.file("tokenizer.json"), j.dump());
  const auto tok = Tokenizer::open(dir.path());  // a directory holding tokenizer.json
  CHECK(tok->vocab_size() == 70001);
  CHECK_FALSE(tok->bos_id());
  const auto ids = tok->encode("hello<|end|> wow");
  const std::uint32_t he = j["model"]["vocab"]["he"], hel = j["model"]["vocab"]["hel"], sw = j["model"]["vocab"]["Ġw"];
  CHECK(ids == std::vector<std::uint32_t>{hel, 'l', 'o', 70000, sw, 'o', 'w'});
  CHECK(he != hel);
  CHECK(tok->decode(ids) == "hello<|end|> wow");
  auto e = error_of([&] { tok->decode({1, 69999}); });
  CHECK_THAT(e, Catch::Contains("id 69999") && Catch::Contains("tokenizer.json"));
  e = error_of([&] { tok->encode("ok \xff\xfe"); });
  CHECK_THAT(e, Catch::Contains("not UTF-8 at byte 3"));
}

TEST_CASE("token files are uint16 version 1 when ids fit, else uint32 version 2, written whole",
          "[tokenizer][boundary]") {
  test::TempDir dir("strata-tokenizer");
  const std::vector<std::uint32_t> small = {1, 65535, 3}, wide = {1, 65536, 128255};
  CHECK(write_token_file(dir.file("v1.bin"), small, 65536) == 1);
  CHECK(std::filesystem::file_size(dir.file("v1.bin")) == 1024 + 2 * small.size());
  CHECK(write_token_file(dir.file("v2.bin"), wide, 128256) == 2);
  CHECK(std::filesystem::file_size(dir.file("v2.bin")) == 1024 + 4 * wide.size());
  CHECK(write_token_file(dir.file("v2-vocab.bin"), small, 128256) == 2);  // ids fit, the vocabulary does not
  // Read back by the format's description (token_file.h), not by the writer's code: the
  // GPT's reader of these files is tests/models' (gpt_data_test.cc).
  for (const auto& [name, want, version] : {std::tuple{"v1.bin", small, 1}, std::tuple{"v2.bin", wide, 2}}) {
    std::ifstream f(dir.file(name), std::ios::binary);
    std::vector<std::int32_t> header(256);
    f.read(reinterpret_cast<char*>(header.data()), 1024);
    CHECK(header[0] == 20240520);
    CHECK(header[1] == version);
    REQUIRE(header[2] == static_cast<std::int32_t>(want.size()));
    std::vector<std::uint32_t> got(want.size());
    for (auto& id : got) {
      std::uint32_t v = 0;  // little-endian, 2 or 4 bytes
      f.read(reinterpret_cast<char*>(&v), version == 1 ? 2 : 4);
      id = v;
    }
    CHECK(f.good());
    CHECK(got == want);
  }
  // A failed rename (OUT is a directory) leaves no OUT.tmp behind.
  std::filesystem::create_directory(dir.file("out"));
  const auto e = error_of([&] { write_token_file(dir.file("out"), small, 256); });
  CHECK_THAT(e, Catch::Contains("out.tmp"));
  CHECK_FALSE(std::filesystem::exists(dir.file("out.tmp")));
}
