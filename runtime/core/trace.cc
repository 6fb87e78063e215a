// Tracer (see trace.h): events in memory, one JSON document on write().
#include "runtime/core/trace.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "runtime/core/error.h"

namespace strata {
namespace {
std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) o.push_back(c);
  }
  return o;
}
}  // namespace

int Tracer::lane_id(const std::string& lane) {
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i] == lane) return static_cast<int>(i) + 1;
  }
  lanes_.push_back(lane);
  return static_cast<int>(lanes_.size());
}

void Tracer::record(const std::string& lane, const std::string& name, Clock::time_point start, Clock::time_point end,
                    const std::string& args_json) {
  if (!enabled_) return;
  const double ts = std::chrono::duration<double, std::micro>(start - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - start).count();
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({lane_id(lane), name, ts, dur, args_json});
}

std::size_t Tracer::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

void Tracer::append_events(std::ostringstream& os, bool& first) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!process_name_.empty()) {
    os << (first ? "" : ",\n") << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << pid_ << ",\"args\":{\"name\":\""
       << escape(process_name_) << "\"}}";
    first = false;
  }
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    os << (first ? "" : ",\n") << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << pid_ << ",\"tid\":" << i + 1
       << ",\"args\":{\"name\":\"" << escape(lanes_[i]) << "\"}}";
    os << ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" << pid_ << ",\"tid\":" << i + 1
       << ",\"args\":{\"sort_index\":" << i << "}}";
    first = false;
  }
  char buf[96];
  for (const auto& e : events_) {
    std::snprintf(buf, sizeof buf, "\"ts\":%.3f,\"dur\":%.3f", e.ts_us, e.dur_us);
    os << (first ? "" : ",\n") << "{\"ph\":\"X\",\"pid\":" << pid_ << ",\"tid\":" << e.tid << ",\"name\":\""
       << escape(e.name) << "\"," << buf;
    if (!e.args.empty()) os << ",\"args\":" << e.args;
    os << "}";
    first = false;
  }
}

std::string Tracer::merged_json(const std::vector<const Tracer*>& tracers) {
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  for (const Tracer* t : tracers) t->append_events(os, first);
  os << "\n]}\n";
  return os.str();
}

std::string Tracer::to_json() const { return merged_json({this}); }

void Tracer::write(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  STRATA_CHECK(f.good(), Errc::io, "trace file '", path, "' cannot be opened for writing: ", errno_text(errno));
  f << to_json();
  f.close();
  STRATA_CHECK(f.good(), Errc::io, "writing trace file '", path, "' failed: ", errno_text(errno));
}

}  // namespace strata
