// The bounded JSON parse behind parse_config (json_reader.h): the limits of config.h checked
// while nlohmann parses (so no later step recurses deeper than kMaxConfigDepth or runs
// quadratic in the number of keys), duplicate keys refused, and every error one line with
// the source, line, column, byte and key path. Also the echo helpers clip/one_line/show.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <unordered_set>

#include "engine/detail/json_reader.h"
#include "runtime/core/error.h"

namespace strata::engine::detail {
namespace {

// Bytes in the UTF-8 sequence at text[i], or 0 when it is not one.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  const std::size_t n = c < 0x80                 ? 1
                        : c >= 0xC2 && c <= 0xDF ? 2
                        : c >= 0xE0 && c <= 0xEF ? 3
                        : c >= 0xF0 && c <= 0xF4 ? 4
                                                 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// Appends text[i...] (one character or one escaped byte) to out; returns the bytes used.
std::size_t append_printable(std::string_view text, std::size_t i, std::string& out) {
  const auto c = static_cast<unsigned char>(text[i]);
  const std::size_t n = utf8_length(text, i);
  if (n == 0 || c < 0x20 || c == 0x7F) {
    static const char hex[] = "0123456789abcdef";
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
    return 1;
  }
  out.append(text.substr(i, n));
  return n;
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

// An iterator over the text that records how far nlohmann's lexer has read, so that the
// parser callback and the errors it raises can name the line and column.
class TrackingIterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  TrackingIterator() = default;
  TrackingIterator(const char* at, const char** read) : at_(at), read_(read) {}
  reference operator*() const { return *at_; }
  TrackingIterator& operator++() {
    ++at_;
    if (read_ != nullptr) *read_ = at_;
    return *this;
  }
  TrackingIterator operator++(int) {
    TrackingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const TrackingIterator& other) const { return at_ == other.at_; }

 private:
  const char* at_ = nullptr;
  const char** read_ = nullptr;
};

// One open object or array while parsing: its current key (and whether its value is being
// parsed) or element index, and the keys seen so far (a hash set, so that an object with
// many long keys stays linear).
struct Frame {
  bool object = false;
  std::size_t count = 0;  // keys, or elements completed
  bool in_value = false;  // objects: between a key and the end of its value
  std::string key;
  std::unordered_set<std::string> keys;
};

class BoundedParse {
 public:
  BoundedParse(const std::string& text, const std::string& source) : text_(text), source_(source) {}

  Json run() {
    STRATA_CHECK(text_.size() <= kMaxConfigBytes, Errc::invalid_argument, source_, ": ", text_.size(),
                 " bytes of JSON is over the ", kMaxConfigBytes >> 20, " MiB limit for a config file: ", kAdvice);
    // nlohmann takes a NUL byte for the end of the input and would ignore what follows.
    if (const auto nul = text_.find('\0'); nul != std::string::npos) {
      fail_at(nul + 1, "invalid JSON", "a NUL byte: a config is text; check that it is the config you meant");
    }
    read_ = text_.data();
    const Json::parser_callback_t callback = [this](int, Json::parse_event_t event, Json& parsed) {
      on_event(event, parsed);
      return true;
    };
    try {
      return Json::parse(TrackingIterator(text_.data(), &read_), TrackingIterator(text_.data() + text_.size(), nullptr),
                         callback);
    } catch (const Json::parse_error& e) {
      fail_at(e.byte, "invalid JSON", nlohmann_detail(e.what()));
    } catch (const Json::out_of_range& e) {
      if (e.id != 406) fail_at(consumed(), "invalid JSON", nlohmann_detail(e.what()));
      number_overflow();
    }
  }

 private:
  static constexpr const char* kAdvice =
      "DeepSpeed configs are a few KiB, nest a few levels and hold a few dozen keys per object; check that it is "
      "the config you meant";

  std::size_t consumed() const { return static_cast<std::size_t>(read_ - text_.data()); }

  // The key path of the value being parsed: "zero_optimization.stage", "optimizer.params.betas[1]".
  std::string path() const {
    std::string out;
    for (const Frame& f : open_) {
      if (!f.object) {
        out += str_cat("[", f.count, "]");
        continue;
      }
      if (!f.in_value) break;
      out += (out.empty() ? "" : ".") + clip(f.key);
    }
    return clip(out, 4 * kEchoChars);
  }

  // "<source>: <what> at line L, column C (byte B)[, in 'path']: <detail>"; `byte` is 1-based.
  [[noreturn]] void fail_at(std::size_t byte, const std::string& what, const std::string& detail) const {
    const auto [line, column] = line_column(text_, byte);
    const std::string at = path();
    STRATA_THROW(Errc::invalid_argument, source_, ": ", what, " at line ", line, ", column ", column, " (byte ", byte,
                 ")", at.empty() ? "" : ", in '" + at + "'", ": ", one_line(detail));
  }

  void on_event(Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (open_.size() >= static_cast<std::size_t>(kMaxConfigDepth)) {
          fail_at(consumed(), str_cat("objects and arrays nest deeper than ", kMaxConfigDepth, " levels"), kAdvice);
        }
        open_.push_back(Frame{event == E::object_start});
        break;
      case E::object_end:
      case E::array_end:
        open_.pop_back();
        value_done();
        break;
      case E::value:
        value_done();
        break;
      case E::key:
        add_key(parsed.get_ref<const std::string&>());
        break;
    }
  }

  // A value is complete: the enclosing array's index moves on, or its object's key is done.
  void value_done() {
    if (open_.empty()) return;
    Frame& f = open_.back();
    if (f.object) {
      f.in_value = false;
    } else {
      ++f.count;
    }
  }

  // The 1-based byte of the opening quote of the key nlohmann has just read: the quote
  // before it that no backslash escapes (the key is a valid JSON string).
  std::size_t key_start() const {
    std::size_t quote = consumed() - 1;  // the closing quote, 0-based
    while (quote > 0) {
      --quote;
      if (text_[quote] != '"') continue;
      std::size_t slashes = 0;
      while (slashes < quote && text_[quote - 1 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) break;
    }
    return quote + 1;
  }

  void add_key(const std::string& key) {
    Frame& f = open_.back();
    if (f.count == kMaxConfigKeys) {
      fail_at(key_start(), str_cat("an object holds more than ", kMaxConfigKeys, " keys"), kAdvice);
    }
    ++f.count;
    f.key = key;
    f.in_value = true;
    if (!f.keys.insert(key).second) {
      const auto [line, column] = line_column(text_, key_start());
      STRATA_THROW(Errc::invalid_argument, source_, ": key '", path(), "' appears twice (again at line ", line,
                   ", column ", column, "): keep one (JSON readers disagree on which one wins, so Strata, like ",
                   "DeepSpeed, refuses the file)");
    }
  }

  // nlohmann read a number beyond a double (1e999): name it and where it starts.
  [[noreturn]] void number_overflow() {
    const auto is_number = [](char c) {
      return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
    };
    std::size_t end = consumed();
    if (end > 0 && !is_number(text_[end - 1])) --end;  // the lexer reads one character past the number
    std::size_t start = end;
    while (start > 0 && is_number(text_[start - 1])) --start;
    fail_at(start + 1, "invalid JSON",
            str_cat("number ", clip(std::string_view(text_).substr(start, end - start)),
                    " is out of range: JSON numbers here must lie within +-1.7e308; write a smaller one"));
  }

  // nlohmann's what() without its "[json.exception...] parse error at line 3, column 5: "
  // prefix (the position is given separately) and with the token it quotes clipped.
  static std::string nlohmann_detail(std::string detail) {
    if (const auto at = detail.find("column "); at != std::string::npos) {
      if (const auto colon = detail.find(": ", at); colon != std::string::npos) detail.erase(0, colon + 2);
    } else if (const auto bracket = detail.find("] "); bracket != std::string::npos) {
      detail.erase(0, bracket + 2);
    }
    const std::string quote = "last read: '";
    if (const auto at = detail.find(quote); at != std::string::npos) {
      const std::size_t from = at + quote.size();
      std::size_t to = detail.rfind("'; expected");
      if (to == std::string::npos || to < from) to = detail.size() - (detail.ends_with('\'') ? 1 : 0);
      detail.replace(from, to - from, clip(std::string_view(detail).substr(from, to - from)));
    }
    return detail;
  }

  const std::string& text_;
  const std::string& source_;
  const char* read_ = nullptr;
  std::vector<Frame> open_;
};

}  // namespace

Json parse_json(const std::string& text, const std::string& source) { return BoundedParse(text, source).run(); }

std::string clip(std::string_view text, std::size_t limit) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size() && out.size() < limit) i += append_printable(text, i, out);
  if (i < text.size()) out += str_cat("... (", text.size(), " bytes)");
  return out;
}

std::string one_line(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (std::size_t i = 0; i < message.size();) i += append_printable(message, i, out);
  return out;
}

std::string show(const Json& value) {
  const std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  return text.size() <= kEchoChars ? text : clip(text, kEchoChars - 3);
}

}  // namespace strata::engine::detail
