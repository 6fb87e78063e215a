// A timed run of a schedule, simulated or measured, and the figures both are judged by.
// The definitions follow the Zero Bubble paper: a stage's span runs from the start of its
// first action to the end of its last (what repeats when steps follow each other);
// makespan is the longest span; a stage's bubble rate is (makespan - its busy time) /
// makespan; the overall bubble rate is 1 - mean busy time / makespan, which with equal
// stages is (makespan - m(F+B+W)) / makespan.
#pragma once

#include <string>
#include <vector>

#include "pipeline/action.h"

namespace strata::pipeline {

struct TimedAction {
  int stage = 0;
  Action action;
  double start = 0;  // in the timeline's unit
  double end = 0;
};

struct Timeline {
  int stages = 1;
  int micro_batches = 1;
  int chunks = 1;
  std::string kind;                  // schedule kind, for titles
  std::string unit = "unit";         // "unit" (simulated) or "s" (measured)
  double unit_us = 1000.0;           // microseconds per unit in traces (1 unit = 1 ms by default)
  std::vector<TimedAction> actions;  // compute actions, plus comm/OPT where known
};

struct TimelineStats {
  double makespan = 0;
  double bubble_rate = 0;
  std::vector<double> span;  // per stage
  std::vector<double> busy;  // per stage: time in F, B, W, BW, OPT
  std::vector<double> bubble_rate_per_stage;
  std::vector<double> peak_activations;  // per stage, in micro-batches (a chunk counts 1/v)
};

// Figures of a timeline. Activations: one micro-batch's chunk is live from the start of
// its F to the end of its W or BW.
TimelineStats summarize(const Timeline& t);

// Chrome trace-event JSON (chrome://tracing, Perfetto): one thread per stage, compute
// actions as complete events, receives as their wait.
std::string to_chrome_trace(const Timeline& t);

// An SVG picture like the papers' figures: one row per stage, a box per compute action
// coloured by kind (F, B, W, BW) with its micro-batch number, a time axis and a legend.
// `title` goes above the rows.
std::string to_svg(const Timeline& t, const std::string& title);

// Writes `text` to `path`, replacing it; throws Errc::io naming the path.
void write_file(const std::string& path, const std::string& text);

}  // namespace strata::pipeline
