// Thread and process runners and the measured timeline (see runner.h).
#include "pipeline/runner.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "pipeline/simulate.h"
#include "runtime/core/error.h"

namespace strata::pipeline {

std::vector<int> stage_layers(const Schedule& schedule, const PipelineModel& model, int stage) {
  std::vector<int> ids;
  for (int c = 0; c < schedule.chunks; ++c) {
    const auto part = model.layers_of(schedule.virtual_stage(stage, c), schedule.virtual_stages());
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::vector<StageReport> run_stages_as_threads(const Schedule& schedule, const PipelineModel& model,
                                               const std::vector<ParameterStore*>& stores,
                                               const ExecutorOptions& options, int steps,
                                               std::chrono::milliseconds recv_timeout) {
  const std::vector<const PipelineModel*> models(static_cast<std::size_t>(std::max(schedule.stages, 0)), &model);
  return run_stages_as_threads(schedule, models, stores, options, steps, recv_timeout);
}

std::vector<StageReport> run_stages_as_threads(const Schedule& schedule,
                                               const std::vector<const PipelineModel*>& models,
                                               const std::vector<ParameterStore*>& stores,
                                               const ExecutorOptions& options, int steps,
                                               std::chrono::milliseconds recv_timeout) {
  STRATA_CHECK(static_cast<int>(stores.size()) == schedule.stages, Errc::invalid_argument, "pipeline: ", stores.size(),
               " parameter stores for ", schedule.stages, " stages");
  STRATA_CHECK(static_cast<int>(models.size()) == schedule.stages, Errc::invalid_argument, "pipeline: ", models.size(),
               " models for ", schedule.stages, " stages");
  STRATA_CHECK(steps >= 1, Errc::invalid_argument, "pipeline: steps=", steps, " must be at least 1");
  check_valid(schedule);
  LocalMailboxes boxes(recv_timeout);
  std::vector<StageReport> reports(schedule.stages);
  std::mutex mutex;
  std::exception_ptr first;  // the root cause: later failures are the abort it caused
  std::vector<std::thread> threads;
  for (int s = 0; s < schedule.stages; ++s) {
    threads.emplace_back([&, s] {
      try {
        LocalTransport transport(boxes, s);
        StageExecutor exec(schedule, s, *models[static_cast<std::size_t>(s)], *stores[s], transport, options);
        for (int k = 0; k < steps; ++k) reports[s] = exec.run_step();
      } catch (...) {  // nothing may leave a thread body: hand it to the caller
        std::string what = "unknown exception";
        try {
          throw;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (!first) first = std::current_exception();
        }
        boxes.abort(str_cat("stage ", s, " failed: ", what));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
  return reports;
}

StageReport run_stage_as_rank(const Schedule& schedule, const PipelineModel& model, ParameterStore& store,
                              comm::Communicator& comm, const ExecutorOptions& options, int steps) {
  STRATA_CHECK(comm.world_size() == schedule.stages, Errc::invalid_argument, "pipeline: a ", schedule.stages,
               "-stage schedule needs ", schedule.stages, " ranks, not ", comm.world_size(), " (strata launch -n ",
               schedule.stages, ")");
  CommTransport transport(comm);
  StageExecutor exec(schedule, comm.rank(), model, store, transport, options);
  StageReport report;
  for (int k = 0; k < steps; ++k) report = exec.run_step();
  return report;
}

namespace {

// A report as bytes: header (stage, recomputed, count), doubles (peak activations, peak
// bytes), then per action kind, micro, chunk, peer as int32 and start, end as doubles.
std::vector<unsigned char> encode(const StageReport& r) {
  std::vector<unsigned char> out;
  auto put = [&](const auto& x) {
    const auto* p = reinterpret_cast<const unsigned char*>(&x);
    out.insert(out.end(), p, p + sizeof x);
  };
  put(static_cast<std::int32_t>(r.stage));
  put(static_cast<std::int32_t>(r.recomputed));
  put(static_cast<std::int32_t>(r.timings.size()));
  put(r.peak_activations);
  put(static_cast<double>(r.peak_device_bytes));
  for (const auto& t : r.timings) {
    put(static_cast<std::int32_t>(t.action.kind));
    put(static_cast<std::int32_t>(t.action.micro));
    put(static_cast<std::int32_t>(t.action.chunk));
    put(static_cast<std::int32_t>(t.action.peer));
    put(t.start);
    put(t.end);
  }
  return out;
}

StageReport decode(const std::vector<unsigned char>& in) {
  std::size_t off = 0;
  auto get = [&](auto& x) {
    STRATA_CHECK(off + sizeof x <= in.size(), Errc::comm, "pipeline: a stage report arrived truncated");
    std::memcpy(&x, in.data() + off, sizeof x);
    off += sizeof x;
  };
  std::int32_t stage = 0, recomputed = 0, count = 0;
  double peak_bytes = 0;
  StageReport r;
  get(stage);
  get(recomputed);
  get(count);
  get(r.peak_activations);
  get(peak_bytes);
  r.stage = stage;
  r.recomputed = recomputed;
  r.peak_device_bytes = static_cast<std::uint64_t>(peak_bytes);
  for (std::int32_t i = 0; i < count; ++i) {
    std::int32_t kind = 0, micro = 0, chunk = 0, peer = 0;
    TimedAction t;
    get(kind);
    get(micro);
    get(chunk);
    get(peer);
    get(t.start);
    get(t.end);
    t.stage = stage;
    t.action = {static_cast<ActionKind>(kind), micro, chunk, peer};
    r.timings.push_back(t);
  }
  return r;
}

}  // namespace

std::vector<StageReport> gather_reports(comm::Communicator& comm, const StageReport& mine) {
  constexpr int kSizeTag = 0x7ff00000, kDataTag = 0x7ff00001;  // above every executor tag in use
  if (comm.rank() != 0) {
    const auto bytes = encode(mine);
    const std::uint64_t n = bytes.size();
    comm.send(&n, sizeof n, 0, kSizeTag);
    comm.send(bytes.data(), bytes.size(), 0, kDataTag);
    return {};
  }
  std::vector<StageReport> all(comm.world_size());
  all[0] = mine;
  for (int r = 1; r < comm.world_size(); ++r) {
    std::uint64_t n = 0;
    comm.recv(&n, sizeof n, r, kSizeTag);
    std::vector<unsigned char> bytes(n);
    comm.recv(bytes.data(), bytes.size(), r, kDataTag);
    all[r] = decode(bytes);
  }
  return all;
}

Timeline measured_timeline(const Schedule& schedule, const std::vector<StageReport>& reports) {
  Timeline t;
  t.stages = schedule.stages;
  t.micro_batches = schedule.micro_batches;
  t.chunks = schedule.chunks;
  t.kind = schedule.kind;
  t.unit = "s";
  t.unit_us = 1e6;
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& r : reports)
    for (const auto& a : r.timings) origin = std::min(origin, a.start);
  for (const auto& r : reports) {
    for (auto a : r.timings) {
      a.start -= origin;
      a.end -= origin;
      t.actions.push_back(a);
    }
  }
  return t;
}

Costs measured_costs(const Schedule& s, const std::vector<StageReport>& reports, double bw_share) {
  Costs c;
  c.forward.assign(static_cast<std::size_t>(s.stages), 0);
  c.backward_input.assign(static_cast<std::size_t>(s.stages), 0);
  c.backward_weight.assign(static_cast<std::size_t>(s.stages), 0);
  for (const auto& r : reports) {
    double f = 0, b = 0, w = 0;
    int nf = 0, nb = 0, nw = 0;
    for (const auto& t : r.timings) {
      const double d = t.end - t.start;
      switch (t.action.kind) {
        case ActionKind::forward:
          f += d, ++nf;
          break;
        case ActionKind::backward_input:
          b += d, ++nb;
          break;
        case ActionKind::backward_weight:
          w += d, ++nw;
          break;
        case ActionKind::backward_full:
          b += d * bw_share, ++nb, w += d * (1 - bw_share), ++nw;
          break;
        default:
          break;
      }
    }
    // Per action of one chunk -> per stage (all chunks).
    c.forward[r.stage] = nf ? f / nf * s.chunks : 0;
    c.backward_input[r.stage] = nb ? b / nb * s.chunks : 0;
    c.backward_weight[r.stage] = nw ? w / nw * s.chunks : 0;
  }
  return c;
}

double measured_comm(const Schedule& s, const std::vector<StageReport>& reports) {
  // The send of each message, by (producing virtual stage, micro-batch, gradient or not).
  std::map<std::tuple<int, int, bool>, const TimedAction*> sends;
  for (const auto& r : reports) {
    for (const auto& t : r.timings) {
      const bool grad = t.action.kind == ActionKind::send_gradient;
      if (t.action.kind == ActionKind::send_activation || grad)
        sends[{s.virtual_stage(r.stage, t.action.chunk), t.action.micro, grad}] = &t;
    }
  }
  std::vector<double> waits;
  for (const auto& r : reports) {
    for (const auto& t : r.timings) {
      const bool grad = t.action.kind == ActionKind::recv_gradient;
      if (t.action.kind != ActionKind::recv_activation && !grad) continue;
      const int vs = s.virtual_stage(r.stage, t.action.chunk);
      const auto it = sends.find({grad ? vs + 1 : vs - 1, t.action.micro, grad});
      // A receive already waiting when the send was posted: its end is when the data landed.
      if (it != sends.end() && t.start <= it->second->end) waits.push_back(t.end - it->second->end);
    }
  }
  if (waits.empty()) return 0;
  std::nth_element(waits.begin(), waits.begin() + static_cast<std::ptrdiff_t>(waits.size() / 2), waits.end());
  return std::max(0.0, waits[waits.size() / 2]);
}

}  // namespace strata::pipeline
