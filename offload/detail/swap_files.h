// Helpers shared by offload/'s two NVMe stores (the optimizer swapper and the parameter
// store): file names from tensor names, block reservation so a full device fails at
// creation rather than mid-step, and creating the per-rank swap directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::offload::detail {

// A file-name-safe stem of a tensor name ("layer 3" -> "layer_3").
std::string file_stem(const std::string& name);
// posix_fallocate(path, 0, bytes); throws strata::Error naming the path and `tier` on failure.
void reserve_blocks(const std::string& path, std::uint64_t bytes, const char* tier);
// Creates `dir` (and parents); returns the directories this call created, outermost first,
// for remove_swap_dirs. Throws naming `key` (the config key that chose the directory) when
// it cannot be created.
std::vector<std::string> create_swap_dir(const std::string& dir, const char* key);
// Removes the directories create_swap_dir made, innermost first, each only if now empty.
void remove_swap_dirs(const std::vector<std::string>& created) noexcept;

}  // namespace strata::offload::detail
