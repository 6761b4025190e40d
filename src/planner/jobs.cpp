// Jobs and pools for the multi-job planner: the JSON files, Gavel's trace, the usable counts
// (tessel/planner/jobs.hpp).
#include "tessel/planner/jobs.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../core/known_fields.hpp"
#include "tessel/core/common.hpp"
#include "tessel/planner/model_job.hpp"

namespace tessel::planner {

using json = nlohmann::json;

namespace {

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw PlanError(fmt::format("cannot open the {} '{}': check the path", what, path));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse(const std::string& text, const std::string& origin) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw PlanError(fmt::format("{}: not valid JSON ({})", origin, e.what()));
  }
}

// The fields of a profiled job entry (a model job's are model_job.cpp's); jobs_to_json writes
// only these.
const std::vector<std::string> kProfiledJobKeys = {"name",       "steps",         "step_time_s",
                                                   "peak_bytes", "may_span_nodes", "requested_devices"};
const std::vector<std::string> kPoolKeys = {"nodes",           "devices_per_node", "memory_bytes", "intra_node_gbps",
                                            "inter_node_gbps", "allow_spanning",   "cores"};

// {"1": 0.9, "2": 0.5} -> {1: 0.9, 2: 0.5}, every key a positive device count and every value
// positive and finite. `where` names the file and the job.
std::map<int32_t, double> count_map(const json& j, const std::string& where, const char* field) {
  if (!j.is_object())
    throw PlanError(fmt::format("{}: \"{}\" must be an object from device count to a number, e.g. "
                                "{{\"1\": 0.9, \"2\": 0.5}}",
                                where, field));
  std::map<int32_t, double> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    int32_t g = 0;
    std::size_t used = 0;
    try {
      g = std::stoi(it.key(), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != it.key().size() || g <= 0)
      throw PlanError(fmt::format("{}: \"{}\" has the key \"{}\", which is not a positive device count", where,
                                  field, it.key()));
    if (!it.value().is_number() || !(it.value().get<double>() > 0) || !std::isfinite(it.value().get<double>()))
      throw PlanError(fmt::format("{}: \"{}\"[\"{}\"] = {} must be a positive number", where, field, it.key(),
                                  it.value().dump()));
    out[g] = it.value().get<double>();
  }
  return out;
}

// Entry `index` of a job file. Errors name the file and the job, counted from 1: "job 3 'gpt-a'".
JobEntry parse_entry(const json& j, std::size_t index, const std::string& origin) {
  if (!j.is_object())
    throw PlanError(fmt::format("{}: job {} is {}, not an object ({{\"name\": ..., \"steps\": ..., ...}})", origin,
                                index + 1, j.dump()));
  JobEntry e;
  JobProfile& p = e.profile;
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
    throw PlanError(fmt::format("{}: job {} needs a \"name\" (a non-empty string)", origin, index + 1));
  p.name = j["name"].get<std::string>();
  const std::string where = fmt::format("{}: job {} '{}'", origin, index + 1, p.name);
  const bool model = j.contains("gpt") || j.contains("train_step");
  if (model) {
    if (j.contains("step_time_s"))
      throw PlanError(fmt::format("{} has both a model (\"gpt\"/\"train_step\") and \"step_time_s\": give one (a "
                                  "model job's step times come from its plans)",
                                  where));
    // Every field of a model job is checked here, as the file is read, not when the job's turn to
    // be profiled comes: tessel-plan then refuses a bad job before it spends seconds profiling
    // the others.
    const ModelJob m = parse_model_job(j.dump(), origin, index);
    p.steps = m.steps;
    p.may_span_nodes = m.may_span_nodes;
    p.requested_devices = m.requested_devices;
    e.model_json = j.dump();
    return e;
  }
  if (const std::string bad = unknown_field(j, kProfiledJobKeys); !bad.empty())
    throw PlanError(fmt::format("{}: {}; a model job, one with \"gpt\", takes more (docs/planner.md)", where, bad));
  if (!j.contains("steps") || !j["steps"].is_number_integer() || j["steps"].get<int64_t>() <= 0)
    throw PlanError(fmt::format("{} needs \"steps\", a positive integer (got {})", where,
                                j.contains("steps") ? j["steps"].dump() : std::string("nothing")));
  p.steps = j["steps"].get<int64_t>();
  if (j.contains("may_span_nodes")) {
    if (!j["may_span_nodes"].is_boolean())
      throw PlanError(fmt::format("{}: \"may_span_nodes\" = {} must be true or false", where,
                                  j["may_span_nodes"].dump()));
    p.may_span_nodes = j["may_span_nodes"].get<bool>();
  }
  if (j.contains("requested_devices")) {
    if (!j["requested_devices"].is_number_integer() || j["requested_devices"].get<int64_t>() < 0 ||
        j["requested_devices"].get<int64_t>() > (1 << 20))
      throw PlanError(fmt::format("{}: \"requested_devices\" = {} must be an integer >= 0", where,
                                  j["requested_devices"].dump()));
    p.requested_devices = j["requested_devices"].get<int32_t>();
  }
  if (!j.contains("step_time_s"))
    throw PlanError(fmt::format("{} needs \"step_time_s\" (seconds per step by device count) or a model (\"gpt\")",
                                where));
  p.step_time_s = count_map(j["step_time_s"], where, "step_time_s");
  if (p.step_time_s.empty()) throw PlanError(fmt::format("{}: \"step_time_s\" is empty", where));
  if (j.contains("peak_bytes")) {
    p.peak_bytes = count_map(j["peak_bytes"], where, "peak_bytes");
    for (const auto& [g, b] : p.peak_bytes)
      if (!p.step_time_s.count(g))
        throw PlanError(fmt::format("{}: \"peak_bytes\" has {} devices, which \"step_time_s\" lacks", where, g));
  }
  return e;
}

}  // namespace

double JobProfile::runtime_s(int32_t g) const {
  auto it = step_time_s.find(g);
  if (it == step_time_s.end())
    throw PlanError(fmt::format("job '{}' has no step time on {} devices", name, g));
  return static_cast<double>(steps) * it->second;
}

std::vector<JobEntry> parse_job_file(const std::string& text, const std::string& origin) {
  const json j = parse(text, origin);
  if (const std::string bad = unknown_field(j, {"jobs"}); !bad.empty())
    throw PlanError(fmt::format("{}: {} at the top level (a job file is {{\"jobs\": [ ... ]}})", origin, bad));
  if (!j.is_object() || !j.contains("jobs") || !j["jobs"].is_array())
    throw PlanError(fmt::format("{}: a job file is {{\"jobs\": [ ... ]}}", origin));
  std::vector<JobEntry> out;
  for (std::size_t i = 0; i < j["jobs"].size(); ++i) {
    out.push_back(parse_entry(j["jobs"][i], i, origin));
    for (std::size_t k = 0; k + 1 < out.size(); ++k)
      if (out[k].profile.name == out.back().profile.name)
        throw PlanError(fmt::format("{}: two jobs are named '{}': names must be unique", origin, out.back().profile.name));
  }
  if (out.empty()) throw PlanError(fmt::format("{}: \"jobs\" is empty", origin));
  return out;
}

std::vector<JobEntry> read_job_file(const std::string& path) { return parse_job_file(read_text(path, "job file"), path); }

std::vector<JobProfile> parse_jobs_json(const std::string& text, const std::string& origin) {
  std::vector<JobProfile> out;
  for (JobEntry& e : parse_job_file(text, origin)) {
    if (e.is_model())
      throw PlanError(fmt::format("{}: job '{}' is a model job: plan it first (planner/model_job.hpp, or tessel-plan)",
                                  origin, e.profile.name));
    out.push_back(std::move(e.profile));
  }
  return out;
}

std::vector<JobProfile> read_jobs_json(const std::string& path) { return parse_jobs_json(read_text(path, "job file"), path); }

Pool parse_pool_json(const std::string& text, const std::string& origin) {
  const json j = parse(text, origin);
  if (!j.is_object()) throw PlanError(fmt::format("{}: a pool is {{\"nodes\": N, \"devices_per_node\": D, ...}}", origin));
  if (const std::string bad = unknown_field(j, kPoolKeys, "pool field"); !bad.empty())
    throw PlanError(fmt::format("{}: {}", origin, bad));
  Pool p;
  auto positive_int = [&](const char* key, int32_t& dst) {
    if (!j.contains(key)) throw PlanError(fmt::format("{}: the pool needs \"{}\", a positive integer", origin, key));
    if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > (1 << 20))
      throw PlanError(fmt::format("{}: \"{}\" = {} must be a positive integer", origin, key, j[key].dump()));
    dst = j[key].get<int32_t>();
  };
  auto nonneg = [&](const char* key, double& dst) {
    if (!j.contains(key)) return;
    if (!j[key].is_number() || !(j[key].get<double>() >= 0) || !std::isfinite(j[key].get<double>()))
      throw PlanError(fmt::format("{}: \"{}\" = {} must be a number >= 0", origin, key, j[key].dump()));
    dst = j[key].get<double>();
  };
  positive_int("nodes", p.nodes);
  positive_int("devices_per_node", p.devices_per_node);
  // The devices are counted (and placed) in 32 bits: a pool past 2^20 devices overflowed into
  // "internal: no makespan bound found" (issue 37 D11).
  if (static_cast<int64_t>(p.nodes) * p.devices_per_node > kMaxPoolDevices)
    throw PlanError(fmt::format("{}: {} nodes of {} devices is {} devices; a pool has at most {}", origin, p.nodes,
                                p.devices_per_node, static_cast<int64_t>(p.nodes) * p.devices_per_node,
                                kMaxPoolDevices));
  nonneg("memory_bytes", p.memory_bytes);
  nonneg("intra_node_gbps", p.intra_node_gbps);
  nonneg("inter_node_gbps", p.inter_node_gbps);
  if (j.contains("allow_spanning")) {
    if (!j["allow_spanning"].is_boolean())
      throw PlanError(fmt::format("{}: \"allow_spanning\" = {} must be true or false", origin,
                                  j["allow_spanning"].dump()));
    p.allow_spanning = j["allow_spanning"].get<bool>();
  }
  if (j.contains("cores")) {
    if (!j["cores"].is_number_integer() || j["cores"].get<int64_t>() < 0 || j["cores"].get<int64_t>() > (1 << 20))
      throw PlanError(fmt::format("{}: \"cores\" = {} must be an integer >= 0", origin, j["cores"].dump()));
    p.cores = j["cores"].get<int32_t>();
  }
  return p;
}

Pool read_pool_json(const std::string& path) { return parse_pool_json(read_text(path, "pool file"), path); }

std::string jobs_to_json(const std::vector<JobProfile>& jobs) {
  json out = json::object();
  out["jobs"] = json::array();
  for (const JobProfile& p : jobs) {
    json j;
    j["name"] = p.name;
    j["steps"] = p.steps;
    json st = json::object(), pb = json::object();
    for (const auto& [g, t] : p.step_time_s) st[std::to_string(g)] = t;
    for (const auto& [g, b] : p.peak_bytes) pb[std::to_string(g)] = b;
    j["step_time_s"] = st;
    if (!p.peak_bytes.empty()) j["peak_bytes"] = pb;
    if (p.requested_devices > 0) j["requested_devices"] = p.requested_devices;
    if (p.may_span_nodes) j["may_span_nodes"] = true;
    out["jobs"].push_back(j);
  }
  return out.dump(1);
}

std::vector<JobProfile> read_gavel_trace(const std::string& trace_path, const std::string& throughputs_path,
                                         const GavelOptions& options) {
  for (const std::string& path : {throughputs_path, trace_path}) {
    std::ifstream probe(path);
    if (!probe)
      throw PlanError(fmt::format(
          "cannot open Gavel's file '{}': --gavel DIR needs minimize_makespan.trace and "
          "simulation_throughputs.json in DIR. They come from github.com/stanford-futuredata/gavel "
          "(scheduler/traces/physical_cluster/minimize_makespan.trace and "
          "scheduler/simulation_throughputs.json, MIT): copy both into one folder and pass it",
          path));
  }
  const json rates = parse(read_text(throughputs_path, "Gavel throughputs file"), throughputs_path);
  if (!rates.contains(options.gpu))
    throw PlanError(fmt::format("{}: no GPU kind '{}' (it has k80, p100, v100 and their *_unconsolidated)",
                                throughputs_path, options.gpu));
  const json& table = rates[options.gpu];
  std::istringstream lines(read_text(trace_path, "Gavel trace"));
  std::vector<JobProfile> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.empty()) continue;
    if (options.max_jobs >= 0 && static_cast<int32_t>(out.size()) >= options.max_jobs) break;
    std::vector<std::string> f;
    std::istringstream ls(line);
    for (std::string cell; std::getline(ls, cell, '\t');) f.push_back(cell);
    if (f.size() < 7)
      throw PlanError(fmt::format("{}:{}: a trace line has 10 tab-separated fields, this one {}", trace_path, line_no,
                                  f.size()));
    JobProfile p;
    p.name = fmt::format("j{:02d} {}", out.size(), f[0]);
    try {
      p.steps = std::stoll(f[5]);
      p.requested_devices = std::stoi(f[6]);
    } catch (const std::exception&) {
      throw PlanError(fmt::format("{}:{}: fields 6 and 7 (steps, scale factor) must be integers", trace_path, line_no));
    }
    double rate1 = 0;
    for (int32_t g : {1, 2, 4, 8}) {
      const std::string key = fmt::format("('{}', {})", f[0], g);
      if (!table.contains(key)) continue;
      double r = table[key]["null"].get<double>();
      if (!(r > 0)) continue;
      if (g == 1) rate1 = r;
      if (options.clamp_superlinear && rate1 > 0 && r > g * rate1) r = g * rate1;
      p.step_time_s[g] = 1.0 / r;
    }
    if (p.step_time_s.empty())
      throw PlanError(fmt::format("{}:{}: job type '{}' has no rate on {} in {}", trace_path, line_no, f[0],
                                  options.gpu, throughputs_path));
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<int32_t> usable_counts(const JobProfile& job, const Pool& pool) {
  std::vector<int32_t> out;
  const bool span = job.may_span_nodes || pool.allow_spanning;
  for (const auto& [g, t] : job.step_time_s) {
    (void)t;
    const bool fits_node = g <= pool.devices_per_node;
    const bool whole_nodes = span && g % pool.devices_per_node == 0 && g <= pool.num_devices();
    if (!fits_node && !whole_nodes) continue;
    if (pool.memory_bytes > 0) {
      auto it = job.peak_bytes.find(g);
      if (it != job.peak_bytes.end() && it->second > pool.memory_bytes) continue;
    }
    out.push_back(g);
  }
  return out;
}

}  // namespace tessel::planner
