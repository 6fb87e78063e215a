// Forward-only passes through a pipeline's stages between steps (validation, sampling):
// every stage runs its layers' forward on micro-batches 0..n-1 and hands each output on; no
// gradient is made and nothing is kept once a layer has run. StageExecutor::forward_pass
// (executor.h) runs one on the executor's stage.
//
// Protocol. Every stage of one replica calls forward_pass() with the same n and model (the
// executor's, or one with the same layers for fewer rows: sampling's shorter sequences),
// after a step has finished and before the next begins. Per chunk of the stage (chunk-major,
// so a stage never waits on a later chunk of an earlier micro-batch) and per micro-batch:
// the first virtual stage takes `input(micro, x)` and the others receive their input from
// the virtual stage before it; each layer runs forward on the parameters the store hands
// out (before_action, parameters, after_action around it, so an engine gathers and releases
// the layer as in training); the last virtual stage hands the output to `output(micro, y)`
// and the others send it on. A tied weight is lent from its owner's stage once per pass
// (TiedStore::begin_forward, on the executor's tied store).
// Memory. The pass runs as the executor's steps do: its buffers are the stage device's, of
// the sizes a training step allocates (the trained model's rows, whatever the pass's), one
// micro-batch's layer input, output and saved values at a time, so a stage's pool made for
// the schedule holds them (pipeline/memory.h); the layers run as stream work with the
// executor's work buffer; where the CPU cannot reach the device, the input and output cross
// through the executor's pinned staging buffer, and `input` and `output` see host memory.
// Messages use tags in [kForwardTagBase, kForwardTagEnd), which the executor's steps do not
// use (the tie's messages are its steps' and passes' alike, counted per step or pass); tags
// from kForwardTagEnd up are the caller's (what it exchanges between passes). Each pass
// reuses its tags, so a stage must not start the next pass before the stages after it have
// taken this one's messages: the callers wait on something those stages send after the
// pass (strata train: the step report gathered from every rank, a sampled token). A stage
// that fails leaves the others waiting until the transport's timeout or abort.
#pragma once

#include <cstdint>

namespace strata::pipeline {

inline constexpr std::uint32_t kForwardTagBase = 0x78000000u, kForwardTagEnd = 0x7c000000u;

}  // namespace strata::pipeline
