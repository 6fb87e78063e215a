// CheckpointPart (checkpoint_part.h): the engine's state mapped onto the checkpoint format
// (checkpoint/format.h). Each rank saves what it owns: its shard of every bucket, the same
// ranges at every stage (so stage 0's replicas are saved once), cut at parameter boundaries
// with the padding left out. A tensor's elements are so addressed by their place in the
// tensor, and a rank of any world size or stage reads back the ranges it owns from whichever
// files hold them. The compute-dtype parameters are not saved: they are the masters
// converted, as step() makes them, and are rebuilt from them on load.
#include "engine/checkpoint_part.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/directory.h"
#include "checkpoint/shard_file.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/moment_format.h"
#include "runtime/core/q8_codec.h"
#include "runtime/core/units.h"

namespace strata::engine {

checkpoint::Manifest CheckpointPart::build(const std::string& staging, std::int64_t step,
                                           const std::string& trainer_state, bool link_nvme, SaveResult& counts,
                                           const Appender& append) {
  const Layout& lay = c_.layout;
  checkpoint::Manifest part;
  part.step = step;
  part.world_size = c_.ranks.world;
  part.zero_stage = c_.cfg.zero.stage;
  part.compute_dtype = dtype_name(c_.cdt);
  part.moment_dtype = moment_format_name(c_.state.moment_format());
  part.engine_state = engine_state_json();
  part.trainer_state = trainer_state;
  for (const auto& p : lay.params()) part.tensors.push_back({p.name, p.shape, p.numel, {}});
  const std::string name = checkpoint::shard_file_name(c_.ranks.rank);
  part.files.emplace_back();  // the shard file, described when finished
  std::vector<float> st[checkpoint::kStates];
  const bool q8 = c_.state.moment_format() == MomentFormat::q8;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    const int l = static_cast<int>(li);
    const auto& L = lay.layers()[li];
    if (c_.state.tier(static_cast<int>(li)) == Tier::nvme && link_nvme) {
      // The sealed generation's files join the checkpoint as they are; segments point into
      // their payloads ([master | exp_avg | exp_avg_sq] of each sub-group's elements, the
      // moments in the moment dtype).
      const auto sealed = c_.state.sealed_files(l);
      const int first = static_cast<int>(part.files.size());
      for (const auto& f : sealed) {
        bool linked = false;
        const std::string fname =
            str_cat(name.substr(0, name.size() - 4), ".", std::filesystem::path(f.path).filename().string());
        part.files.push_back(checkpoint::adopt_swap_file(f.path, staging, fname, c_.ranks.rank, &linked));
        (linked ? counts.nvme_linked_bytes : counts.nvme_copied_bytes) += part.files.back().bytes;
      }
      const MomentFormat f = c_.state.moment_format();
      for (int s = 0; s < checkpoint::kStates; ++s) {
        for (const auto& pc : pieces(l)) {
          detail::for_each_param_range(lay, L, pc, [&](int pi, std::size_t elem, std::size_t index, std::size_t count) {
            for (std::size_t c = 0; c < sealed.size(); ++c) {
              const std::uint64_t lo = std::max<std::uint64_t>(index, sealed[c].offset);
              const std::uint64_t hi = std::min<std::uint64_t>(index + count, sealed[c].offset + sealed[c].elems);
              if (lo >= hi) continue;
              // The file's payload: [master (fp32) | exp_avg | exp_avg_sq], the moments of its
              // elems elements in the moment format (q8: whole blocks; a lane into the first).
              const std::uint64_t n = sealed[c].elems, i = lo - sealed[c].offset;
              const std::uint64_t lane = s == 0 ? 0 : i % moment_align(f);
              const std::uint64_t at =
                  s == 0 ? 4 * i : 4 * n + (s - 1) * moment_bytes(f, n) + moment_offset(f, i - lane);
              part.tensors[pi].states[s].push_back(
                  {first + static_cast<int>(c), at, elem + (lo - index), hi - lo, static_cast<std::uint32_t>(lane)});
            }
          });
        }
      }
      continue;
    }
    const std::size_t n = c_.state.elems(l);
    st[0].resize(n);
    for (int s = 1; s < checkpoint::kStates; ++s) st[s].resize(q8 || L.frozen ? 0 : n);
    // A frozen layer saves its values (its compute copies, widened) and no moments.
    std::vector<std::uint8_t> held[2];  // q8: the moments' blocks as held
    if (L.frozen) {
      c_.homes.read_own(l, st[0].data());
    } else if (q8) {
      for (auto& h : held) h.resize(moment_bytes(MomentFormat::q8, n));
      c_.state.read_held(l, st[0].data(), held[0].data(), held[1].data());
    } else {
      c_.state.read(l, st[0].data(), st[1].data(), st[2].data());
    }
    std::vector<std::uint16_t> narrow;  // bf16 moments are stored as they are held
    for (int s = 0; s < (L.frozen ? 1 : checkpoint::kStates); ++s) {
      const bool wide = part.elem_bytes(static_cast<checkpoint::State>(s)) == 4;
      if (q8 && s > 0) {
        append_q8_blocks(l, s, held[s - 1], part, append);
        continue;
      }
      for (const auto& pc : pieces(l)) {
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

void CheckpointPart::append_q8_blocks(int l, int s, const std::vector<std::uint8_t>& coded, checkpoint::Manifest& part,
                                      const Appender& append) const {
  const auto& L = c_.layout.layers()[static_cast<std::size_t>(l)];
  for (const auto& pc : pieces(l)) {
    // The blocks that hold the piece's parameters, once; each tensor's range points into them.
    const auto [b0, b1] = q8_blocks_of(L, pc);
    if (b0 == b1) continue;
    const std::uint64_t off = append(coded.data() + b0 * q8::kBlockBytes, (b1 - b0) * q8::kBlockBytes);
    detail::for_each_param_range(c_.layout, L, pc, [&](int pi, std::size_t elem, std::size_t index, std::size_t count) {
      const std::size_t b = index / q8::kBlockElems;
      part.tensors[pi].states[s].push_back(
          {0, off + (b - b0) * q8::kBlockBytes, elem, count, static_cast<std::uint32_t>(index % q8::kBlockElems)});
    });
  }
}

std::pair<std::size_t, std::size_t> CheckpointPart::q8_blocks_of(const LayerLayout& L, const detail::Piece& pc) const {
  std::size_t lo = pc.index + pc.len, hi = pc.index;
  detail::for_each_param_range(c_.layout, L, pc, [&](int, std::size_t, std::size_t index, std::size_t count) {
    lo = std::min(lo, index);
    hi = std::max(hi, index + count);
  });
  if (lo >= hi) return {0, 0};
  return {lo / q8::kBlockElems, (hi + q8::kBlockElems - 1) / q8::kBlockElems};
}

std::uint64_t CheckpointPart::shard_file_bytes(bool link_nvme) const {
  const Layout& lay = c_.layout;
  // Per element: the fp32 master, and the two moments unless frozen (values only): 4 bytes
  // each in fp32, 2 for bf16; q8's blocks are counted per piece (checkpoint/format.h).
  const MomentFormat f = c_.state.moment_format();
  const std::uint64_t moments = f == MomentFormat::fp32 ? 8 : f == MomentFormat::bf16 ? 4 : 0;
  std::uint64_t bytes = 0;
  for (std::size_t li = 0; li < c_.layout.layers().size(); ++li) {
    if (c_.state.tier(static_cast<int>(li)) == Tier::nvme && link_nvme) continue;
    const bool frozen = lay.layers()[li].frozen;
    const std::uint64_t per = frozen ? 4 : 4 + moments;
    for (const auto& pc : pieces(static_cast<int>(li))) {
      detail::for_each_param_range(lay, lay.layers()[li], pc,
                                   [&](int, std::size_t, std::size_t, std::size_t count) { bytes += count * per; });
      if (f == MomentFormat::q8 && !frozen) {
        const auto [b0, b1] = q8_blocks_of(lay.layers()[li], pc);
        bytes += 2 * (b1 - b0) * q8::kBlockBytes;
      }
    }
  }
  return bytes;
}

// The synchronous form: the shard file written as build() produces it.
std::string CheckpointPart::write(const std::string& staging, std::int64_t step, const std::string& trainer_state,
                                  bool link_nvme, SaveResult& counts) {
  const std::string name = checkpoint::shard_file_name(c_.ranks.rank);
  checkpoint::ShardWriter w(staging + "/" + name, checkpoint::kDefaultChunkBytes);
  auto part = build(staging, step, trainer_state, link_nvme, counts,
                    [&](const void* data, std::uint64_t bytes) { return w.append(data, bytes); });
  part.files[0] = w.finish(name, c_.ranks.rank);
  counts.bytes += part.files[0].bytes;
  return checkpoint::to_json(part);
}

std::string CheckpointPart::engine_state_json() const {
  const auto c = c_.scalars.counters();
  const auto& s = c.scaler;
  return nlohmann::json{{"steps_taken", c.steps_taken},
                        {"step_calls", c.step_calls},
                        {"optimizer", optimizer_type_name(c_.cfg.optimizer.type)},
                        {"loss_scaling", detail::scaling_name(c_.scalars.scaler_config(), c_.cfg.fp16.enabled)},
                        {"loss_scaler",
                         {{"scale", s.scale},
                          {"iteration", s.iteration},
                          {"last_overflow_iteration", s.last_overflow_iteration},
                          {"hysteresis_left", s.hysteresis_left}}}}
      .dump();
}

}  // namespace strata::engine
