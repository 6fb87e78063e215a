// Forward-only passes through a pipeline (see forward.h).
#include "pipeline/forward.h"

#include <utility>

#include "pipeline/detail/forward_pass.h"
#include "runtime/core/error.h"

namespace strata::pipeline::detail {
namespace {

// `pass` runs in the buffers of `trained`: the same layers, in the same shapes, for at most
// as many rows, each keeping at most what the trained model's keep as a stage on `backend`
// calls them (the slots the stage's pool has; binding checks the bound layers keep that).
void check_fits(const ForwardStage& st, const PipelineModel& pass, device::Backend backend) {
  const PipelineModel& t = st.trained;
  STRATA_CHECK(pass.layers.size() == t.layers.size() && pass.rows <= t.rows, Errc::invalid_argument,
               "forward pass: a model of ", pass.layers.size(), " layers at ", pass.rows,
               " rows does not run in the buffers of the trained model's ", t.layers.size(), " layers at ", t.rows,
               " rows");
  for (const auto& ids : st.chunks) {
    for (int id : ids) {
      const Layer &p = *pass.layers[static_cast<std::size_t>(id)], &q = *t.layers[static_cast<std::size_t>(id)];
      STRATA_CHECK(p.in_features() == q.in_features() && p.out_features() == q.out_features() &&
                       p.param_count() == q.param_count() &&
                       pass.saved_floats(id, backend) <= t.saved_floats(id, backend),
                   Errc::invalid_argument, "forward pass: layer ", id, " (", p.name(),
                   ") is not the trained model's layer in shape or size");
    }
  }
  STRATA_CHECK(pass.work_floats(st.chunks) <= t.work_floats(st.chunks), Errc::invalid_argument,
               "forward pass: the layers need more work memory than the trained model's");
}

}  // namespace

void forward_pass(const ForwardStage& st, const PipelineModel* other, int micro_batches,
                  const std::function<void(int micro, float* x)>& input,
                  const std::function<void(int micro, const float* y)>& output) {
  const Schedule& s = st.schedule;
  const int vstages = s.virtual_stages();
  const PipelineModel& pass = other != nullptr ? *other : st.trained;
  StageDevice& sd = st.sd;
  const device::Backend backend = sd.dev().backend();
  check_fits(st, pass, backend);
  // Another model's layers are bound here, as the executor bound the trained ones (which
  // it reuses: no second compute state for the model it runs).
  const std::vector<std::shared_ptr<const Layer>> layers =
      other == nullptr || other == &st.trained ? st.layers : sd.layers_of(pass, "forward pass");
  STRATA_CHECK(micro_batches >= 0, Errc::invalid_argument, "forward pass: ", micro_batches, " micro-batches");
  const std::uint64_t last_tag =
      kForwardTagBase + static_cast<std::uint64_t>(vstages) * static_cast<std::uint64_t>(micro_batches);
  STRATA_CHECK(last_tag <= kForwardTagEnd, Errc::invalid_argument, "forward pass: ", vstages, " virtual stages x ",
               micro_batches, " micro-batches need more message tags than a pass has");
  const auto tag = [&](int producer_vs, int mb) {
    return kForwardTagBase + static_cast<std::uint32_t>(producer_vs * micro_batches + mb);
  };
  if (st.tied != nullptr) st.tied->begin_forward();
  const PipelineModel& t = st.trained;
  const std::size_t rows = pass.rows;
  float* const work = sd.work();
  for (int c = 0; c < s.chunks; ++c) {
    const int vs = s.virtual_stage(st.stage, c);
    const auto& ids = st.chunks[static_cast<std::size_t>(c)];
    for (int mb = 0; mb < micro_batches; ++mb) {
      // Buffers of the trained model's sizes (the ones the stage's pool has slots for).
      const std::size_t in = pass.layers[static_cast<std::size_t>(ids.front())]->in_features();
      device::DeviceBuffer x = sd.alloc(t.rows * in, vs == 0 ? "pipeline input" : "pipeline received tensor");
      if (vs == 0) {
        float* into = sd.staged() ? sd.host() : x.as<float>();
        sd.launch([&input, mb, into] { input(mb, into); });
        if (sd.staged())
          sd.stream().copy_async(x.get(), into, rows * in * sizeof(float), device::CopyKind::host_to_device);
        // Waited for here, not only by the first layer's synchronize: an error between the
        // two (no pool slot, the store's gather) would free x under the queued input.
        sd.stream().synchronize();
      } else {
        sd.receive(st.transport, s.stage_of(vs - 1), tag(vs - 1, mb), x.get(), rows * in * sizeof(float));
      }
      for (int id : ids) {
        const Layer* layer = layers[static_cast<std::size_t>(id)].get();
        const Layer& sized = *t.layers[static_cast<std::size_t>(id)];
        device::DeviceBuffer y = sd.alloc(t.rows * sized.out_features(), "pipeline activation");
        device::DeviceBuffer saved = sd.alloc(t.saved_floats(id, backend), "pipeline saved activation");
        const Action f{ActionKind::forward, mb, c};
        st.store.before_action(f, {id});
        const float* p = st.store.parameters(id);
        const float* xp = x.as<float>();
        float *yp = y.as<float>(), *sp = saved.as<float>();
        sd.launch_layer([=] { layer->forward(p, xp, yp, sp, work, rows); });
        sd.stream().synchronize();  // rethrows a layer's error; the store may release the layer now
        st.store.after_action(f, {id});
        x = std::move(y);
      }
      const std::size_t bytes =
          rows * pass.layers[static_cast<std::size_t>(ids.back())]->out_features() * sizeof(float);
      if (vs == vstages - 1) {
        const float* y = x.as<float>();
        if (sd.staged()) {
          sd.stream().copy_async(sd.host(), y, bytes, device::CopyKind::device_to_host);
          sd.stream().synchronize();
          y = sd.host();
        }
        output(mb, y);
      } else {
        sd.send(st.transport, s.stage_of(vs + 1), tag(vs, mb), x.get(), bytes);
      }
    }
  }
  st.transport.flush();
}

}  // namespace strata::pipeline::detail
