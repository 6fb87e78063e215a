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
// close_enough(). Keys longer than kMaxSuggestedKey are nobody's typo: no search.
std::string nearest_key(const std::string& key, const std::vector<std::string>& known) {
  if (key.size() > kMaxSuggestedKey) return {};
  std::vector<std::size_t> distance;
  distance.reserve(known.size());
  for (const auto& candidate : known) distance.push_back(edit_distance(key, candidate));
  const auto best_by = [&](auto&& accept) {
    std::string best;
    std::size_t best_distance = std::numeric_limits<std::size_t>::max();
    for (std::size_t i = 0; i < known.size(); ++i) {
      if (distance[i] < best_distance && accept(known[i], distance[i])) {
        best = known[i];
        best_distance = distance[i];
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

// A string short and plain enough to hand to parse_count/parse_bytes, whose messages quote
// it whole: within kEchoChars and free of control characters.
bool short_plain(const Json& v) {
  const auto& text = v.get_ref<const std::string&>();
  return text.size() <= kEchoChars && std::none_of(text.begin(), text.end(), [](char c) {
           return static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
         });
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment: Levenshtein plus adjacent transpositions ("stgae"), over
  // three rolling rows (i - 2, i - 1, i).
  const std::size_t m = b.size();
  std::vector<std::size_t> before(m + 1), previous(m + 1), current(m + 1);
  for (std::size_t j = 0; j <= m; ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1])) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[m];
}

void ParseContext::fail(const std::string& message) const {
  STRATA_THROW(Errc::invalid_argument, source_, ": ", one_line(message));
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
      const std::string full = join_path(section.path, clip(key));
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
    if (!short_plain(*v)) fail_value(key, *v, str_cat("is not a count: ", range));
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
    if (!short_plain(*v)) fail_value(key, *v, str_cat("is not a byte size: ", range));
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
  // The value is stored as a float: beyond its range is out of range whatever hi says.
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  if (!std::isfinite(value) || value < std::max(lo, -kFloatMax) || value > std::min(hi, kFloatMax)) {
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
