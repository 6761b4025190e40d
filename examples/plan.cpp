// tessel-plan — plans a batch of training jobs on one pool of devices (docs/planner.md).
//
//   tessel-plan JOBS.json --pool POOL.json [--baselines] [--json PLAN.json]
//   tessel-plan --gavel ../shared/benchmarks/multijob-gavel --pool-shape 1x8 --baselines
//   mpirun -np 8 tessel-plan JOBS.json --pool POOL.json --run    # one process per device
//
// Prints the plan as a table first, then which of its figures were measured, which predicted and
// by which cost model, which given (and the baselines beside it with --baselines; every model
// job's candidate layouts before it with --verbose), writes it as a Perfetto trace and an SVG
// Gantt chart, and with --json as {"makespan_s": ..., "jobs": [...]}. Every job is checked
// before any is profiled: a job that cannot be planned or run is refused at once.
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
#include "tessel/planner/pool_runtime.hpp"
#include "tessel/planner/schedule.hpp"
#include "tessel/planner/show.hpp"
#include "tessel/runtime/cuda/cuda.hpp"  // cuda_compiled
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/make_runtime.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/runtime/process_group.hpp"

namespace {

using namespace tessel::planner;

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw tessel::Error(fmt::format("cannot write the {} to '{}'", what, path));
  fmt::print("wrote the {} to {}\n", what, path);
}

// Where the figures of the plan come from: tessel-plan says so under the plan.
struct Sources {
  std::vector<std::string> measured;   // model jobs: step times timed by trial steps
  std::vector<std::string> predicted;  // model jobs: step times priced by the cost model alone
  std::vector<std::string> given;      // profiled jobs: the job file's step times
  std::string cost_model;              // the model jobs' cost model, in words
  int timed_steps = 0;                 // per trial, the median kept
  bool gavel = false;
};

// The names, quoted; beyond 8, the first 8 and how many more (a 20,000-job file's line stays short).
std::string quoted(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 8;
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i) out += fmt::format("{}'{}'", i == 0 ? "" : ", ", names[i]);
  if (names.size() > kShown) out += fmt::format(" and {} more", names.size() - kShown);
  return out;
}

// The cost model that prices the model jobs (ProfileOptions::cost and what model_job_profile.cpp
// adds to it), in words.
std::string cost_model_words(const ProfileOptions& po, const Pool& pool) {
  std::string out = "the cost model with its default figures (one H100 node, docs/links.md)";
  if (pool.intra_node_gbps > 0) out += fmt::format(", links of {:g} GB/s within a node", pool.intra_node_gbps);
  if (pool.inter_node_gbps > 0) out += fmt::format(" and {:g} GB/s across nodes", pool.inter_node_gbps);
  if (po.shared_cores > 0) out += fmt::format(", compute shared by this machine's {} cores", po.shared_cores);
  return out;
}

std::vector<JobProfile> load_jobs(const PlanArgs& a, const Pool& pool, double& trial_seconds,
                                  std::vector<ModelJob>& models, Sources& sources) {
  if (!a.gavel_dir.empty()) {
    GavelOptions g;
    g.gpu = a.gpu;
    g.clamp_superlinear = a.clamp_superlinear;
    g.max_jobs = a.max_jobs;
    sources.gavel = true;
    return read_gavel_trace(a.gavel_dir + "/minimize_makespan.trace", a.gavel_dir + "/simulation_throughputs.json", g);
  }
  // Every job is checked before any is profiled (a model job's trials take seconds): its fields
  // (read_job_file), that --run can run it, that a device count of it fits the pool with a
  // layout (check_model_job), then that a layout fits the memory (price_model_job, the cost
  // model alone). Only then are the trials run.
  std::vector<JobEntry> entries = read_job_file(a.jobs_file);
  if (a.max_jobs > 0 && static_cast<int32_t>(entries.size()) > a.max_jobs)
    entries.resize(static_cast<std::size_t>(a.max_jobs));
  if (a.run) {
    std::vector<std::string> profiled;
    for (const JobEntry& e : entries)
      if (!e.is_model()) profiled.push_back(e.profile.name);
    if (!profiled.empty())
      throw tessel::PlanError(fmt::format("{}: --run runs model jobs only; {} of the {} jobs ({}) {} profiled "
                                          "job{}, with no model to run: plan {} without --run, or give {} a \"gpt\"",
                                          a.jobs_file, profiled.size(), entries.size(), quoted(profiled),
                                          profiled.size() == 1 ? "is a" : "are", profiled.size() == 1 ? "" : "s",
                                          profiled.size() == 1 ? "it" : "them", profiled.size() == 1 ? "it" : "them"));
  }
  ProfileOptions po;
  po.measure = a.measure;
  // Pipelines run in the threads pool only yet: not planned for GPUs or one process per device.
  po.pipeline = a.backend != "cuda" && !tessel::launched_by_mpi();
  // On GPUs (--backend cuda) each device computes on its own; on CPU virtual devices the trials'
  // threads share this machine's cores.
  po.shared_cores = a.backend == "cuda" ? 0 : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  sources.cost_model = cost_model_words(po, pool);
  sources.timed_steps = po.timed_steps;
  std::vector<ModelJobReport> reports(entries.size());
  try {
    for (const JobEntry& e : entries)
      if (e.is_model()) {
        models.push_back(parse_model_job(e.model_json, a.jobs_file));
        check_model_job(models.back(), pool);
      }
    for (std::size_t i = 0, m = 0; i < entries.size(); ++i)
      if (entries[i].is_model()) price_model_job(models[m++], pool, po, reports[i]);
  } catch (const tessel::PlanError& e) {  // name the file: the library's message names the job
    throw tessel::PlanError(fmt::format("{}: {} (refused before any trial step)", a.jobs_file, e.what()));
  }
  // The trials: a model job's layouts priced for every device count, the best one or two timed on
  // this machine's CPU devices (threads sharing its cores).
  std::vector<JobProfile> jobs;
  if (a.verbose && !models.empty())
    fmt::print("the model jobs' candidate layouts: \"predicted\" by {}{}\n", sources.cost_model,
               po.measure ? fmt::format("; \"measured\" by trial steps on this machine's CPU virtual devices (the "
                                        "median of {})",
                                        po.timed_steps)
                          : std::string());
  for (std::size_t i = 0, m = 0; i < entries.size(); ++i) {
    if (!entries[i].is_model()) {
      sources.given.push_back(entries[i].profile.name);
      jobs.push_back(std::move(entries[i].profile));
      continue;
    }
    jobs.push_back(time_model_job(models[m++], pool, po, reports[i]));
    (reports[i].trials > 0 ? sources.measured : sources.predicted).push_back(jobs.back().name);
    if (a.verbose) {
      std::fputs(reports[i].table().c_str(), stdout);
      std::fflush(stdout);  // a progress report: the next job's trials take seconds
    }
    trial_seconds += reports[i].trial_seconds;
  }
  return jobs;
}

// What tessel-plan prints under the plan: which figures were measured, which are predicted and
// by what, which were given.
void print_sources(const Sources& src, const PlanArgs& a) {
  if (src.gavel) {
    fmt::print("step times: Gavel's measured {} rates ({}/simulation_throughputs.json{})\n", a.gpu, a.gavel_dir,
               a.clamp_superlinear ? "; rates above linear scaling clamped to it" : "");
  } else {
    std::vector<std::string> parts;
    if (!src.measured.empty())
      parts.push_back(fmt::format("measured for {} (trial steps on this machine's CPU virtual devices, the median "
                                  "of {})",
                                  quoted(src.measured), src.timed_steps));
    if (!src.predicted.empty())
      parts.push_back(fmt::format("predicted for {} by {}", quoted(src.predicted), src.cost_model));
    if (!src.given.empty()) parts.push_back(fmt::format("from the job file for {}", quoted(src.given)));
    fmt::print("step times: {}\n", fmt::join(parts, "; "));
  }
  fmt::print("predicted: the starts, ends, runtimes and the makespan, as steps x step time{}\n",
             src.measured.empty() ? ""
                                  : fmt::format("; the layouts timed were chosen by {}", src.cost_model));
}

// --run: the plan executed on this machine's CPU devices (planner/pool_runtime.hpp), then the
// plan beside what ran, and a Gantt chart of what ran.
PoolRunOptions run_options(const PlanArgs& a, std::shared_ptr<tessel::ProcessGroup> processes) {
  PoolRunOptions o;
  o.progress_interval_s = a.progress_every;
  o.replan_interval_s = a.replan_every;
  o.checkpoint_dir = a.checkpoint_dir;
  o.processes = std::move(processes);
  if (a.backend == "cuda") {
    // One GPU per process (the GPU of its local rank), NCCL over each job's processes.
    o.make_runtime = [](const std::vector<int>& ranks, int tag) {
      tessel::RuntimeRequest r;
      r.backend = "cuda";
      r.mpi_ranks = ranks;
      r.mpi_group_tag = tag;
      return tessel::make_runtime(r);
    };
  }
  return o;
}

void run_planned(const PlanArgs& a, const std::vector<ModelJob>& models, const std::vector<JobProfile>& jobs,
                 const Schedule& plan, const Pool& pool, std::shared_ptr<tessel::ProcessGroup> processes) {
  PoolRunOptions o = run_options(a, processes);
  // On CPU virtual devices sharing the machine's cores, the plan is priced with the sharing.
  auto run_one = [&](const Schedule& s, const char* what) {
    fmt::print("\nrunning {} ({} jobs) on {} {}{}{}\n", what, models.size(), pool.num_devices(),
               a.backend == "cuda" ? "GPUs" : "CPU virtual devices", processes ? " (one process each)" : "",
               pool.cores > 0 ? fmt::format(" sharing {} cores", pool.cores) : "");
    PoolRunReport r = run_pool(models, jobs, s, pool, o);
    if (pool.cores > 0) {
      const Schedule predicted = predict_shared_cores(s, jobs, pool);
      r.predicted_makespan_s = predicted.makespan_s;
      for (std::size_t j = 0; j < r.jobs.size(); ++j) {
        r.jobs[j].predicted_start_s = predicted.jobs[j].start_s;
        r.jobs[j].predicted_end_s = predicted.jobs[j].end_s;
      }
    }
    std::fputs(r.table().c_str(), stdout);
    std::fflush(stdout);  // the progress lines of the next run follow it
    return r;
  };
  const PoolRunReport r = run_one(plan, "the plan");
  if (a.run_baselines) {
    o.progress_interval_s = 0;
    o.replan_interval_s = 0;
    struct Row {
      std::string name;
      double predicted, measured;
    };
    std::vector<Row> rows{{"tessel's plan", r.predicted_makespan_s, r.makespan_s}};
    for (const Schedule& b : {baseline_sequential(jobs, pool), baseline_equal_split(jobs, pool),
                              baseline_requested(jobs, pool)}) {
      const PoolRunReport rb = run_one(b, b.method.c_str());
      rows.push_back({b.method, rb.predicted_makespan_s, rb.makespan_s});
    }
    fmt::print("\n{:<52}  {:>10}  {:>10}  {:>9}  {:>10}\n", "run", "predicted", "measured", "meas/pred", "vs tessel");
    for (const Row& row : rows)
      fmt::print("{:<52}  {:>10}  {:>10}  {:>8.2f}x  {:>9.2f}x\n", row.name, format_duration(row.predicted),
                 format_duration(row.measured), row.measured / row.predicted, row.measured / rows[0].measured);
  }
  if (!a.pictures) return;
  Schedule ran;  // one bar per segment
  for (std::size_t j = 0; j < r.jobs.size(); ++j)
    for (const RunSegment& seg : r.jobs[j].segments) {
      Placement p;
      p.job = r.jobs[j].name;
      p.job_index = static_cast<int32_t>(j);
      p.num_devices = static_cast<int32_t>(seg.devices.size());
      p.devices = seg.devices;
      p.start_s = seg.start_s;
      p.end_s = seg.end_s;
      ran.jobs.push_back(p);
    }
  ran.makespan_s = r.makespan_s;
  std::string path = a.svg_out;
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".svg") == 0) path.resize(path.size() - 4);
  write_file(path + ".run.svg",
             schedule_svg(ran, pool, fmt::format("as run: makespan {} (planned {})", format_duration(r.makespan_s),
                                                 format_duration(r.predicted_makespan_s))),
             "Gantt chart of the run");
}

// Under mpirun, the processes other than rank 0 only serve the pool runs (one per device):
// the same runs as rank 0, in the same order.
int serve(const PlanArgs& a, const Pool& pool, std::shared_ptr<tessel::ProcessGroup> processes) {
  std::vector<ModelJob> models;
  for (JobEntry& e : read_job_file(a.jobs_file)) {
    if (a.max_jobs > 0 && static_cast<int32_t>(models.size()) >= a.max_jobs) break;
    if (e.is_model()) models.push_back(parse_model_job(e.model_json, a.jobs_file));
  }
  const PoolRunOptions o = run_options(a, processes);
  const int runs = a.run_baselines ? 4 : 1;
  for (int i = 0; i < runs; ++i) run_pool(models, {}, {}, pool, o);
  return 0;
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
  // Several processes: an MPI launch runs the plan with one process per device (--run); rank 0
  // plans and prints, the others serve its runs.
  std::shared_ptr<tessel::ProcessGroup> processes;
  const tessel::LaunchInfo launch = tessel::detect_launch();
  if (a.backend == "cuda") {
    if (!tessel::cuda_compiled())
      throw tessel::UsageError("--backend cuda: this tessel-plan was built without CUDA (configure with "
                               "-DTESSEL_WITH_CUDA=ON -DTESSEL_WITH_NCCL=ON)");
    if (launch.source != "mpi")
      throw tessel::UsageError(fmt::format("--backend cuda runs one process per GPU: launch it with mpirun -np {} "
                                           "(the pool's devices)",
                                           pool.num_devices()));
  }
  if (launch.multi_process() || a.backend == "cuda") {
    if (launch.source != "mpi")
      throw tessel::UsageError(fmt::format("tessel-plan runs several processes only under mpirun (this launcher "
                                           "says rank {} of {}): run it as one process, or with mpirun -np {} --run",
                                           launch.rank, launch.world_size, pool.num_devices()));
    if (!a.run) {
      if (launch.rank != 0) return 0;  // planning needs one process: rank 0 prints the plan
    } else {
      if (!a.gavel_dir.empty()) throw tessel::UsageError("--run runs model jobs (\"gpt\" entries of JOBS.json)");
      processes = tessel::mpi_process_group();
      if (processes->size() != pool.num_devices())
        throw tessel::UsageError(fmt::format("under mpirun, --run takes one process per device: the pool has {} "
                                             "devices, so launch mpirun -np {} (this job has {} processes)",
                                             pool.num_devices(), pool.num_devices(), processes->size()));
      if (processes->rank() != 0) return serve(a, pool, processes);
    }
  }
  double trial_seconds = 0;
  std::vector<ModelJob> models;
  Sources sources;
  const std::vector<JobProfile> jobs = load_jobs(a, pool, trial_seconds, models, sources);
  PlanOptions o;
  o.objective = a.objective == "sum" ? Objective::sum_completion : Objective::makespan;
  o.time_limit_s = a.seconds;
  o.seed = a.seed;
  o.max_iterations = a.iterations;
  const Schedule s = a.method == "fast"    ? plan_fast(jobs, pool, o)
                     : a.method == "exact" ? plan_exact(jobs, pool, o)
                     : a.method == "bnb"   ? plan_branch_and_bound(jobs, pool, o)
                                           : plan(jobs, pool, o);
  validate_schedule(s, jobs, pool);
  fmt::print("{}{} jobs on {} node(s) x {} devices\n", a.verbose && !models.empty() ? "\n" : "", jobs.size(),
             pool.nodes, pool.devices_per_node);
  std::fputs(schedule_table(s, jobs, pool).c_str(), stdout);
  print_sources(sources, a);
  // The planned time: on devices that share cores, the plan priced with the sharing.
  double planned_s = s.makespan_s;
  if (pool.cores > 0) {
    planned_s = predict_shared_cores(s, jobs, pool).makespan_s;
    fmt::print("predicted on {} cores shared by the {} devices (the pool's \"cores\": a job slows while more device "
               "threads run than there are cores): the plan takes {}\n",
               pool.cores, pool.num_devices(), format_duration(planned_s));
  }
  if (trial_seconds > 0)
    fmt::print("the model jobs' trial steps took {:.2f} s, {:.2f}% of the planned makespan{}\n", trial_seconds,
               100.0 * trial_seconds / planned_s,
               trial_seconds > 0.05 * planned_s ? " (above 5%: the jobs are short for their trials; give them more "
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
  if (a.run) run_planned(a, models, jobs, s, pool, processes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tessel::UsageError& e) {
    std::fprintf(stderr, "tessel-plan: %s\n%s", e.what(), usage_plan().c_str());
    tessel::abort_job_on_error(2, 2.0);  // under mpirun: end every process (returns otherwise)
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel-plan: %s\n", e.what());
    tessel::abort_job_on_error(1, 2.0);
    return 1;
  }
}
