// tessel-plan's command line (tessel/planner/plan_args.hpp).
#include "tessel/planner/plan_args.hpp"
#include "tessel/planner/jobs.hpp"

#include <fmt/format.h>

#include "tessel/cli.hpp"

namespace tessel::planner {

std::string usage_plan() {
  return "usage: tessel-plan JOBS.json (--pool POOL.json | --pool-shape NxD) [options]\n"
         "       tessel-plan --gavel DIR (--pool POOL.json | --pool-shape NxD) [options]\n"
         "Plans a batch of training jobs on one pool of devices: each job's device count, devices and\n"
         "start time, minimising the makespan (docs/planner.md). Prints the plan as a table, then where\n"
         "its figures come from (measured, predicted by the cost model, or given), and writes it as a\n"
         "Perfetto trace and an SVG Gantt chart. Every job is checked before any is profiled.\n"
         "  JOBS.json          {\"jobs\": [...]}: profiled jobs (step_time_s per device count) or model\n"
         "                     jobs (\"gpt\": a GptConfig), planned per device count by the cost model\n"
         "  --pool POOL.json   {\"nodes\": N, \"devices_per_node\": D, \"memory_bytes\": B}\n"
         "  --pool-shape NxD   N nodes of D devices, no memory limit\n"
         "  --gavel DIR        Gavel's minimize_makespan.trace + simulation_throughputs.json as the jobs\n"
         "  --gpu KIND         with --gavel: v100 (default), p100 or k80\n"
         "  --no-clamp         with --gavel: keep measured rates above g x the 1-GPU rate\n"
         "  --jobs N           only the first N jobs\n"
         "  --objective makespan|sum   what to minimise (sum: the sum of completion times)\n"
         "  --method auto|fast|exact|bnb   auto (default): fast, then up to 12 jobs the branch and\n"
         "                     bound (makespan) or CBC (sum); exact: CBC; bnb: the makespan's\n"
         "                     optimum by branch and bound (within --seconds)\n"
         "  --seconds S        the planner's time limit (default 1)\n"
         "  --seed N           the local search's seed (default 1)\n"
         "  --iterations N     the fast method's local-search moves (default 200 x jobs)\n"
         "  --baselines        also plan the three baselines and compare\n"
         "  --json PLAN.json   write the plan as JSON\n"
         "  --profiles PATH    write every job as a profiled job (a job file to plan again without trials)\n"
         "  --trace PATH       the Perfetto trace (default tessel-plan.trace.json)\n"
         "  --svg PATH         the Gantt chart (default tessel-plan.svg)\n"
         "  --no-pictures      write neither\n"
         "  --no-measure       model jobs: predicted step times only, no timed trial steps\n"
         "  --verbose          also every model job's candidate layouts, predicted and measured, as\n"
         "                     each job is profiled (before the plan)\n"
         "  --run              run the planned model jobs side by side on this machine's CPU devices,\n"
         "                     with progress lines, then the plan beside what ran (and its Gantt chart,\n"
         "                     the --svg path with .run.svg); under mpirun -np <the pool's devices>, one\n"
         "                     process per device (rank 0 plans and prints, the others run its jobs)\n"
         "  --run-baselines    with --run: then run the three baselines the same way, one after another\n"
         "  --replan-every S   with --run: re-plan the rest every S s from the measured step times\n"
         "                     (a moved job is checkpointed and restored on its new devices)\n"
         "  --checkpoint-dir D with --run: where moved jobs' states go (default tessel-plan-checkpoints)\n"
         "  --progress-every S with --run: a progress line per running job every S s (default 2; 0: none)\n"
         "  --backend cpu|cuda with --run under mpirun (one process per device): each job on an MpiRuntime\n"
         "                     (cpu, default) or on one GPU per process with NCCL (cuda; model jobs are then\n"
         "                     priced by the cost model, no CPU trial steps)\n";
}

PlanArgs parse_plan_args(const std::vector<std::string>& args) {
  PlanArgs a;
  std::vector<char*> argv;  // cli::next_value walks an argv
  std::vector<std::string> copy = args;
  copy.insert(copy.begin(), "tessel-plan");
  for (std::string& s : copy) argv.push_back(s.data());
  const int argc = static_cast<int>(argv.size());
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (cli::is_help(f)) {
      a.help = true;
      return a;
    }
    if (f == "--pool") a.pool_file = cli::next_value(i, argc, argv.data());
    else if (f == "--pool-shape") {
      const std::string v = cli::next_value(i, argc, argv.data());
      const std::size_t x = v.find('x');
      if (x == std::string::npos)
        throw UsageError(fmt::format("--pool-shape: '{}' is not NxD (expected e.g. --pool-shape 2x8)", v));
      a.pool_nodes = static_cast<int32_t>(cli::parse_i64("--pool-shape", v.substr(0, x), 1, 1 << 16));
      a.pool_devices_per_node = static_cast<int32_t>(cli::parse_i64("--pool-shape", v.substr(x + 1), 1, 1 << 16));
      if (static_cast<int64_t>(a.pool_nodes) * a.pool_devices_per_node > kMaxPoolDevices)
        throw UsageError(fmt::format("--pool-shape {}: {} devices; a pool has at most {}", v,
                                     static_cast<int64_t>(a.pool_nodes) * a.pool_devices_per_node, kMaxPoolDevices));
    } else if (f == "--gavel") a.gavel_dir = cli::next_value(i, argc, argv.data());
    else if (f == "--gpu") a.gpu = cli::next_value(i, argc, argv.data());
    else if (f == "--no-clamp") a.clamp_superlinear = false;
    else if (f == "--jobs") a.max_jobs = static_cast<int32_t>(cli::parse_i64(f, cli::next_value(i, argc, argv.data()), 1, 1 << 20));
    else if (f == "--objective") {
      a.objective = cli::next_value(i, argc, argv.data());
      if (a.objective != "makespan" && a.objective != "sum")
        throw UsageError(fmt::format("--objective: '{}' is not makespan or sum", a.objective));
    } else if (f == "--method") {
      a.method = cli::next_value(i, argc, argv.data());
      if (a.method != "auto" && a.method != "fast" && a.method != "exact" && a.method != "bnb")
        throw UsageError(fmt::format("--method: '{}' is not auto, fast, exact or bnb", a.method));
    } else if (f == "--seconds") a.seconds = cli::parse_double(f, cli::next_value(i, argc, argv.data()), 0.001, 1e6);
    else if (f == "--seed") a.seed = cli::parse_u64(f, cli::next_value(i, argc, argv.data()));
    else if (f == "--iterations") a.iterations = cli::parse_i64(f, cli::next_value(i, argc, argv.data()), 0, INT64_MAX);
    else if (f == "--baselines") a.baselines = true;
    else if (f == "--json") a.json_out = cli::next_value(i, argc, argv.data());
    else if (f == "--profiles") a.profiles_out = cli::next_value(i, argc, argv.data());
    else if (f == "--trace") a.trace_out = cli::next_value(i, argc, argv.data());
    else if (f == "--svg") a.svg_out = cli::next_value(i, argc, argv.data());
    else if (f == "--no-pictures") a.pictures = false;
    else if (f == "--no-measure") a.measure = false;
    else if (f == "--verbose") a.verbose = true;
    else if (f == "--run") a.run = true;
    else if (f == "--run-baselines") a.run_baselines = true;
    else if (f == "--replan-every") a.replan_every = cli::parse_double(f, cli::next_value(i, argc, argv.data()), 0, 1e6);
    else if (f == "--progress-every") a.progress_every = cli::parse_double(f, cli::next_value(i, argc, argv.data()), 0, 1e6);
    else if (f == "--checkpoint-dir") a.checkpoint_dir = cli::next_value(i, argc, argv.data());
    else if (f == "--backend") {
      a.backend = cli::next_value(i, argc, argv.data());
      if (a.backend != "cpu" && a.backend != "cuda")
        throw UsageError(fmt::format("--backend: '{}' is not cpu or cuda", a.backend));
    }
    else if (!f.empty() && f[0] == '-')
      throw UsageError(fmt::format("unknown flag '{}' (tessel-plan --help lists them)", f));
    else if (a.jobs_file.empty()) a.jobs_file = f;
    else throw UsageError(fmt::format("a second job file '{}' (one JOBS.json, already '{}')", f, a.jobs_file));
  }
  if (a.run_baselines && !a.run) throw UsageError("--run-baselines goes with --run");
  if (a.backend != "cpu" && !a.run) throw UsageError("--backend says what --run runs on: give --run too");
  if (a.backend == "cuda") a.measure = false;  // trial steps would time this machine's CPU, not its GPUs
  if (a.run && !a.gavel_dir.empty())
    throw UsageError("--run runs model jobs (\"gpt\" entries of JOBS.json); Gavel's jobs are profiles only");
  if (a.jobs_file.empty() == a.gavel_dir.empty())
    throw UsageError(a.jobs_file.empty() ? "no jobs: give JOBS.json or --gavel DIR"
                                         : "give JOBS.json or --gavel DIR, not both");
  if (a.pool_file.empty() == (a.pool_nodes == 0))
    throw UsageError(a.pool_file.empty() ? "no pool: give --pool POOL.json or --pool-shape NxD"
                                         : "give --pool or --pool-shape, not both");
  return a;
}

}  // namespace tessel::planner
