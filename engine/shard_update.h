// ShardUpdate: the optimizer's arithmetic on this rank's shards (docs/design.md, "The engine's
// parts"): master, moments and gradient in, the stepped state and the updated compute copies
// out, wherever the layer's state lives.
//
// Protocol. range() steps elements [e0, e0 + n) of bucket k of layer li (the whole bucket at
// stage 0, this rank's shard of it above) with master/m/v wherever they live, cut where the
// parameters' lr_scale changes: on the device's stream when the layer's state lives on the
// device, else on the calling thread; with `from`, out of place (the state is read from there
// and the stepped state written to master/m/v). The updated compute copies go where
// UpdateStaging's target() says. sub_group() steps one of the NVMe swapper's sub-groups of
// layer li, bucket by bucket, and swapped() every NVMe layer through the swapper
// (OptimizerState::step_swapped); resident() every layer whose state lives on the device or in
// host RAM but those `skip` names, then waits for the device's updates; out_of_place() a host
// layer from its state into its spare arrays (the overlapped step's lane); lamb() LAMB's
// whole tensors (stage 0 only) and muon() Muon's at stage 0: Muon orthogonalizes each hidden
// matrix (detail::muon_matrix, muon_runs.h) and steps every other parameter with AdamW. muon_sharded() is Muon at
// stages 1-3, where the ranks gather each matrix's update to orthogonalize it (muon_update.cc), with the state
// anywhere: the layers on NVMe take two passes over the swapper (muon_swapped.cc), a scan that writes nothing and then
// the step. commit() and abort() end a step's writes of compute copies; restore_copies() rewrites copies from the
// masters after an abort() (the overlapped undo). The moments are in the state's moment format. Bits depend only on the
// gradients, the arguments and the state, never on where state lives or how a range is cut (every optimizer but LAMB
// and Muon is elementwise; q8 moments are stepped a block of 16 at a time, and every cut falls on a block: shards,
// buckets and sub-groups are whole blocks, and q8 refuses parameters with a learning rate of their own, where a range
// would be cut inside one).
#pragma once

#include <cstddef>
#include <vector>

#include "engine/config.h"
#include "engine/detail/muon_runs.h"
#include "engine/grad_reducer.h"
#include "engine/layout.h"
#include "engine/optimizer_state.h"
#include "engine/update_staging.h"
#include "offload/optimizer_swapper.h"
#include "optim/muon.h"
#include "optim/step_args.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace strata::engine {

class ShardUpdate {
 public:
  struct Context {  // what the update reads and writes and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    int rank = 0;
    DType cdt = DType::fp32;
    device::Stream& dev_stream;  // the device optimizer's stream
    const GradReducer& grads;
    OptimizerState& state;
    UpdateStaging& updates;
    Tracer* tracer = nullptr;            // the host optimizer's spans, or null
    comm::Communicator* comm = nullptr;  // the data-parallel ranks (Muon's whole matrices), or null
  };
  struct Source {  // out-of-place state (null master: in place)
    const float* master;
    const void *m, *v;
  };

  explicit ShardUpdate(const Context& ctx) : c_(ctx) {}
  ShardUpdate(const ShardUpdate&) = delete;
  ShardUpdate& operator=(const ShardUpdate&) = delete;

  void range(const optim::StepArgs& base, float lr, int li, std::size_t k, std::size_t e0, std::size_t n, float* master,
             void* m, void* v, Source from = {nullptr, nullptr, nullptr});
  void sub_group(const optim::StepArgs& base, float lr, int li, const offload::SubGroup& g);
  void swapped(const optim::StepArgs& base, float lr, IoStats& io);  // every NVMe layer, in the swapper's order
  void resident(const optim::StepArgs& base, float lr, const std::vector<char>& skip);
  void out_of_place(const optim::StepArgs& base, float lr, int li);
  void lamb(const optim::StepArgs& base, float lr);
  void muon(const optim::StepArgs& base, float lr);
  void muon_sharded(const optim::StepArgs& base, float lr, IoStats& io);
  // Muon's config for parameter pi at the step's rate lr, and the rate of its AdamW side.
  optim::MuonConfig muon_config(int pi, float lr) const;
  float muon_adam_lr(float lr) const;
  // The step's written compute copies: commit() queues the commit of the NVMe parameter
  // shards written behind their writes; abort() drops them and the staging (the last
  // committed shards stay current; the caller has let queued work finish).
  void commit() { c_.updates.commit_params(); }
  void commit(int li) { c_.updates.commit_params(li); }  // layer li's shards alone (the tail)
  void abort() noexcept;
  // The overlapped step's undo (after abort()): layer li's compute copies rewritten from its
  // committed fp32 masters (UpdateStaging::restore_copies), and its NVMe shard written whole
  // from them and committed if the store had begun to commit the undone write (params_stale).
  void restore_copies(int li);
  // After abort(): every layer's NVMe shard that the store had begun to commit
  // (UpdateStaging::params_stale) written whole from the committed masters and committed. A
  // failed synchronous step's roll-back; a shard that cannot be rebuilt (its masters' files
  // mix two states, or the drive fails) is logged and stays refused until a checkpoint load.
  void rebuild_stale_shards() noexcept;
  // Layer li keeps a whole compute copy on the device (stages 0-2; persistent stage-3 layers).
  bool replicated(int li) const { return c_.updates.resident_copy(li) != nullptr; }
  // The staging's traffic goes to `io` (null: the engine's again): the overlapped lane's.
  void count_into(IoStats* io) noexcept { c_.updates.count_into(io); }

 private:
  // fn(first, master, n) over layer li's committed fp32 masters, in pieces.
  template <class Fn> void committed_masters(int li, const Fn& fn);
  // rebuild_stale_shards() for layer li; false when its shard was whole.
  bool rebuild_stale_shard(int li);
  // Muon at stages 1-3 on the layers whose state is on NVMe (muon_swapped.cc), and layer li's
  // hidden matrices with their configs at the step's rate lr, in registration order.
  void muon_swapped(const optim::StepArgs& base, float lr, float adam_lr, IoStats& io);
  std::vector<detail::MuonMatrix> muon_matrices(int li, float lr) const;
  // One piece of a range whose parameters share lr_scale.
  void piece(const optim::StepArgs& base, float lr, float lr_scale, int li, std::size_t k, std::size_t e0,
             std::size_t n, float* master, void* m, void* v, Source from);

  Context c_;
};

}  // namespace strata::engine
