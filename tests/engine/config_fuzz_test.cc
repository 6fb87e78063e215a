// Generated configs through the real reader (parse_config): the collected DeepSpeed configs
// (ds_configs/) truncated and mutated at random, deep nesting, huge keys and values, bad
// numbers and bad bytes, and inputs at the limits of config.h. Every case must be accepted
// or refused with a strata::Error whose message is one line naming the file, and each must
// take under a second. Seeded, so a failure names a case that reproduces.
#include "tests/engine/config_test_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "runtime/core/log.h"

using namespace strata;
using namespace strata::engine;
using namespace strata::engine::test;

namespace {

struct Case {
  std::string name;
  std::string text;
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<Case> seeds() {
  std::vector<Case> out;
  for (const auto& entry : std::filesystem::directory_iterator(STRATA_DS_CONFIGS_DIR)) {
    if (entry.path().extension() == ".json") out.push_back({entry.path().filename().string(), read_file(entry.path())});
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
  return out;
}

std::string nest(int depth, bool objects, const std::string& inner) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += objects ? "{\"k\": " : "[";
  text += inner;
  for (int i = 0; i < depth; ++i) text += objects ? "}" : "]";
  return text;
}

// `value` placed at one of the places a config reads (or does not read) values from.
std::string place(int where, const std::string& value) {
  switch (where) {
    case 0:
      return "{\"train_batch_size\": " + value + "}";
    case 1:
      return with_batch("\"zero_optimization\": {\"stage\": " + value + "}");
    case 2:
      return with_batch("\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": " + value + "}}");
    case 3:
      return with_batch("\"memory_budget\": {\"host\": " + value + "}");
    case 4:
      return with_batch("\"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": " + value + "}");
    case 5:
      return with_batch("\"gradient_clipping\": " + value);
    case 6:
      return with_batch("\"unknown_top_level\": " + value);
    case 7:
      return with_batch("\"optimizer\": {\"type\": " + value + "}");
    case 8:
      return with_batch("\"zero_optimization\": " + value);
    default:
      return with_batch("\"checkpoint\": {\"save_dir\": " + value + "}");
  }
}
constexpr int kPlaces = 10;

void add_nesting(std::vector<Case>& out) {
  for (int depth : {1, 2, 10, 62, 63, 64, 65, 100, 1000, 30000, 70000}) {
    for (int kind = 0; kind < 3; ++kind) {
      std::string value = kind == 2 ? nest(depth / 2, true, nest(depth - depth / 2, false, "1"))
                                    : nest(depth, kind == 1, kind == 1 ? "1" : "");
      for (int where = 0; where < kPlaces; ++where) {
        out.push_back({str_cat("nesting depth ", depth, " kind ", kind, " at place ", where), place(where, value)});
      }
    }
  }
}

void add_huge_keys_and_values(std::vector<Case>& out) {
  for (std::size_t length : {1, 5, 63, 64, 65, 1000, 100000, 1000000}) {
    for (const std::string& fill : {std::string("k"), std::string("stage"), std::string("\\n\\u0000")}) {
      std::string key;
      while (key.size() < length) key += fill;
      key.resize(length);
      if (key.back() == '\\') key.back() = 'x';
      const std::string entry = "\"" + key + "\": 1";
      out.push_back({str_cat("key of ", length, " at the top"), with_batch(entry)});
      out.push_back({str_cat("key of ", length, " in zero_optimization"), place(8, "{" + entry + "}")});
      out.push_back({str_cat("key of ", length, " in optimizer.params"),
                     with_batch("\"optimizer\": {\"type\": \"Adam\", \"params\": {" + entry + "}}")});
      out.push_back(
          {str_cat("key of ", length, " in memory_budget"), with_batch("\"memory_budget\": {" + entry + "}")});
    }
    const std::string text(length, 'v');
    const std::string numbers = "[" + std::string(length / 2, '1') + "]";
    for (int where = 0; where < kPlaces; ++where) {
      out.push_back({str_cat("string of ", length, " at place ", where), place(where, "\"" + text + "\"")});
      out.push_back({str_cat("array of ", length, " at place ", where), place(where, numbers)});
      out.push_back({str_cat("object of ", length, " at place ", where), place(where, "{\"" + text + "\": 0}")});
    }
  }
}

void add_bad_numbers(std::vector<Case>& out) {
  for (const char* number : {"1e999",
                             "-1e999",
                             "1e-999",
                             "1E+400",
                             "123456789012345678901234567890",
                             "-9223372036854775809",
                             "18446744073709551616",
                             "1e19",
                             "9.3e18",
                             "-0",
                             "0.5",
                             "NaN",
                             "Infinity",
                             "-Infinity",
                             "0x10",
                             "01",
                             "+1",
                             "1e",
                             "1.",
                             ".5",
                             "--1",
                             "1e+",
                             "2.5e-310",
                             "1.7976931348623157e308",
                             "1.7976931348623159e308",
                             "3.5e38",
                             "-3.5e38",
                             "\"1e999\"",
                             "\"5e8\"",
                             "\"-1\"",
                             "\"8GiB\"",
                             "\"8 GiB\"",
                             "\"1e30\"",
                             "\"nan\"",
                             "\"inf\"",
                             "true",
                             "null"}) {
    for (int where = 0; where < kPlaces; ++where) {
      out.push_back({str_cat("number ", number, " at place ", where), place(where, number)});
    }
  }
}

void add_bad_bytes(std::vector<Case>& out) {
  const std::vector<std::string> bytes = {
      std::string(1, '\0'), "\x01",    "\n",      "\x7f", "\x80",        "\xc0\xaf", "\xff", "\xed\xa0\x80",
      "\xf4\x90\x80\x80",   "\\ud800", "\\u0000", "\\",   "\xef\xbb\xbf"};
  for (const auto& b : bytes) {
    out.push_back({"bad byte in a key", with_batch("\"ke" + b + "y\": 1")});
    out.push_back({"bad byte in a value", place(7, "\"Ad" + b + "am\"")});
    out.push_back({"bad byte in a byte size", place(3, "\"8" + b + "GiB\"")});
    out.push_back({"bad byte between tokens", with_batch("\"x\": " + b + "1")});
    out.push_back({"bad byte first", b + with_batch("")});
    out.push_back({"bad byte last", with_batch("") + b});
  }
}

void add_limits(std::vector<Case>& out) {
  out.push_back({"size limit + 1", std::string(kMaxConfigBytes + 1, ' ')});
  const std::string head = with_batch("\"padding\": \"");
  out.push_back({"size limit exactly", head + std::string(kMaxConfigBytes - head.size() - 2, 'p') + "\"}"});
  for (std::size_t keys : {kMaxConfigKeys - 1, kMaxConfigKeys, kMaxConfigKeys + 1}) {
    std::string body = "\"train_micro_batch_size_per_gpu\": 1";
    for (std::size_t i = 1; i < keys; ++i) body += str_cat(", \"", std::string(60000, 'k'), i, "\": 0");
    out.push_back({str_cat(keys, " long keys at the top"), "{" + body + "}"});
  }
}

// Random edits of a real config: bytes changed, inserted, removed or repeated, tokens
// that break JSON or its numbers, and deep nesting dropped in.
std::string mutate(std::string text, std::mt19937_64& rng) {
  const std::vector<std::string> tokens = {"{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"",
                                           ",",
                                           ":",
                                           "\\",
                                           "0",
                                           "-",
                                           "e",
                                           ".",
                                           " ",
                                           "\n",
                                           std::string(1, '\0'),
                                           "\x80",
                                           "\xff",
                                           "true",
                                           "null",
                                           "1e999",
                                           "\"auto\"",
                                           "-1",
                                           "18446744073709551616",
                                           "\"stage\": 3",
                                           nest(100, false, "")};
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    const std::size_t at = text.empty() ? 0 : rng() % (text.size() + 1);
    const std::size_t span = 1 + rng() % 32;
    switch (rng() % 5) {
      case 0:
        if (at < text.size()) text[at] = static_cast<char>(rng() % 256);
        break;
      case 1:
        text.insert(at, tokens[rng() % tokens.size()]);
        break;
      case 2:
        text.erase(at, span);
        break;
      case 3:
        text.insert(at, text.substr(rng() % (text.size() + 1), span));
        break;
      default:
        text.insert(at, std::string(span, static_cast<char>(rng() % 256)));
        break;
    }
  }
  return text;
}

std::vector<Case> generate() {
  std::vector<Case> out;
  std::mt19937_64 rng(20240521);
  for (const Case& seed : seeds()) {
    out.push_back(seed);
    for (int i = 0; i < 20; ++i) {
      const std::size_t cut = rng() % (seed.text.size() + 1);
      out.push_back({str_cat(seed.name, " truncated at ", cut), seed.text.substr(0, cut)});
    }
    for (int i = 0; i < 25; ++i) out.push_back({str_cat(seed.name, " mutation ", i), mutate(seed.text, rng)});
  }
  add_nesting(out);
  add_huge_keys_and_values(out);
  add_bad_numbers(out);
  add_bad_bytes(out);
  add_limits(out);
  return out;
}

bool one_line(const std::string& message) {
  return std::none_of(message.begin(), message.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; });
}

}  // namespace

TEST_CASE("generated configs are read or refused with a one-line error, each within a second",
          "[config][negative][fuzz]") {
  const std::vector<Case> cases = generate();
  REQUIRE(cases.size() >= 1000);
  const LogLevel saved = log_level();
  set_log_level(LogLevel::error);  // the generated unknown top-level keys each warn
  std::size_t accepted = 0, refused = 0;
  double slowest = 0;
  std::string slowest_name;
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    try {
      parse_config(c.text, "fuzz.json", facts(2, 1024));
      ++accepted;
    } catch (const Error& e) {
      ++refused;
      const std::string message = e.what();
      if (!one_line(message) || message.rfind("fuzz.json: ", 0) != 0 || message.size() > 2000) {
        FAIL_CHECK(c.name << ": the error is not one short line naming the file: " << message);
      }
    } catch (const std::exception& e) {
      FAIL_CHECK(c.name << ": " << typeid(e).name() << " escaped the reader: " << e.what());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > slowest) {
      slowest = seconds;
      slowest_name = c.name;
    }
  }
  set_log_level(saved);
  std::printf("config fuzz: %zu cases, %zu accepted, %zu refused; slowest %.3f s (%s)\n", cases.size(), accepted,
              refused, slowest, slowest_name.c_str());
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitizer slows the reader about 3.5x (the largest case, 15 MB of keys, takes 0.28 s
  // plain and 1.02 s under ASan): the time bound is the plain build's, as the [timing]
  // assertions are.
#else
  CHECK(slowest < 1.0);
#endif
}
