// Cost model: α–β per collective with ring factors, roofline per op.
#include "tessel/core/cost.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "tessel/core/common.hpp"
#include "known_fields.hpp"

namespace tessel {

LinkSpec CostModel::link(const std::vector<std::string>& axes) const {
  if (axes.empty()) return default_link;
  LinkSpec out{0, 0};
  bool first = true;
  for (const auto& a : axes) {
    auto it = links.find(a);
    LinkSpec l = it == links.end() ? default_link : it->second;
    out.alpha_s = std::max(out.alpha_s, l.alpha_s);
    out.bandwidth = first ? l.bandwidth : std::min(out.bandwidth, l.bandwidth);
    first = false;
  }
  return out;
}

double CostModel::ring_factor(CollectiveKind k, int64_t n) { return collective_ring_factor(k, n); }

double CostModel::collective_seconds(CollectiveKind k, const Mesh& mesh,
                                     const std::vector<std::string>& axes, int64_t bytes) const {
  const bool pairs = collective_info(k).over_pairs;  // a permute moves between two devices
  int64_t n = pairs ? 2 : mesh.axes_size(axes);
  if (n <= 1 && !pairs) return 0;
  LinkSpec l = link(axes);
  return l.alpha_s + static_cast<double>(bytes) * ring_factor(k, n) / l.bandwidth;
}

double CostModel::op_seconds(double flops, double bytes) const {
  return std::max(flops / flops_per_s, bytes / memory_bandwidth) * compute_sharing;
}

double CostModel::dispatch_seconds() const { return dispatch_s * compute_sharing; }

void CostModel::validate() const {
  const auto positive = [](const char* what, double v) {
    if (!std::isfinite(v) || v <= 0)
      throw Error(fmt::format("cost model: {} must be a finite number > 0, got {}", what, v));
  };
  positive("flops_per_s", flops_per_s);
  positive("memory_bandwidth", memory_bandwidth);
  if (!std::isfinite(dispatch_s) || dispatch_s < 0)
    throw Error(fmt::format("cost model: dispatch_s must be a finite number >= 0 seconds, got {}", dispatch_s));
  if (!std::isfinite(run_s) || run_s < 0)
    throw Error(fmt::format("cost model: run_s must be a finite number >= 0 seconds, got {}", run_s));
  if (!std::isfinite(launch_s) || launch_s < 0 || launch_s > run_s)
    throw Error(fmt::format("cost model: launch_s must be a finite number of seconds in [0, run_s = {}], got {}", run_s,
                            launch_s));
  if (!std::isfinite(compute_sharing) || compute_sharing < 1)
    throw Error(fmt::format("cost model: compute_sharing must be a finite number >= 1 (device programs per "
                            "device's worth of compute), got {}", compute_sharing));
  const auto link_ok = [&](const std::string& what, const LinkSpec& l) {
    positive((what + " bandwidth").c_str(), l.bandwidth);
    if (!std::isfinite(l.alpha_s) || l.alpha_s < 0)
      throw Error(fmt::format("cost model: {} alpha must be a finite number >= 0 seconds, got {}", what, l.alpha_s));
  };
  link_ok("default link", default_link);
  for (const auto& kv : links) link_ok("link '" + kv.first + "'", kv.second);
}

double compute_sharing(int64_t devices, int64_t cores) {
  if (devices < 1) throw Error(fmt::format("compute_sharing: devices must be >= 1, got {}", devices));
  if (cores <= 0 || devices <= cores) return 1;
  return static_cast<double>(devices) / static_cast<double>(cores);
}

void CostModel::parse_links(std::string_view spec_in) {
  // axis=key:value,key:value;axis=...  — ';' or a newline between entries, '#' starts a
  // comment that runs to the end of the line (the file form, docs/links.md).
  std::string spec;
  spec.reserve(spec_in.size());
  for (std::size_t i = 0; i < spec_in.size(); ++i) {
    if (spec_in[i] == '#') {
      while (i < spec_in.size() && spec_in[i] != '\n') ++i;
      spec += ';';
      continue;
    }
    spec += spec_in[i] == '\n' ? ';' : spec_in[i];
  }
  std::size_t b = 0;
  while (b < spec.size()) {
    std::size_t e = spec.find(';', b);
    std::string part(spec.substr(b, e == std::string::npos ? std::string::npos : e - b));
    b = e == std::string::npos ? spec.size() : e + 1;
    const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
    while (!part.empty() && blank(part.back())) part.pop_back();
    std::size_t lead = 0;
    while (lead < part.size() && blank(part[lead])) ++lead;
    part.erase(0, lead);
    if (part.empty()) continue;
    auto eq = part.find('=');
    if (eq == std::string::npos)
      throw Error(fmt::format("link spec '{}': expected axis=bw:<bytes/s>,alpha:<seconds>", part));
    std::string axis = part.substr(0, eq);
    if (axis.empty())
      throw Error(fmt::format("link spec '{}': the axis name is missing (axis=bw:<bytes/s>)", part));
    LinkSpec l = default_link;
    std::string rest = part.substr(eq + 1);
    std::size_t c = 0;
    while (c < rest.size()) {
      std::size_t ce = rest.find(',', c);
      std::string kv = rest.substr(c, ce == std::string::npos ? std::string::npos : ce - c);
      c = ce == std::string::npos ? rest.size() : ce + 1;
      auto colon = kv.find(':');
      if (colon == std::string::npos)
        throw Error(fmt::format("link spec '{}': expected key:value, got '{}'", part, kv));
      std::string key = kv.substr(0, colon);
      // The whole value must be a finite number: std::stod would accept "nan", "inf" and
      // "5e9xyz", and a NaN bandwidth printed comm_s=nan.
      const std::string text = kv.substr(colon + 1);
      char* end = nullptr;
      const double val = text.empty() || std::isspace(static_cast<unsigned char>(text[0]))
                             ? 0.0
                             : std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size() || text.empty())
        throw Error(fmt::format("link spec '{}': '{}' is not a number", part, text));
      if (!std::isfinite(val))
        throw Error(fmt::format("link spec '{}': {} must be a finite number, got '{}'", part, key, text));
      if (val <= 0 && key == "bw")
        throw Error(fmt::format("link spec '{}': bw must be > 0 bytes/s", part));
      if (val < 0 && key == "alpha")
        throw Error(fmt::format("link spec '{}': alpha must be >= 0 seconds", part));
      if (key == "bw") l.bandwidth = val;
      else if (key == "alpha") l.alpha_s = val;
      else
        throw Error(fmt::format("link spec '{}': {}", part, unknown_key_message(key, {"bw", "alpha"}, "key", '\'')));
    }
    links[axis] = l;
  }
}

std::string read_links_file(const std::string& path) {
  check_not_directory(path, "the link figures file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("cannot read the link figures file '{}' (does it exist?)", path));
  // A link file is a few lines: read at most 1 MiB, so that a wrong path (/dev/zero, a
  // dataset) fails at once instead of filling memory.
  constexpr std::size_t kMax = std::size_t{1} << 20;
  std::string text(kMax + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (f.bad()) throw Error(fmt::format("error reading the link figures file '{}'", path));
  text.resize(static_cast<std::size_t>(f.gcount()));
  if (text.size() > kMax)
    throw Error(fmt::format("'{}' is larger than 1 MiB: not a link figures file (docs/links.md)", path));
  return text;
}

bool operator==(const LinkSpec& a, const LinkSpec& b) { return a.alpha_s == b.alpha_s && a.bandwidth == b.bandwidth; }

bool operator==(const CostModel& a, const CostModel& b) {
  return a.flops_per_s == b.flops_per_s && a.memory_bandwidth == b.memory_bandwidth &&
         a.default_link == b.default_link && a.links == b.links && a.dispatch_s == b.dispatch_s && a.run_s == b.run_s &&
         a.launch_s == b.launch_s && a.compute_sharing == b.compute_sharing;
}

std::string format_links(const std::map<std::string, LinkSpec>& links) {
  std::string out;
  for (const auto& kv : links)
    out += fmt::format("{}=bw:{:.6g},alpha:{:.6g}\n", kv.first, kv.second.bandwidth, kv.second.alpha_s);
  return out;
}

}  // namespace tessel
