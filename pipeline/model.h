// What the executor runs: a PipelineModel (the layers in forward order, the micro-batch
// inputs and the loss gradient) split evenly over the schedule's virtual stages, and per
// stage a ParameterStore that hands out the stage's parameters and gradient buffers.
//
// ParameterStore protocol (called from the stage's own thread only). Per step:
// begin_step() once; for every compute action, before_action(action, layers) with the
// global ids of the layers it touches, then parameters() of those layers, then
// add_gradient(layer, micro, dw) for each weight gradient the action completed, then
// after_action(action, layers); gradients_ready(layer) once that layer's weight gradient
// holds every micro-batch; optimizer_step() at the schedule's OPT. loss_scale() is the
// factor this step's loss gradient carries (an fp16 engine's loss scaler; 1 otherwise),
// read by the last stage before each loss gradient and fixed from begin_step() to
// optimizer_step(). add_gradient comes for
// each layer in micro-batch order (0, 1, ...), whatever order the schedule ran W in, with
// the layer still held (inside its action), and `dw` is that one micro-batch's dW, valid
// for the call only: a store sums them in that order (LocalParameterStore) or hands each
// to a reduction (a ZeRO engine, engine/stage_store.h), so the sums are the bits of a
// sequential loop. A ZeRO engine plugs in here: gather a layer's parameters in
// before_action, release them in after_action, reduce each micro-batch's gradient in
// add_gradient, step its shards in optimizer_step. The pointers from parameters() stay
// valid until after_action. Both they and `dw` are memory of the stage's device: a store
// that reads or writes them with the CPU (LocalParameterStore) serves only a device the CPU
// reaches (device::cpu_reaches); elsewhere a store moves them with stream work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "pipeline/action.h"
#include "pipeline/layer.h"

namespace strata::device {
class Device;
class Stream;
enum class Backend;
}  // namespace strata::device

namespace strata::pipeline {

// A weight two layers share (the GPT's token embedding, read again by its LM head): the
// user layer's last `count` parameters are the owner layer's [owner_offset, owner_offset +
// count). The owner's store holds them; the user's store holds only the user's other
// parameters (stored_params). Every step the owner's values reach the user's stage once, and
// each micro-batch's gradient of the user's copy is added to the owner's gradient of that
// micro-batch before the owner's store gets it (pipeline/tie.h). The user must not split its
// backward, so that its gradient leaves during its B, before the owner's B of that
// micro-batch can start.
struct Tie {
  int owner = -1;
  std::size_t owner_offset = 0;
  int user = -1;
  std::size_t count = 0;
};

struct PipelineModel {
  std::vector<std::shared_ptr<const Layer>> layers;  // forward order
  std::size_t rows = 1;                              // rows per micro-batch
  // Writes micro-batch `micro`'s input for the step-th step (0-based) of the run: rows *
  // layers.front()->in_features() floats.
  std::function<void(std::int64_t step, int micro, float* x)> input;
  // Writes dL/dy times `loss_scale` (the store's loss_scale()) for micro-batch `micro` of
  // step `step` from the last layer's output y (rows * out floats).
  std::function<void(std::int64_t step, int micro, const float* y, float* dy, float loss_scale)> loss_grad;
  std::optional<Tie> tie;
  // For devices where host code cannot run as stream work (CUDA): the same layers bound to
  // one stage's `stream`, sharing one compute state made there (the GPT's kernels, their
  // scratch on `scratch`), whose calls enqueue their own work in stream order; the stage
  // makes them from its own thread. Null: the layers are host code only, which a stage runs
  // as work on its stream, on host devices.
  std::function<std::vector<std::shared_ptr<const Layer>>(device::Device& scratch, device::Stream& stream)> bind;
  // Device bytes one bind() allocates on `scratch` and holds while its layers live (the
  // GPT's CUDA kernels' scratch). A stage on a ZeRO engine reserves room for two binds:
  // its own layers' and one forward pass's (engine::StageStore::setup).
  std::uint64_t bind_bytes = 0;
  // Floats a layer bind() makes keeps between forward and backward at `rows`, where the
  // bound layers keep other sizes than these (the GPT's CUDA attention keeps its [B,NH,T,T]
  // probabilities, the host's only row statistics). Null: the same sizes. A CUDA stage's
  // pool is counted from it before the stage binds (stage_memory); binding checks it.
  std::function<std::size_t(int layer, std::size_t rows)> bound_saved_floats;

  // Throws Errc::invalid_argument when the layers do not split evenly into
  // `virtual_stages` groups, features do not chain, a callback is missing, or the tie does
  // not fit its layers.
  void check(int virtual_stages) const;
  // Global ids of virtual stage vs's layers (contiguous, forward order).
  std::vector<int> layers_of(int vs, int virtual_stages) const;
  // The parameters a store holds for `layer`: param_count() less a tie's shared tail.
  std::size_t stored_params(int layer) const;
  // Floats layer `id` keeps between forward and backward, as a stage on `backend` calls it
  // (a CUDA stage calls the layers bind() makes).
  std::size_t saved_floats(int id, device::Backend backend) const;
  // Floats of the one work buffer a stage's layers share (the executor's, which the memory
  // replay counts): the widest work_floats(rows) over the chunks' layers.
  std::size_t work_floats(const std::vector<std::vector<int>>& chunk_layers) const;
};

class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  virtual void begin_step() = 0;
  virtual void before_action(const Action& action, const std::vector<int>& layers) { (void)action, (void)layers; }
  virtual const float* parameters(int layer) = 0;
  virtual void add_gradient(int layer, int micro, const float* dw) = 0;
  virtual void after_action(const Action& action, const std::vector<int>& layers) { (void)action, (void)layers; }
  virtual void gradients_ready(int layer) { (void)layer; }
  virtual void optimizer_step() {}
  virtual float loss_scale() { return 1.0f; }
};

// Parameters and gradients of some layers in host memory (stored_params of each):
// parameters from each layer's init_params(seed, id), gradients zeroed by begin_step() and
// summed by add_gradient(). optimizer_step() does nothing (the gradients stay for
// inspection) unless a learning rate is set (plain SGD).
class LocalParameterStore final : public ParameterStore {
 public:
  LocalParameterStore(const PipelineModel& model, std::vector<int> layers, std::uint64_t seed, float sgd_lr = 0);
  void begin_step() override;
  const float* parameters(int layer) override;
  void add_gradient(int layer, int micro, const float* dw) override;
  void gradients_ready(int layer) override;
  void optimizer_step() override;

  const std::vector<int>& layers() const noexcept { return ids_; }
  const std::vector<float>& params_of(int layer) const;
  const std::vector<float>& grads_of(int layer) const;
  int ready_count(int layer) const;  // gradients_ready calls this step

 private:
  std::size_t index(int layer) const;
  std::vector<int> ids_;
  std::vector<std::vector<float>> params_, grads_;
  std::vector<int> ready_;
  float lr_;
};

// The deterministic model the tests and `strata pipeline` use: `layers` layers, each a
// TanhLinear(width, width) (every `unsplittable_every`-th one cannot split its backward,
// 0: none) or, with layer_time > 0, a TimedLayer whose F, B, W take layer_time * (f, b, w).
struct SyntheticModelSpec {
  int layers = 8;
  std::size_t width = 16;
  std::size_t rows = 4;
  int micro_batches = 8;  // for the loss scale 1 / (rows m)
  std::uint64_t seed = 1;
  int unsplittable_every = 0;
  double layer_time_s = 0;
  double f = 1, b = 1, w = 1;
};
PipelineModel synthetic_model(const SyntheticModelSpec& spec);

// The plain sequential loop the pipeline must match bit for bit: for each micro-batch in
// order, forward through every layer, loss gradient, backward through every layer (B then
// W, or the full backward), handing each layer's weight gradient to store.add_gradient.
// Each layer's forward and backward is an action of its own to the store (F, then BW, of
// that micro-batch): an engine store gathers and releases the layer around each, as a
// plain data-parallel loop does. `store` must hold every layer; optimizer_step() is the
// caller's. `step` is the one the model's input and loss see. Each call's work buffer
// (Layer::work_floats) is NaN on entry, so a layer that reads scratch it did not write
// shows here.
void run_sequential(const PipelineModel& model, int micro_batches, ParameterStore& store, std::int64_t step = 0);

}  // namespace strata::pipeline
