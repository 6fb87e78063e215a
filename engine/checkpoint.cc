// Engine::save_checkpoint and Engine::load_checkpoint (the protocol in engine.h): the
// engine's state mapped onto the checkpoint format (checkpoint/format.h). Each rank saves
// what it owns: its shard of every bucket, the same ranges at every stage (so stage 0's
// replicas are saved once), cut at parameter boundaries with the padding left out. A
// tensor's elements are so addressed by their place in the tensor, and a rank of any world
// size or stage reads back the ranges it owns from whichever files hold them. The
// compute-dtype parameters are not saved: they are the masters converted, as step() makes
// them, and are rebuilt from them on load.
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_set>

#include "checkpoint/directory.h"
#include "checkpoint/format.h"
#include "checkpoint/shard_file.h"
#include "engine/detail/checkpoint_ranges.h"
#include "engine/detail/engine_impl.h"
#include "engine/engine.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {
using checkpoint::State;

std::vector<Engine::Impl::Piece> Engine::Impl::pieces(int li, bool whole) const {
  const auto& L = layout->layers()[li];
  std::vector<Piece> out;
  for (std::size_t k = 0; k < L.buckets.size(); ++k) {
    const auto& b = layout->buckets()[L.buckets[k]];
    const std::size_t pos = bucket_pos(b, L);
    if (whole)
      out.push_back({pos, pos, b.padded});
    else
      out.push_back({cfg.zero.stage == 0 ? pos + own_begin(b) : layout->layers()[li].shard_offsets[k],
                     pos + own_begin(b), b.shard});
  }
  return out;
}

int Engine::Impl::first_failure(bool ok) {
  if (comm == nullptr || world == 1) return ok ? -1 : rank;
  const float mine = ok ? 0.0f : 1.0f;
  std::vector<float> all(static_cast<std::size_t>(world));
  comm->all_gather(&mine, all.data(), 1, DType::fp32);
  for (int r = 0; r < world; ++r)
    if (all[static_cast<std::size_t>(r)] != 0.0f) return r;
  return -1;
}

// A save that hard-links NVMe swap files shares their blocks with the run, and the run
// writes a linked file again only under a new inode (OptimizerSwapper::unshare), the
// checkpoint keeping the old blocks. So every run file that will still have a link outside
// the run after this save (the current generation this save links, and files earlier saves
// linked that retention keeps) needs its size anew on nvme_path's filesystem within two
// steps, against what is free now plus what this save's retention frees (checkpoint files
// nothing else links). Refused here, naming the bytes, rather than as ENOSPC in a later
// step; a checkpoint on another filesystem is copied there and needs none.
void Engine::Impl::check_link_space(const std::string& root, std::int64_t step, int keep) const {
  auto* swapper = nvme ? nvme->swapper() : nullptr;
  if (swapper == nullptr) return;
  struct stat dir_st {
  }, swap_st{};
  if (::stat(checkpoint::staging_dir(root, step).c_str(), &dir_st) != 0 ||
      ::stat(swapper->dir().c_str(), &swap_st) != 0 || dir_st.st_dev != swap_st.st_dev)
    return;
  using Inode = std::pair<dev_t, ino_t>;
  struct File {
    std::uint64_t bytes = 0, links = 0, gone = 0;  // on disk, st_nlink, links retention removes
  };
  std::map<Inode, File> files;
  // Records the file at `path` (on the checkpoint's filesystem) and returns its inode.
  auto look = [&](const std::string& path) -> std::optional<Inode> {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || st.st_dev != dir_st.st_dev) return std::nullopt;
    File& f = files[{st.st_dev, st.st_ino}];
    f.bytes = static_cast<std::uint64_t>(st.st_blocks) * 512;
    f.links = st.st_nlink;
    return Inode{st.st_dev, st.st_ino};
  };
  // The checkpoints retention removes once this save commits: commit_save's rule, this step latest.
  if (keep > 0) {
    auto steps = checkpoint::list_checkpoints(root);
    if (std::find(steps.begin(), steps.end(), step) == steps.end()) steps.push_back(step);
    std::sort(steps.begin(), steps.end());
    const std::string mine = checkpoint::shard_file_name(rank).substr(0, 10);  // "rank00003."
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
      if (steps[i] == step) continue;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(root + "/" + checkpoint::step_dir_name(steps[i]), ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(mine, 0) != 0 || e.path().extension() != ".swap") continue;
        if (const auto inode = look(e.path().string())) ++files[*inode].gone;
      }
    }
  }
  std::set<Inode> run, linked_now;
  for (const auto& p : swapper->all_files())
    if (const auto inode = look(p)) run.insert(*inode);
  for (std::size_t t = 0; t < swapper->tensors(); ++t)
    for (const auto& f : swapper->sealed_files(t))
      if (const auto inode = look(f.path)) linked_now.insert(*inode);
  std::uint64_t needed = 0, freed = 0, linking = 0;
  for (const auto& [inode, f] : files) {
    const bool now = linked_now.count(inode) != 0;
    if (run.count(inode) != 0) {
      const std::uint64_t outside = f.links - 1 - f.gone + (now ? 1 : 0);  // links beside the run's own
      if (outside > 0) needed += f.bytes;
      if (now && f.links == 1) linking += f.bytes;
    } else if (f.gone == f.links) {
      freed += f.bytes;  // only checkpoints retention removes hold it
    }
  }
  if (linking == 0) return;  // this save shares nothing new
  struct statvfs vfs {};
  if (::statvfs(swapper->dir().c_str(), &vfs) != 0) return;
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  STRATA_CHECK(free_bytes + freed >= needed, Errc::out_of_budget, "rank ", rank, ": the checkpoint in '", root,
               "' would hard-link ", format_bytes(linking), " of NVMe optimizer state that training rewrites within ",
               "two steps; the run's linked swap files then need ", format_bytes(needed),
               " more on the filesystem of '", swapper->dir(), "', and only ", format_bytes(free_bytes), " is free",
               freed > 0 ? str_cat(" (", format_bytes(freed), " more once --keep ", keep, " removes older checkpoints)")
                         : std::string(),
               ": free space there, keep fewer checkpoints (--keep), or save checkpoints on another "
               "filesystem (the state is copied there)");
}

// This rank's part of a save of `step`, described by a partial manifest whose file 0 is
// the rank's shard file: its bytes go to `append` in file order (returning their offset);
// the NVMe tier's sealed swap files are linked into the staging directory as they are.
checkpoint::Manifest Engine::Impl::build_part(const std::string& staging, std::int64_t step,
                                              const std::string& trainer_state, bool link_nvme, SaveResult& counts,
                                              const Appender& append) {
  const Layout& lay = *layout;
  checkpoint::Manifest part;
  part.step = step;
  part.world_size = world;
  part.zero_stage = cfg.zero.stage;
  part.compute_dtype = dtype_name(cdt);
  part.moment_dtype = dtype_name(opt_state->moment_dtype());
  part.engine_state = engine_state_json();
  part.trainer_state = trainer_state;
  for (const auto& p : lay.params()) part.tensors.push_back({p.name, p.shape, p.numel, {}});
  const std::string name = checkpoint::shard_file_name(rank);
  part.files.emplace_back();  // the shard file, described when finished
  std::vector<float> st[checkpoint::kStates];
  for (std::size_t li = 0; li < layer_count(); ++li) {
    const int l = static_cast<int>(li);
    const auto& L = lay.layers()[li];
    if (plan->opt_tier(static_cast<int>(li)) == Tier::nvme && link_nvme) {
      // The sealed generation's files join the checkpoint as they are; segments point into
      // their payloads ([master | exp_avg | exp_avg_sq] of each sub-group's elements, the
      // moments in the moment dtype).
      const auto sealed =
          nvme->swapper()->sealed_files(static_cast<std::size_t>(nvme->swap_index(static_cast<int>(li))));
      const int first = static_cast<int>(part.files.size());
      for (const auto& f : sealed) {
        bool linked = false;
        const std::string fname =
            str_cat(name.substr(0, name.size() - 4), ".", std::filesystem::path(f.path).filename().string());
        part.files.push_back(checkpoint::adopt_swap_file(f.path, staging, fname, rank, &linked));
        (linked ? counts.nvme_linked_bytes : counts.nvme_copied_bytes) += part.files.back().bytes;
      }
      for (int s = 0; s < checkpoint::kStates; ++s) {
        for (const auto& pc : pieces(l, false)) {
          detail::for_each_param_range(lay, L, pc, [&](int pi, std::size_t elem, std::size_t index, std::size_t count) {
            for (std::size_t c = 0; c < sealed.size(); ++c) {
              const std::uint64_t lo = std::max<std::uint64_t>(index, sealed[c].offset);
              const std::uint64_t hi = std::min<std::uint64_t>(index + count, sealed[c].offset + sealed[c].elems);
              if (lo >= hi) continue;
              const std::uint64_t es = part.elem_bytes(static_cast<checkpoint::State>(s));
              const std::uint64_t before = s == 0 ? 0 : s == 1 ? 4 : 4 + es;  // bytes per element of earlier states
              const std::uint64_t at = before * sealed[c].elems + (lo - sealed[c].offset) * es;
              part.tensors[pi].states[s].push_back({first + static_cast<int>(c), at, elem + (lo - index), hi - lo});
            }
          });
        }
      }
      continue;
    }
    for (auto& v : st) v.resize(opt_state->elems(l));
    // A frozen layer saves its values (its compute copies, widened) and no moments.
    if (L.frozen)
      homes->read_own(l, st[0].data());
    else
      opt_state->read(l, st[0].data(), st[1].data(), st[2].data());
    std::vector<std::uint16_t> narrow;  // bf16 moments are stored as they are held
    for (int s = 0; s < (L.frozen ? 1 : checkpoint::kStates); ++s) {
      const bool wide = part.elem_bytes(static_cast<checkpoint::State>(s)) == 4;
      for (const auto& pc : pieces(l, false)) {
        detail::for_each_param_range(lay, L, pc, [&](int pi, std::size_t elem, std::size_t index, std::size_t count) {
          std::uint64_t off = 0;
          if (wide) {
            off = append(st[s].data() + index, count * 4);
          } else {
            narrow.resize(count);
            convert(st[s].data() + index, DType::fp32, narrow.data(), DType::bf16, count);  // exact: bf16 values
            off = append(narrow.data(), count * 2);
          }
          part.tensors[pi].states[s].push_back({0, off, elem, count});
        });
      }
    }
  }
  return part;
}

std::uint64_t Engine::Impl::shard_file_bytes(bool link_nvme) const {
  const Layout& lay = *layout;
  // Per element: the fp32 master, and the two moments unless frozen (values only).
  const std::uint64_t moments = 2 * dtype_size(opt_state->moment_dtype());
  std::uint64_t bytes = 0;
  for (std::size_t li = 0; li < layer_count(); ++li) {
    if (plan->opt_tier(static_cast<int>(li)) == Tier::nvme && link_nvme) continue;
    const std::uint64_t per = lay.layers()[li].frozen ? 4 : 4 + moments;
    for (const auto& pc : pieces(static_cast<int>(li), false)) {
      detail::for_each_param_range(lay, lay.layers()[li], pc,
                                   [&](int, std::size_t, std::size_t, std::size_t count) { bytes += count * per; });
    }
  }
  return bytes;
}

// The synchronous form: the shard file written as build_part produces it.
std::string Engine::Impl::write_part(const std::string& staging, std::int64_t step, const std::string& trainer_state,
                                     bool link_nvme, SaveResult& counts) {
  const std::string name = checkpoint::shard_file_name(rank);
  checkpoint::ShardWriter w(staging + "/" + name, checkpoint::kDefaultChunkBytes);
  auto part = build_part(staging, step, trainer_state, link_nvme, counts,
                         [&](const void* data, std::uint64_t bytes) { return w.append(data, bytes); });
  part.files[0] = w.finish(name, rank);
  counts.bytes += part.files[0].bytes;
  return checkpoint::to_json(part);
}

// Every rank's part to rank 0 (length, then text), which merges and commits them.
void Engine::Impl::commit_parts(const std::string& root, const std::string& part_text, int keep) {
  if (rank != 0) {
    const std::uint64_t n = part_text.size();
    comm->send(&n, sizeof n, 0, 71);
    comm->send(part_text.data(), n, 0, 72);
    return;
  }
  std::vector<checkpoint::Manifest> parts;
  parts.push_back(checkpoint::parse_manifest(part_text, "rank 0's part", true));
  for (int r = 1; r < world; ++r) {
    std::uint64_t n = 0;
    comm->recv(&n, sizeof n, r, 71);
    std::string text(n, '\0');
    comm->recv(text.data(), n, r, 72);
    parts.push_back(checkpoint::parse_manifest(text, str_cat("rank ", r, "'s part"), true));
  }
  checkpoint::commit_save(root, checkpoint::merge_parts(parts), keep);
}

void Engine::Impl::sum_counts_over_ranks(SaveResult& r) {
  if (comm == nullptr || world == 1) return;
  const std::uint64_t mine[3] = {r.bytes, r.nvme_linked_bytes, r.nvme_copied_bytes};
  std::vector<std::uint64_t> all(3 * static_cast<std::size_t>(world));
  comm->all_gather(mine, all.data(), 3 * 2, DType::fp32);  // 8-byte counts as two fp32 words each
  r.bytes = r.nvme_linked_bytes = r.nvme_copied_bytes = 0;
  for (std::size_t i = 0; i < all.size(); i += 3) {
    r.bytes += all[i];
    r.nvme_linked_bytes += all[i + 1];
    r.nvme_copied_bytes += all[i + 2];
  }
}

void Engine::Impl::lock_save_root(const std::string& root) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);  // a failure is named by SaveLock
  const std::string key = std::filesystem::weakly_canonical(root, ec).string();
  for (const auto& l : save_locks)
    if (l->root() == key) return;
  save_locks.push_back(std::make_unique<checkpoint::SaveLock>(key));
}

SaveResult Engine::save_checkpoint(const std::string& root, const std::string& trainer_state, const SaveOptions& opts) {
  auto& I = *impl_;
  I.require_complete_setup("save_checkpoint");
  STRATA_CHECK(!I.in_step && !I.in_eval, Errc::invalid_argument,
               "save_checkpoint() inside a step or an evaluation: call it after step() or end_eval()");
  {
    bool object = false;
    try {
      object = nlohmann::json::parse(trainer_state).is_object();
    } catch (const nlohmann::json::exception&) {
    }
    STRATA_CHECK(object, Errc::invalid_argument, "save_checkpoint: trainer_state must be a JSON object, got '",
                 trainer_state.substr(0, 80), "'");
  }
  STRATA_CHECK(!I.state_mixed, Errc::invalid_argument, "save_checkpoint() after a checkpoint load failed while ",
               "writing the state: the state is partly loaded and must not become a checkpoint; load one first");
  synchronize();      // parameter write-backs and reductions have landed
  I.poll_save(true);  // one save at a time
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t step = I.step_calls();
  // Each phase ends with every rank knowing whether every rank succeeded, so all fail
  // together and rank 0 removes the unfinished save.
  const std::string what = str_cat("the checkpoint save to '", root, "' (the previous checkpoint stays latest)");
  auto phase = [&](const std::function<void()>& fn) {
    I.all_or_nothing(fn, what, [&] {
      if (I.rank == 0) checkpoint::abandon_save(root, step);
    });
  };
  // The lock first, and outside `phase`: a refused lock must not abandon the holder's save.
  I.all_or_nothing(
      [&] {
        if (I.rank == 0) I.lock_save_root(root);
      },
      what);
  phase([&] {
    if (I.rank == 0) checkpoint::prepare_save(root, step);
  });
  if (opts.link_nvme) phase([&] { I.check_link_space(root, step, opts.keep); });
  SaveResult out;
  out.step = step;
  if (opts.async && I.start_async_save(root, step, trainer_state, opts, out)) return out;
  std::string part_text;
  phase(
      [&] { part_text = I.write_part(checkpoint::staging_dir(root, step), step, trainer_state, opts.link_nvme, out); });
  out.dir = root + "/" + checkpoint::step_dir_name(step);
  phase([&] { I.commit_parts(root, part_text, opts.keep); });
  I.sum_counts_over_ranks(out);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void Engine::Impl::all_or_nothing(const std::function<void()>& fn, const std::string& what,
                                  const std::function<void()>& on_failure) {
  std::exception_ptr err;
  try {
    fn();
  } catch (...) {
    err = std::current_exception();
  }
  const int bad = first_failure(!err);
  if (bad < 0) return;
  if (on_failure) on_failure();
  if (err) std::rethrow_exception(err);
  STRATA_THROW(Errc::comm, "rank ", rank, ": ", what, " failed on rank ", bad, " (its error says why)");
}

}  // namespace strata::engine
