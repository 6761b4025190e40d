// The joint schedule as a table, JSON, a Perfetto trace and an SVG Gantt chart
// (tessel/planner/show.hpp).
#include "tessel/planner/show.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessel::planner {

using json = nlohmann::json;

std::string format_duration(double seconds) {
  if (seconds < 3600) return fmt::format("{:.4g} s", seconds);
  const int64_t total = static_cast<int64_t>(std::llround(seconds));
  return fmt::format("{}:{:02d}:{:02d}", total / 3600, (total / 60) % 60, total % 60);
}

std::string format_devices(const std::vector<int32_t>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t k = i;
    while (k + 1 < ids.size() && ids[k + 1] == ids[k] + 1) ++k;
    out += fmt::format("{}{}", out.empty() ? "" : ",", ids[i]);
    if (k > i) out += fmt::format("-{}", ids[k]);
    i = k + 1;
  }
  return out;
}

namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// A colour per job: the golden-angle hue walk, alternating lightness, so neighbours differ.
// Written as #rrggbb (some SVG renderers do not read hsl()).
std::string job_colour(int32_t j) {
  const double h = std::fmod(j * 137.508, 360.0) / 60.0, s = 0.65, l = j % 2 == 0 ? 0.62 : 0.74;
  const double c = (1 - std::abs(2 * l - 1)) * s, x = c * (1 - std::abs(std::fmod(h, 2.0) - 1)), m = l - c / 2;
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(h)) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x; break;
  }
  auto byte = [&](double v) { return static_cast<int>(std::lround((v + m) * 255)); };
  return fmt::format("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b));
}

}  // namespace

std::string schedule_table(const Schedule& s, const std::vector<JobProfile>& jobs, const Pool& pool) {
  std::size_t width = 3;
  for (const Placement& p : s.jobs) width = std::max(width, p.job.size());
  std::string out = fmt::format("{:<{}}  {:>7}  {:<12}  {:>10}  {:>10}  {:>10}  {:>10}\n", "job", width, "devices",
                                "ids", "start", "end", "runtime", "step");
  std::vector<int32_t> order(s.jobs.size());
  for (std::size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int32_t>(j);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return s.jobs[a].start_s < s.jobs[b].start_s; });
  for (int32_t j : order) {
    const Placement& p = s.jobs[j];
    const JobProfile& job = jobs[p.job_index];
    out += fmt::format("{:<{}}  {:>7}  {:<12}  {:>10}  {:>10}  {:>10}  {:>10}", p.job, width, p.num_devices,
                       format_devices(p.devices), format_duration(p.start_s), format_duration(p.end_s),
                       format_duration(p.end_s - p.start_s), format_duration(job.step_time_s.at(p.num_devices)));
    auto plan = job.plan.find(p.num_devices);
    if (plan != job.plan.end()) out += "  " + plan->second;
    out += "\n";
  }
  double busy = 0;
  for (const Placement& p : s.jobs) busy += p.num_devices * (p.end_s - p.start_s);
  out += fmt::format(
      "makespan {} (lower bound {}, {:.2f}x of it), sum of completion times {}, devices busy {:.1f}% of the "
      "makespan\nmethod: {}{}, {:.3f} s\n",
      format_duration(s.makespan_s), format_duration(s.lower_bound_s),
      s.lower_bound_s > 0 ? s.makespan_s / s.lower_bound_s : 0.0, format_duration(s.sum_completion_s),
      s.makespan_s > 0 ? 100.0 * busy / (s.makespan_s * pool.num_devices()) : 0.0, s.method,
      s.optimal ? " (optimal)" : "", s.solve_seconds);
  return out;
}

std::string schedule_json(const Schedule& s, const std::vector<JobProfile>& jobs) {
  json out;
  out["makespan_s"] = s.makespan_s;
  out["sum_completion_s"] = s.sum_completion_s;
  out["lower_bound_s"] = s.lower_bound_s;
  out["method"] = s.method;
  out["optimal"] = s.optimal;
  out["solve_seconds"] = s.solve_seconds;
  out["jobs"] = json::array();
  for (const Placement& p : s.jobs) {
    const JobProfile& job = jobs[p.job_index];
    json j;
    j["name"] = p.job;
    j["devices"] = p.devices;
    j["start_s"] = p.start_s;
    j["end_s"] = p.end_s;
    j["num_devices"] = p.num_devices;
    j["step_time_s"] = job.step_time_s.at(p.num_devices);
    j["steps"] = job.steps;
    auto plan = job.plan.find(p.num_devices);
    if (plan != job.plan.end()) j["plan"] = plan->second;
    out["jobs"].push_back(j);
  }
  return out.dump(1);
}

std::string schedule_perfetto(const Schedule& s, const Pool& pool) {
  json events = json::array();
  for (int32_t node = 0; node < pool.nodes; ++node) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", node}, {"args", {{"name", fmt::format("node {}", node)}}}});
    for (int32_t d = 0; d < pool.devices_per_node; ++d)
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", node},
                        {"tid", pool.device_id(node, d)},
                        {"args", {{"name", fmt::format("device {}", pool.device_id(node, d))}}}});
  }
  for (const Placement& p : s.jobs)
    for (int32_t d : p.devices)
      events.push_back({{"name", p.job},
                        {"ph", "X"},
                        {"pid", d / pool.devices_per_node},
                        {"tid", d},
                        {"ts", p.start_s * 1e6},
                        {"dur", (p.end_s - p.start_s) * 1e6},
                        {"args", {{"devices", p.num_devices}, {"start_s", p.start_s}, {"end_s", p.end_s}}}});
  json out;
  out["traceEvents"] = events;
  out["displayTimeUnit"] = "ms";
  return out.dump();
}

std::string schedule_svg(const Schedule& s, const Pool& pool, const std::string& title) {
  const double left = 90, right = 20, top = 40, row = 22, width = 1100;
  const int32_t devices = pool.num_devices();
  const double plot_w = width - left - right;
  const double height = top + row * devices + 40;
  const double span = s.makespan_s > 0 ? s.makespan_s : 1;
  auto x_of = [&](double t) { return left + plot_w * t / span; };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"20\" font-size=\"14\">{}</text>\n",
      width, height, left, xml_escape(title));
  for (int32_t d = 0; d < devices; ++d)
    out += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">device {}</text>\n", left - 8,
                       top + row * d + row * 0.68, d);
  for (const Placement& p : s.jobs)
    for (int32_t d : p.devices) {
      const double x0 = x_of(p.start_s), x1 = x_of(p.end_s);
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"#333\" "
          "stroke-width=\"0.5\"><title>{} on {} devices, {} to {}</title></rect>\n",
          x0, top + row * d + 1, std::max(0.5, x1 - x0), row - 2, job_colour(p.job_index), xml_escape(p.job),
          p.num_devices, format_duration(p.start_s), format_duration(p.end_s));
      const double chars = (x1 - x0 - 4) / 6.2;  // ~6 px per character at 11 px
      if (chars >= 3) {
        std::string label = p.job.size() <= static_cast<std::size_t>(chars) ? p.job : p.job.substr(0, static_cast<std::size_t>(chars));
        out += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\">{}</text>\n", x0 + 2, top + row * d + row * 0.68,
                           xml_escape(label));
      }
    }
  for (int32_t node = 1; node < pool.nodes; ++node)
    out += fmt::format("<line x1=\"{:.0f}\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\" stroke-width=\"2\"/>\n",
                       left - 60, width - right, top + row * pool.devices_per_node * node,
                       top + row * pool.devices_per_node * node);
  const double axis_y = top + row * devices + 4;
  out += fmt::format("<line x1=\"{:.0f}\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n", left,
                     width - right, axis_y, axis_y);
  for (int32_t k = 0; k <= 10; ++k) {
    const double t = span * k / 10;
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x_of(t), axis_y + 16,
                       format_duration(t));
  }
  out += "</svg>\n";
  return out;
}

}  // namespace tessel::planner
