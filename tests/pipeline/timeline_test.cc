// Timeline figures, the Chrome trace and the SVG picture.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "pipeline/generators.h"
#include "pipeline/runner.h"
#include "pipeline/simulate.h"

using namespace strata;
using namespace strata::pipeline;

TEST_CASE("summarize follows the Zero Bubble paper's definitions", "[pipeline]") {
  Timeline t;
  t.stages = 2;
  t.micro_batches = 1;
  // Stage 0 busy 0-1 and 3-5 (span 5, busy 3); stage 1 busy 1-3 (span 2, busy 2).
  t.actions = {{0, {ActionKind::forward, 0, 0, -1}, 0, 1},        {1, {ActionKind::forward, 0, 0, -1}, 1, 2},
               {1, {ActionKind::backward_full, 0, 0, -1}, 2, 3},  {0, {ActionKind::recv_gradient, 0, 0, 1}, 1, 3},
               {0, {ActionKind::backward_input, 0, 0, -1}, 3, 4}, {0, {ActionKind::backward_weight, 0, 0, -1}, 4, 5}};
  const TimelineStats s = summarize(t);
  CHECK(s.makespan == 5);
  CHECK(s.span == std::vector<double>{5, 2});
  CHECK(s.busy == std::vector<double>{3, 2});
  CHECK(s.bubble_rate_per_stage == std::vector<double>{0.4, 0.6});
  CHECK(s.bubble_rate == Approx(1 - 2.5 / 5));
  CHECK(s.peak_activations == std::vector<double>{1, 1});
}

TEST_CASE("the Chrome trace has one complete event per compute action and a thread per stage", "[pipeline]") {
  const auto r = simulate(zb_h1(4, 8), Costs::uniform(1, 1, 1, 0.1));
  const auto j = nlohmann::json::parse(to_chrome_trace(r.timeline));
  int complete = 0, threads = 0, waits = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] != "recv_activation" && e["cat"] != "recv_gradient" && e["cat"] != "optimizer_step")
      ++complete;
    if (e["ph"] == "X" && (e["cat"] == "recv_activation" || e["cat"] == "recv_gradient")) ++waits;
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
  }
  CHECK(complete == 4 * 8 * 3);
  CHECK(threads == 4);
  CHECK(waits > 0);
}

TEST_CASE("the SVG draws a labelled box per compute action", "[pipeline]") {
  const auto r = simulate(one_f_one_b(4, 8), Costs{});
  const std::string svg = to_svg(r.timeline, "1f1b");
  std::size_t boxes = 0;
  for (std::size_t pos = 0; (pos = svg.find("<title>", pos)) != std::string::npos; ++pos) ++boxes;
  CHECK(boxes == 4 * 8 * 2);
  CHECK(svg.find("Stage 3") != std::string::npos);
  CHECK(svg.find("BW full backward") != std::string::npos);
  CHECK(svg.rfind("</svg>") != std::string::npos);
}

TEST_CASE("a message's cost is read from receives that waited for their send", "[pipeline]") {
  const Schedule s = one_f_one_b(2, 4);
  StageReport sender, receiver;
  sender.stage = 0;
  receiver.stage = 1;
  const auto add = [](StageReport& r, ActionKind k, int micro, double start, double end) {
    r.timings.push_back({r.stage, Action{k, micro, 0, 1 - r.stage}, start, end});
  };
  // Activations 0-2: the receive waited; it ended 0.1, 0.2 and 0.5 after its send.
  add(sender, ActionKind::send_activation, 0, 1.0, 1.1);
  add(receiver, ActionKind::recv_activation, 0, 0.5, 1.2);
  add(sender, ActionKind::send_activation, 1, 2.0, 2.1);
  add(receiver, ActionKind::recv_activation, 1, 1.9, 2.3);
  add(sender, ActionKind::send_activation, 2, 3.0, 3.1);
  add(receiver, ActionKind::recv_activation, 2, 3.05, 3.6);
  // Activation 3 arrived before its receive began: it says nothing about the transport.
  add(sender, ActionKind::send_activation, 3, 4.0, 4.1);
  add(receiver, ActionKind::recv_activation, 3, 9.0, 9.01);
  CHECK(measured_comm(s, {sender, receiver}) == Approx(0.2));
  CHECK(measured_comm(s, {sender}) == 0.0);
}
