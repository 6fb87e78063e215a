// Reading tokenizer.json and the encode/decode pipeline around the BPE model (hf_tokenizer.h).
#include "tokenizer/hf_tokenizer.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "runtime/core/error.h"
#include "tokenizer/byte_level.h"

namespace strata::tokenizer {
namespace {

using nlohmann::json;

// Deeper nesting than any tokenizer.json has (they reach 6) is refused while parsing, before
// a hostile file can exhaust the stack.
constexpr int kMaxJsonDepth = 64;

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in, Errc::io, "tokenizer '", path, "' cannot be opened: ", errno_text(errno));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str(), [&](int depth, json::parse_event_t, json&) {
      STRATA_CHECK(depth <= kMaxJsonDepth, Errc::corrupt, "tokenizer '", path, "' nests deeper than ", kMaxJsonDepth,
                   " levels: not a tokenizer.json");
      return true;
    });
  } catch (const json::exception& e) {
    STRATA_THROW(Errc::corrupt, "tokenizer '", path, "' is not valid JSON (", e.what(),
                 "): give a Hugging Face tokenizer.json or a SentencePiece tokenizer.model");
  }
}

bool null_or_empty(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

// The model's merges as byte pairs: "a b" strings (older files) or [a, b] pairs (newer).
std::vector<std::pair<std::string, std::string>> read_merges(const json& merges, const std::string& where) {
  STRATA_CHECK(merges.is_array(), Errc::corrupt, where, ": model.merges is not an array");
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const auto& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const auto s = m.get<std::string>();
      const auto space = s.find(' ');
      STRATA_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, Errc::corrupt, where,
                   ": model.merges[", i, "] \"", s, "\" is not two parts joined by one space");
      a = s.substr(0, space), b = s.substr(space + 1);
    } else {
      STRATA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), Errc::corrupt, where,
                   ": model.merges[", i, "] is neither \"a b\" nor [\"a\", \"b\"]");
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    }
    std::string ab, bb;
    STRATA_CHECK(unicode_to_bytes(a, ab) && unicode_to_bytes(b, bb), Errc::corrupt, where, ": model.merges[", i,
                 "] is not written in the byte-level alphabet (GPT-2's bytes-to-unicode)");
    out.emplace_back(std::move(ab), std::move(bb));
  }
  return out;
}

// The BOS a TemplateProcessing post-processor prepends to a single sequence, if any.
std::optional<std::uint32_t> template_bos(const json& p, const std::string& key, const std::string& where) {
  const auto& single = p.at("single");
  STRATA_CHECK(single.is_array(), Errc::corrupt, where, ": ", key, ".single is not an array");
  std::optional<std::string> first;
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const auto& item = single[i];
    if (item.contains("Sequence")) {
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      STRATA_CHECK(!seen_sequence, Errc::invalid_argument, where, ": ", key, ".single[", i,
                   "] appends a special token after the text: not implemented (Strata prepends a BOS at most)");
      STRATA_CHECK(!first, Errc::invalid_argument, where, ": ", key,
                   ".single prepends more than one special token: not implemented (Strata prepends a BOS at most)");
      first = item["SpecialToken"].at("id").get<std::string>();
    } else {
      STRATA_THROW(Errc::corrupt, where, ": ", key, ".single[", i, "] is neither a Sequence nor a SpecialToken");
    }
  }
  if (!first) return std::nullopt;
  const auto& specials = p.at("special_tokens");
  STRATA_CHECK(specials.contains(*first), Errc::corrupt, where, ": ", key, ".special_tokens has no \"", *first, "\"");
  const auto& ids = specials[*first].at("ids");
  STRATA_CHECK(ids.is_array() && ids.size() == 1, Errc::invalid_argument, where, ": ", key, ".special_tokens[\"",
               *first, "\"] is not one id: not implemented");
  return ids[0].get<std::uint32_t>();
}

std::optional<std::uint32_t> post_processor_bos(const json& p, const std::string& key, const std::string& where) {
  if (p.is_null()) return std::nullopt;
  const auto type = p.at("type").get<std::string>();
  if (type == "ByteLevel") return std::nullopt;  // offsets only: the ids are unchanged
  if (type == "TemplateProcessing") return template_bos(p, key, where);
  if (type == "Sequence") {
    std::optional<std::uint32_t> bos;
    const auto& list = p.at("processors");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto b = post_processor_bos(list[i], str_cat(key, ".processors[", i, "]"), where);
      if (b) bos = b;
    }
    return bos;
  }
  STRATA_THROW(Errc::invalid_argument, where, ": ", key, ".type \"", type,
               "\" is not implemented (ByteLevel, TemplateProcessing and Sequence are)");
}

void check_decoder(const json& d, const std::string& key, const std::string& where) {
  STRATA_CHECK(!d.is_null(), Errc::invalid_argument, where,
               ": decoder is null: a byte-level BPE tokenizer decodes with "
               "ByteLevel; Strata implements that one only");
  const auto type = d.at("type").get<std::string>();
  if (type == "Sequence") {
    const auto& list = d.at("decoders");
    for (std::size_t i = 0; i < list.size(); ++i) check_decoder(list[i], str_cat(key, ".decoders[", i, "]"), where);
    return;
  }
  STRATA_CHECK(type == "ByteLevel", Errc::invalid_argument, where, ": ", key, ".type \"", type,
               "\" is not implemented (ByteLevel is)");
}

}  // namespace

std::unique_ptr<HfTokenizer> HfTokenizer::open(const std::string& path) {
  try {
    return read(path);
  } catch (const Error& e) {
    throw Error(e.code(), printable(e.what()), e.where(), e.sys_errno());
  }
}

std::unique_ptr<HfTokenizer> HfTokenizer::read(const std::string& path) {
  const json j = read_json(path);
  const std::string where = "tokenizer '" + path + "'";
  try {
    STRATA_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), Errc::corrupt, where,
                 ": has no \"model\" object: not a Hugging Face tokenizer.json");
    const auto& m = j["model"];
    const std::string type = m.value("type", m.contains("merges") ? "BPE" : "?");
    STRATA_CHECK(type == "BPE", Errc::invalid_argument, where, ": model.type \"", type,
                 "\" is not implemented: Strata reads byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen2); "
                 "for a SentencePiece tokenizer give its tokenizer.model");
    STRATA_CHECK(!m.value("byte_fallback", false), Errc::invalid_argument, where,
                 ": model.byte_fallback is true (a SentencePiece-style BPE): not implemented; give the "
                 "tokenizer.model beside it instead");
    STRATA_CHECK(null_or_empty(m, "dropout"), Errc::invalid_argument, where,
                 ": model.dropout is set: BPE dropout is not implemented");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      STRATA_CHECK(null_or_empty(m, k), Errc::invalid_argument, where, ": model.", k, " is set: not implemented");
    }
    for (const char* k : {"truncation", "padding"}) {
      const auto it = j.find(k);
      STRATA_CHECK(it == j.end() || it->is_null(), Errc::invalid_argument, where, ": ", k,
                   " is set: not implemented (Strata writes every token of the text); set it to null");
    }
    Normalizer norm = Normalizer::from_json(j.value("normalizer", json()), where);
    const auto& vocab = m.at("vocab");
    STRATA_CHECK(vocab.is_object(), Errc::corrupt, where, ": model.vocab is not an object");
    std::unordered_map<std::string, std::uint32_t> bytes_vocab;
    std::vector<std::pair<std::uint32_t, std::string>> spelled;  // id -> its bytes, for decode
    bytes_vocab.reserve(vocab.size());
    std::string bytes;
    for (const auto& [token, id] : vocab.items()) {
      STRATA_CHECK(id.is_number_unsigned() && id.get<std::uint64_t>() < kMaxTokenId, Errc::corrupt, where,
                   ": model.vocab[\"", token, "\"] is not an id below ", kMaxTokenId);
      if (unicode_to_bytes(token, bytes)) {
        bytes_vocab.emplace(bytes, id.get<std::uint32_t>());
        spelled.emplace_back(id.get<std::uint32_t>(), bytes);
      } else {
        // Not in the byte alphabet (a special token written out): decodes as its UTF-8, as
        // Hugging Face's ByteLevel decoder does; never produced by BPE over bytes.
        spelled.emplace_back(id.get<std::uint32_t>(), token);
      }
    }
    BytePairModel model(std::move(bytes_vocab), read_merges(m.at("merges"), where), m.value("ignore_merges", false),
                        where);
    AddedTokens added = j.contains("added_tokens") && !j["added_tokens"].is_null()
                            ? AddedTokens(j["added_tokens"], where)
                            : AddedTokens();
    PreTokenizer pre = PreTokenizer::from_json(j.value("pre_tokenizer", json()), where);
    check_decoder(j.value("decoder", json()), "decoder", where);
    std::unique_ptr<HfTokenizer> t(new HfTokenizer(std::move(model), norm, std::move(pre), std::move(added)));
    t->path_ = path;
    t->bos_ = post_processor_bos(j.value("post_processor", json()), "post_processor", where);
    for (auto& [id, b] : spelled) {
      t->vocab_size_ = std::max(t->vocab_size_, id + 1);
      t->spelling_[id] = std::move(b);
    }
    for (const auto& [content, id] : t->added_.all()) {
      t->vocab_size_ = std::max(t->vocab_size_, id + 1);
      t->spelling_[id] = content;
    }
    STRATA_CHECK(!t->bos_ || t->spelling_.count(*t->bos_), Errc::corrupt, where, ": post_processor's special token id ",
                 t->bos_.value_or(0), " is not in the vocabulary");
    return t;
  } catch (const json::exception& e) {
    STRATA_THROW(Errc::corrupt, where, ": a key is missing or has the wrong type (", e.what(), ")");
  }
}

std::vector<std::uint32_t> HfTokenizer::encode(std::string_view text) const {
  // Hugging Face takes text as a Rust &str, UTF-8 by construction; Oniguruma does not check.
  char32_t cp = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t at = i;
    STRATA_CHECK(next_utf8(text, i, cp), Errc::invalid_argument, "tokenizer '", path_,
                 "': the text is not UTF-8 at byte ", at, ": convert it first (iconv -t UTF-8)");
  }
  std::vector<std::uint32_t> out;
  out.reserve(text.size() / 3);
  // Words repeat (" the", " of"): each distinct one is merged once per call.
  std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> seen;
  std::vector<std::uint32_t> cached;
  const auto word = [&](std::string_view w) {
    const auto it = seen.find(w);
    if (it != seen.end()) {
      out.insert(out.end(), cached.begin() + static_cast<std::ptrdiff_t>(it->second.first),
                 cached.begin() + static_cast<std::ptrdiff_t>(it->second.second));
      return;
    }
    const std::size_t before = out.size();
    model_.encode(w, out);
    // Only words that are views of `text` (not of a prefixed copy) may be keys.
    if (w.data() >= text.data() && w.data() + w.size() <= text.data() + text.size()) {
      seen.emplace(w, std::make_pair(cached.size(), cached.size() + out.size() - before));
      cached.insert(cached.end(), out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
    }
  };
  std::string normalized;
  added_.split(
      text, [&](std::string_view piece) { pre_.split(norm_.apply(piece, normalized), word); },
      [&](std::uint32_t id) { out.push_back(id); });
  return out;
}

std::string HfTokenizer::decode(const std::vector<std::uint32_t>& ids) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto it = spelling_.find(ids[i]);
    STRATA_CHECK(it != spelling_.end(), Errc::invalid_argument, "decode: id ", ids[i], " (position ", i,
                 ") is not a token of tokenizer '", path_, "' (vocabulary of ", vocab_size_, ")");
    out += it->second;
  }
  return out;
}

}  // namespace strata::tokenizer
