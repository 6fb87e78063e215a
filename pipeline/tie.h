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
// weight once. Messages use tags from `tag_base` up (kTieTagBase, which the executor never
// uses; a forward-only pass gives its own, forward.h), 2^22 of them.
// Memory: the tied values and one micro-batch's tied gradient, in host memory, per end,
// outside any device budget. The store reads and writes them, and the ends' parameters and
// gradients, with the CPU: it serves devices the CPU reaches (device::cpu_reaches) only, and
// the executor refuses a tied model on any other.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "pipeline/model.h"
#include "pipeline/transport.h"

namespace strata::pipeline {

inline constexpr std::uint32_t kTieTagBase = 0x70000000u;

class TiedStore final : public ParameterStore {
 public:
  // `held`: the layers `inner` holds (one end of model.tie or both). With one end, the other
  // end is on stage `peer`, reached through `transport`.
  TiedStore(ParameterStore& inner, const PipelineModel& model, const std::vector<int>& held, Transport* transport,
            int peer, std::uint32_t tag_base = kTieTagBase);

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
  std::vector<float> values_;                  // the tied values this step (user's end)
  std::vector<float> assembled_;               // the user's parameters: its own, then the tied values
  std::map<int, std::vector<float>> pending_;  // the user's tied gradient by micro-batch (both ends here)
  std::vector<float> sum_, incoming_;          // the owner's end
};

}  // namespace strata::pipeline
