// BM_PlanGavel/<devices>/<clamp>: the multi-job planner (planner/schedule.hpp) on Gavel's
// 100-job trace with its measured v100 rates (../shared/benchmarks/multijob-gavel), on 8 devices
// (one node) or 16 (two nodes of 8). clamp 1: rates above g x the 1-GPU rate lowered to it
// (the default); 0: as measured. The fast method with its defaults (a fixed budget of schedule
// generations, so the plan is the same every run). Counters: planning wall time and this
// process's CPU time (the machine is shared), the makespan in hours, its ratio to the lower
// bound, and the ratio of each baseline to it.
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <string>

#include "tessel/planner/jobs.hpp"
#include "tessel/planner/schedule.hpp"

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void BM_PlanGavel(benchmark::State& state) {
  using namespace tessel::planner;
  const std::string dir = std::string(TESSEL_SOURCE_DIR) + "/../shared/benchmarks/multijob-gavel";
  GavelOptions g;
  g.clamp_superlinear = state.range(1) != 0;
  const std::vector<JobProfile> jobs =
      read_gavel_trace(dir + "/minimize_makespan.trace", dir + "/simulation_throughputs.json", g);
  const Pool pool{static_cast<int32_t>(state.range(0) / 8), 8};
  PlanOptions o;
  o.time_limit_s = 0;  // the budget alone: the same plan every run
  Schedule s;
  double wall = 0, cpu = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    s = plan_fast(jobs, pool, o);
    cpu += cpu_seconds() - c0;
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  validate_schedule(s, jobs, pool);
  const double iters = static_cast<double>(state.iterations());
  state.counters["plan_wall_s"] = wall / iters;
  state.counters["plan_cpu_s"] = cpu / iters;
  state.counters["makespan_h"] = s.makespan_s / 3600;
  state.counters["vs_bound"] = s.makespan_s / s.lower_bound_s;
  state.counters["sequential_x"] = baseline_sequential(jobs, pool).makespan_s / s.makespan_s;
  state.counters["equal_split_x"] = baseline_equal_split(jobs, pool).makespan_s / s.makespan_s;
  state.counters["requested_x"] = baseline_requested(jobs, pool).makespan_s / s.makespan_s;
}

}  // namespace

BENCHMARK(BM_PlanGavel)->ArgsProduct({{8, 16}, {1, 0}})->Unit(benchmark::kMillisecond)->Iterations(3);
