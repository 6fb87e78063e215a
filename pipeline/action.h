// One step of a pipeline schedule (the IR's unit): forward, the two halves of backward
// (B: input gradient, W: weight gradient) or both at once, a send/recv of activations or
// gradients, or the optimizer step. Actions print as short tokens ("F3", "B3:1", "SA3>2",
// "OPT") so a schedule reads, diffs and parses as text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata::pipeline {

enum class ActionKind : std::uint8_t {
  forward,          // F: forward of one micro-batch through one chunk of layers
  backward_input,   // B: gradient w.r.t. the chunk's input (the critical path)
  backward_weight,  // W: gradient w.r.t. the chunk's weights (deferrable)
  backward_full,    // BW: B and W together (1F1B, GPipe; layers that cannot split)
  send_activation,  // SA: send F's output to the next virtual stage
  recv_activation,  // RA: receive F's input from the previous virtual stage
  send_gradient,    // SG: send B's input gradient to the previous virtual stage
  recv_gradient,    // RG: receive B's output gradient from the next virtual stage
  optimizer_step,   // OPT: once per stage, after every W/BW
};

// Token prefix: F, B, W, BW, SA, RA, SG, RG, OPT.
const char* action_kind_token(ActionKind k) noexcept;
// "forward", "backward_input", ... (trace and JSON names).
const char* action_kind_name(ActionKind k) noexcept;

bool is_compute(ActionKind k) noexcept;  // F, B, W, BW
bool is_comm(ActionKind k) noexcept;     // SA, RA, SG, RG

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro = 0;  // micro-batch; 0 for OPT
  int chunk = 0;  // model chunk on this stage (interleaved schedules have several)
  int peer = -1;  // stage sent to / received from (comm actions only)

  friend bool operator==(const Action&, const Action&) = default;
};

// "F3" (chunk 0), "F3:1" (chunk 1), "SA3>2" (send to stage 2), "RG3:1<0", "OPT".
std::string format_action(const Action& a);
// Inverse of format_action; throws Errc::invalid_argument naming the token.
Action parse_action(std::string_view token);

}  // namespace strata::pipeline
