// tessel/planner/plan_args.hpp — the command line of tessel-plan (examples/plan.cpp), parsed in
// the library so that it is unit-tested. Bad arguments are tessel::UsageError (tessel/cli.hpp)
// naming the flag, the text and what it expects.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel::planner {

struct PlanArgs {
  std::string jobs_file;           // JOBS.json (or empty with --gavel)
  std::string pool_file;           // --pool POOL.json
  int32_t pool_nodes = 0;          // --pool-shape NxD instead of a file (0: not given)
  int32_t pool_devices_per_node = 0;
  std::string gavel_dir;           // --gavel DIR: Gavel's trace and rates as the jobs
  std::string gpu = "v100";        // --gpu (with --gavel)
  bool clamp_superlinear = true;   // --no-clamp (with --gavel)
  int32_t max_jobs = -1;           // --jobs N: the first N jobs
  std::string objective = "makespan";  // --objective makespan|sum
  std::string method = "auto";     // --method auto|fast|exact|bnb
  double seconds = 1.0;            // --seconds S: the planner's time limit
  uint64_t seed = 1;               // --seed N
  int64_t iterations = -1;         // --iterations N: the fast method's local-search moves
  bool baselines = false;          // --baselines
  std::string json_out;            // --json PLAN.json
  std::string profiles_out;        // --profiles JOBS.json: every job as a profiled job (model jobs' step times as measured)
  std::string trace_out = "tessel-plan.trace.json";  // --trace PATH
  std::string svg_out = "tessel-plan.svg";           // --svg PATH
  bool pictures = true;            // --no-pictures: neither trace nor SVG
  bool measure = true;             // --no-measure: model jobs by prediction only (no trial steps)
  bool verbose = false;            // --verbose: every model job's candidates, predicted and measured
  bool run = false;                // --run: run the planned model jobs on this machine's CPU devices
  bool run_baselines = false;      // --run-baselines: with --run, run the three baselines too
  double replan_every = 0;         // --replan-every S: with --run, re-plan the rest every S seconds
  std::string checkpoint_dir = "tessel-plan-checkpoints";  // --checkpoint-dir: moved jobs' states
  double progress_every = 2;       // --progress-every S: with --run, progress lines (0: none)
  std::string backend = "cpu";     // --backend cpu|cuda: with --run under mpirun, what each job runs on
  bool help = false;
};

PlanArgs parse_plan_args(const std::vector<std::string>& args);
std::string usage_plan();

}  // namespace tessel::planner
