// tessel/planner/jobs.hpp — what the multi-job planner plans: jobs and the pool of devices.
//
// A job, to the planner, is its profile: how many steps it has left and how long one step takes
// (and how many bytes a device holds) on each device count it may use. A profile comes from one
// of three places:
//  - written by the user or measured elsewhere (a "profiled job" in the job file);
//  - Gavel's measured step rates (read_gavel_trace, for the simulated benchmark);
//  - a tessel training step planned by the cost model for every device count and confirmed by
//    timing a few real steps (planner/model_job.hpp).
// A pool is nodes x devices per node, with the memory of one device and the links' figures.
// A job runs on devices of one node unless it may span nodes; a spanning job takes whole nodes.
//
// Job file (JSON): {"jobs": [ {"name": "a", "steps": 1000,
//                              "step_time_s": {"1": 0.9, "2": 0.5, "4": 0.3},
//                              "peak_bytes": {"1": 9e9, "2": 5e9, "4": 3e9}}, ... ]}
// Pool file (JSON): {"nodes": 2, "devices_per_node": 8, "memory_bytes": 8e10}
// (optional: "intra_node_gbps", "inter_node_gbps", "allow_spanning", "cores").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessel::planner {

// The most devices a pool may have (nodes x devices_per_node): device counts are 32-bit.
inline constexpr int64_t kMaxPoolDevices = int64_t{1} << 20;

struct Pool {
  int32_t nodes = 1;
  int32_t devices_per_node = 8;
  double memory_bytes = 0;          // per device; 0 = not checked
  double intra_node_gbps = 0;       // per-level link figures, for model jobs' cost model (0 = the
  double inter_node_gbps = 0;       // cost model's defaults)
  bool allow_spanning = false;      // every job may span whole nodes (else only jobs that say so)
  // A pool of CPU virtual devices sharing this many cores (0: every device computes on its
  // own, as GPUs do). predict_shared_cores prices a plan with it.
  int32_t cores = 0;
  int32_t num_devices() const { return nodes * devices_per_node; }  // <= kMaxPoolDevices (checked on read)
  // Global device id of device d of node n (node-major).
  int32_t device_id(int32_t node, int32_t d) const { return node * devices_per_node + d; }
};

struct JobProfile {
  std::string name;
  int64_t steps = 0;                         // steps left to run
  std::map<int32_t, double> step_time_s;     // device count -> seconds per step
  std::map<int32_t, double> peak_bytes;      // device count -> bytes per device (optional)
  std::map<int32_t, std::string> plan;       // device count -> the layout chosen (model jobs)
  int32_t requested_devices = 0;             // what the job asked for (0 = none; baselines)
  bool may_span_nodes = false;
  // Seconds on g devices: steps * step_time_s[g]. Throws if g is not one of its counts.
  double runtime_s(int32_t g) const;
};

// One entry of a job file. A profiled job has its step times; a model job (an entry with a
// "gpt" or "train_step" key) keeps its JSON text in model_json and has only its name and steps
// in profile until planner/model_job.hpp plans it for each device count.
struct JobEntry {
  JobProfile profile;
  std::string model_json;
  bool is_model() const { return !model_json.empty(); }
};

// Reads a job file / pool file (formats above). Errors (PlanError) name the file, the job (by
// its place in the file and its name: "job 3 'gpt-a'") and the field; a field not in the format
// is one, at every level, naming the known fields and a close match. Every field of a model
// entry is checked here too (parse_model_job), so a bad job is refused before any is profiled.
// read_jobs_json and parse_jobs_json accept profiled jobs only.
std::vector<JobEntry> read_job_file(const std::string& path);
std::vector<JobEntry> parse_job_file(const std::string& text, const std::string& origin);
std::vector<JobProfile> read_jobs_json(const std::string& path);
std::vector<JobProfile> parse_jobs_json(const std::string& text, const std::string& origin);
Pool read_pool_json(const std::string& path);
Pool parse_pool_json(const std::string& text, const std::string& origin);
std::string jobs_to_json(const std::vector<JobProfile>& jobs);

// Gavel's trace (minimize_makespan.trace) with its measured rates (simulation_throughputs.json)
// for one GPU kind ("v100", "p100", "k80"): a profile per job, step_time_s[g] = 1 / rate(g) for
// g in 1, 2, 4, 8 where measured, requested_devices = the trace's scale factor. With
// clamp_superlinear, a rate above g x rate(1) is lowered to g x rate(1) (some measured multi-GPU
// rates scale better than linearly; clamped by default, see docs/planner.md).
struct GavelOptions {
  std::string gpu = "v100";
  bool clamp_superlinear = true;
  int32_t max_jobs = -1;   // the first max_jobs jobs of the trace (-1 = all)
};
std::vector<JobProfile> read_gavel_trace(const std::string& trace_path, const std::string& throughputs_path,
                                         const GavelOptions& options = {});

// The device counts a job may use in a pool: its profiled counts that fit one node (or whole
// nodes when it may span) and, when the pool's memory is known, whose peak bytes fit.
std::vector<int32_t> usable_counts(const JobProfile& job, const Pool& pool);

}  // namespace tessel::planner
