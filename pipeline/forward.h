// Forward-only passes through a pipeline's stages between steps (validation): every stage
// runs its layers' forward on micro-batches 0..n-1 and hands each output on; no gradient is
// made and nothing is kept once a layer has run.
//
// Protocol. Every stage of one replica calls run_forward() with the same schedule (only its
// stage and chunk layout is read), model and n, after a step has finished and before the
// next begins. Per chunk of the stage (chunk-major, so a stage never waits on a later
// chunk of an earlier micro-batch) and per micro-batch: the first virtual stage takes
// `input(micro, x)` and the others receive their input from the virtual stage before it;
// each layer runs forward on the parameters the store hands out (before_action,
// parameters, after_action around it, so an engine gathers and releases the layer as in
// training); the last virtual stage hands the output to `output(micro, y)` and the others
// send it on. A tied weight is lent from its owner's stage once per pass
// (TiedStore::begin_forward). Buffers are host memory, one micro-batch's layer input,
// output and saved values at a time, outside any device budget. Messages use tags in
// [kForwardTagBase, kForwardTagEnd), which neither the executor nor a training step's tie
// uses (the pass's tie takes kForwardTieTagBase up); tags from kForwardTagEnd up are the
// caller's (what it exchanges between passes). Each pass reuses its tags, so a stage must
// not start the next pass before the stages after it have taken this one's messages: the
// callers wait on something those stages send after the pass (strata train: the step
// report gathered from every rank, a sampled token). A stage that fails leaves the others
// waiting until the transport's timeout or abort.
#pragma once

#include <cstdint>
#include <functional>

#include "pipeline/model.h"
#include "pipeline/schedule.h"
#include "pipeline/transport.h"

namespace strata::pipeline {

inline constexpr std::uint32_t kForwardTagBase = 0x78000000u, kForwardTieTagBase = 0x7b000000u,
                               kForwardTagEnd = 0x7c000000u;

void run_forward(const Schedule& schedule, int stage, const PipelineModel& model, ParameterStore& store,
                 Transport& transport, int micro_batches, const std::function<void(int micro, float* x)>& input,
                 const std::function<void(int micro, const float* y)>& output);

}  // namespace strata::pipeline
