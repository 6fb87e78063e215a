// The checkpoint format: what a checkpoint directory holds and the manifest that describes it.
//
// A checkpoint is one directory per saved step (`step-00000012`) under a root directory,
// holding one shard file per rank (`rank00000.bin`) and `manifest.json`. A shard file is
// raw little-endian data: the pieces of fp32 master weights and optimizer moments (fp32, or
// bf16 where the manifest's "moment_dtype" says bf16 (version 3), or q8 blocks as the
// optimizer holds them (version 5; runtime/core/q8_codec.h)) that its rank owned, unpadded,
// one segment per (tensor, state, contiguous range). The manifest says
// everything needed to read them back at any world size and stage:
//   - format and version, the step, the world size, ZeRO stage and compute dtype it was
//     saved with, the engine's and the trainer's own state (opaque JSON objects);
//   - per file: its name, rank and kind. A "raw" file is written for the checkpoint: its
//     byte size and one XXH3-64 per `chunk_bytes` chunk. A "swap" file is an optimizer swap
//     file of the NVMe tier (io/swap_format.h: [master | exp_avg | exp_avg_sq] of one
//     sub-group), hard-linked (or copied) into the checkpoint as it was: it carries its own
//     per-block checksums, and the manifest pins them with the XXH3-64 of its checksum
//     table; its size is its payload's, and segment offsets are payload offsets;
//   - per tensor: its name, global shape and, per state (master, exp_avg, exp_avg_sq), the
//     segments (file, byte offset, first element, element count) that tile it exactly; a
//     frozen tensor (no optimizer state) has master segments only and both moments empty.
//     A q8 moment segment points at whole 17-byte blocks of 16 elements, and a fifth number,
//     the lane (0-15, written when not 0), says where in its first block the tensor's element
//     `elem` is: tensors are packed into a layer's flat buffer with no regard for blocks, so a
//     block may hold the end of one tensor and the start of the next, and both segments
//     point at it. Blocks are stored as the optimizer holds them (a parameter's moments take
//     2.125 bytes, not version 4's 4), and a swap file of q8 state joins a checkpoint as any other.
// A manifest is only accepted when every field is in range (each refusal names its key),
// its segments lie inside their files and tile every tensor with no gap or overlap, so a
// reader never returns an element nobody saved.
//
// Manifest file. The shard files' chunk sums protect the data but nothing protected the
// manifest itself: one changed digit in a segment offset, the step or the loss scale read
// as a valid, different checkpoint. So the file `manifest.json` (version 2) opens with
// `{\n "xxh3": "<16 hex digits>",` and those digits are the XXH3-64 of the file's exact
// bytes with the 16 digits written as zeros; the reader zeroes them back, hashes and
// compares before it parses anything. The checksum belongs to the file, not to the JSON:
// to_json/parse_manifest (also used for the rank parts sent to rank 0 before the merge)
// neither write nor check it, manifest_file_text/parse_manifest_file do. A version-1 file
// (earlier Strata, no checksum) is still read, with a warning that it carries none; a
// version-2 file without one is refused, since the line can only have gone by an edit.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::checkpoint {

// 2: manifest.json carries its XXH3. 3: the moments may be bf16 ("moment_dtype"). 4: or q8
// (exp_avg's values and exp_avg_sq's square roots stored as bf16, both exact; still read).
// 5: q8 moments stored as q8 blocks (segments with lanes). A checkpoint is written at the
// lowest version its moments need (fp32: 2, bf16: 3, q8: 5), which earlier Strata reads.
inline constexpr int kFormatVersion = 5;
inline constexpr int kOldestFormatVersion = 1;  // read, with a warning (no checksum)
inline constexpr const char* kFormatName = "strata-checkpoint";
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr std::uint64_t kDefaultChunkBytes = std::uint64_t{1} << 20;
// A chunk is read whole to check its sum: a larger one in a manifest is damage.
inline constexpr std::uint64_t kMaxChunkBytes = std::uint64_t{1} << 30;

enum class State { master = 0, exp_avg = 1, exp_avg_sq = 2 };
inline constexpr int kStates = 3;
const char* state_name(State s) noexcept;

struct Segment {
  int file = 0;                   // index into Manifest::files
  std::uint64_t file_offset = 0;  // bytes
  std::uint64_t elem = 0;         // first element within the tensor (row-major, unpadded)
  std::uint64_t count = 0;        // elements
  std::uint32_t lane = 0;         // q8 blocks: element `elem`'s place in the block at file_offset
};

struct TensorEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 0;
  std::array<std::vector<Segment>, kStates> states;
  // Saved with optimizer moments (a frozen tensor has its values only).
  bool has_moments() const noexcept { return !states[1].empty() || !states[2].empty(); }
};

enum class FileKind { raw, swap };

struct FileEntry {
  std::string name;  // relative to the checkpoint directory
  int rank = 0;
  std::uint64_t bytes = 0;          // raw: the file's size; swap: its payload's
  std::vector<std::uint64_t> xxh3;  // raw: one per chunk_bytes chunk (the last may be shorter)
  FileKind kind = FileKind::raw;
  std::uint64_t table_xxh3 = 0;  // swap: XXH3-64 of the file's checksum table
};

struct Manifest {
  int version = 2;  // to_json writes 3 for bf16 moments and 5 for q8 ones (4 when q8_as_bf16)
  std::int64_t step = 0;
  int world_size = 1;
  int zero_stage = 0;
  std::string compute_dtype = "fp32";
  // exp_avg and exp_avg_sq: fp32, bf16, or q8 (as blocks); the master is fp32.
  std::string moment_dtype = "fp32";
  // Version 4's q8: exp_avg and sqrt(exp_avg_sq) stored in bf16 (the q8 values exactly).
  // Set by parse_manifest for such files; Strata writes blocks.
  bool q8_as_bf16 = false;
  std::uint64_t chunk_bytes = kDefaultChunkBytes;
  std::string engine_state = "{}";   // a JSON object, the engine's (step counters, loss scaler)
  std::string trainer_state = "{}";  // a JSON object, the trainer's (data position, seed)
  std::vector<FileEntry> files;
  std::vector<TensorEntry> tensors;

  const TensorEntry* find(const std::string& tensor) const noexcept;
  // The state's moments are q8 blocks (segments with lanes, segment_bytes) rather than an
  // array of elem_bytes(s) bytes an element: 4, or 2 for bf16 moments (and version 4's q8).
  bool blocks(State s) const noexcept { return s != State::master && moment_dtype == "q8" && !q8_as_bf16; }
  std::uint64_t elem_bytes(State s) const noexcept;
  // Bytes of the file a segment of state s covers (blocks: every block it touches).
  std::uint64_t segment_bytes(State s, const Segment& g) const noexcept;
  std::uint64_t payload_bytes() const noexcept;  // sum of the files' sizes
};

// JSON text of a manifest (also used for one rank's part before they are merged).
std::string to_json(const Manifest& m);
// Parses and validates (see the protocol above); throws Errc::corrupt naming `where` and the
// key, file or tensor that is wrong. `partial`: one rank's part, not checked for tiling.
Manifest parse_manifest(const std::string& text, const std::string& where, bool partial = false);
// The bytes of a manifest file: to_json's text (at kFormatVersion) with the checksum line
// first (see the protocol above).
std::string manifest_file_text(const Manifest& m);
// Checks a manifest file's checksum (or warns that a version-1 file has none), then
// parses it whole; throws Errc::corrupt naming `path` when the bytes changed.
Manifest parse_manifest_file(const std::string& text, const std::string& path);
// One manifest from every rank's part (in rank order): files concatenated, segments
// re-pointed at them. Every part must list the same tensors in the same order.
Manifest merge_parts(const std::vector<Manifest>& parts);

// "rank00003.bin": rank 3's shard file.
std::string shard_file_name(int rank);
// "step-00000012"
std::string step_dir_name(std::int64_t step);
// The step of a "step-NNNNNNNN" name, or -1.
std::int64_t step_of_dir_name(const std::string& name) noexcept;

}  // namespace strata::checkpoint
