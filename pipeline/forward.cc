// Forward-only passes through a pipeline (see forward.h).
#include "pipeline/forward.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "pipeline/runner.h"
#include "pipeline/tie.h"
#include "runtime/core/error.h"

namespace strata::pipeline {

void run_forward(const Schedule& s, int stage, const PipelineModel& model, ParameterStore& plain, Transport& transport,
                 int micro_batches, const std::function<void(int micro, float* x)>& input,
                 const std::function<void(int micro, const float* y)>& output) {
  const int vstages = s.virtual_stages();
  model.check(vstages);
  STRATA_CHECK(stage >= 0 && stage < s.stages && micro_batches >= 0, Errc::invalid_argument, "forward pass: stage ",
               stage, " of ", s.stages, " with ", micro_batches, " micro-batches");
  const std::uint64_t last_tag =
      kForwardTagBase + static_cast<std::uint64_t>(vstages) * static_cast<std::uint64_t>(micro_batches);
  STRATA_CHECK(last_tag <= kForwardTieTagBase, Errc::invalid_argument, "forward pass: ", vstages, " virtual stages x ",
               micro_batches, " micro-batches need more message tags than a pass has");
  const auto tag = [&](int producer_vs, int mb) {
    return kForwardTagBase + static_cast<std::uint32_t>(producer_vs * micro_batches + mb);
  };
  std::unique_ptr<TiedStore> tied;
  if (model.tie) {
    const int per = static_cast<int>(model.layers.size()) / vstages;
    const int owner_stage = s.stage_of(model.tie->owner / per), user_stage = s.stage_of(model.tie->user / per);
    tied = std::make_unique<TiedStore>(plain, model, stage_layers(s, model, stage), &transport,
                                       stage == owner_stage ? user_stage : owner_stage, kForwardTieTagBase);
    tied->begin_forward();
  }
  ParameterStore& store = tied ? static_cast<ParameterStore&>(*tied) : plain;
  const std::size_t rows = model.rows;
  std::vector<float> x, y, saved, work;  // forward-only: host arrays
  for (int c = 0; c < s.chunks; ++c) {
    const int vs = s.virtual_stage(stage, c);
    const auto ids = model.layers_of(vs, vstages);
    for (int mb = 0; mb < micro_batches; ++mb) {
      x.resize(rows * model.layers[static_cast<std::size_t>(ids.front())]->in_features());
      if (vs == 0)
        input(mb, x.data());
      else
        transport.recv(s.stage_of(vs - 1), tag(vs - 1, mb), x.data(), x.size() * sizeof(float));
      for (int id : ids) {
        const Layer& layer = *model.layers[static_cast<std::size_t>(id)];
        y.resize(rows * layer.out_features());
        saved.resize(layer.saved_floats(rows));
        work.resize(layer.work_floats(rows));
        const Action f{ActionKind::forward, mb, c};
        store.before_action(f, {id});
        layer.forward(store.parameters(id), x.data(), y.data(), saved.data(), work.data(), rows);
        store.after_action(f, {id});
        std::swap(x, y);
      }
      if (vs == vstages - 1)
        output(mb, x.data());
      else
        transport.send(s.stage_of(vs + 1), tag(vs, mb), x.data(), x.size() * sizeof(float));
    }
  }
  transport.flush();
}

}  // namespace strata::pipeline
