// CheckpointSave (checkpoint_save.h; the protocol in engine.h): a synchronous save's phases,
// each ending with every rank knowing whether every rank succeeded; rank 0 merges the parts
// (checkpoint_part.h) and commits.
#include <chrono>
#include <filesystem>
#include <functional>

#include "checkpoint/directory.h"
#include "checkpoint/format.h"
#include "checkpoint/link_space.h"
#include "engine/checkpoint_save.h"
#include "engine/detail/checkpoint_ranges.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"

namespace strata::engine {

// Every rank's part to rank 0 (length, then text), which merges and commits them.
void CheckpointSave::commit_parts(const std::string& root, const std::string& part_text, int keep) {
  if (c_.ranks.rank != 0) {
    const std::uint64_t n = part_text.size();
    c_.ranks.comm->send(&n, sizeof n, 0, 71);
    c_.ranks.comm->send(part_text.data(), n, 0, 72);
    return;
  }
  std::vector<checkpoint::Manifest> parts;
  parts.push_back(checkpoint::parse_manifest(part_text, "rank 0's part", true));
  for (int r = 1; r < c_.ranks.world; ++r) {
    std::uint64_t n = 0;
    c_.ranks.comm->recv(&n, sizeof n, r, 71);
    std::string text(n, '\0');
    c_.ranks.comm->recv(text.data(), n, r, 72);
    parts.push_back(checkpoint::parse_manifest(text, str_cat("rank ", r, "'s part"), true));
  }
  checkpoint::commit_save(root, checkpoint::merge_parts(parts), keep);
}

void CheckpointSave::sum_counts_over_ranks(SaveResult& r) {
  if (c_.ranks.comm == nullptr || c_.ranks.world == 1) return;
  const std::uint64_t mine[3] = {r.bytes, r.nvme_linked_bytes, r.nvme_copied_bytes};
  std::vector<std::uint64_t> all(3 * static_cast<std::size_t>(c_.ranks.world));
  c_.ranks.comm->all_gather(mine, all.data(), 3 * 2, DType::fp32);  // 8-byte counts as two fp32 words each
  r.bytes = r.nvme_linked_bytes = r.nvme_copied_bytes = 0;
  for (std::size_t i = 0; i < all.size(); i += 3) {
    r.bytes += all[i];
    r.nvme_linked_bytes += all[i + 1];
    r.nvme_copied_bytes += all[i + 2];
  }
}

void CheckpointSave::lock_save_root(const std::string& root) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);  // a failure is named by SaveLock
  const std::string key = std::filesystem::weakly_canonical(root, ec).string();
  for (const auto& l : save_locks_)
    if (l->root() == key) return;
  save_locks_.push_back(std::make_unique<checkpoint::SaveLock>(key));
}

SaveResult CheckpointSave::save(const std::string& root, const std::string& trainer_state, const SaveOptions& opts) {
  poll(true);  // one save at a time
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t step = c_.scalars.calls();
  // Each phase ends with every rank knowing whether every rank succeeded, so all fail
  // together and rank 0 removes the unfinished save.
  const std::string what = str_cat("the checkpoint save to '", root, "' (the previous checkpoint stays latest)");
  auto phase = [&](const std::function<void()>& fn) {
    detail::all_or_nothing(c_.ranks, fn, what, [&] {
      if (c_.ranks.rank == 0) checkpoint::abandon_save(root, step);
    });
  };
  // The lock first, and outside `phase`: a refused lock must not abandon the holder's save.
  detail::all_or_nothing(
      c_.ranks,
      [&] {
        if (c_.ranks.rank == 0) lock_save_root(root);
      },
      what);
  phase([&] {
    if (c_.ranks.rank == 0) checkpoint::prepare_save(root, step);
  });
  if (opts.link_nvme)
    phase([&] {
      if (const auto run = c_.state.linked_run())
        checkpoint::check_link_space(root, step, opts.keep, c_.ranks.rank, *run);
    });
  SaveResult out;
  out.step = step;
  if (opts.async && start_async(root, step, trainer_state, opts, out)) return out;
  std::string part_text;
  phase(
      [&] { part_text = part_.write(checkpoint::staging_dir(root, step), step, trainer_state, opts.link_nvme, out); });
  out.dir = root + "/" + checkpoint::step_dir_name(step);
  phase([&] { commit_parts(root, part_text, opts.keep); });
  sum_counts_over_ranks(out);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace strata::engine
