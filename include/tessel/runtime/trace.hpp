// tessel/runtime/trace.hpp — a timeline of every device's kernels and collectives, written
// as Chrome-trace JSON (open it in https://ui.perfetto.dev or chrome://tracing).
// One track (tid) per device; events carry the instruction, its shapes and bytes.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace tessel {

struct TraceEvent {
  std::string name;
  std::string category;  // "kernel", "collective", "slice", "io"
  int64_t device = 0;
  std::string stream = "compute";  // the device's track it is drawn on (compute, comm, ...)
  double start_us = 0;
  double dur_us = 0;
  std::string args;  // JSON object body, e.g. "\"bytes\": 1024"
};

class Trace {
 public:
  Trace() : origin_(std::chrono::steady_clock::now()) {}
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
  }
  // Thread-safe.
  void add(TraceEvent e);
  std::vector<TraceEvent> events() const;
  std::string to_json() const;
  // Throws RuntimeError when the file cannot be written.
  void write(const std::string& path) const;

 private:
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

}  // namespace tessel
