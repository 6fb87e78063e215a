// Chrome trace-event recorder ("X" complete events), viewable in Perfetto or
// chrome://tracing. Rows (tid) are named lanes such as "compute", "gather", "copy",
// "reduce", "optimizer", so overlap shows as boxes on different rows at the same time.
// Thread-safe; disabled recorders cost one branch per event.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace strata {

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Tracer(bool enabled = false, int pid = 0) : enabled_(enabled), pid_(pid), origin_(Clock::now()) {}
  // Several recorders that write one trace together (one per pipeline stage: pid = stage)
  // share an origin, so their times line up.
  Tracer(bool enabled, int pid, Clock::time_point origin, std::string process_name)
      : enabled_(enabled), pid_(pid), origin_(origin), process_name_(std::move(process_name)) {}
  bool enabled() const noexcept { return enabled_; }

  // Records an event on `lane` from `start` to `end`.
  void record(const std::string& lane, const std::string& name, Clock::time_point start, Clock::time_point end,
              const std::string& args_json = {});

  // RAII span: records from construction to destruction.
  class Span {
   public:
    Span(Tracer* t, std::string lane, std::string name)
        : t_(t && t->enabled() ? t : nullptr), lane_(std::move(lane)), name_(std::move(name)), start_(Clock::now()) {}
    ~Span() {
      if (t_) t_->record(lane_, name_, start_, Clock::now());
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Tracer* t_;
    std::string lane_, name_;
    Clock::time_point start_;
  };

  // {"traceEvents": [...]} with lane names as thread names. Throws naming the path.
  void write(const std::string& path) const;
  std::string to_json() const;
  // One document holding every recorder's lanes and events (each under its pid).
  static std::string merged_json(const std::vector<const Tracer*>& tracers);
  std::size_t size() const;

 private:
  struct Event {
    int tid;
    std::string name;
    double ts_us, dur_us;
    std::string args;
  };
  int lane_id(const std::string& lane);
  void append_events(std::ostringstream& os, bool& first) const;

  bool enabled_;
  int pid_;
  Clock::time_point origin_;
  std::string process_name_;
  mutable std::mutex mutex_;
  std::vector<std::string> lanes_;
  std::vector<Event> events_;
};

}  // namespace strata
