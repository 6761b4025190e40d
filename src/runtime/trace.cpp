// Chrome-trace JSON writer for device timelines.
#include "tessel/runtime/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "tessel/core/common.hpp"

namespace tessel {

void Trace::add(TraceEvent e) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(e));
}

std::vector<TraceEvent> Trace::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

namespace {
std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}
}  // namespace

std::string Trace::to_json() const {
  auto ev = events();
  std::sort(ev.begin(), ev.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.device != b.device ? a.device < b.device : a.start_us < b.start_us;
  });
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  // One process per device, one thread (track) per stream of it: a collective on `comm`
  // running under a kernel on `compute` shows as two overlapping bars.
  std::vector<std::string> streams = {"compute"};
  for (const auto& e : ev)
    if (std::find(streams.begin(), streams.end(), e.stream) == streams.end()) streams.push_back(e.stream);
  auto tid = [&](const std::string& s) { return std::find(streams.begin(), streams.end(), s) - streams.begin(); };
  int64_t maxdev = -1;
  for (const auto& e : ev) maxdev = std::max(maxdev, e.device);
  bool first = true;
  for (int64_t d = 0; d <= maxdev; ++d) {
    out += fmt::format("{}{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {}, \"args\": {{\"name\": \"device {}\"}}}}",
                       first ? "" : ",\n", d, d);
    first = false;
    for (const auto& s : streams)
      out += fmt::format(",\n{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": {}, "
                         "\"args\": {{\"name\": \"{}\"}}}}", d, tid(s), escape(s));
  }
  for (const auto& e : ev) {
    out += fmt::format("{}{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"pid\": {}, \"tid\": {}, "
                       "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{{}}}}}",
                       first ? "" : ",\n", escape(e.name), e.category, e.device, tid(e.stream), e.start_us,
                       e.dur_us, e.args);
    first = false;
  }
  out += "\n]}\n";
  return out;
}

void Trace::write(const std::string& path) const {
  std::ofstream f(path);
  if (!f) throw RuntimeError(fmt::format("trace: cannot write '{}'", path));
  f << to_json();
  if (!f) throw RuntimeError(fmt::format("trace: writing '{}' failed", path));
}

}  // namespace tessel
