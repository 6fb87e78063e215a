// Checkpoint directories: how a save becomes visible, atomically, and how a path is opened.
//
// Protocol. Under a root directory, one process (rank 0) calls prepare_save(root, step),
// which removes what crashed saves left (`.step-*.tmp`, `.step-*.old`) and creates an empty
// staging directory `.step-N.tmp`; every rank writes its shard file there (shard_file.h);
// then that process calls commit_save(), which writes `manifest.json` (checksummed,
// format.h) under a temporary name, fsyncs it, renames it into place and fsyncs the
// directory, renames the staging directory to `step-N` (atomically exchanging it with an
// existing `step-N`, which is then removed) and fsyncs the root, then points `latest` at it
// the same way (temporary file, fsync, rename, fsync), and finally removes all but the
// newest `keep` checkpoints (never the one `latest` names; each is first renamed away, so
// no half-removed checkpoint keeps its name). A process killed at any moment leaves
// `latest` naming a complete checkpoint (or no `latest` at all before the first commit): a
// checkpoint without its manifest does not exist. A failed save is abandoned (abandon_save)
// and the previous checkpoint stays latest.
//
// open_checkpoint(path) takes a root (follows `latest`) or a step directory, reads and
// validates the manifest (its checksum first, format.h), and names what is missing when it
// cannot. `latest` and `manifest.json` are control files anyone can replace: they are
// opened non-blocking, refused unless they are regular files, and read whole only up to a
// bound (4 KiB, 256 MiB), so a FIFO or /dev/zero in their place is an error naming the
// path, never a hang or an unbounded read.
//
// Fallback. `latest` is one file; a checkpoint is whole once its manifest is in place, so
// a `latest` that is missing, empty, torn, not a regular file, or names no step directory or
// one that is gone does not mean no checkpoint exists: open_checkpoint then loads the newest
// step-N directory under the root whose manifest reads and validates, and logs one warning
// saying why `latest` was not used and which step is loaded. Only when there is none does
// it throw `latest`'s error. What a usable `latest` names is the checkpoint asked for: its
// damage (no manifest, a manifest failing its checksum) is an error naming it, never hidden
// behind an older checkpoint, and so is an I/O error reading `latest`. A step directory
// given explicitly never falls back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/format.h"

namespace strata::checkpoint {

inline constexpr const char* kLatestName = "latest";

struct Opened {
  std::string dir;  // the step directory
  Manifest manifest;
};

Opened open_checkpoint(const std::string& path);

// The staging directory of a save of `step` under `root` (where every rank writes).
std::string staging_dir(const std::string& root, std::int64_t step);
// Creates root if needed, clears crashed saves' leftovers, returns a fresh staging_dir().
std::string prepare_save(const std::string& root, std::int64_t step);
// Commits the staged save (see the protocol); returns the step directory.
std::string commit_save(const std::string& root, const Manifest& manifest, int keep);
// Removes a staging directory after a failed save (never throws).
void abandon_save(const std::string& root, std::int64_t step) noexcept;
// Steps of the committed checkpoints under root (those with a manifest), ascending.
std::vector<std::int64_t> list_checkpoints(const std::string& root);

}  // namespace strata::checkpoint
