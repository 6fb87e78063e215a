// The executor's forward-only pass (private to pipeline/; its protocol is forward.h's).
#pragma once

#include <functional>

#include "pipeline/detail/stage_device.h"
#include "pipeline/model.h"
#include "pipeline/schedule.h"
#include "pipeline/tie.h"
#include "pipeline/transport.h"

namespace strata::pipeline::detail {

// One executor's stage: `trained` is the model its step buffers are sized for, `layers` its
// layers as the stage calls them (StageDevice::layers_of: bound to the stage's stream on
// CUDA), `store` the store its layers read (the tied store when there is one, `tied`).
struct ForwardStage {
  const Schedule& schedule;
  int stage;
  const std::vector<std::vector<int>>& chunks;  // [chunk] -> global layer ids
  const PipelineModel& trained;
  const std::vector<std::shared_ptr<const Layer>>& layers;
  ParameterStore& store;
  TiedStore* tied;
  Transport& transport;
  StageDevice& sd;
};

// `pass`: null runs the trained model's layers.
void forward_pass(const ForwardStage& st, const PipelineModel* pass, int micro_batches,
                  const std::function<void(int micro, float* x)>& input,
                  const std::function<void(int micro, const float* y)>& output);

}  // namespace strata::pipeline::detail
