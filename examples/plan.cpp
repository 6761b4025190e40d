// tessel-plan — plans a batch of training jobs on one pool of devices (docs/planner.md).
//
//   tessel-plan JOBS.json --pool POOL.json [--baselines] [--json PLAN.json]
//   tessel-plan --gavel ../shared/benchmarks/multijob-gavel --pool-shape 1x8 --baselines
//
// Prints the plan as a table (and the baselines beside it with --baselines), writes it as a
// Perfetto trace and an SVG Gantt chart, and with --json as {"makespan_s": ..., "jobs": [...]}.
// Exit status: 0 with a plan; 1 when the jobs cannot be planned (a job no device count fits; the
// message names it); 2 for bad arguments.
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tessel/cli.hpp"
#include "tessel/core/common.hpp"
#include "tessel/planner/jobs.hpp"
#include "tessel/planner/model_job.hpp"
#include "tessel/planner/plan_args.hpp"
#include "tessel/planner/schedule.hpp"
#include "tessel/planner/show.hpp"

namespace {

using namespace tessel::planner;

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw tessel::Error(fmt::format("cannot write the {} to '{}'", what, path));
  fmt::print("wrote the {} to {}\n", what, path);
}

std::vector<JobProfile> load_jobs(const PlanArgs& a, const Pool& pool, double& trial_seconds) {
  if (!a.gavel_dir.empty()) {
    GavelOptions g;
    g.gpu = a.gpu;
    g.clamp_superlinear = a.clamp_superlinear;
    g.max_jobs = a.max_jobs;
    return read_gavel_trace(a.gavel_dir + "/minimize_makespan.trace", a.gavel_dir + "/simulation_throughputs.json", g);
  }
  std::vector<JobProfile> jobs;
  for (JobEntry& e : read_job_file(a.jobs_file)) {
    if (a.max_jobs > 0 && static_cast<int32_t>(jobs.size()) >= a.max_jobs) break;
    if (!e.is_model()) {
      jobs.push_back(std::move(e.profile));
      continue;
    }
    // A model job: its layouts priced for every device count, the best one or two timed on
    // this machine's CPU devices (threads sharing its cores).
    const ModelJob job = parse_model_job(e.model_json, a.jobs_file);
    ProfileOptions po;
    po.measure = a.measure;
    po.shared_cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    ModelJobReport report;
    jobs.push_back(profile_model_job(job, pool, po, &report));
    std::fputs(report.table().c_str(), stdout);
    trial_seconds += report.trial_seconds;
  }
  return jobs;
}

int run(int argc, char** argv) {
  const PlanArgs a = parse_plan_args(std::vector<std::string>(argv + 1, argv + argc));
  if (a.help) {
    std::fputs(usage_plan().c_str(), stdout);
    return 0;
  }
  Pool pool;
  if (!a.pool_file.empty()) pool = read_pool_json(a.pool_file);
  else {
    pool.nodes = a.pool_nodes;
    pool.devices_per_node = a.pool_devices_per_node;
  }
  double trial_seconds = 0;
  const std::vector<JobProfile> jobs = load_jobs(a, pool, trial_seconds);
  PlanOptions o;
  o.objective = a.objective == "sum" ? Objective::sum_completion : Objective::makespan;
  o.time_limit_s = a.seconds;
  o.seed = a.seed;
  o.max_iterations = a.iterations;
  const Schedule s = a.method == "fast" ? plan_fast(jobs, pool, o) : a.method == "exact" ? plan_exact(jobs, pool, o)
                                                                                         : plan(jobs, pool, o);
  validate_schedule(s, jobs, pool);
  fmt::print("{} jobs on {} node(s) x {} devices\n", jobs.size(), pool.nodes, pool.devices_per_node);
  std::fputs(schedule_table(s, jobs, pool).c_str(), stdout);
  if (trial_seconds > 0)
    fmt::print("the model jobs' trial steps took {:.2f} s, {:.2f}% of the planned makespan{}\n", trial_seconds,
               100.0 * trial_seconds / s.makespan_s,
               trial_seconds > 0.05 * s.makespan_s ? " (above 5%: the jobs are short for their trials; give them more "
                                                     "steps, or plan with --no-measure)"
                                                   : "");
  if (a.baselines) {
    fmt::print("\n{:<52}  {:>12}  {:>10}\n", "plan", "makespan", "vs tessel");
    auto line = [&](const Schedule& b) {
      validate_schedule(b, jobs, pool);
      fmt::print("{:<52}  {:>12}  {:>9.3f}x\n", b.method, format_duration(b.makespan_s), b.makespan_s / s.makespan_s);
    };
    line(s);
    line(baseline_sequential(jobs, pool));
    line(baseline_equal_split(jobs, pool));
    line(baseline_requested(jobs, pool));
  }
  if (!a.json_out.empty()) write_file(a.json_out, schedule_json(s, jobs), "plan");
  if (!a.profiles_out.empty()) write_file(a.profiles_out, jobs_to_json(jobs), "jobs' profiles");
  if (a.pictures) {
    write_file(a.trace_out, schedule_perfetto(s, pool), "Perfetto trace");
    write_file(a.svg_out,
               schedule_svg(s, pool, fmt::format("{} jobs, makespan {} ({})", jobs.size(), format_duration(s.makespan_s),
                                                 s.method)),
               "Gantt chart");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tessel::UsageError& e) {
    std::fprintf(stderr, "tessel-plan: %s\n%s", e.what(), usage_plan().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel-plan: %s\n", e.what());
    return 1;
  }
}
