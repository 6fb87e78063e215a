// Per-stage action times and the communication delay that the simulator and the automatic
// zero-bubble scheduler plan with. Times are for a whole stage (all its chunks); a chunk's
// action takes time / chunks. Units are the caller's (the CLI uses abstract units, the
// executor's comparison uses seconds).
#pragma once

#include <vector>

namespace strata::pipeline {

struct Costs {
  // One entry per stage, or one entry for all stages.
  std::vector<double> forward{1.0};
  std::vector<double> backward_input{1.0};   // B
  std::vector<double> backward_weight{1.0};  // W; a full backward (BW) takes B + W
  double comm = 0;                           // delay from a send to the matching receive's data being there
  double optimizer = 0;                      // the OPT action

  static Costs uniform(double f, double b, double w, double comm = 0) {
    Costs c;
    c.forward = {f};
    c.backward_input = {b};
    c.backward_weight = {w};
    c.comm = comm;
    return c;
  }
  double f(int stage) const { return pick(forward, stage); }
  double b(int stage) const { return pick(backward_input, stage); }
  double w(int stage) const { return pick(backward_weight, stage); }
  // Throws Errc::invalid_argument when a list is neither 1 nor `stages` long, or a time is
  // negative or not finite, or a stage's F + B + W is 0.
  void check(int stages) const;

 private:
  static double pick(const std::vector<double>& v, int stage) {
    return v.size() == 1 ? v[0] : v[static_cast<std::size_t>(stage)];
  }
};

}  // namespace strata::pipeline
