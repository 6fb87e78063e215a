// Split / ByteLevel / Sequence pre-tokenizers (pre_tokenizer.h).
#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

namespace strata::tokenizer {
namespace {

bool flag(const nlohmann::json& j, const char* name, bool fallback) {
  const auto it = j.find(name);
  return it == j.end() || it->is_null() ? fallback : it->get<bool>();
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& where) {
  PreTokenizer p;
  STRATA_CHECK(!j.is_null(), Errc::invalid_argument, where,
               ": pre_tokenizer is null: Strata reads byte-level BPE tokenizers, whose pre_tokenizer has a ByteLevel "
               "step (GPT-2, Llama 3, Qwen2)");
  p.add(j, "pre_tokenizer", where);
  STRATA_CHECK(p.byte_level_, Errc::invalid_argument, where,
               ": pre_tokenizer has no ByteLevel step: Strata reads byte-level BPE tokenizers only (GPT-2, Llama 3, "
               "Qwen2); for a SentencePiece tokenizer give its tokenizer.model");
  return p;
}

void PreTokenizer::add(const nlohmann::json& j, const std::string& key, const std::string& where) {
  STRATA_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), Errc::corrupt, where, ": ", key,
               " is not an object with a \"type\"");
  const auto type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto& list = j.at("pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i) add(list[i], str_cat(key, ".pretokenizers[", i, "]"), where);
  } else if (type == "ByteLevel") {
    byte_level_ = true;
    if (flag(j, "add_prefix_space", false)) steps_.push_back(Step{nullptr, "", false, false, true});
    if (flag(j, "use_regex", true)) {
      steps_.push_back(Step{std::make_shared<Regex>(kGpt2Pattern, where + ": " + key), "", false, false, false});
    }
  } else if (type == "Split") {
    Step s;
    const auto& pattern = j.at("pattern");
    if (pattern.contains("Regex")) {
      s.regex =
          std::make_shared<Regex>(pattern["Regex"].get<std::string>(), str_cat(where, ": ", key, ".pattern.Regex"));
    } else if (pattern.contains("String")) {
      s.literal = pattern["String"].get<std::string>();
      STRATA_CHECK(!s.literal.empty(), Errc::invalid_argument, where, ": ", key, ".pattern.String is empty");
    } else {
      STRATA_THROW(Errc::invalid_argument, where, ": ", key,
                   ".pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    const auto behavior = j.value("behavior", std::string("Isolated"));
    STRATA_CHECK(behavior == "Isolated" || behavior == "Removed", Errc::invalid_argument, where, ": ", key,
                 ".behavior \"", behavior, "\" is not implemented (Isolated and Removed are)");
    s.removed = behavior == "Removed";
    s.invert = flag(j, "invert", false);
    steps_.push_back(std::move(s));
  } else {
    STRATA_THROW(Errc::invalid_argument, where, ": ", key, ".type \"", type,
                 "\" is not implemented: Strata's pre-tokenizers are Split, ByteLevel and a Sequence of them");
  }
}

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& word) const {
  run(0, text, word);
}

void PreTokenizer::run(std::size_t step, std::string_view text,
                       const std::function<void(std::string_view)>& word) const {
  if (text.empty()) return;
  if (step == steps_.size()) {
    word(text);
    return;
  }
  const Step& s = steps_[step];
  if (s.prefix_space) {
    if (text.front() == ' ') {
      run(step + 1, text, word);
    } else {
      const std::string spaced = " " + std::string(text);
      run(step + 1, spaced, word);
    }
    return;
  }
  // Pieces in order: the gaps between matches and the matches; `invert` swaps which is which.
  std::size_t at = 0;
  const auto piece = [&](std::size_t b, std::size_t e, bool is_match) {
    if (e > b && !(s.removed && (is_match != s.invert))) run(step + 1, text.substr(b, e - b), word);
  };
  const auto match = [&](std::size_t b, std::size_t e) {
    piece(at, b, false);
    piece(b, e, true);
    at = e;
  };
  if (s.regex) {
    s.regex->find_all(text, match);
  } else {
    for (std::size_t b = text.find(s.literal); b != std::string_view::npos; b = text.find(s.literal, at)) {
      match(b, b + s.literal.size());
    }
  }
  piece(at, text.size(), false);
}

}  // namespace strata::tokenizer
