// The ZeRO engine as a pipeline stage's ParameterStore (docs/pipeline.md, "Inside a stage:
// the engine's side"): the executor's layers read parameters the engine gathered and
// hand it each micro-batch's weight gradient, and the schedule's OPT is the engine's step().
//
// Protocol. One StageStore per stage, over an Engine that holds only that stage's layers
// and whose communicator is the stage's data-parallel group (null: one replica). The
// constructor registers each layer's tensors under engine layer id = the layer's global id
// (Layer::tensors(), with their learning-rate scales, up to a tied tail; a layer that names
// none: one fp32 tensor "pipeline.layer<id>" of stored_params), so make it before the
// engine's setup. A layer's tensors lie back to back in the engine's buffers, so the
// executor reads and writes a layer as one array whatever its tensors; then
// setup(activations, ...) takes the executor's device memory as pools of its own (a slot
// for every buffer the schedule has live at once, activation_device(); the fp32 copies of
// a 16-bit stage; on CUDA the bound layers' kernels, scratch_device()) at the start of
// the engine's device, so the engine's buffers never
// interleave with them, then sets the engine up and gives the tensors
// Layer::init_params(seed, id) or values from a file (or engine.setup() and init(seed),
// with nothing reserved).
// Then the executor drives it: begin_step() is the engine's; before_action gathers the
// action's layers and after_action releases them; add_gradient
// copies one micro-batch's dW into the layer's gradient buffer and reduces it (the engine's
// per-micro-batch reduction, so D replicas of a stage sum alike whatever the schedule);
// optimizer_step() is engine.step(). With every stage's engine fed in micro-batch order the
// parameters are the bits of one engine over the whole model running the plain loop
// (pipeline::run_sequential) with the same data-parallel ranks, at every ZeRO stage and
// placement. The layers compute in fp32: with a 16-bit compute dtype each gathered layer is
// widened into an fp32 buffer on the engine's device for its action and each gradient
// rounded to bf16 or fp16 on its way in. Those conversions (and the fp32 gradient's copy)
// are stream work on a stream of the store's own, waited for before the layers read or the
// engine reduces: the store never touches the device's memory from the CPU. Under fp16
// loss_scale() is the engine's loss scale, which the last stage's loss gradient carries and
// every stage's engine divides out at its step. With P > 1 the engines of one replica's stages must be linked
// (EngineOptions::pipeline_comm): clipping and the overflow skip then see the norm over
// every stage, so every stage steps, clips or skips alike, and their loss scalers move
// together.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "pipeline/memory.h"
#include "pipeline/model.h"
#include "runtime/device/device.h"
#include "runtime/device/pool_device.h"

namespace strata::engine {

class StageStore final : public pipeline::ParameterStore {
 public:
  // Throws Errc::invalid_argument naming what the pipeline cannot run: an engine not linked
  // to pipeline_stages stages.
  StageStore(Engine& engine, const pipeline::PipelineModel& model, std::vector<int> layers, int pipeline_stages);

  // Writes layer `layer`'s `count` stored parameters (model.stored_params(layer): its
  // tensors concatenated as the layer reads them, a tied tail left out): initial values
  // from elsewhere than Layer::init_params (a file of trained weights).
  using LayerValues = std::function<void(int layer, std::size_t count, float* out)>;

  // After engine.setup(): every layer's initial parameters, from `from` if set, else
  // Layer::init_params(seed, id) (collective, as init_weights).
  void init(std::uint64_t seed, const LayerValues& from = {});
  // engine.setup() with `activations` (pipeline::stage_memory for this stage's schedule)
  // and the fp32 copies of `layers_at_once` layers (one action's chunk) under a 16-bit
  // compute dtype held in pools, those layers gathered at once
  // (Engine::reserve_for_trainer), then init(seed). Throws Errc::out_of_budget naming the
  // stage's activations, the budget and what to change when they alone do not fit; the
  // engine's own refusal names its minimum beside the bytes reserved.
  void setup(const pipeline::StageMemory& activations, int layers_at_once, int stage, std::uint64_t seed,
             const LayerValues& from = {});

  void begin_step() override;
  void before_action(const pipeline::Action& action, const std::vector<int>& layers) override;
  const float* parameters(int layer) override;
  void add_gradient(int layer, int micro, const float* dw) override;
  void after_action(const pipeline::Action& action, const std::vector<int>& layers) override;
  void optimizer_step() override;
  float loss_scale() override;

  // Where the executor's buffers go: the pool setup() made, else the engine's device.
  device::Device& activation_device() noexcept { return pool_ ? *pool_ : engine_.device(); }
  // Where layers bound to a CUDA stage's stream keep their compute state
  // (ExecutorOptions::scratch_device): the room setup() kept for them, else null.
  device::Device* scratch_device() noexcept { return kernels_.get(); }
  // The stage's layers in registration order: engine.full_parameters() is theirs, concatenated.
  const std::vector<int>& layers() const noexcept { return ids_; }
  const StepResult& last_step() const noexcept { return last_; }

  static std::string tensor_name(int layer);
  // Device bytes of the fp32 copies an action's layers need under `compute` (0 for fp32).
  static std::uint64_t conversion_bytes(const pipeline::PipelineModel& model, const std::vector<int>& layers,
                                        int layers_at_once, DType compute);
  // Device bytes kept for layers bound to the stage's stream on a `backend` device: two
  // binds of model.bind_bytes (the executor's, and one forward pass's), rounded; 0 on a
  // host device, whose stages run the layers unbound.
  static std::uint64_t bound_bytes(const pipeline::PipelineModel& model, device::Backend backend);
  // What setup() takes from the device before the engine: the activations' pool, the fp32
  // copies and the bound layers' compute state.
  static std::uint64_t reserved_bytes(const pipeline::StageMemory& activations, const pipeline::PipelineModel& model,
                                      const std::vector<int>& layers, int layers_at_once, DType compute,
                                      device::Backend backend);
  // What the constructor registers for these layers, in order (for sizing without an engine).
  static std::vector<ParamSpec> param_specs(const pipeline::PipelineModel& model, const std::vector<int>& layers);

 private:
  std::size_t count(int layer) const;
  device::Stream& stream();
  TensorView contiguous(const std::vector<TensorView>& views, int layer) const;
  Engine& engine_;
  std::unique_ptr<device::PoolDevice> pool_, copies_, kernels_;  // declared before the buffers taken from them
  const pipeline::PipelineModel& model_;
  std::vector<int> ids_;
  std::map<int, const float*> held_;             // gathered layers of the current action
  std::map<int, device::DeviceBuffer> widened_;  // their fp32 copies under a 16-bit compute dtype
  std::unique_ptr<device::Stream> stream_;       // widening and gradient conversion (made on first use)
  StepResult last_;
};

}  // namespace strata::engine
