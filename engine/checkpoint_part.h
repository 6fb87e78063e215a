// CheckpointPart: what one rank's part of a checkpoint holds, built from the engine's state
// (checkpoint/format.h's manifest and shard file), for CheckpointSave's synchronous and
// background saves alike.
//
// Protocol. build() describes this rank's part of a save of `step`: a partial manifest whose
// file 0 is the rank's shard file (described by the caller once written), every tensor's
// masters and moments as segments of it, in the order their bytes go to `append` (which
// returns their offset in the file); a frozen layer gives its values and no moments; the
// sealed NVMe swap files the optimizer state names are linked into the staging directory as
// they are (or copied where no link can be made; counted in SaveResult). shard_file_bytes() is
// what build() appends. write() is the synchronous form: the shard file written as build()
// produces it, and the part's manifest text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/format.h"
#include "engine/config.h"
#include "engine/detail/checkpoint_ranges.h"
#include "engine/engine.h"
#include "engine/layout.h"
#include "engine/optimizer_state.h"
#include "engine/param_homes.h"
#include "engine/step_scalars.h"
#include "optim/loss_scaler.h"

namespace strata::engine {

class CheckpointPart {
 public:
  struct Context {  // what a part reads and does not own
    const EngineConfig& cfg;
    const Layout& layout;
    Ranks ranks;
    DType cdt = DType::fp32;
    OptimizerState& state;       // masters and moments wherever they live; the sealed NVMe files
    ParamHomes& homes;           // a frozen layer's values
    const StepScalars& scalars;  // the counters and loss scaler saved beside the state
  };
  using Appender = std::function<std::uint64_t(const void* data, std::uint64_t bytes)>;

  explicit CheckpointPart(const Context& ctx) : c_(ctx) {}

  checkpoint::Manifest build(const std::string& staging, std::int64_t step, const std::string& trainer_state,
                             bool link_nvme, SaveResult& counts, const Appender& append);
  std::uint64_t shard_file_bytes(bool link_nvme) const;
  std::string write(const std::string& staging, std::int64_t step, const std::string& trainer_state, bool link_nvme,
                    SaveResult& counts);

 private:
  std::string engine_state_json() const;
  // Layer l's moment s (1 exp_avg, 2 exp_avg_sq) from its q8 blocks as held: the blocks of
  // each of the rank's pieces appended once, every tensor's range a segment into them.
  void append_q8_blocks(int l, int s, const std::vector<std::uint8_t>& coded, checkpoint::Manifest& part,
                        const Appender& append) const;
  // The q8 blocks [first, end) that hold the piece's parameters (padding before the first and
  // after the last left out); {0, 0} when it holds none.
  std::pair<std::size_t, std::size_t> q8_blocks_of(const LayerLayout& L, const detail::Piece& pc) const;
  std::vector<detail::Piece> pieces(int li) const {
    return detail::pieces(c_.layout, c_.cfg.zero.stage, c_.ranks.rank, li, false);
  }

  Context c_;
};

}  // namespace strata::engine
