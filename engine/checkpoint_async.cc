// Asynchronous checkpoint saves (SaveOptions::async). save_checkpoint takes a snapshot and
// returns: the NVMe tier's sealed swap files are linked at once (later steps write other
// inodes), everything else is copied into host staging charged to the host tier, and a
// writer thread writes the rank's shard file from it while training goes on. At the end of
// each step(), where every rank is in lockstep, the ranks compare their writers; once all
// are done the save is committed exactly as a synchronous one (rank 0 merges the parts,
// renames, moves `latest`); if any failed it is abandoned and the previous checkpoint stays
// latest. The outcome is reported by finished_checkpoints(). A later save or load, and
// wait_checkpoint(), wait for a pending save. Staging that does not fit the host budget
// beside the steps' own use (steady and transient) on some rank makes the save synchronous
// on every rank, with a notice.
#include <algorithm>
#include <chrono>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "engine/checkpoint_save.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/log.h"
#include "runtime/core/units.h"

namespace strata::engine {

bool CheckpointSave::start_async(const std::string& root, std::int64_t step, const std::string& trainer_state,
                                 const SaveOptions& opts, SaveResult& out) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t bytes = part_.shard_file_bytes(opts.link_nvme);
  // The staging stays charged while later steps run: it must leave them the host room their
  // transient buffers have needed above the steady use, as measured before any staging was
  // charged (the tier's peak includes staging from then on).
  const auto host = c_.ledger.usage(Tier::host);
  if (!staged_before_) host_transient_ = std::max(host_transient_, host.peak_bytes - host.used_bytes);
  bool fits = host.used_bytes + host_transient_ + bytes <= host.budget_bytes;
  if (fits) {
    try {
      c_.ledger.charge(Tier::host, Kind::buffers, bytes, "asynchronous checkpoint staging");
    } catch (const Error& e) {
      if (e.code() != Errc::out_of_budget) throw;
      fits = false;
    }
  }
  if (detail::first_failure(c_.ranks, fits) >= 0) {
    if (fits) c_.ledger.discharge(Tier::host, Kind::buffers, bytes);
    warn_once("checkpoint.async",
              str_cat("rank ", c_.ranks.rank, ": an asynchronous checkpoint needs ", format_bytes(bytes),
                      " of host staging per save, more than the host budget leaves beside the steps' peak on some "
                      "rank: saving synchronously (raise memory_budget.host to save in the background)"));
    return false;
  }
  staged_before_ = true;
  auto P = std::make_unique<PendingSave>();
  P->root = root;
  P->keep = opts.keep;
  P->charged = bytes;
  P->t0 = t0;
  P->staging.reserve(bytes);
  P->result.step = step;
  P->result.dir = root + "/" + checkpoint::step_dir_name(step);
  P->result.async = true;
  const std::string staging = checkpoint::staging_dir(root, step);
  detail::all_or_nothing(
      c_.ranks,
      [&] {
        P->part = part_.build(staging, step, trainer_state, opts.link_nvme, P->result,
                              [&](const void* data, std::uint64_t n) {
                                const std::uint64_t at = P->staging.size();
                                const char* p = static_cast<const char*>(data);
                                P->staging.insert(P->staging.end(), p, p + n);
                                return at;
                              });
      },
      str_cat("staging the checkpoint save to '", root, "' (the previous checkpoint stays latest)"),
      [&] {
        c_.ledger.discharge(Tier::host, Kind::buffers, bytes);
        if (c_.ranks.rank == 0) checkpoint::abandon_save(root, step);
      });
  P->writer = std::thread([p = P.get(), staging, r = c_.ranks.rank] {
    const std::string name = checkpoint::shard_file_name(r);
    try {
      checkpoint::ShardWriter w(staging + "/" + name, checkpoint::kDefaultChunkBytes);
      w.append(p->staging.data(), p->staging.size());
      p->file = w.finish(name, r);
    } catch (...) {
      p->error = std::current_exception();
    }
    p->done = true;
  });
  out = P->result;
  out.committed = false;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pending_ = std::move(P);
  return true;
}

void CheckpointSave::poll(bool wait) {
  if (!pending_) return;
  auto& P = *pending_;
  if (wait && P.writer.joinable()) P.writer.join();
  if (detail::first_failure(c_.ranks, P.done.load()) >= 0) return;  // some rank is still writing
  if (P.writer.joinable()) P.writer.join();
  SaveResult r = P.result;
  r.committed = false;
  try {
    detail::all_or_nothing(
        c_.ranks,
        [&] {
          if (P.error) std::rethrow_exception(P.error);
          P.part.files[0] = P.file;
          r.bytes += P.file.bytes;
          commit_parts(P.root, checkpoint::to_json(P.part), P.keep);
        },
        str_cat("the asynchronous checkpoint save to '", P.root, "' (the previous checkpoint stays latest)"),
        [&] {
          if (c_.ranks.rank == 0) checkpoint::abandon_save(P.root, r.step);
        });
    sum_counts_over_ranks(r);
    r.committed = true;
  } catch (const std::exception& e) {
    r.error = e.what();
    STRATA_LOG(error, "rank ", c_.ranks.rank, ": ", e.what());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - P.t0).count();
  c_.ledger.discharge(Tier::host, Kind::buffers, P.charged);
  pending_.reset();
  finished_.push_back(std::move(r));
}

void CheckpointSave::drop_pending() noexcept {
  if (!pending_) return;
  if (pending_->writer.joinable()) pending_->writer.join();
  c_.ledger.discharge(Tier::host, Kind::buffers, pending_->charged);
  pending_.reset();  // its staging directory is cleared by the next save under the root
}

}  // namespace strata::engine
