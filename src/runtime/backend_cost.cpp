// backend_cost_model (tessel/runtime/backend_cost.hpp): the figures of the machine a program runs
// on, measured once per machine, runtime and mesh and kept in a cache file.
#include "tessel/runtime/backend_cost.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tessel/core/common.hpp"

namespace tessel {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "tessel cost model v3";  // v2: dispatch_s and run_s; v3: launch_s

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const std::size_t c = line.find(':');
      if (c != std::string::npos) {
        std::string m = line.substr(c + 1);
        m.erase(0, m.find_first_not_of(" \t"));
        return m;
      }
    }
  return "unknown CPU";
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown host";
  return buf;
}

// A file name of [A-Za-z0-9=,._-] only: "{data=2, model=2}" -> "data=2,model=2".
std::string file_safe(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '{' || c == '}' || c == ' ') continue;
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '=' || c == ',' || c == '.' || c == '-' ? c : '_';
  }
  return out;
}

std::string serialize(const CostModel& c, const std::string& header) {
  std::string out = fmt::format("# {}\n# {}\n", kFormat, header);
  out += fmt::format("flops_per_s={:.17g}\nmemory_bandwidth={:.17g}\ncompute_sharing={:.17g}\ndispatch_s={:.17g}\nrun_s={:.17g}\n"
                     "launch_s={:.17g}\n",
                     c.flops_per_s, c.memory_bandwidth, c.compute_sharing, c.dispatch_s, c.run_s, c.launch_s);
  for (const auto& [axis, l] : c.links)
    out += fmt::format("{}=bw:{:.17g},alpha:{:.17g}\n", axis, l.bandwidth, l.alpha_s);
  return out;
}

// Throws Error naming the line when `text` is not a cost model this file wrote.
CostModel parse(const std::string& text) {
  std::istringstream in(text);
  std::string line, links;
  CostModel c;
  bool format = false, flops = false, bw = false, sharing = false, dispatch = false, run = false, launch = false;
  while (std::getline(in, line)) {
    if (line == std::string("# ") + kFormat) format = true;
    if (line.empty() || line[0] == '#') continue;
    auto value = [&](const char* key, double& out) {
      const std::string k = std::string(key) + "=";
      if (line.rfind(k, 0) != 0) return false;
      try {
        std::size_t used = 0;
        out = std::stod(line.substr(k.size()), &used);
        if (used != line.size() - k.size()) throw std::invalid_argument(line);
      } catch (const std::exception&) {
        throw Error(fmt::format("'{}' is not a number", line));
      }
      return true;
    };
    if (value("flops_per_s", c.flops_per_s)) flops = true;
    else if (value("memory_bandwidth", c.memory_bandwidth)) bw = true;
    else if (value("compute_sharing", c.compute_sharing)) sharing = true;
    else if (value("dispatch_s", c.dispatch_s)) dispatch = true;
    else if (value("run_s", c.run_s)) run = true;
    else if (value("launch_s", c.launch_s)) launch = true;
    else links += line + "\n";
  }
  if (!format) throw Error(fmt::format("no '# {}' line", kFormat));
  if (!flops || !bw || !sharing || !dispatch || !run || !launch)
    throw Error("flops_per_s, memory_bandwidth, compute_sharing, dispatch_s, run_s or launch_s is missing");
  c.parse_links(links);
  c.validate();
  return c;
}

}  // namespace

std::string default_cost_cache_dir() {
  if (std::string d = env("TESSEL_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/tessel";
  if (std::string d = env("HOME"); !d.empty()) return d + "/.cache/tessel";
  return "";
}

std::string machine_description() {
  return fmt::format("{}, {} hardware threads, host {}", cpu_model(), std::thread::hardware_concurrency(), host_name());
}

BackendCost backend_cost_model(Runtime& runtime, const Mesh& mesh, const BackendCostOptions& options) {
  BackendCost out;
  const std::string name = runtime.name();
  if (name.rfind("cuda", 0) == 0) {
    out.source = fmt::format("the GPU figures of the cost model (an H100 SXM: {:.4g} TFLOP/s, {:.4g} TB/s, links {:.4g} GB/s; "
                             "docs/links.md)",
                             out.cost.flops_per_s / 1e12, out.cost.memory_bandwidth / 1e12,
                             out.cost.default_link.bandwidth / 1e9);
    return out;
  }
  const std::string machine = machine_description();
  const std::string key = fmt::format("{}|{}|{}|{}|{}", kFormat, machine, name, mesh.to_string(), runtime.process_count());
  const std::string dir = options.use_cache ? (options.cache_dir.empty() ? default_cost_cache_dir() : options.cache_dir) : "";
  const std::string file =
      dir.empty() ? "" : fmt::format("{}/cost-{}-{}-{:016x}.txt", dir, file_safe(name), file_safe(mesh.to_string()), fnv1a_64(key));
  const bool leader = runtime.process_rank() == 0;
  // Rank 0 reads the cache; every process learns whether it hit (and rank 0's text).
  std::string text, why_not_read;
  if (leader && !file.empty()) {
    std::ifstream f(file, std::ios::binary);
    if (f) {
      std::ostringstream ss;
      ss << f.rdbuf();
      try {
        parse(ss.str());
        text = ss.str();
      } catch (const Error& e) {
        why_not_read = fmt::format("{} was unreadable ({}) and is replaced", file, e.what());
      }
    }
  }
  std::vector<std::string> shared = runtime.allgather_host(text);
  text = shared.empty() ? text : shared[0];
  std::string why_not_saved;
  if (text.empty()) {  // a miss: every process measures (the link calibration is collective)
    const CostModel measured = measured_cost_model(runtime, mesh, options.calibration);
    std::string mine = serialize(measured, fmt::format("measured by backend_cost_model on {}; runtime {}, mesh {}, {} "
                                                       "process(es)",
                                                       machine, name, mesh.to_string(), runtime.process_count()));
    shared = runtime.allgather_host(mine);
    text = shared.empty() ? mine : shared[0];  // rank 0's, on every process
    out.measured_now = true;
    if (leader && !file.empty()) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      const std::string tmp = fmt::format("{}.tmp.{}", file, ::getpid());
      {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << text;
        if (!f.flush()) why_not_saved = fmt::format("cannot write {}", tmp);
      }
      if (why_not_saved.empty()) {
        fs::rename(tmp, file, ec);
        if (ec) why_not_saved = fmt::format("cannot rename {} to {}: {}", tmp, file, ec.message());
      }
      if (!why_not_saved.empty()) std::remove(tmp.c_str());
    }
  }
  out.cost = parse(text);
  out.cache_file = why_not_saved.empty() ? file : "";
  std::string where;
  if (file.empty()) where = options.use_cache ? "measured now; not cached: no cache directory ($TESSEL_CACHE_DIR, "
                                                "$XDG_CACHE_HOME or $HOME)"
                                              : "measured now, not cached";
  else if (!out.measured_now) where = "read from " + file;
  else if (!why_not_saved.empty()) where = "measured now; not cached: " + why_not_saved;
  else where = "measured now and saved in " + file + (why_not_read.empty() ? "" : "; " + why_not_read);
  out.source = fmt::format("this machine's measured figures ({}: {:.3g} GFLOP/s and {:.3g} GB/s per device, sharing {:.3g}, "
                           "dispatch {:.3g} us per instruction, {:.3g} us per run ({:.3g} us of it the launch); {})",
                           machine, out.cost.flops_per_s / 1e9, out.cost.memory_bandwidth / 1e9,
                           out.cost.compute_sharing, out.cost.dispatch_s * 1e6, out.cost.run_s * 1e6,
                           out.cost.launch_s * 1e6, where);
  return out;
}

}  // namespace tessel
