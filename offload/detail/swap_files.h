// Helpers shared by offload/'s two NVMe stores (the optimizer swapper and the parameter
// store): file names from tensor names, block reservation so a full device fails at
// creation rather than mid-step, the per-rank swap directory, the chunks' swap files and
// the io_uring engine with its pinned buffers.
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
#include "offload/swap_footprint.h"

namespace strata::offload::detail {

// A file-name-safe stem of a tensor name ("layer 3" -> "layer_3").
std::string file_stem(const std::string& name);
// posix_fallocate(path, 0, bytes); throws strata::Error naming the path and `tier` on failure.
void reserve_blocks(const std::string& path, std::uint64_t bytes, const char* tier);
// Creates `dir` (and parents); returns the directories this call created, outermost first,
// for remove_swap_dirs. Throws naming `key` (the config key that chose the directory) when
// it cannot be created.
std::vector<std::string> create_swap_dir(const std::string& dir, const char* key);
// A swap file: chunk `chunk`'s own generation `gen` (0: ".a.swap", 1: ".b.swap").
struct SlotRef {
  std::size_t chunk = 0;
  int gen = 0;
  bool operator==(const SlotRef&) const = default;
};
// One chunk of a store's tensor on NVMe: `length` units from `offset` of the tensor (the
// store's units: elements or bytes). It owns its ".a" file and, unless the store keeps fewer
// spares than chunks, its ".b" file; `slot` names the file holding its committed state and
// `next` (when has_next) the file a write of its new state went to.
struct SwapChunk {
  std::size_t tensor = 0, index = 0;  // index: the chunk's place within its tensor
  std::uint64_t offset = 0, length = 0;
  std::size_t klass = 0;  // chunks of one class share spare files (all of one length)
  std::string path[2];
  std::unique_ptr<io::SwapFile> file[2];
  SlotRef slot{}, next{};
  bool has_next = false;
};
// How a store cuts its tensors into swap files.
struct SwapLayout {
  std::uint64_t chunk_units = 1;  // units per chunk at most (a tensor's last chunk may be shorter)
  std::uint64_t unit_bytes = 1;   // payload bytes per group of group_units units
  std::uint64_t group_units = 1;  // units coded together (q8 moments: 16 elements); a part group takes a whole one
  std::uint64_t payload(std::uint64_t units) const { return (units + group_units - 1) / group_units * unit_bytes; }
  std::uint32_t element_bytes = 1;       // the files' element size
  std::uint32_t block_bytes = 1u << 20;  // checksum block size at most (aio.block_size)
  // Spare files: 0, one per chunk (two generations of everything); n > 0, n per distinct
  // chunk length (at most one per chunk of that length), shared by the chunks of that length.
  std::uint64_t spares = 0;
};
// Adds to `f` what the files of tensors of these sizes take (file_bytes, file_count,
// host_bytes), without creating anything; the buffer fields are the caller's.
void count_swap_files(SwapFootprint& f, const std::vector<std::uint64_t>& sizes, const SwapLayout& layout);

// A store's swap files. create() cuts tensor t (`sizes[t]` units, named `names[t]`) into
// chunks per the layout and makes each chunk's ".a" file, `dir`/<file_stem(name)><infix>
// <chunk index>.a.swap, which holds its first state, and the spare files (".b.swap" of the
// first chunks of each class), with their blocks reserved so that a full device fails here
// rather than mid-step. It is all or nothing: on a failure every file and directory it made
// is removed before the error propagates; `where(chunk, gen)` names the file in errors,
// `tier` the tier. The destructor closes and unlinks every file and removes the directories
// create() made, each only if then empty.
//
// Slots: a chunk's committed state is in file `slot`; acquire(ci) lends it a free spare of
// its class as `next` (false when the class has none free), commit(ci) makes `next` its
// committed file and frees the old one, discard(ci) frees `next` unused. A free spare may be
// a file a checkpoint hard-linked while it was committed: the caller replaces it (new inode)
// before writing.
class SwapChunks {
 public:
  using Where = std::function<std::string(const SwapChunk&, int gen)>;
  SwapChunks() = default;
  SwapChunks(const SwapChunks&) = delete;
  SwapChunks& operator=(const SwapChunks&) = delete;
  ~SwapChunks();
  void create(io::Engine& engine, const std::string& dir, const char* dir_key, const std::vector<std::string>& names,
              const std::vector<std::uint64_t>& sizes, const SwapLayout& layout, const char* infix, const Where& where,
              const char* tier);

  io::SwapFile& file(SlotRef s) { return *chunks[s.chunk].file[s.gen]; }
  const std::string& path(SlotRef s) const { return chunks[s.chunk].path[s.gen]; }
  bool acquire(std::size_t ci);
  bool has_free(std::size_t ci) const { return !free_[chunks[ci].klass].empty(); }
  void commit(std::size_t ci);
  void discard(std::size_t ci) noexcept;
  std::vector<std::string> all_paths() const;  // every file, committed or spare

  std::vector<SwapChunk> chunks;
  std::vector<std::size_t> first;  // tensor t's chunks are [first[t], first[t + 1])
  std::uint64_t file_bytes = 0;    // every file, headers included

 private:
  std::vector<std::vector<SlotRef>> free_;  // per class: its spare files not lent out
  std::vector<std::string> created_dirs_;
};
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
