// The stage executor (see executor.h). Buffers of a micro-batch's chunk live on the
// stage's device from its F (or its receive) to its W; every layer call is a host "kernel"
// on the stage's stream (or, on CUDA, a call of the layers bound to that stream, which
// enqueue their own work), and each action ends with a stream synchronize, which is where a
// failing layer's error surfaces and after which the action's retired buffers are freed.
// Where the CPU cannot reach the device's memory (device::cpu_reaches), host data goes
// through one pinned staging buffer with copies in stream order: received and sent tensors,
// the model's input and its loss (which read and write host memory). The device, stream,
// work and staging buffers are a detail::StageDevice, which forward-only passes
// (forward.cc) share.
#include "pipeline/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "pipeline/detail/forward_pass.h"
#include "pipeline/detail/stage_device.h"
#include "pipeline/simulate.h"
#include "pipeline/tie.h"
#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

using device::DeviceBuffer;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

// The buffers of one (micro-batch, chunk) on this stage.
struct Micro {
  std::vector<DeviceBuffer> x;      // x[0]: chunk input; x[l+1]: output of layer l
  std::vector<DeviceBuffer> saved;  // per layer, from forward
  std::vector<DeviceBuffer> dy;     // per layer: gradient w.r.t. its output, kept from B for W
  DeviceBuffer grad_out;            // gradient w.r.t. the chunk's output (received, loss, or local)
  DeviceBuffer grad_in;             // gradient w.r.t. the chunk's input, until sent
  bool materialized = false;        // x[1..] and saved hold this micro-batch's forward
};

// Micro-batch-ordered accumulation of one layer's weight gradient.
struct Accumulator {
  int next = 0;                       // the micro-batch whose dW is added next
  std::map<int, DeviceBuffer> early;  // dW of later micro-batches, waiting their turn
};

// The stage's chunks' layer ids ([chunk] -> global ids), after checking the schedule and model.
std::vector<std::vector<int>> checked_chunks(const Schedule& s, int stage, const PipelineModel& model) {
  STRATA_CHECK(stage >= 0 && stage < s.stages, Errc::invalid_argument, "executor: stage ", stage,
               " is not a stage of a ", s.stages, "-stage schedule");
  check_valid(s);
  model.check(s.virtual_stages());
  std::vector<std::vector<int>> out;
  for (int c = 0; c < s.chunks; ++c) out.push_back(model.layers_of(s.virtual_stage(stage, c), s.virtual_stages()));
  return out;
}

// The largest host transfer of a stage: a chunk's input, or the loss's logits and gradient.
std::size_t staging_floats(const PipelineModel& model, const std::vector<std::vector<int>>& chunks) {
  std::size_t floats = 0;
  for (const auto& ids : chunks) {
    floats = std::max({floats, model.rows * model.layers[ids.front()]->in_features(),
                       2 * model.rows * model.layers[ids.back()]->out_features()});
  }
  return floats;
}

}  // namespace

const char* remat_name(Remat r) noexcept {
  return r == Remat::always ? "always" : r == Remat::except_last ? "except_last" : "never";
}

Remat parse_remat(std::string_view text) {
  if (text == "never") return Remat::never;
  if (text == "always") return Remat::always;
  if (text == "except_last") return Remat::except_last;
  STRATA_THROW(Errc::invalid_argument, "re-materialization mode '", text, "' is not one of always, except_last, never");
}

struct StageExecutor::Impl {
  const Schedule& s;
  const int stage;
  const PipelineModel& model;
  ParameterStore* store;
  Transport& transport;
  const ExecutorOptions options;
  const int m, v, vstages;
  const std::vector<std::vector<int>> chunk_layers;        // [chunk] -> global layer ids
  detail::StageDevice sd;                                  // declared before every buffer, so that buffers go first
  const std::vector<std::shared_ptr<const Layer>> layers;  // the model's, or bound to sd's stream
  std::unique_ptr<TiedStore> tied;                         // in front of the stage's store when the model ties a weight
  std::vector<Micro> micro;                                // [mb * v + chunk]
  std::map<int, Accumulator> acc;                          // by global layer id
  std::vector<DeviceBuffer> retired;                       // freed after the current action's synchronize
  struct Pending {
    int layer, micro;
    DeviceBuffer dw;
  };
  std::vector<Pending> pending;  // dW for the store, in micro-batch order per layer
  std::vector<int> ready;        // layers whose gradient completed in this action
  std::int64_t step = 0;
  int live = 0, peak_live = 0, recomputed = 0;
  std::vector<std::size_t> recv_at;  // positions of RA/RG in the stage's list
  std::size_t next_expect = 0, recvs_done = 0;

  Impl(const Schedule& sched, int st, const PipelineModel& mdl, ParameterStore& ps, Transport& tr,
       const ExecutorOptions& o)
      : s(sched),
        stage(st),
        model(mdl),
        store(&ps),
        transport(tr),
        options(o),
        m(sched.micro_batches),
        v(sched.chunks),
        vstages(sched.virtual_stages()),
        chunk_layers(checked_chunks(sched, st, mdl)),
        sd(o, mdl.work_floats(chunk_layers), staging_floats(mdl, chunk_layers)),
        layers(sd.layers_of(mdl, str_cat("pipeline stage ", stage).c_str())),
        step(o.first_step) {
    if (model.tie) {
      std::vector<int> held;
      for (const auto& ids : chunk_layers) held.insert(held.end(), ids.begin(), ids.end());
      const int per = static_cast<int>(model.layers.size()) / vstages;
      const int owner_stage = s.stage_of(model.tie->owner / per), user_stage = s.stage_of(model.tie->user / per);
      tied = std::make_unique<TiedStore>(ps, model, held, &transport, stage == owner_stage ? user_stage : owner_stage,
                                         kTieTagBase, &sd.dev());
      store = tied.get();
    }
    micro.resize(static_cast<std::size_t>(m) * v);
    const auto& list = s.actions[stage];
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i].kind == ActionKind::recv_activation || list[i].kind == ActionKind::recv_gradient)
        recv_at.push_back(i);
    }
  }

  // The transport tag and size of receive action `a`.
  std::pair<std::uint32_t, std::size_t> recv_shape(const Action& a) const {
    const int vs = s.virtual_stage(stage, a.chunk);
    const auto& ids = chunk_layers[a.chunk];
    if (a.kind == ActionKind::recv_activation) return {tag(0, vs - 1, a.micro), floats_in(ids.front()) * sizeof(float)};
    return {tag(1, vs + 1, a.micro), floats_out(ids.back()) * sizeof(float)};
  }

  // Announces receives up to recv_window beyond the ones already taken.
  void expect_ahead() {
    while (next_expect < recv_at.size() && next_expect < recvs_done + static_cast<std::size_t>(options.recv_window)) {
      const Action& a = s.actions[stage][recv_at[next_expect++]];
      const auto [t, bytes] = recv_shape(a);
      transport.expect(a.peer, t, bytes);
    }
  }

  ~Impl() { sd.drain(); }  // queued layer work may still use buffers that are about to go (after a failure)

  Micro& at(int mb, int chunk) { return micro[static_cast<std::size_t>(mb) * v + chunk]; }
  const Layer& layer(int id) const { return *layers[static_cast<std::size_t>(id)]; }
  std::size_t floats_in(int id) const { return model.rows * layer(id).in_features(); }
  std::size_t floats_out(int id) const { return model.rows * layer(id).out_features(); }
  DeviceBuffer alloc(std::size_t floats, const char* what) { return sd.alloc(floats, what); }
  void retire(DeviceBuffer& b) {
    if (b.get() != nullptr) retired.push_back(std::move(b));
  }
  bool remat_applies(int mb) const {
    return options.remat == Remat::always || (options.remat == Remat::except_last && mb != m - 1);
  }
  // Message tags: unique per (step parity, kind, producing virtual stage, micro-batch); a
  // stage is never more than one step ahead of a neighbour it exchanges with.
  std::uint32_t tag(int kind, int producer_vs, int mb) const {
    const std::uint64_t t = ((static_cast<std::uint64_t>(step % 4) * 2 + kind) * vstages + producer_vs) * m + mb;
    STRATA_CHECK(t < kTieTagBase, Errc::invalid_argument, "executor: ", vstages, " virtual stages x ", m,
                 " micro-batches need message tags beyond 2^31");
    return static_cast<std::uint32_t>(t);
  }

  // Forward of (mb, chunk) through its layers, from x[0]; fills x[1..] and saved.
  void forward_layers(int mb, int chunk) {
    Micro& st = at(mb, chunk);
    const auto& ids = chunk_layers[chunk];
    st.x.resize(ids.size() + 1);
    st.saved.resize(ids.size());
    for (std::size_t l = 0; l < ids.size(); ++l) {
      const int id = ids[l];
      if (st.x[l + 1].get() == nullptr) st.x[l + 1] = alloc(floats_out(id), "pipeline activation");
      st.saved[l] = alloc(layer(id).saved_floats(model.rows), "pipeline saved activation");
      const float* p = store->parameters(id);
      const float* x = st.x[l].as<float>();
      float* y = st.x[l + 1].as<float>();
      float* saved = st.saved[l].as<float>();
      const Layer* lay = &layer(id);
      const std::size_t rows = model.rows;
      float* w = sd.work();
      sd.launch_layer([=] { lay->forward(p, x, y, saved, w, rows); });
    }
    st.materialized = true;
    (void)mb;
  }

  void run_forward(const Action& a) {
    Micro& st = at(a.micro, a.chunk);
    const int vs = s.virtual_stage(stage, a.chunk);
    if (vs == 0) {
      st.x.resize(1);
      st.x[0] = alloc(floats_in(chunk_layers[a.chunk].front()), "pipeline input");
      float* x = st.x[0].as<float>();
      float* into = sd.staged() ? sd.host() : x;
      const int mb = a.micro;
      const auto* input = &model.input;
      const std::int64_t at_step = step;
      sd.launch([=] { (*input)(at_step, mb, into); });
      if (sd.staged()) sd.stream().copy_async(x, into, st.x[0].bytes(), device::CopyKind::host_to_device);
    }
    STRATA_CHECK(!st.x.empty() && st.x[0].get() != nullptr, Errc::internal, "stage ", stage, ": ", format_action(a),
                 " has no input");
    if (++live > peak_live) peak_live = live;
    forward_layers(a.micro, a.chunk);
    Micro* next_local = nullptr;
    if (vs + 1 < vstages && s.stage_of(vs + 1) == stage) next_local = &at(a.micro, s.chunk_of(vs + 1));
    if (next_local != nullptr) {  // one stage, several chunks: the output is the next chunk's input
      next_local->x.resize(1);
      next_local->x[0] = std::move(st.x.back());
    }
    if (remat_applies(a.micro)) {
      // Keep the input (to recompute from) and the output (until sent, or for the loss).
      for (std::size_t l = 1; l + 1 < st.x.size(); ++l) retire(st.x[l]);
      for (auto& b : st.saved) retire(b);
      st.materialized = false;
    }
  }

  void recompute(int mb, int chunk) {
    ++recomputed;
    forward_layers(mb, chunk);
  }

  // Queues `dw` (layer id's dW of micro-batch mb) for the store in micro-batch order; the
  // queue goes to the store once the action's layer work has run (deliver()).
  void accumulate_ordered(int id, int mb, DeviceBuffer dw) {
    Accumulator& a = acc[id];
    if (mb != a.next) {
      a.early.emplace(mb, std::move(dw));
      return;
    }
    pending.push_back({id, a.next++, std::move(dw)});
    for (auto it = a.early.find(a.next); it != a.early.end(); it = a.early.find(a.next)) {
      pending.push_back({id, a.next++, std::move(it->second)});
      a.early.erase(it);
    }
    if (a.next == m) ready.push_back(id);
  }

  // After the action's synchronize: every queued dW to the store, in queue order.
  void deliver() {
    for (auto& g : pending) {
      store->add_gradient(g.layer, g.micro, g.dw.as<float>());
      retire(g.dw);
    }
    pending.clear();
  }

  void weight_grad(int mb, int chunk, std::size_t l) {
    Micro& st = at(mb, chunk);
    const int id = chunk_layers[chunk][l];
    DeviceBuffer dw = alloc(layer(id).param_count(), "pipeline weight gradient");
    const float* p = store->parameters(id);
    const float* x = st.x[l].as<float>();
    const float* saved = st.saved[l].as<float>();
    const float* dy = st.dy[l].as<float>();
    float* out = dw.as<float>();
    const Layer* lay = &layer(id);
    const std::size_t rows = model.rows;
    float* w = sd.work();
    sd.launch_layer([=] { lay->backward_weight(p, x, saved, dy, out, w, rows); });
    accumulate_ordered(id, mb, std::move(dw));
  }

  // B (with_weight = false) or BW (true) of (mb, chunk).
  void run_backward(const Action& a, bool with_weight) {
    Micro& st = at(a.micro, a.chunk);
    const int vs = s.virtual_stage(stage, a.chunk);
    const auto& ids = chunk_layers[a.chunk];
    const std::size_t n = ids.size();
    if (!st.materialized) recompute(a.micro, a.chunk);
    if (vs == vstages - 1) {
      st.grad_out = alloc(floats_out(ids.back()), "pipeline loss gradient");
      const float* y = st.x.back().as<float>();
      float* dy = st.grad_out.as<float>();
      const std::size_t bytes = st.grad_out.bytes();
      // Staged, the loss reads and writes the pinned buffer: the logits, then the gradient.
      const float* loss_y = sd.staged() ? sd.host() : y;
      float* loss_dy = sd.staged() ? sd.host() + floats_out(ids.back()) : dy;
      if (sd.staged()) sd.stream().copy_async(sd.host(), y, bytes, device::CopyKind::device_to_host);
      const int mb = a.micro;
      const auto* loss = &model.loss_grad;
      const std::int64_t at_step = step;
      const float loss_scale = store->loss_scale();
      sd.launch([=] { (*loss)(at_step, mb, loss_y, loss_dy, loss_scale); });
      if (sd.staged()) sd.stream().copy_async(dy, loss_dy, bytes, device::CopyKind::host_to_device);
    }
    STRATA_CHECK(st.grad_out.get() != nullptr, Errc::internal, "stage ", stage, ": ", format_action(a),
                 " has no output gradient");
    retire(st.x.back());  // the chunk's output: sent, handed on, or used by the loss by now
    st.dy.resize(n);
    st.dy[n - 1] = std::move(st.grad_out);
    for (std::size_t l = n; l-- > 0;) {
      const int id = ids[l];
      const Layer* lay = &layer(id);
      DeviceBuffer dx = alloc(floats_in(id), "pipeline input gradient");
      const float* p = store->parameters(id);
      const float* x = st.x[l].as<float>();
      float* saved = st.saved[l].as<float>();
      const float* dy = st.dy[l].as<float>();
      float* dxp = dx.as<float>();
      const std::size_t rows = model.rows;
      float* w = sd.work();
      if (lay->splits_backward()) {
        sd.launch_layer([=] { lay->backward_input(p, x, saved, dy, dxp, w, rows); });
        if (with_weight) weight_grad(a.micro, a.chunk, l);
      } else {  // cannot split: the whole backward now, whatever the schedule says
        DeviceBuffer dw = alloc(lay->param_count(), "pipeline weight gradient");
        float* dwp = dw.as<float>();
        sd.launch_layer([=] { lay->backward(p, x, saved, dy, dxp, dwp, w, rows); });
        accumulate_ordered(id, a.micro, std::move(dw));
      }
      if (l > 0)
        st.dy[l - 1] = std::move(dx);
      else
        st.grad_in = std::move(dx);
    }
    if (vs == 0)
      retire(st.grad_in);
    else if (s.stage_of(vs - 1) == stage)
      at(a.micro, s.chunk_of(vs - 1)).grad_out = std::move(st.grad_in);
    if (with_weight) release(a.micro, a.chunk);
  }

  void run_weight(const Action& a) {
    Micro& st = at(a.micro, a.chunk);
    const auto& ids = chunk_layers[a.chunk];
    STRATA_CHECK(st.dy.size() == ids.size(), Errc::internal, "stage ", stage, ": ", format_action(a), " before its B");
    for (std::size_t l = 0; l < ids.size(); ++l) {
      if (layer(ids[l]).splits_backward()) weight_grad(a.micro, a.chunk, l);
    }
    release(a.micro, a.chunk);
  }

  void release(int mb, int chunk) {
    Micro& st = at(mb, chunk);
    for (auto& b : st.x) retire(b);
    for (auto& b : st.saved) retire(b);
    for (auto& b : st.dy) retire(b);
    st.x.clear();
    st.saved.clear();
    st.dy.clear();
    st.materialized = false;
    --live;
  }

  void run_comm(const Action& a) {
    Micro& st = at(a.micro, a.chunk);
    const int vs = s.virtual_stage(stage, a.chunk);
    switch (a.kind) {
      case ActionKind::recv_activation:
      case ActionKind::recv_gradient: {
        const auto [t, bytes] = recv_shape(a);
        if (a.kind == ActionKind::recv_activation) st.x.resize(1);
        DeviceBuffer& into = a.kind == ActionKind::recv_activation ? st.x[0] : st.grad_out;
        into = DeviceBuffer(sd.dev(), bytes, "pipeline received tensor");
        sd.receive(transport, a.peer, t, into.get(), bytes);
        ++recvs_done;
        expect_ahead();
        break;
      }
      case ActionKind::send_activation: {
        STRATA_CHECK(!st.x.empty() && st.x.back().get() != nullptr, Errc::internal, "stage ", stage, ": ",
                     format_action(a), " has no output");
        DeviceBuffer& out = st.x.back();
        sd.send(transport, a.peer, tag(0, vs, a.micro), out.get(), out.bytes());
        retire(out);
        break;
      }
      case ActionKind::send_gradient:
        STRATA_CHECK(st.grad_in.get() != nullptr, Errc::internal, "stage ", stage, ": ", format_action(a),
                     " has no gradient");
        sd.send(transport, a.peer, tag(1, vs, a.micro), st.grad_in.get(), st.grad_in.bytes());
        retire(st.grad_in);
        break;
      default:
        break;
    }
  }

  StageReport run_step() {
    StageReport report;
    report.stage = stage;
    store->begin_step();
    acc.clear();
    for (auto& st : micro) st = Micro{};
    live = peak_live = recomputed = 0;
    next_expect = recvs_done = 0;
    expect_ahead();
    for (const Action& a : s.actions[stage]) {
      const auto t0 = Clock::now();
      if (is_compute(a.kind)) {
        const auto& ids = chunk_layers[a.chunk];
        store->before_action(a, ids);
        switch (a.kind) {
          case ActionKind::forward:
            run_forward(a);
            break;
          case ActionKind::backward_input:
            run_backward(a, false);
            break;
          case ActionKind::backward_full:
            run_backward(a, true);
            break;
          default:
            run_weight(a);
            break;
        }
        sd.stream().synchronize();  // rethrows a layer's error
        deliver();
        store->after_action(a, ids);
      } else if (a.kind == ActionKind::optimizer_step) {
        store->optimizer_step();
      } else {
        run_comm(a);
      }
      retired.clear();
      for (int id : ready) store->gradients_ready(id);
      ready.clear();
      report.timings.push_back({stage, a, seconds(t0), seconds(Clock::now())});
    }
    transport.flush();
    for (const auto& [id, a] : acc) {
      STRATA_CHECK(a.next == m, Errc::internal, "stage ", stage, ": layer ", id, " accumulated ", a.next, " of ", m,
                   " micro-batches");
    }
    STRATA_CHECK(live == 0, Errc::internal, "stage ", stage, ": ", live, " micro-batches still hold activations");
    report.peak_activations = static_cast<double>(peak_live) / v;
    report.peak_device_bytes = sd.dev().memory_stats().peak_bytes;
    report.recomputed = recomputed;
    ++step;
    return report;
  }
};

StageExecutor::StageExecutor(const Schedule& schedule, int stage, const PipelineModel& model, ParameterStore& store,
                             Transport& transport, const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>(schedule, stage, model, store, transport, options)) {}

StageExecutor::~StageExecutor() = default;

StageReport StageExecutor::run_step() { return impl_->run_step(); }

void StageExecutor::forward_pass(int micro_batches, const std::function<void(int micro, float* x)>& input,
                                 const std::function<void(int micro, const float* y)>& output,
                                 const PipelineModel* model) {
  Impl& m = *impl_;
  detail::forward_pass({m.s, m.stage, m.chunk_layers, m.model, m.layers, *m.store, m.tied.get(), m.transport, m.sd},
                       model, micro_batches, input, output);
}

}  // namespace strata::pipeline
