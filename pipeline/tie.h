// A tied weight across stages (PipelineModel::tie): a ParameterStore in front of a stage's
// own store that lends the user layer the owner's values and hands the user's gradient of
// them to the owner's. The executor puts one in front of its store when the model has a tie;
// run_sequential does too, with both ends in one store.
//
// Protocol. Every step, begin_step() on the owner's stage gathers the owner layer once and
// sends the tied values to the user's stage (or keeps them, when it holds both ends); the
// user's first parameters() of the step receives them and returns the user's own parameters
// followed by them, the same buffer for the rest of the step. add_gradient() of the user
// sends the tied tail of each micro-batch's dW to the owner's stage (or keeps it) and hands
// the rest to the inner store; add_gradient() of the owner for micro-batch k receives the
// user's tail of k, adds it to the owner's dW (owner + user, element by element) and hands
// the sum to the inner store. The owner's inner store thus sees one gradient per
// micro-batch, as a model with one shared tensor would, and the gradient norm counts the
// weight once. begin_forward() lends the values the same way for a forward-only pass between
// steps (forward.h), counted with the steps. Messages use tags from `tag_base` up
// (kTieTagBase, which the executor's own messages never use), 2^22 of them.
// Memory. With a device (the executor's), the buffers the layers and the inner store read
// are that device's, held for the store's life (device_floats(), which the memory replay
// counts): the user's assembled parameters, and the owner's summed gradient with the user's
// part beside it; the store fills them with copies and an accumulation on a stream of its
// own, waited for before they are handed on, so it never touches device memory from the CPU
// (the CUDA rule; device::cpu_reaches). The tied values and the user's gradient of them
// cross in host memory (the transport's side), one copy per end, outside any budget, plus
// one per micro-batch in flight when one stage holds both ends. Without a device (the
// sequential loop: host arrays) every buffer is host memory and the CPU reads the ends'
// parameters and gradients directly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "pipeline/model.h"
#include "pipeline/transport.h"
#include "runtime/device/device.h"

namespace strata::pipeline {

inline constexpr std::uint32_t kTieTagBase = 0x70000000u;

class TiedStore final : public ParameterStore {
 public:
  // `held`: the layers `inner` holds (one end of model.tie or both). With one end, the other
  // end is on stage `peer`, reached through `transport`.
  // `dev`: where the layers and `inner` read (null: host memory).
  TiedStore(ParameterStore& inner, const PipelineModel& model, const std::vector<int>& held, Transport* transport,
            int peer, std::uint32_t tag_base = kTieTagBase, device::Device* dev = nullptr);
  ~TiedStore() override;

  // The device buffers (floats each) a store with a device holds for a stage that holds
  // `held`: the user's assembled parameters; the owner's summed gradient and the user's part.
  static std::vector<std::size_t> device_floats(const PipelineModel& model, const std::vector<int>& held);

  void begin_step() override;
  // begin_step() for a forward-only pass between steps (forward.h): lends the tied values
  // the same way without starting a step of the inner store.
  void begin_forward();
  void before_action(const Action& action, const std::vector<int>& layers) override;
  const float* parameters(int layer) override;
  void add_gradient(int layer, int micro, const float* dw) override;
  void after_action(const Action& action, const std::vector<int>& layers) override;
  void gradients_ready(int layer) override;
  void optimizer_step() override;
  float loss_scale() override;

 private:
  std::uint32_t tag(int micro) const;  // micro -1: the tied values
  void begin(bool step);
  ParameterStore& inner_;
  const PipelineModel& model_;
  Tie tie_;
  bool owner_ = false, user_ = false;
  Transport* transport_;
  int peer_;
  std::uint32_t tag_base_;
  std::int64_t step_ = -1;
  bool have_values_ = false;
  // `bytes` from src to dst (kind as the device sees it), or the CPU's memcpy without a device.
  void copy(void* dst, const void* src, std::size_t bytes, device::CopyKind kind);
  void wait();  // for the copies so far
  device::Device* dev_;
  std::unique_ptr<device::Stream> stream_;  // with a device
  bool assembled_this_step_ = false;
  std::vector<float> values_;                  // the tied values this step (host)
  std::map<int, std::vector<float>> pending_;  // the user's tied gradient by micro-batch (both ends here)
  std::vector<float> incoming_, outgoing_;     // the user's tied gradient at each end (host)
  // The user's parameters (its own, then the tied values), the owner's dW plus the user's
  // part, and that part on the device: in `*_buf` with a device, else in the host vectors.
  device::DeviceBuffer assembled_buf_, sum_buf_, part_buf_;
  std::vector<float> assembled_host_, sum_host_;
  float *assembled_ = nullptr, *sum_ = nullptr, *part_ = nullptr;
};

}  // namespace strata::pipeline
