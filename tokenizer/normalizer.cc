// NFC through ICU's Normalizer2 on UTF-8 (normalizer.h).
#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

namespace strata::tokenizer {
namespace {

const icu::Normalizer2& nfc() {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  STRATA_CHECK(U_SUCCESS(err) && n != nullptr, Errc::internal,
               "ICU's NFC normalizer is unavailable: ", u_errorName(err));
  return *n;
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& j, const std::string& where) {
  Normalizer n;
  if (!j.is_null()) n.add(j, "normalizer", where);
  return n;
}

void Normalizer::add(const nlohmann::json& j, const std::string& key, const std::string& where) {
  STRATA_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), Errc::corrupt, where, ": ", key,
               " is not an object with a \"type\"");
  const auto type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto& list = j.at("normalizers");
    for (std::size_t i = 0; i < list.size(); ++i) add(list[i], str_cat(key, ".normalizers[", i, "]"), where);
    return;
  }
  STRATA_CHECK(type == "NFC", Errc::invalid_argument, where, ": ", key, ".type \"", type,
               "\" is not implemented (NFC is): Strata refuses rather than tokenize text the model's tokenizer would "
               "have changed first");
  nfc_ = true;
}

std::string_view Normalizer::apply(std::string_view text, std::string& buffer) const {
  if (!nfc_) return text;
  const icu::StringPiece piece(text.data(), static_cast<std::int32_t>(text.size()));
  UErrorCode err = U_ZERO_ERROR;
  if (nfc().isNormalizedUTF8(piece, err) && U_SUCCESS(err)) return text;
  err = U_ZERO_ERROR;
  buffer.clear();
  icu::StringByteSink<std::string> sink(&buffer);
  nfc().normalizeUTF8(0, piece, sink, nullptr, err);
  STRATA_CHECK(U_SUCCESS(err), Errc::invalid_argument, "NFC normalization failed (ICU: ", u_errorName(err),
               "): is the text UTF-8?");
  return buffer;
}

}  // namespace strata::tokenizer
