// Helpers shared by offload/'s two NVMe stores (the optimizer swapper and the parameter
// store): file names from tensor names, block reservation so a full device fails at
// creation rather than mid-step, and creating the per-rank swap directory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/buffer_pool.h"
#include "io/engine.h"
#include "io/swap_file.h"

namespace strata::offload::detail {

// A file-name-safe stem of a tensor name ("layer 3" -> "layer_3").
std::string file_stem(const std::string& name);
// posix_fallocate(path, 0, bytes); throws strata::Error naming the path and `tier` on failure.
void reserve_blocks(const std::string& path, std::uint64_t bytes, const char* tier);
// Creates `dir` (and parents); returns the directories this call created, outermost first,
// for remove_swap_dirs. Throws naming `key` (the config key that chose the directory) when
// it cannot be created.
std::vector<std::string> create_swap_dir(const std::string& dir, const char* key);
// Creates both generations of one chunk's swap file, `base` + ".a.swap" and ".b.swap", for
// `payload_bytes` of `element_bytes`-sized elements in checksum blocks of at most
// `block_bytes`, with their blocks reserved. Each path goes into `created` before its file
// is made, so the caller can remove_swap_files() on failure. `where(gen)` names the chunk
// in errors, `tier` the tier. Returns the bytes of both files.
std::uint64_t create_swap_pair(io::Engine& engine, const std::string& base, std::uint32_t element_bytes,
                               std::uint64_t payload_bytes, std::uint32_t block_bytes, std::string path[2],
                               std::unique_ptr<io::SwapFile> file[2], std::vector<std::string>& created,
                               const std::function<std::string(int gen)>& where, const char* tier);
// What create_swap_pair() makes for these arguments, without creating anything: the bytes
// it puts on disk (both files, headers, checksum tables and padded blocks included) and the
// host memory the pair keeps while open (io::SwapFile::host_bytes of each file).
struct SwapPairSize {
  std::uint64_t file_bytes = 0, host_bytes = 0;
};
SwapPairSize swap_pair_size(std::uint32_t element_bytes, std::uint64_t payload_bytes, std::uint32_t block_bytes);
// Unlinks the files (missing ones are fine).
void remove_swap_files(const std::vector<std::string>& paths) noexcept;
// Removes the directories create_swap_dir made, innermost first, each only if now empty.
void remove_swap_dirs(const std::vector<std::string>& created) noexcept;

// An io_uring engine with a fixed-file slot for each of `files` swap files, and `count` pool
// buffers of `buffer_bytes`, all leased for the owner's lifetime (registered with the ring,
// mlocked when lock_memory). Each open swap file holds two descriptors (O_DIRECT and
// buffered): the soft open-file limit is raised toward the hard one when the files need it,
// and when even the hard limit is too small the store is refused, naming the count, the
// limit and `files_key`, the config key that makes the files larger and fewer. `who` and
// `buffers_what` name the store and its buffers in errors ("optimizer swapper", "swap buffers").
struct SwapIo {
  std::optional<io::Engine> engine;
  std::optional<io::BufferPool> pool;
  std::vector<io::PoolBuffer> buffers;
};
void start_swap_io(SwapIo& out, unsigned queue_depth, unsigned submit_batch, std::uint32_t block_bytes,
                   std::uint64_t buffer_bytes, int count, bool lock_memory, const char* who, const char* buffers_what,
                   std::uint64_t files, const char* files_key);

}  // namespace strata::offload::detail
