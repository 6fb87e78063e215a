// The typed, path-tracking JSON reader (json_reader.h): JSON syntax and duplicate-key
// errors, typed reads with ranges, the notice/refuse classes and the nearest-key search.
#include "engine/detail/json_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine::detail {
namespace {

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}

std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

// How far a misspelling may be from the key it meant: one edit for short keys, about one
// per four characters for long ones ("zero_optimisation", "warmup_steps").
std::size_t close_enough(std::string_view a, std::string_view b) {
  return std::max<std::size_t>(1, std::max(a.size(), b.size()) / 4);
}

std::vector<std::string> words(std::string_view key) {
  std::vector<std::string> out;
  std::string word;
  for (char c : key) {
    if (c == '_') {
      if (!word.empty()) out.push_back(word);
      word.clear();
    } else {
      word.push_back(lower(c));
    }
  }
  if (!word.empty()) out.push_back(word);
  return out;
}

// Whether every word of `a` is a word of `b`.
bool words_within(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return !a.empty() && std::all_of(a.begin(), a.end(),
                                   [&](const std::string& w) { return std::find(b.begin(), b.end(), w) != b.end(); });
}

// The known key `key` most likely meant, or "": a typo of one edit (two for long keys)
// first, then a key with the same words and one more or fewer, then a typo within
// close_enough().
std::string nearest_key(const std::string& key, const std::vector<std::string>& known) {
  const auto best_by = [&](auto&& accept) {
    std::string best;
    std::size_t best_distance = std::numeric_limits<std::size_t>::max();
    for (const auto& candidate : known) {
      const std::size_t d = edit_distance(key, candidate);
      if (d < best_distance && accept(candidate, d)) {
        best = candidate;
        best_distance = d;
      }
    }
    return best;
  };
  const auto typo = [&](const std::string& c, std::size_t d) {
    return d <= std::min<std::size_t>(2, close_enough(key, c));
  };
  if (auto best = best_by(typo); !best.empty()) return best;
  const auto key_words = words(key);
  if (auto best = best_by([&](const std::string& c, std::size_t) {
        const auto c_words = words(c);
        return words_within(key_words, c_words) || words_within(c_words, key_words);
      });
      !best.empty()) {
    return best;
  }
  return best_by([&](const std::string& c, std::size_t d) { return d <= close_enough(key, c); });
}

// 1-based line and column of a 1-based byte position, as editors count them.
std::pair<std::size_t, std::size_t> line_column(const std::string& text, std::size_t byte) {
  const std::size_t end = std::min(byte == 0 ? 0 : byte - 1, text.size());
  std::size_t line = 1, line_start = 0;
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return {line, end - line_start + 1};
}

}  // namespace

Json parse_json(const std::string& text, const std::string& source) {
  // Duplicate keys: one frame per open object or array, holding the keys seen so far.
  struct Frame {
    bool object;
    std::vector<std::string> keys;
  };
  std::vector<Frame> open;
  const Json::parser_callback_t check = [&](int, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      open.push_back({event == E::object_start, {}});
    } else if (event == E::object_end || event == E::array_end) {
      open.pop_back();
    } else if (event == E::key) {
      const auto key = parsed.get<std::string>();
      std::string path;
      for (std::size_t i = 0; i + 1 < open.size(); ++i) {
        path += open[i].object ? (open[i].keys.empty() ? "?" : open[i].keys.back()) + "." : "[].";
      }
      auto& keys = open.back().keys;
      STRATA_CHECK(std::find(keys.begin(), keys.end(), key) == keys.end(), Errc::invalid_argument, source, ": key '",
                   path, key, "' appears twice: keep one (JSON readers disagree on ",
                   "which one wins, so Strata, like DeepSpeed, refuses the file)");
      keys.push_back(key);
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::parse_error& e) {
    const auto [line, column] = line_column(text, e.byte);
    std::string detail = e.what();
    // nlohmann's text reads "[json.exception.parse_error.101] parse error at line 3, column
    // 5: syntax error ..."; keep only the part after the position, which is given above.
    if (const auto at = detail.find("column "); at != std::string::npos) {
      if (const auto colon = detail.find(": ", at); colon != std::string::npos) detail.erase(0, colon + 2);
    } else if (const auto bracket = detail.find("] "); bracket != std::string::npos) {
      detail.erase(0, bracket + 2);
    }
    STRATA_THROW(Errc::invalid_argument, source, ": invalid JSON at line ", line, ", column ", column, " (byte ",
                 e.byte, "): ", detail);
  }
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment: Levenshtein plus adjacent transpositions ("stgae").
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string show(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

void ParseContext::fail(const std::string& message) const {
  STRATA_THROW(Errc::invalid_argument, source_, ": ", message);
}

Section& ParseContext::add_section(std::string path, const Json* object) {
  sections_.push_back(Section{std::move(path), object, {}});
  return sections_.back();
}

void ParseContext::check_unknown_keys() const {
  for (const Section& section : sections_) {
    if (section.object == nullptr) continue;
    for (const auto& item : section.object->items()) {
      const std::string& key = item.key();
      const auto& known = section.declared;
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      const std::string full = join_path(section.path, key);
      // 1. A near miss at the same level: a typo ("stag", "zero_optimisation"), or a name
      // with a word missing or extra ("warmup_steps" for warmup_num_steps).
      const std::string best = nearest_key(key, known);
      if (!best.empty()) {
        fail(str_cat("unknown key '", full, "'; did you mean '", join_path(section.path, best), "'?"));
      }
      // 2. The right key at the wrong level ("stage" at the top level).
      for (const Section& other : sections_) {
        if (&other == &section) continue;
        for (const auto& candidate : other.declared) {
          if (iequal(candidate, key)) {
            fail(str_cat("unknown key '", full, "'; did you mean '", join_path(other.path, candidate), "'?"));
          }
        }
      }
      // 3. Nothing close. DeepSpeed ignores unknown keys at the top level (its sections are
      // strict): so does Strata, saying so; in a section, list what it accepts.
      if (section.path.empty()) {
        STRATA_LOG(warn, source_, ": unknown key '", full,
                   "' is ignored, as DeepSpeed ignores unknown top-level keys (nothing Strata knows is close to it)");
        continue;
      }
      std::string list;
      for (const auto& candidate : known) list += (list.empty() ? "" : ", ") + candidate;
      fail(str_cat("unknown key '", full, "'; the keys known ",
                   section.path.empty() ? std::string("at the top level") : "in '" + section.path + "'",
                   " are: ", list));
    }
  }
}

ObjectReader::ObjectReader(ParseContext& ctx, const Json* object, std::string path)
    : ctx_(ctx),
      section_(&ctx.add_section(std::move(path), object != nullptr && object->is_null() ? nullptr : object)) {}

ObjectReader ObjectReader::child(std::string_view key) {
  const Json* value = find(key);
  if (value != nullptr && !value->is_object()) {
    if (is_auto(key)) refuse_auto(key, "an object {...}");
    fail_value(key, *value, "has the wrong type: expected an object {...}");
  }
  return ObjectReader(ctx_, value, path_of(key));
}

std::string ObjectReader::path_of(std::string_view key) const { return join_path(section_->path, key); }

const Json* ObjectReader::find(std::string_view key) {
  auto& declared = section_->declared;
  if (std::find(declared.begin(), declared.end(), key) == declared.end()) declared.emplace_back(key);
  if (section_->object == nullptr) return nullptr;
  const auto it = section_->object->find(std::string(key));
  if (it == section_->object->end() || it->is_null()) return nullptr;  // null: "not set"
  return &*it;
}

bool ObjectReader::is_auto(std::string_view key) {
  const Json* value = find(key);
  return value != nullptr && value->is_string() && value->get_ref<const std::string&>() == "auto";
}

void ObjectReader::fail_value(std::string_view key, const Json& value, std::string_view problem) const {
  ctx_.fail(str_cat(path_of(key), " = ", show(value), " ", problem));
}

void ObjectReader::refuse_auto(std::string_view key, std::string_view expect, std::string_view why) const {
  ctx_.fail(str_cat(path_of(key), " = \"auto\" is a placeholder the Hugging Face trainer fills in; ", why,
                    why.empty() ? "" : "; ", "give ", expect));
}

bool ObjectReader::read_bool(std::string_view key, bool& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (is_auto(key)) refuse_auto(key, "true or false");
  if (!v->is_boolean()) fail_value(key, *v, "has the wrong type: use true or false");
  out = v->get<bool>();
  return true;
}

bool ObjectReader::read_int(std::string_view key, std::int64_t lo, std::int64_t hi, std::string_view range,
                            std::int64_t& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (is_auto(key)) refuse_auto(key, "a whole number");
  if (v->is_number_unsigned()) {
    const auto u = v->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail_value(key, *v, str_cat("is out of range: ", range));
    }
    out = static_cast<std::int64_t>(u);
  } else if (v->is_number_integer()) {
    out = v->get<std::int64_t>();
  } else if (v->is_number_float()) {
    const double value = v->get<double>();
    if (!std::isfinite(value) || value != std::floor(value)) {
      fail_value(key, *v, str_cat("is not a whole number: ", range));
    }
    if (value < -9.2e18 || value > 9.2e18) fail_value(key, *v, str_cat("is out of range: ", range));
    out = static_cast<std::int64_t>(value);
  } else {
    fail_value(key, *v, str_cat("has the wrong type: ", range));
  }
  if (out < lo || out > hi) fail_value(key, *v, str_cat("is out of range: ", range));
  return true;
}

bool ObjectReader::read_int(std::string_view key, std::int64_t lo, std::int64_t hi, std::string_view range, int& out) {
  std::int64_t value = 0;
  lo = std::max<std::int64_t>(lo, std::numeric_limits<int>::min());
  hi = std::min<std::int64_t>(hi, std::numeric_limits<int>::max());
  if (!read_int(key, lo, hi, range, value)) return false;
  out = static_cast<int>(value);
  return true;
}

bool ObjectReader::read_count(std::string_view key, std::uint64_t lo, std::uint64_t& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (is_auto(key)) refuse_auto(key, "a number of elements like 5e8");
  const std::string range = str_cat("use a whole number of elements >= ", lo, ", like 5e8 or 500000000");
  if (v->is_number_unsigned()) {
    out = v->get<std::uint64_t>();
  } else if (v->is_number_integer()) {
    if (v->get<std::int64_t>() < 0) fail_value(key, *v, str_cat("is out of range: ", range));
    out = static_cast<std::uint64_t>(v->get<std::int64_t>());
  } else if (v->is_number_float()) {
    const double value = v->get<double>();
    if (!std::isfinite(value) || value != std::floor(value)) {
      fail_value(key, *v, str_cat("is not a whole number: ", range));
    }
    if (value < 0 || value >= 1.8e19) fail_value(key, *v, str_cat("is out of range: ", range));
    out = static_cast<std::uint64_t>(value);
  } else if (v->is_string()) {
    try {
      out = parse_count(v->get_ref<const std::string&>(), path_of(key));
    } catch (const Error& e) {
      ctx_.fail(e.what());
    }
  } else {
    fail_value(key, *v, str_cat("has the wrong type: ", range));
  }
  if (out < lo) fail_value(key, *v, str_cat("is out of range: ", range));
  return true;
}

bool ObjectReader::read_bytes(std::string_view key, std::uint64_t& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (is_auto(key)) refuse_auto(key, "a byte size like \"8GiB\"");
  const char* range = "use a byte size like \"8GiB\", \"512MB\" or a whole number of bytes >= 0";
  if (v->is_string()) {
    try {
      out = parse_bytes(v->get_ref<const std::string&>(), path_of(key));
    } catch (const Error& e) {
      ctx_.fail(e.what());
    }
    return true;
  }
  if (!v->is_number()) fail_value(key, *v, str_cat("has the wrong type: ", range));
  const double value = v->get<double>();
  if (v->is_number_unsigned()) {
    out = v->get<std::uint64_t>();
  } else if (!std::isfinite(value) || value != std::floor(value) || value < 0 || value >= 1.8e19) {
    fail_value(key, *v, str_cat("is out of range: ", range));
  } else {
    out = static_cast<std::uint64_t>(value);
  }
  return true;
}

bool ObjectReader::read_float(std::string_view key, double lo, double hi, std::string_view range, float& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (is_auto(key)) refuse_auto(key, "a number");
  if (!v->is_number()) fail_value(key, *v, str_cat("has the wrong type: ", range));
  const double value = v->get<double>();
  if (!std::isfinite(value) || value < lo || value > hi) {
    fail_value(key, *v, str_cat("is out of range: ", range));
  }
  out = static_cast<float>(value);
  return true;
}

bool ObjectReader::read_string(std::string_view key, std::string& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (is_auto(key)) refuse_auto(key, "a string");
  if (!v->is_string()) fail_value(key, *v, "has the wrong type: expected a string");
  out = v->get<std::string>();
  return true;
}

bool ObjectReader::read_choice(std::string_view key, std::initializer_list<std::string_view> choices,
                               std::string& out) {
  std::string list;
  std::size_t i = 0;
  for (auto c : choices) {
    list += str_cat(i == 0 ? "" : (i + 1 == choices.size() ? " or " : ", "), c);
    ++i;
  }
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (is_auto(key)) refuse_auto(key, str_cat("one of ", list));
  if (!v->is_string()) fail_value(key, *v, str_cat("has the wrong type: use ", list));
  for (auto c : choices) {
    if (iequal(v->get_ref<const std::string&>(), c)) {
      out = std::string(c);
      return true;
    }
  }
  fail_value(key, *v, str_cat("is not a valid choice: use ", list));
}

void ObjectReader::notice(std::string_view key) {
  find(key);
  if (present() && section_->object->contains(std::string(key))) ctx_.add_ignored(path_of(key));
}

void ObjectReader::notice_if(std::string_view key, const Json& allowed, std::string_view why) {
  find(key);
  if (!present()) return;
  const auto it = section_->object->find(std::string(key));
  if (it == section_->object->end()) return;
  if (*it != allowed) fail_value(key, *it, why);
  ctx_.add_ignored(path_of(key));
}

void ObjectReader::notice_if_disabled(std::string_view key, std::string_view why, bool auto_is_off) {
  find(key);
  if (!present()) return;
  const auto it = section_->object->find(std::string(key));
  if (it == section_->object->end()) return;
  bool on = false;
  if (it->is_boolean()) on = it->get<bool>();
  if (it->is_object() && it->contains("enabled")) {
    const Json& enabled = (*it)["enabled"];
    const bool off =
        (enabled.is_boolean() && !enabled.get<bool>()) || enabled.is_null() || (auto_is_off && enabled == "auto");
    on = !off;
  }
  if (on) fail_value(key, *it, why);
  ctx_.add_ignored(path_of(key));
}

void ObjectReader::refuse(std::string_view key, std::string_view why) {
  if (has(key)) fail_value(key, *find(key), str_cat("is a DeepSpeed feature Strata does not support: ", why));
}

}  // namespace strata::engine::detail
