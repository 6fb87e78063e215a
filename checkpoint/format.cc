// The manifest's JSON form, its validation and the merge of every rank's part (format.h).
#include "checkpoint/format.h"

#include <xxhash.h>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <type_traits>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/q8_codec.h"

namespace strata::checkpoint {
namespace {

using nlohmann::json;

// The manifest file's first line: `{\n "xxh3": "` 16 hex digits `",` (see format.h).
constexpr std::string_view kChecksumOpen = "{\n \"xxh3\": \"";
constexpr std::string_view kChecksumClose = "\",";

std::string hex64(std::uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, v);
  return hex;
}

// Nesting a manifest may have: its own is four levels, the engine's and trainer's states a
// few more. Deeper is damage (and every step that walks the JSON recursively stays bounded).
constexpr int kMaxDepth = 128;

// A whole JSON number that fits in T (a float, or one out of T's range, would be undefined
// or wrap in nlohmann's conversion).
template <class T> bool fits(const json& v) {
  if (v.is_number_unsigned())
    return v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
  if (!v.is_number_integer()) return false;
  const std::int64_t i = v.get<std::int64_t>();
  if (i < 0) return std::is_signed_v<T> && i >= static_cast<std::int64_t>(std::numeric_limits<T>::min());
  return static_cast<std::uint64_t>(i) <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
}

template <class T> bool has_type(const json& v) {
  if constexpr (std::is_integral_v<T>) {
    return fits<T>(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.is_string();
  } else if constexpr (std::is_same_v<T, json>) {
    return true;
  } else {  // std::vector of a whole-number type
    return v.is_array() &&
           std::all_of(v.begin(), v.end(), [](const json& e) { return fits<typename T::value_type>(e); });
  }
}

// Reads a required key of the expected JSON type; a missing or mistyped key is corrupt.
template <class T> T need(const json& j, const char* key, const std::string& where, const std::string& ctx) {
  STRATA_CHECK(j.is_object() && j.contains(key), Errc::corrupt, "checkpoint manifest ", where, ": ", ctx, " has no '",
               key, "'");
  const json& v = j.at(key);
  STRATA_CHECK(has_type<T>(v), Errc::corrupt, "checkpoint manifest ", where, ": ", ctx, " '", key,
               "' has the wrong type or is out of range (", v.type_name(), ")");
  return v.get<T>();
}

json segments_json(const std::vector<Segment>& segs) {
  json a = json::array();
  for (const auto& s : segs) {
    a.push_back({s.file, s.file_offset, s.elem, s.count});
    if (s.lane != 0) a.back().push_back(s.lane);
  }
  return a;
}

std::vector<Segment> parse_segments(const json& a, const std::string& where, const std::string& ctx) {
  STRATA_CHECK(a.is_array(), Errc::corrupt, "checkpoint manifest ", where, ": ", ctx, " is not an array");
  std::vector<Segment> out;
  for (const auto& s : a) {
    STRATA_CHECK(s.is_array() && (s.size() == 4 || s.size() == 5) && fits<int>(s[0]) && s[1].is_number_unsigned() &&
                     s[2].is_number_unsigned() && s[3].is_number_unsigned() &&
                     (s.size() == 4 || fits<std::uint32_t>(s[4])),
                 Errc::corrupt, "checkpoint manifest ", where, ": ", ctx,
                 " has a segment that is not [file, offset, elem, count] or [file, offset, elem, count, lane]: ",
                 s.dump().substr(0, 200));
    out.push_back({s[0].get<int>(), s[1].get<std::uint64_t>(), s[2].get<std::uint64_t>(), s[3].get<std::uint64_t>(),
                   s.size() == 5 ? s[4].get<std::uint32_t>() : 0u});
  }
  return out;
}

// The oldest version that can hold the manifest's moments (fp32: any).
int moments_version(const Manifest& m) {
  if (m.moment_dtype == "fp32") return 0;
  if (m.moment_dtype == "q8") return m.q8_as_bf16 ? 4 : 5;
  return 3;
}

// A file name the reader may join to the checkpoint directory: one plain component, not a
// control file of the directory, no NUL (which would cut the path short).
bool plain_file_name(const std::string& n) {
  return !n.empty() && n[0] != '.' && n.find('/') == std::string::npos && n.find('\0') == std::string::npos &&
         n != kManifestName && n != "latest";
}

bool known_dtype_name(const std::string& n) {
  for (DType t : {DType::fp32, DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2})
    if (n == dtype_name(t)) return true;
  return false;
}

// The top-level fields, each refused by its key with the range it must lie in.
void validate_fields(const Manifest& m, const std::string& where) {
  const auto bad = [&](const char* key, const auto& value, const char* range) {
    STRATA_THROW(Errc::corrupt, "checkpoint manifest ", where, ": '", key, "' is ", value, " but must be ", range,
                 ": the file is damaged; load another checkpoint");
  };
  if (m.step < 0) bad("step", m.step, ">= 0");
  if (m.world_size < 1) bad("world_size", m.world_size, ">= 1");
  if (m.zero_stage < 0 || m.zero_stage > 3) bad("zero_stage", m.zero_stage, "0, 1, 2 or 3");
  if (!known_dtype_name(m.compute_dtype))
    bad("compute_dtype", "'" + m.compute_dtype + "'", "fp32, bf16, fp16, fp8_e4m3 or fp8_e5m2");
  if (m.moment_dtype != "fp32" && m.moment_dtype != "bf16" && m.moment_dtype != "q8")
    bad("moment_dtype", "'" + m.moment_dtype + "'", "fp32, bf16 or q8");
  if (m.chunk_bytes == 0 || m.chunk_bytes > kMaxChunkBytes) bad("chunk_bytes", m.chunk_bytes, "in 1 to 2^30");
  std::set<std::string> names;
  for (const auto& f : m.files) {
    STRATA_CHECK(plain_file_name(f.name), Errc::corrupt, "checkpoint manifest ", where, ": file name ",
                 json(f.name).dump(), " is not a plain file name (one component inside the checkpoint directory)");
    STRATA_CHECK(names.insert(f.name).second, Errc::corrupt, "checkpoint manifest ", where, ": file ", f.name,
                 " is listed twice");
    STRATA_CHECK(f.rank >= 0 && f.rank < m.world_size, Errc::corrupt, "checkpoint manifest ", where, ": file ", f.name,
                 " has 'rank' ", f.rank, " outside the world of ", m.world_size);
  }
  names.clear();
  for (const auto& t : m.tensors) {
    STRATA_CHECK(!t.name.empty(), Errc::corrupt, "checkpoint manifest ", where, ": a tensor has an empty 'name'");
    STRATA_CHECK(names.insert(t.name).second, Errc::corrupt, "checkpoint manifest ", where, ": tensor '", t.name,
                 "' is listed twice");
  }
}

// Segments inside their files, and (whole manifests) tiling each tensor exactly.
void validate(const Manifest& m, const std::string& where, bool partial) {
  validate_fields(m, where);
  for (const auto& t : m.tensors) {
    std::uint64_t numel = 1;
    for (auto d : t.shape) {
      STRATA_CHECK(d >= 0, Errc::corrupt, "checkpoint manifest ", where, ": tensor '", t.name, "' has a negative dim");
      STRATA_CHECK(!__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel), Errc::corrupt,
                   "checkpoint manifest ", where, ": tensor '", t.name, "' has a shape too large for 64 bits");
    }
    STRATA_CHECK(numel == t.numel, Errc::corrupt, "checkpoint manifest ", where, ": tensor '", t.name, "' has ",
                 t.numel, " elements but its shape holds ", numel);
    for (int s = 0; s < kStates; ++s) {
      auto segs = t.states[s];
      const std::string ctx = str_cat("tensor '", t.name, "' (", state_name(static_cast<State>(s)), ")");
      for (const auto& g : segs) {
        STRATA_CHECK(g.file >= 0 && g.file < static_cast<int>(m.files.size()), Errc::corrupt, "checkpoint manifest ",
                     where, ": ", ctx, " names file #", g.file, " of ", m.files.size());
        const std::uint64_t bytes = m.files[g.file].bytes;
        const bool blocks = m.blocks(static_cast<State>(s));
        STRATA_CHECK(g.lane == 0 || (blocks && g.lane < static_cast<std::uint32_t>(q8::kBlockElems)), Errc::corrupt,
                     "checkpoint manifest ", where, ": ", ctx, " has a segment with lane ", g.lane,
                     blocks ? " (0 to 15)" : " (only q8 blocks have lanes)");
        // In whole elements (blocks) first, so no byte count below can overflow or wrap.
        bool inside = false;
        if (blocks) {
          const std::uint64_t have = bytes / q8::kBlockBytes;
          inside = g.count <= have * q8::kBlockElems &&
                   (g.lane + g.count + q8::kBlockElems - 1) / q8::kBlockElems <= have &&
                   g.file_offset <= bytes - m.segment_bytes(static_cast<State>(s), g);
        } else {
          const std::uint64_t eb = m.elem_bytes(static_cast<State>(s));
          inside = g.count <= bytes / eb && g.file_offset <= bytes - g.count * eb;
        }
        STRATA_CHECK(inside && g.count <= t.numel && g.elem <= t.numel - g.count, Errc::corrupt, "checkpoint manifest ",
                     where, ": ", ctx, " has a segment outside ", m.files[g.file].name, " or the tensor");
      }
      if (partial || (s > 0 && !t.has_moments())) continue;  // a frozen tensor has no moments
      std::sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) { return a.elem < b.elem; });
      std::uint64_t next = 0;
      for (const auto& g : segs) {
        STRATA_CHECK(g.elem == next, Errc::corrupt, "checkpoint manifest ", where, ": ", ctx,
                     g.elem < next ? " has overlapping segments at element " : " has no data for elements from ",
                     std::min(g.elem, next));
        next += g.count;
      }
      STRATA_CHECK(next == t.numel, Errc::corrupt, "checkpoint manifest ", where, ": ", ctx,
                   " has no data for elements from ", next);
    }
  }
  for (const auto& f : m.files) {
    const std::uint64_t chunks =
        f.kind == FileKind::swap ? 0 : f.bytes / m.chunk_bytes + (f.bytes % m.chunk_bytes != 0 ? 1 : 0);
    STRATA_CHECK(f.xxh3.size() == chunks, Errc::corrupt, "checkpoint manifest ", where, ": file ", f.name, " has ",
                 f.xxh3.size(), " checksums for ", chunks, " chunks");
  }
}

}  // namespace

const char* state_name(State s) noexcept {
  switch (s) {
    case State::master:
      return "master";
    case State::exp_avg:
      return "exp_avg";
    case State::exp_avg_sq:
      return "exp_avg_sq";
  }
  return "?";
}

const TensorEntry* Manifest::find(const std::string& tensor) const noexcept {
  for (const auto& t : tensors)
    if (t.name == tensor) return &t;
  return nullptr;
}

std::uint64_t Manifest::elem_bytes(State s) const noexcept {
  return s == State::master || moment_dtype == "fp32" ? 4 : 2;
}

std::uint64_t Manifest::segment_bytes(State s, const Segment& g) const noexcept {
  if (!blocks(s)) return g.count * elem_bytes(s);
  const std::uint64_t lanes = g.lane + g.count;
  return (lanes / q8::kBlockElems + (lanes % q8::kBlockElems != 0 ? 1 : 0)) * q8::kBlockBytes;
}

std::uint64_t Manifest::payload_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& f : files) n += f.bytes;
  return n;
}

std::string to_json(const Manifest& m) {
  json files = json::array();
  for (const auto& f : m.files) {
    json e = {{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}};
    if (f.kind == FileKind::swap) {
      e["kind"] = "swap";
      e["table_xxh3"] = f.table_xxh3;
    } else {
      e["xxh3"] = f.xxh3;
    }
    files.push_back(e);
  }
  json tensors = json::array();
  for (const auto& t : m.tensors) {
    json states;
    for (int s = 0; s < kStates; ++s) states[state_name(static_cast<State>(s))] = segments_json(t.states[s]);
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"numel", t.numel}, {"states", states}});
  }
  json j = {{"format", kFormatName},
            {"version", std::max(m.version, moments_version(m))},
            {"step", m.step},
            {"world_size", m.world_size},
            {"zero_stage", m.zero_stage},
            {"compute_dtype", m.compute_dtype},
            {"chunk_bytes", m.chunk_bytes},
            {"engine", json::parse(m.engine_state)},
            {"trainer", json::parse(m.trainer_state)},
            {"files", files},
            {"tensors", tensors}};
  if (m.moment_dtype != "fp32") j["moment_dtype"] = m.moment_dtype;  // version 3 (bf16) or 5 (q8); absent: fp32
  return j.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& where, bool partial) {
  json j;
  try {
    j = json::parse(text, [&](int depth, json::parse_event_t event, json&) {
      const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
      STRATA_CHECK(!opens || depth < kMaxDepth, Errc::corrupt, "checkpoint manifest ", where, " nests deeper than ",
                   kMaxDepth, " levels: the file is damaged; load an earlier checkpoint");
      return true;
    });
  } catch (const json::exception& e) {
    STRATA_THROW(Errc::corrupt, "checkpoint manifest ", where, " is not valid JSON (", e.what(),
                 "): the file is damaged; load an earlier checkpoint");
  }
  const std::string top = "the manifest";
  STRATA_CHECK(need<std::string>(j, "format", where, top) == kFormatName, Errc::corrupt, "checkpoint manifest ", where,
               " is not a Strata checkpoint (format '", j["format"].get<std::string>(), "')");
  Manifest m;
  m.version = need<int>(j, "version", where, top);
  STRATA_CHECK(m.version >= kOldestFormatVersion && m.version <= kFormatVersion, Errc::corrupt, "checkpoint manifest ",
               where, " has format version ", m.version, "; this Strata reads versions ", kOldestFormatVersion, " to ",
               kFormatVersion, " (a newer Strata wrote it, or the file is damaged)");
  m.step = need<std::int64_t>(j, "step", where, top);
  m.world_size = need<int>(j, "world_size", where, top);
  m.zero_stage = need<int>(j, "zero_stage", where, top);
  m.compute_dtype = need<std::string>(j, "compute_dtype", where, top);
  m.chunk_bytes = need<std::uint64_t>(j, "chunk_bytes", where, top);
  if (j.contains("moment_dtype")) {
    m.moment_dtype = need<std::string>(j, "moment_dtype", where, top);
    m.q8_as_bf16 = m.moment_dtype == "q8" && m.version == 4;
    const int needs = moments_version(m);
    STRATA_CHECK(m.version >= needs, Errc::corrupt, "checkpoint manifest ", where, " is format version ", m.version,
                 " but has 'moment_dtype' ", m.moment_dtype, " (version ", needs,
                 "): the file was changed or damaged; load another checkpoint");
  }
  for (const char* key : {"engine", "trainer"}) {
    STRATA_CHECK(need<json>(j, key, where, top).is_object(), Errc::corrupt, "checkpoint manifest ", where, ": '", key,
                 "' is not a JSON object (", j[key].type_name(), ")");
  }
  m.engine_state = j["engine"].dump();
  m.trainer_state = j["trainer"].dump();
  for (const char* key : {"files", "tensors"}) {
    STRATA_CHECK(need<json>(j, key, where, top).is_array(), Errc::corrupt, "checkpoint manifest ", where, ": '", key,
                 "' is not an array (", j[key].type_name(), ")");
  }
  for (const auto& f : j["files"]) {
    FileEntry e;
    e.name = need<std::string>(f, "name", where, "a file");
    const std::string ctx = "file " + e.name;
    e.rank = need<int>(f, "rank", where, ctx);
    e.bytes = need<std::uint64_t>(f, "bytes", where, ctx);
    const std::string kind = f.contains("kind") ? need<std::string>(f, "kind", where, ctx) : "raw";
    STRATA_CHECK(kind == "raw" || kind == "swap", Errc::corrupt, "checkpoint manifest ", where, ": ", ctx,
                 " has kind '", kind, "' (raw or swap)");
    if (kind == "swap") {
      e.kind = FileKind::swap;
      e.table_xxh3 = need<std::uint64_t>(f, "table_xxh3", where, ctx);
    } else {
      e.xxh3 = need<std::vector<std::uint64_t>>(f, "xxh3", where, ctx);
    }
    m.files.push_back(std::move(e));
  }
  for (const auto& t : j["tensors"]) {
    TensorEntry e;
    e.name = need<std::string>(t, "name", where, "a tensor");
    const std::string ctx = "tensor '" + e.name + "'";
    e.shape = need<std::vector<std::int64_t>>(t, "shape", where, ctx);
    e.numel = need<std::uint64_t>(t, "numel", where, ctx);
    const json states = need<json>(t, "states", where, ctx);
    for (int s = 0; s < kStates; ++s) {
      const char* sn = state_name(static_cast<State>(s));
      e.states[s] = parse_segments(need<json>(states, sn, where, ctx), where, ctx + " " + sn);
    }
    m.tensors.push_back(std::move(e));
  }
  validate(m, where, partial);
  return m;
}

std::string manifest_file_text(const Manifest& m) {
  Manifest v = m;
  v.version = 2;  // to_json raises it to what the moments need (3 or 5); what earlier Strata reads stays 2
  const std::string body = to_json(v);  // "{\n \"chunk_bytes\": ..."
  std::string text = str_cat(kChecksumOpen, std::string(16, '0'), kChecksumClose, body.substr(1));
  text.replace(kChecksumOpen.size(), 16, hex64(XXH3_64bits(text.data(), text.size())));
  return text;
}

Manifest parse_manifest_file(const std::string& text, const std::string& path) {
  const std::size_t at = kChecksumOpen.size();
  const bool has_sum = text.compare(0, at, kChecksumOpen) == 0;
  if (has_sum) {
    STRATA_CHECK(text.size() >= at + 16 + kChecksumClose.size() &&
                     text.compare(at + 16, kChecksumClose.size(), kChecksumClose) == 0,
                 Errc::corrupt, "checkpoint manifest ", path,
                 " has a damaged 'xxh3' line: the file was changed or damaged; load another checkpoint");
    std::uint64_t stated = 0;
    for (std::size_t i = at; i < at + 16; ++i) {
      const char c = text[i];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      STRATA_CHECK(d >= 0, Errc::corrupt, "checkpoint manifest ", path, ": its 'xxh3' is not 16 hex digits",
                   ": the file was changed or damaged; load another checkpoint");
      stated = stated << 4 | static_cast<std::uint64_t>(d);
    }
    std::string zeroed = text;
    zeroed.replace(at, 16, 16, '0');
    const std::uint64_t actual = XXH3_64bits(zeroed.data(), zeroed.size());
    STRATA_CHECK(actual == stated, Errc::corrupt, "checkpoint manifest ", path, " fails its XXH3 checksum (it says ",
                 text.substr(at, 16), ", its bytes hash to ", hex64(actual),
                 "): the file was changed or damaged after it was written; load another checkpoint");
  }
  Manifest m = parse_manifest(text, path);
  if (!has_sum) {
    STRATA_CHECK(m.version < 2, Errc::corrupt, "checkpoint manifest ", path, " is format version ", m.version,
                 " but does not open with its 'xxh3' checksum: the file was changed (rewritten by another tool?) "
                 "or damaged; load another checkpoint");
    STRATA_LOG(warn, "checkpoint manifest ", path, " is format version ", m.version,
               " (written by an earlier Strata) and carries no checksum: a change to it cannot be detected");
  }
  return m;
}

Manifest merge_parts(const std::vector<Manifest>& parts) {
  STRATA_CHECK(!parts.empty(), Errc::internal, "merge_parts: no parts");
  Manifest m = parts[0];
  m.files.clear();
  for (auto& t : m.tensors)
    for (auto& s : t.states) s.clear();
  for (const auto& p : parts) {
    STRATA_CHECK(p.tensors.size() == m.tensors.size(), Errc::internal, "checkpoint: rank parts list ", p.tensors.size(),
                 " and ", m.tensors.size(), " tensors");
    const int base = static_cast<int>(m.files.size());
    m.files.insert(m.files.end(), p.files.begin(), p.files.end());
    for (std::size_t i = 0; i < p.tensors.size(); ++i) {
      STRATA_CHECK(p.tensors[i].name == m.tensors[i].name, Errc::internal, "checkpoint: rank parts disagree on tensor ",
                   i, " ('", p.tensors[i].name, "' vs '", m.tensors[i].name, "')");
      for (int s = 0; s < kStates; ++s) {
        for (Segment g : p.tensors[i].states[s]) {
          g.file += base;
          m.tensors[i].states[s].push_back(g);
        }
      }
    }
  }
  return m;
}

std::string shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank%05d.bin", rank);
  return buf;
}

std::string step_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08" PRId64, step);
  return buf;
}

std::int64_t step_of_dir_name(const std::string& name) noexcept {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return -1;
  std::int64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace strata::checkpoint
