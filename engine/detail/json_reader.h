// The typed, path-tracking JSON reader behind parse_config (engine/config.h). It turns
// every key of the file into one of: honoured (read_*), accepted with a notice (notice*),
// refused (refuse) or unknown (an error naming the nearest known key), and words every
// error as "<source>: <key path> = <value> ...: <what is allowed>".
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config.h"

namespace strata::engine::detail {

// Ordered, so that unknown keys and notices come out in the file's order.
using Json = nlohmann::ordered_json;

// Parses JSON text within the limits of config.h (size, nesting depth, keys per object);
// refuses duplicate keys (DeepSpeed refuses them too; nlohmann would silently keep the last
// one) and numbers beyond a double's range. Every error is one line naming `source`, the
// line, column and byte, and the key path where one is open (json_parse.cc).
Json parse_json(const std::string& text, const std::string& source);

// Optimal-string-alignment distance, case-insensitive ("stag" -> "stage" is 1).
std::size_t edit_distance(std::string_view a, std::string_view b);

// Text from the file as it appears in messages: control characters and bytes that are not
// UTF-8 escaped (\n, \x9f), cut after `limit` characters with "... (N bytes)".
std::string clip(std::string_view text, std::size_t limit = kEchoChars);
// A message made one line: control characters escaped as clip() does, nothing cut.
std::string one_line(std::string_view message);
// A JSON value as it appears in messages: 4, "auto", true, {...}, [0.9,0.999]; a long one
// cut as clip() does.
std::string show(const Json& value);

struct Section {
  std::string path;                   // "" for the top level, else "zero_optimization" etc.
  const Json* object = nullptr;       // null: the section is absent from the file
  std::vector<std::string> declared;  // every key this section knows, present or not
};

// One parse. Sections are registered as they are read; check_unknown_keys() runs once
// everything is read, so a misplaced key ("stage" at the top level) can be pointed to the
// section that knows it. Checks that relate several keys (batch arithmetic, offload needs
// stage 3, a required key) are deferred until after it: a misspelled key is the likelier
// cause of such a failure, and its error says more.
class ParseContext {
 public:
  ParseContext(std::string source, const ModelFacts& facts) : source_(std::move(source)), facts_(facts) {}
  const std::string& source() const noexcept { return source_; }
  const ModelFacts& facts() const noexcept { return facts_; }
  [[noreturn]] void fail(const std::string& message) const;
  Section& add_section(std::string path, const Json* object);
  void add_ignored(std::string path) { ignored_.push_back(std::move(path)); }
  const std::vector<std::string>& ignored() const noexcept { return ignored_; }
  void check_unknown_keys() const;
  void defer(std::function<void()> check) { deferred_.push_back(std::move(check)); }
  void run_deferred() const {
    for (const auto& check : deferred_) check();
  }

 private:
  std::string source_;
  ModelFacts facts_;
  std::deque<Section> sections_;  // deque: references stay valid as sections are added
  std::vector<std::string> ignored_;
  std::vector<std::function<void()>> deferred_;
};

// Reads one JSON object. Protocol: construct, call read_*/notice*/refuse for every key the
// section knows (each call declares the key whether or not it is present), and let
// ParseContext::check_unknown_keys() report the rest. "auto" is refused by name in every
// read_* unless the caller checked is_auto() first and resolved it. Copies share the
// section, so a deferred check may hold one.
class ObjectReader {
 public:
  ObjectReader(ParseContext& ctx, const Json* object, std::string path);
  // The sub-object at `key` (absent or null: an empty reader). A non-object is a type error.
  ObjectReader child(std::string_view key);

  bool present() const noexcept { return section_->object != nullptr; }
  std::string path_of(std::string_view key) const;
  const Json* find(std::string_view key);  // declares; null when absent or JSON null
  bool has(std::string_view key) { return find(key) != nullptr; }
  bool is_auto(std::string_view key);
  ParseContext& context() const noexcept { return ctx_; }

  [[noreturn]] void fail_value(std::string_view key, const Json& value, std::string_view problem) const;
  [[noreturn]] void refuse_auto(std::string_view key, std::string_view expect, std::string_view why = {}) const;

  bool read_bool(std::string_view key, bool& out);
  // Whole numbers; an integral float (8.0, 5e8) is accepted. `range` is the advice text.
  bool read_int(std::string_view key, std::int64_t lo, std::int64_t hi, std::string_view range, std::int64_t& out);
  bool read_int(std::string_view key, std::int64_t lo, std::int64_t hi, std::string_view range, int& out);
  // Element counts as DeepSpeed writes them: 500000000, 5e8 or "5e8" (also "500M").
  bool read_count(std::string_view key, std::uint64_t lo, std::uint64_t& out);
  // Byte sizes: a number of bytes or a string with units ("8GiB").
  bool read_bytes(std::string_view key, std::uint64_t& out);
  // Finite numbers in [lo, hi]; `range` is the advice text.
  bool read_float(std::string_view key, double lo, double hi, std::string_view range, float& out);
  bool read_string(std::string_view key, std::string& out);
  // One of `choices`, matched case-insensitively; out is the choice as spelled there.
  bool read_choice(std::string_view key, std::initializer_list<std::string_view> choices, std::string& out);

  // Accepted with the notice whatever the value (logging, monitoring, profiling...).
  void notice(std::string_view key);
  // Accepted with the notice only while the value is `allowed` (DeepSpeed's default);
  // any other value would change the numerics or behaviour, so it is an error with `why`.
  void notice_if(std::string_view key, const Json& allowed, std::string_view why);
  // A section with an "enabled" flag (or a bare bool): accepted with the notice while it is
  // off; `auto_is_off` where Strata can derive "auto" as off (it has no such feature).
  void notice_if_disabled(std::string_view key, std::string_view why, bool auto_is_off = false);
  // A DeepSpeed key Strata knows but does not support: an error whenever present.
  void refuse(std::string_view key, std::string_view why);

 private:
  ParseContext& ctx_;
  Section* section_;
};

}  // namespace strata::engine::detail
