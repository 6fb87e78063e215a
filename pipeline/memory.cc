// The executor's buffers replayed along a stage's action list (see memory.h). Each step
// mirrors one in executor.cc; the names are the executor's.
#include "pipeline/memory.h"

#include <algorithm>
#include <map>
#include <vector>

#include "pipeline/tie.h"
#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

struct Replay {
  const Schedule& s;
  const int stage;
  const PipelineModel& model;
  const Remat remat;
  const std::uint64_t align;
  const device::Backend backend;
  const int m, v, vstages;
  std::vector<std::vector<int>> chunk_layers;
  // Sizes in bytes (0: no buffer) of one (micro-batch, chunk)'s buffers, as in Micro.
  struct Micro {
    std::vector<std::uint64_t> x, saved, dy;
    std::uint64_t grad_out = 0, grad_in = 0;
    bool materialized = false;
  };
  std::vector<Micro> micro;
  std::map<int, std::pair<int, std::map<int, std::uint64_t>>> acc;  // layer -> (next, early dW)
  std::uint64_t used = 0, peak = 0;
  std::vector<std::uint64_t> retired;  // sizes, freed after the action
  std::map<std::uint64_t, int> live_by_size, peak_by_size;
  int live = 0, peak_live = 0;

  Replay(const Schedule& sched, int st, const PipelineModel& mdl, Remat r, std::uint64_t a, device::Backend b)
      : s(sched),
        stage(st),
        model(mdl),
        remat(r),
        align(a),
        backend(b),
        m(sched.micro_batches),
        v(sched.chunks),
        vstages(sched.virtual_stages()) {
    for (int c = 0; c < v; ++c) chunk_layers.push_back(model.layers_of(s.virtual_stage(stage, c), vstages));
    micro.resize(static_cast<std::size_t>(m) * v);
    if (const std::size_t w = model.work_floats(chunk_layers); w > 0) alloc(w);  // held for the executor's life
    std::vector<int> held;
    for (const auto& ids : chunk_layers) held.insert(held.end(), ids.begin(), ids.end());
    for (std::size_t f : TiedStore::device_floats(model, held)) alloc(f);  // the tie's, held as long
  }

  Micro& at(int mb, int chunk) { return micro[static_cast<std::size_t>(mb) * v + chunk]; }
  std::uint64_t round(std::size_t floats) const {
    const std::uint64_t b = std::max<std::uint64_t>(1, floats * sizeof(float));
    return (b + align - 1) / align * align;
  }
  std::uint64_t alloc(std::size_t floats) {
    const std::uint64_t b = round(floats);
    used += b;
    peak = std::max(peak, used);
    int& n = live_by_size[b];
    peak_by_size[b] = std::max(peak_by_size[b], ++n);
    return b;
  }
  void retire(std::uint64_t& b) {  // freed after the action
    if (b > 0) retired.push_back(b);
    b = 0;
  }
  const Layer& layer(int id) const { return *model.layers[id]; }
  std::size_t in(int id) const { return model.rows * layer(id).in_features(); }
  std::size_t out(int id) const { return model.rows * layer(id).out_features(); }
  bool remat_applies(int mb) const { return remat == Remat::always || (remat == Remat::except_last && mb != m - 1); }

  void forward_layers(int mb, int chunk) {
    Micro& st = at(mb, chunk);
    const auto& ids = chunk_layers[chunk];
    st.x.resize(ids.size() + 1, 0);
    st.saved.resize(ids.size(), 0);
    for (std::size_t l = 0; l < ids.size(); ++l) {
      if (st.x[l + 1] == 0) st.x[l + 1] = alloc(out(ids[l]));
      st.saved[l] = alloc(model.saved_floats(ids[l], backend));  // never over a live one
    }
    st.materialized = true;
  }

  void forward(const Action& a) {
    Micro& st = at(a.micro, a.chunk);
    const int vs = s.virtual_stage(stage, a.chunk);
    if (vs == 0) {
      st.x.assign(1, 0);
      st.x[0] = alloc(in(chunk_layers[a.chunk].front()));
    }
    peak_live = std::max(peak_live, ++live);
    forward_layers(a.micro, a.chunk);
    if (vs + 1 < vstages && s.stage_of(vs + 1) == stage) {
      Micro& next = at(a.micro, s.chunk_of(vs + 1));
      next.x.assign(1, st.x.back());
      st.x.back() = 0;
    }
    if (remat_applies(a.micro)) {
      for (std::size_t l = 1; l + 1 < st.x.size(); ++l) retire(st.x[l]);
      for (auto& b : st.saved) retire(b);
      st.materialized = false;
    }
  }

  void accumulate_ordered(int id, int mb, std::uint64_t dw) {
    auto& [next, early] = acc[id];
    if (mb != next) {
      early[mb] = dw;
      return;
    }
    retire(dw);  // delivered after the action, then freed
    ++next;
    for (auto it = early.find(next); it != early.end(); it = early.find(next)) {
      retire(it->second);
      early.erase(it);
      ++next;
    }
  }

  void backward(const Action& a, bool with_weight) {
    Micro& st = at(a.micro, a.chunk);
    const int vs = s.virtual_stage(stage, a.chunk);
    const auto& ids = chunk_layers[a.chunk];
    const std::size_t n = ids.size();
    if (!st.materialized) forward_layers(a.micro, a.chunk);
    if (vs == vstages - 1) st.grad_out = alloc(out(ids.back()));
    retire(st.x.back());
    st.dy.assign(n, 0);
    st.dy[n - 1] = st.grad_out;
    st.grad_out = 0;
    for (std::size_t l = n; l-- > 0;) {
      const int id = ids[l];
      const std::uint64_t dx = alloc(in(id));
      if (!layer(id).splits_backward() || with_weight) accumulate_ordered(id, a.micro, alloc(layer(id).param_count()));
      if (l > 0)
        st.dy[l - 1] = dx;
      else
        st.grad_in = dx;
    }
    if (vs == 0) {
      retire(st.grad_in);
    } else if (s.stage_of(vs - 1) == stage) {
      at(a.micro, s.chunk_of(vs - 1)).grad_out = st.grad_in;
      st.grad_in = 0;
    }
    if (with_weight) release(a.micro, a.chunk);
  }

  void weight(const Action& a) {
    const auto& ids = chunk_layers[a.chunk];
    for (int id : ids) {
      if (layer(id).splits_backward()) accumulate_ordered(id, a.micro, alloc(layer(id).param_count()));
    }
    release(a.micro, a.chunk);
  }

  void release(int mb, int chunk) {
    Micro& st = at(mb, chunk);
    for (auto* list : {&st.x, &st.saved, &st.dy})
      for (auto& b : *list) retire(b);
    st.x.clear();
    st.saved.clear();
    st.dy.clear();
    st.materialized = false;
    --live;
  }

  void comm(const Action& a) {
    Micro& st = at(a.micro, a.chunk);
    const auto& ids = chunk_layers[a.chunk];
    switch (a.kind) {
      case ActionKind::recv_activation:
        st.x.assign(1, 0);
        st.x[0] = alloc(in(ids.front()));
        break;
      case ActionKind::recv_gradient:
        st.grad_out = alloc(out(ids.back()));
        break;
      case ActionKind::send_activation:
        retire(st.x.back());
        break;
      case ActionKind::send_gradient:
        retire(st.grad_in);
        break;
      default:
        break;
    }
  }

  StageMemory run() {
    for (const Action& a : s.actions[stage]) {
      switch (a.kind) {
        case ActionKind::forward:
          forward(a);
          break;
        case ActionKind::backward_input:
          backward(a, false);
          break;
        case ActionKind::backward_full:
          backward(a, true);
          break;
        case ActionKind::backward_weight:
          weight(a);
          break;
        default:
          comm(a);
          break;
      }
      for (std::uint64_t b : retired) {  // the executor's retired.clear() after the action
        used -= b;
        --live_by_size[b];
      }
      retired.clear();
    }
    return {peak, peak_live, peak_by_size};
  }
};

}  // namespace

std::uint64_t StageMemory::pool_bytes() const {
  std::uint64_t sum = 0;
  for (const auto& [size, count] : peak_by_size) sum += size * static_cast<std::uint64_t>(count);
  return sum;
}

bool StageMemory::fits_in(const StageMemory& reserved) const {
  for (const auto& [size, count] : peak_by_size) {
    const auto it = reserved.peak_by_size.find(size);
    if (count > 0 && (it == reserved.peak_by_size.end() || it->second < count)) return false;
  }
  return true;
}

StageMemory stage_memory(const Schedule& schedule, int stage, const PipelineModel& model, Remat remat,
                         std::uint64_t alignment, device::Backend backend) {
  STRATA_CHECK(stage >= 0 && stage < schedule.stages, Errc::invalid_argument, "stage_memory: stage ", stage,
               " is not a stage of a ", schedule.stages, "-stage schedule");
  STRATA_CHECK(alignment >= 1, Errc::invalid_argument, "stage_memory: alignment must be at least 1");
  model.check(schedule.virtual_stages());
  return Replay(schedule, stage, model, remat, alignment, backend).run();
}

}  // namespace strata::pipeline
