// The multi-job planner's schedule (tessel/planner/schedule.hpp): the exact program against
// brute force, the fast method against both, the baselines, the feasibility checks, the job,
// pool and Gavel readers.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "tessel/core/common.hpp"
#include "tessel/planner/jobs.hpp"
#include "tessel/planner/plan_args.hpp"
#include "tessel/planner/schedule.hpp"
#include "tessel/planner/show.hpp"

using namespace tessel;
using namespace tessel::planner;

namespace {

std::string gavel_dir() { return std::string(TESSEL_SOURCE_DIR) + "/../shared/benchmarks/multijob-gavel"; }

// TESSEL_SEED=<the printed seed> reproduces a run.
uint64_t test_seed() {
  static const uint64_t seed =
      std::getenv("TESSEL_SEED") != nullptr
          ? std::strtoull(std::getenv("TESSEL_SEED"), nullptr, 10)
          : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) % 100000;
  return seed;
}

// n jobs with step times on 1, 2 and 4 devices: sub-linear speed-ups drawn at random, some
// jobs without a 4-device figure, a few that may span nodes.
std::vector<JobProfile> random_jobs(std::mt19937_64& rng, int32_t n, bool spanning) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<JobProfile> jobs;
  for (int32_t j = 0; j < n; ++j) {
    JobProfile p;
    p.name = "job" + std::to_string(j);
    p.steps = 10 + static_cast<int64_t>(u(rng) * 90);
    const double t1 = 0.1 + u(rng);
    p.step_time_s[1] = t1;
    p.step_time_s[2] = t1 / (1.2 + 0.8 * u(rng));
    if (u(rng) < 0.7) p.step_time_s[4] = p.step_time_s[2] / (1.1 + 0.9 * u(rng));
    p.requested_devices = 1 << static_cast<int32_t>(u(rng) * 3);
    if (!p.step_time_s.count(p.requested_devices)) p.requested_devices = 2;
    p.may_span_nodes = spanning && u(rng) < 0.3;
    jobs.push_back(p);
  }
  return jobs;
}

}  // namespace

TEST_CASE("planner: the exact program and the fast method against brute force on small random batches", "[planner]") {
  const uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::printf("planner brute-force test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const Pool pools[] = {{1, 4}, {2, 2}, {1, 2}};
  int32_t fast_optimal = 0, cases = 0;
  for (int32_t trial = 0; trial < 12; ++trial) {
    const Pool& pool = pools[trial % 3];
    const int32_t n = 3 + trial % 3;
    std::vector<JobProfile> jobs = random_jobs(rng, n, pool.nodes > 1);
    if (pool.devices_per_node == 2)
      for (JobProfile& j : jobs) j.may_span_nodes = j.may_span_nodes || trial % 2 == 0;
    INFO("trial " << trial << " pool " << pool.nodes << "x" << pool.devices_per_node << "\n" << jobs_to_json(jobs));
    for (Objective obj : {Objective::makespan, Objective::sum_completion}) {
      const Schedule brute = plan_brute_force(jobs, pool, obj);
      INFO("objective " << (obj == Objective::makespan ? "makespan" : "sum of completion times"));
      PlanOptions o;
      o.objective = obj;
      o.time_limit_s = 30;
      o.max_iterations = 5000;  // (20,000 took 99 s of this test under ASan; the bound below holds)
      o.enumerate = false;  // the local search itself (and CBC not handed the optimum)
      const Schedule exact = plan_exact(jobs, pool, o);
      const Schedule fast = plan_fast(jobs, pool, o);
      PlanOptions defaults;
      defaults.objective = obj;
      const Schedule enumerated = plan_fast(jobs, pool, defaults);
      validate_schedule(brute, jobs, pool);
      validate_schedule(exact, jobs, pool);
      validate_schedule(fast, jobs, pool);
      validate_schedule(enumerated, jobs, pool);
      CHECK(enumerated.optimal);
      CHECK(enumerated.method.find("all orders") != std::string::npos);
      CHECK((obj == Objective::makespan ? enumerated.makespan_s : enumerated.sum_completion_s) ==
            Approx(obj == Objective::makespan ? brute.makespan_s : brute.sum_completion_s).epsilon(1e-9));
      const double b = obj == Objective::makespan ? brute.makespan_s : brute.sum_completion_s;
      const double e = obj == Objective::makespan ? exact.makespan_s : exact.sum_completion_s;
      const double f = obj == Objective::makespan ? fast.makespan_s : fast.sum_completion_s;
      CHECK(exact.optimal);
      CHECK(e == Approx(b).epsilon(1e-9));
      CHECK(f >= b * (1 - 1e-12));
      CHECK(f <= b * 1.25);
      CHECK(brute.makespan_s >= makespan_lower_bound(jobs, pool) * (1 - 1e-12));
      if (obj == Objective::makespan) {
        CHECK(exact.lower_bound_s <= b * (1 + 1e-6));
        ++cases;
        fast_optimal += f <= b * (1 + 1e-9) ? 1 : 0;
      }
    }
  }
  std::printf("planner: fast method optimal on %d of %d small makespan cases\n", fast_optimal, cases);
  CHECK(fast_optimal * 2 >= cases);
}

TEST_CASE("planner: branch and bound equals brute force on small random batches", "[planner]") {
  const uint64_t seed = test_seed() + 3;
  INFO("seed " << seed);
  std::printf("planner branch-and-bound test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const Pool pools[] = {{1, 4}, {2, 2}, {1, 2}, {2, 4}, {1, 8}};
  int32_t improved = 0;
  for (int32_t trial = 0; trial < 40; ++trial) {
    const Pool& pool = pools[trial % 5];
    // (brute force tries n! x modes^n schedules: fewer jobs where jobs have more modes)
    const int32_t n = pool.nodes > 1 ? 3 + trial % 2 : pool.devices_per_node == 2 ? 4 + trial % 3 : 3 + trial % 3;
    std::vector<JobProfile> jobs = random_jobs(rng, n, pool.nodes > 1);
    if (trial % 4 == 1) {  // identical jobs (the twin rule)
      jobs[1].steps = jobs[0].steps;
      jobs[1].step_time_s = jobs[0].step_time_s;
      jobs[1].may_span_nodes = jobs[0].may_span_nodes;
    }
    if (pool.devices_per_node == 8)
      for (JobProfile& j : jobs) j.step_time_s[8] = j.step_time_s.rbegin()->second / 1.5;
    INFO("trial " << trial << " pool " << pool.nodes << "x" << pool.devices_per_node << "\n" << jobs_to_json(jobs));
    const Schedule brute = plan_brute_force(jobs, pool);
    PlanOptions o;
    o.time_limit_s = 0;  // deterministic: the search alone decides
    o.exact_warm_start = trial % 4 == 3;  // mostly the search alone, from a weak first plan
    const Schedule bnb = plan_branch_and_bound(jobs, pool, o);
    validate_schedule(bnb, jobs, pool);
    CHECK(bnb.optimal);
    CHECK_THAT(bnb.method, Catch::Contains("proven optimal"));
    CHECK(bnb.makespan_s == Approx(brute.makespan_s).epsilon(1e-9));
    CHECK(bnb.lower_bound_s <= brute.makespan_s * (1 + 1e-9));
    if (baseline_sequential(jobs, pool).makespan_s > bnb.makespan_s * (1 + 1e-9)) ++improved;
  }
  std::printf("planner: branch and bound improved on one job after another in %d of 40 cases\n", improved);
  CHECK(improved >= 20);
}

TEST_CASE("planner: branch and bound stopped early is not proven and bad requests are clear errors", "[planner]") {
  std::mt19937_64 rng(test_seed() + 4);
  const std::vector<JobProfile> jobs = random_jobs(rng, 9, true);
  const Pool pool{2, 4};
  PlanOptions o;
  o.time_limit_s = 0;
  o.exact_warm_start = false;
  o.exact_max_nodes = 3;
  const Schedule s = plan_branch_and_bound(jobs, pool, o);
  validate_schedule(s, jobs, pool);
  if (!s.optimal) {  // (the first plan may already meet the bound: then it is proven without a search)
    CHECK_THAT(s.method, Catch::Contains("node budget"));
    CHECK(s.lower_bound_s < s.makespan_s);
  }
  CHECK(s.lower_bound_s >= makespan_lower_bound(jobs, pool) * (1 - 1e-12));
  PlanOptions sum;
  sum.objective = Objective::sum_completion;
  CHECK_THROWS_WITH(plan_branch_and_bound(jobs, pool, sum), Catch::Contains("minimises the makespan"));
  std::vector<JobProfile> many;
  for (int32_t k = 0; k < 8; ++k) many.insert(many.end(), jobs.begin(), jobs.end());
  for (std::size_t j = 0; j < many.size(); ++j) many[j].name = "job" + std::to_string(j);
  CHECK_THROWS_WITH(plan_branch_and_bound(many, pool), Catch::Contains("at most 64 jobs") && Catch::Contains("72"));
}

TEST_CASE("planner: devices still busy are planned around by plan and refused by the exact methods", "[planner]") {
  PlanOptions o;
  o.device_free_at = {0, 50, 0, 120};  // devices 1 and 3 still busy
  o.time_limit_s = 0;
  std::mt19937_64 rng(test_seed() + 5);
  const Pool pool{1, 4};
  const std::vector<JobProfile> jobs = random_jobs(rng, 6, false);
  // plan (which would otherwise try the branch and bound on 6 jobs) keeps every job off a busy
  // device until it is free.
  const Schedule s = plan(jobs, pool, o);
  REQUIRE(s.jobs.size() == jobs.size());
  for (const Placement& p : s.jobs)
    for (int32_t d : p.devices) {
      INFO(p.job << " on device " << d);
      CHECK(p.start_s >= o.device_free_at[static_cast<std::size_t>(d)] - 1e-9);
    }
  CHECK_THROWS_WITH(plan_branch_and_bound(jobs, pool, o), Catch::Contains("device_free_at"));
  CHECK_THROWS_WITH(plan_exact(jobs, pool, o), Catch::Contains("device_free_at"));
}

TEST_CASE("planner: on Gavel's first 16 and 20 jobs on two nodes the exact and fast plans meet the proven optima", "[planner]") {
  // The optima proven by plan_branch_and_bound (bench/results/2026-11-26T1849-2core-cpu-planner-exact/):
  // 13568.79 s for 16 jobs and 17095.64 s for 20 jobs on 2 nodes of 8 devices.
  const std::string trace = gavel_dir() + "/minimize_makespan.trace", rates = gavel_dir() + "/simulation_throughputs.json";
  const Pool pool{2, 8};
  PlanOptions o;
  o.time_limit_s = 0;  // no clock: the search decides
  {
    GavelOptions g;
    g.max_jobs = 16;
    const std::vector<JobProfile> jobs = read_gavel_trace(trace, rates, g);
    const Schedule s = plan_branch_and_bound(jobs, pool, o);
    validate_schedule(s, jobs, pool);
    CHECK(s.optimal);
    CHECK(s.makespan_s == Approx(13568.791232581312).epsilon(1e-9));
  }
  {
    GavelOptions g;
    g.max_jobs = 20;
    const std::vector<JobProfile> jobs = read_gavel_trace(trace, rates, g);
    PlanOptions starts = o;
    starts.max_iterations = 0;  // the starts alone: the device packing's start is within 2%
    const Schedule s = plan_fast(jobs, pool, starts);
    validate_schedule(s, jobs, pool);
    CHECK(s.makespan_s >= 17095.638322517105 * (1 - 1e-9));
    CHECK(s.makespan_s <= 17095.638322517105 * 1.02);
  }
}

TEST_CASE("planner: the fast method is deterministic and never below the bound", "[planner]") {
  const uint64_t seed = test_seed() + 1;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<JobProfile> jobs = random_jobs(rng, 40, true);
  const Pool pool{2, 4};
  PlanOptions o;
  o.time_limit_s = 0;  // the iteration budget alone
  o.max_iterations = 2000;
  const Schedule a = plan_fast(jobs, pool, o);
  const Schedule b = plan_fast(jobs, pool, o);
  validate_schedule(a, jobs, pool);
  REQUIRE(a.jobs.size() == b.jobs.size());
  for (std::size_t j = 0; j < a.jobs.size(); ++j) {
    CHECK(a.jobs[j].devices == b.jobs[j].devices);
    CHECK(a.jobs[j].start_s == b.jobs[j].start_s);
  }
  CHECK(a.makespan_s >= a.lower_bound_s * (1 - 1e-12));
  // Every baseline is feasible and none beats the plan by more than noise.
  for (const Schedule& s : {baseline_sequential(jobs, pool), baseline_equal_split(jobs, pool), baseline_requested(jobs, pool)}) {
    validate_schedule(s, jobs, pool);
    CHECK(s.makespan_s >= a.lower_bound_s * (1 - 1e-12));
    CHECK(a.makespan_s <= s.makespan_s * (1 + 1e-9));
  }
}

TEST_CASE("planner: validate_schedule names what is wrong", "[planner]") {
  std::vector<JobProfile> jobs(2);
  jobs[0].name = "a";
  jobs[0].steps = 10;
  jobs[0].step_time_s = {{1, 1.0}, {2, 0.6}};
  jobs[1].name = "b";
  jobs[1].steps = 5;
  jobs[1].step_time_s = {{1, 1.0}, {2, 0.6}};
  const Pool pool{2, 2};
  Schedule s = plan_fast(jobs, pool);
  validate_schedule(s, jobs, pool);
  {
    Schedule bad = s;  // both on device 0 at once
    bad.jobs[0].num_devices = bad.jobs[1].num_devices = 1;
    bad.jobs[0].devices = bad.jobs[1].devices = {0};
    bad.jobs[0].start_s = bad.jobs[1].start_s = 0;
    bad.jobs[0].end_s = 10;
    bad.jobs[1].end_s = 5;
    bad.makespan_s = 10;
    CHECK_THROWS_WITH(validate_schedule(bad, jobs, pool), Catch::Contains("device 0") && Catch::Contains("overlap"));
  }
  {
    Schedule bad = s;  // across nodes without permission
    bad.jobs[0].num_devices = 2;
    bad.jobs[0].devices = {1, 2};
    bad.jobs[0].start_s = 0;
    bad.jobs[0].end_s = 6;
    bad.jobs[1].devices = {0, 3};
    bad.jobs[1].num_devices = 2;
    bad.jobs[1].start_s = 6;
    bad.jobs[1].end_s = 9;
    bad.makespan_s = 9;
    CHECK_THROWS_WITH(validate_schedule(bad, jobs, pool), Catch::Contains("'a' spans 2 nodes"));
  }
  {
    Schedule bad = s;
    bad.jobs[1].end_s += 1;
    CHECK_THROWS_WITH(validate_schedule(bad, jobs, pool), Catch::Contains("job 'b' runs"));
  }
  {
    Schedule bad = s;
    bad.jobs[0].num_devices = 4;
    CHECK_THROWS_WITH(validate_schedule(bad, jobs, pool), Catch::Contains("job 'a' is placed on 4 devices"));
  }
}

TEST_CASE("planner: memory and node limits decide the usable counts", "[planner]") {
  JobProfile p;
  p.name = "big";
  p.steps = 100;
  p.step_time_s = {{1, 1.0}, {2, 0.6}, {4, 0.4}, {8, 0.3}};
  p.peak_bytes = {{1, 9e9}, {2, 5e9}, {4, 3e9}, {8, 2e9}};
  Pool pool{2, 4, 6e9};
  CHECK(usable_counts(p, pool) == std::vector<int32_t>{2, 4});
  p.may_span_nodes = true;
  CHECK(usable_counts(p, pool) == std::vector<int32_t>{2, 4, 8});
  // Spanning: the job takes both nodes whole.
  const Schedule s = plan_fast({p}, pool);
  validate_schedule(s, {p}, pool);
  CHECK(s.jobs[0].num_devices == 8);
  CHECK(s.jobs[0].nodes == std::vector<int32_t>{0, 1});
  pool.memory_bytes = 1e9;
  CHECK_THROWS_WITH(plan_fast({p}, pool),
                    Catch::Contains("job 'big' can use none of its device counts (1, 2, 4, 8)") && Catch::Contains("peak bytes"));
}

TEST_CASE("planner: job and pool files and their errors", "[planner]") {
  const std::vector<JobProfile> jobs = parse_jobs_json(
      R"({"jobs": [{"name": "a", "steps": 1000, "step_time_s": {"1": 0.9, "2": 0.5, "4": 0.3},
                    "peak_bytes": {"1": 9e9, "2": 5e9, "4": 3e9}},
                   {"name": "b", "steps": 10, "step_time_s": {"2": 1.5}, "may_span_nodes": true}]})",
      "inline");
  REQUIRE(jobs.size() == 2);
  CHECK(jobs[0].runtime_s(2) == Approx(500));
  CHECK(jobs[0].peak_bytes.at(4) == 3e9);
  CHECK(jobs[1].may_span_nodes);
  CHECK(parse_jobs_json(jobs_to_json(jobs), "round trip")[0].step_time_s == jobs[0].step_time_s);
  const Pool pool = parse_pool_json(R"({"nodes": 2, "devices_per_node": 8, "memory_bytes": 8e10})", "pool");
  CHECK(pool.num_devices() == 16);
  CHECK(pool.memory_bytes == 8e10);

  CHECK_THROWS_WITH(parse_jobs_json(R"({"jobs": [{"name": "a", "step_time_s": {"1": 1}}]})", "f.json"),
                    Catch::Contains("f.json") && Catch::Contains("job 1 'a' needs \"steps\""));
  CHECK_THROWS_WITH(parse_jobs_json(R"({"jobs": [{"name": "a", "steps": 3, "step_time_s": {"x": 1}}]})", "f.json"),
                    Catch::Contains("the key \"x\""));
  CHECK_THROWS_WITH(parse_jobs_json(R"({"jobs": [{"name": "a", "steps": 3, "step_time_s": {"1": -2}}]})", "f.json"),
                    Catch::Contains("must be a positive number"));
  CHECK_THROWS_WITH(parse_jobs_json(R"({"jobs": [{"name": "a", "steps": 3, "step_time_s": {"1": 1}},
                                                 {"name": "a", "steps": 3, "step_time_s": {"1": 1}}]})",
                                    "f.json"),
                    Catch::Contains("two jobs are named 'a'"));
  CHECK_THROWS_WITH(parse_jobs_json(R"({"jobs": [{"name": "m", "steps": 3, "gpt": {"layers": 2}}]})", "f.json"),
                    Catch::Contains("'m' is a model job"));
  CHECK(parse_job_file(R"({"jobs": [{"name": "m", "steps": 3, "gpt": {"layers": 2}}]})", "f.json")[0].is_model());
  CHECK_THROWS_WITH(parse_jobs_json("{\"jobs\": [", "f.json"), Catch::Contains("f.json: not valid JSON"));
  CHECK_THROWS_WITH(parse_pool_json(R"({"nodes": 2, "devices_per_node": 0})", "p.json"),
                    Catch::Contains("\"devices_per_node\" = 0"));
  CHECK_THROWS_WITH(parse_pool_json(R"({"nodes": 2, "devices_per_node": 8, "gpus": 3})", "p.json"),
                    Catch::Contains("unknown pool field \"gpus\""));
  CHECK_THROWS_WITH(read_jobs_json("/nonexistent/jobs.json"), Catch::Contains("/nonexistent/jobs.json"));
}

// Issue 36 item 5: an unknown field was ignored ("devices_count" planned the job as if it were not
// there); now it is an error naming the file, the job, the field, a close match and the known
// fields, at every level of a job or pool file.
TEST_CASE("planner: an unknown field of a job or pool file is an error naming it and the known fields",
          "[planner]") {
  const auto fails = [](auto&& parse, const std::string& text, const std::vector<std::string>& parts) {
    INFO(text);
    try {
      parse(text);
      FAIL("no error");
    } catch (const PlanError& e) {
      const std::string what = e.what();
      INFO(what);
      for (const std::string& p : parts) CHECK(what.find(p) != std::string::npos);
    }
  };
  const auto jobs = [](const std::string& t) { return parse_job_file(t, "jobs.json"); };
  const auto pool = [](const std::string& t) { return parse_pool_json(t, "pool.json"); };
  const std::string gpt = R"("gpt": {"batch": 4, "seq": 8, "d_model": 16, "heads": 2, "layers": 1, "vocab": 32})";
  // A profiled job: the field, its job by number and name, every known field.
  fails(jobs, R"({"jobs": [{"name": "a", "steps": 3, "step_time_s": {"1": 1}, "devices_count": 2}]})",
        {"jobs.json: job 1 'a': unknown field \"devices_count\"",
         "known: name, steps, step_time_s, peak_bytes, may_span_nodes, requested_devices"});
  // A close match is offered.
  fails(jobs, R"({"jobs": [{"name": "a", "step": 3, "step_time_s": {"1": 1}}]})",
        {"job 1 'a': unknown field \"step\" (did you mean \"steps\"?"});
  // A model job, the second entry: its own fields.
  fails(jobs,
        R"({"jobs": [{"name": "a", "steps": 3, "step_time_s": {"1": 1}},
                     {"name": "gpt-a", "steps": 3, )" + gpt + R"(, "devices_count": [1, 2]}]})",
        {"jobs.json: job 2 'gpt-a': unknown field \"devices_count\" (did you mean \"device_counts\"?",
         "known: name, steps, gpt, device_counts, seed, lr, may_span_nodes, requested_devices"});
  // Inside "gpt".
  fails(jobs, R"({"jobs": [{"name": "m", "steps": 3, "gpt": {"layer": 2}}]})",
        {"job 1 'm'", "unknown \"gpt\" field \"layer\" (did you mean \"layers\"?", "known: batch, seq"});
  // The top level.
  fails(jobs, R"({"jobs": [{"name": "a", "steps": 3, "step_time_s": {"1": 1}}], "pool": {}})",
        {"jobs.json: unknown field \"pool\" (known: jobs) at the top level"});
  fails(jobs, R"({"job": []})", {"unknown field \"job\" (did you mean \"jobs\"?"});
  // A field of the right name but the wrong type is named too (it threw nlohmann's message).
  fails(jobs, R"({"jobs": [{"name": "a", "steps": 3, "step_time_s": {"1": 1}, "may_span_nodes": 1}]})",
        {"job 1 'a': \"may_span_nodes\" = 1 must be true or false"});
  // The pool file.
  fails(pool, R"({"nodes": 1, "devices_per_nodes": 8})",
        {"pool.json: unknown pool field \"devices_per_nodes\" (did you mean \"devices_per_node\"?",
         "known: nodes, devices_per_node, memory_bytes, intra_node_gbps, inter_node_gbps, allow_spanning, cores"});
  fails(pool, R"({"nodes": 1, "devices_per_node": 8, "allow_spanning": "yes"})",
        {"pool.json: \"allow_spanning\" = \"yes\" must be true or false"});
  // What the planner writes reads back (every field it writes is known).
  JobProfile p;
  p.name = "x";
  p.steps = 2;
  p.step_time_s = {{1, 1.0}};
  p.peak_bytes = {{1, 5.0}};
  p.requested_devices = 1;
  p.may_span_nodes = true;
  CHECK(parse_jobs_json(jobs_to_json({p}), "profiles.json")[0].may_span_nodes);
}

TEST_CASE("planner: Gavel's trace with its measured rates", "[planner]") {
  const std::vector<JobProfile> raw = read_gavel_trace(gavel_dir() + "/minimize_makespan.trace",
                                                       gavel_dir() + "/simulation_throughputs.json", {"v100", false});
  const std::vector<JobProfile> jobs = read_gavel_trace(gavel_dir() + "/minimize_makespan.trace",
                                                        gavel_dir() + "/simulation_throughputs.json");
  REQUIRE(jobs.size() == 100);
  int32_t asked[9] = {};
  int32_t superlinear = 0;
  double requested_gpu_hours = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    asked[jobs[j].requested_devices]++;
    for (const auto& [g, t] : jobs[j].step_time_s) CHECK(t >= jobs[j].step_time_s.at(1) / g * (1 - 1e-12));
    for (const auto& [g, t] : raw[j].step_time_s)
      if (g > 1 && t < raw[j].step_time_s.at(1) / g) ++superlinear;
    requested_gpu_hours += jobs[j].requested_devices * raw[j].runtime_s(jobs[j].requested_devices) / 3600;
  }
  // The README's counts: 71 jobs ask for 1 GPU, 6 for 2, 23 for 4; 601 GPU-hours as requested.
  CHECK(asked[1] == 71);
  CHECK(asked[2] == 6);
  CHECK(asked[4] == 23);
  CHECK(requested_gpu_hours == Approx(601).epsilon(0.01));
  CHECK(superlinear > 0);
  const Pool pool{1, 8};
  const Schedule s = plan_fast(jobs, pool);
  validate_schedule(s, jobs, pool);
  CHECK(s.makespan_s >= makespan_lower_bound(jobs, pool) * (1 - 1e-12));
  CHECK(s.makespan_s < baseline_sequential(jobs, pool).makespan_s);
  CHECK_THROWS_WITH(read_gavel_trace(gavel_dir() + "/minimize_makespan.trace", gavel_dir() + "/simulation_throughputs.json",
                                     {"h100", true}),
                    Catch::Contains("no GPU kind 'h100'"));
}

TEST_CASE("planner: the plan shown as a table JSON a Perfetto trace and SVG", "[planner]") {
  std::vector<JobProfile> jobs(3);
  for (int32_t j = 0; j < 3; ++j) {
    jobs[j].name = "job<" + std::to_string(j) + ">";
    jobs[j].steps = 100 * (j + 1);
    jobs[j].step_time_s = {{1, 1.0}, {2, 0.55}};
  }
  const Pool pool{1, 2};
  const Schedule s = plan_fast(jobs, pool);
  const std::string table = schedule_table(s, jobs, pool);
  CHECK_THAT(table, Catch::Contains("job<2>") && Catch::Contains("makespan"));
  const std::string js = schedule_json(s, jobs);
  CHECK_THAT(js, Catch::Contains("\"makespan_s\"") && Catch::Contains("\"devices\"") && Catch::Contains("\"start_s\""));
  const std::string trace = schedule_perfetto(s, pool);
  CHECK_THAT(trace, Catch::Contains("\"traceEvents\"") && Catch::Contains("device 1"));
  const std::string svg = schedule_svg(s, pool, "a & b");
  std::size_t rects = 0;
  for (std::size_t at = svg.find("<rect x="); at != std::string::npos; at = svg.find("<rect x=", at + 1)) ++rects;
  std::size_t uses = 0;
  for (const Placement& p : s.jobs) uses += p.devices.size();
  CHECK(rects == uses);
  CHECK_THAT(svg, Catch::Contains("a &amp; b") && Catch::Contains("job&lt;0&gt;"));
  CHECK(format_duration(3725) == "1:02:05");
}

TEST_CASE("planner: tessel-plan's arguments", "[planner]") {
  const PlanArgs a = parse_plan_args({"jobs.json", "--pool-shape", "2x8", "--baselines", "--json", "p.json"});
  CHECK(a.jobs_file == "jobs.json");
  CHECK(a.pool_nodes == 2);
  CHECK(a.pool_devices_per_node == 8);
  CHECK(a.baselines);
  CHECK(a.json_out == "p.json");
  CHECK_THROWS_WITH(parse_plan_args({"jobs.json"}), Catch::Contains("no pool"));
  CHECK_THROWS_WITH(parse_plan_args({"--pool-shape", "2x8"}), Catch::Contains("no jobs"));
  CHECK_THROWS_WITH(parse_plan_args({"j.json", "--pool-shape", "2by8"}), Catch::Contains("--pool-shape: '2by8'"));
  CHECK_THROWS_WITH(parse_plan_args({"j.json", "--pool", "p.json", "--seconds", "-1"}), Catch::Contains("--seconds"));
  CHECK_THROWS_WITH(parse_plan_args({"j.json", "--pool", "p.json", "--objective", "speed"}), Catch::Contains("'speed'"));
  CHECK_THROWS_WITH(parse_plan_args({"j.json", "--pool", "p.json", "--frobnicate"}), Catch::Contains("unknown flag '--frobnicate'"));
  CHECK(parse_plan_args({"--help"}).help);
  CHECK_FALSE(a.verbose);
  CHECK(parse_plan_args({"j.json", "--pool-shape", "1x8", "--verbose"}).verbose);
}

TEST_CASE("planner: a plan priced on devices that share cores", "[planner]") {
  std::vector<JobProfile> jobs(3);
  for (int32_t j = 0; j < 3; ++j) {
    jobs[j].name = "j" + std::to_string(j);
    jobs[j].steps = 10;
    jobs[j].step_time_s = {{1, 1.0}, {2, 0.5}};
  }
  Pool pool = parse_pool_json(R"({"nodes": 1, "devices_per_node": 2, "cores": 1})", "pool.json");
  CHECK(pool.cores == 1);
  // j0 and j1 side by side on one core each get half of it; j2 follows j0 on device 0.
  Schedule s;
  s.jobs.resize(3);
  for (int32_t j = 0; j < 3; ++j) {
    s.jobs[j].job = jobs[j].name;
    s.jobs[j].job_index = j;
    s.jobs[j].num_devices = 1;
  }
  s.jobs[0].devices = {0};
  s.jobs[1].devices = {1};
  s.jobs[2].devices = {0};
  s.jobs[0].end_s = s.jobs[1].end_s = 10;
  s.jobs[2].start_s = 10;
  s.jobs[2].end_s = s.makespan_s = 20;
  validate_schedule(s, jobs, pool);
  const Schedule p = predict_shared_cores(s, jobs, pool);
  CHECK(p.jobs[0].end_s == Approx(20));
  CHECK(p.jobs[1].end_s == Approx(20));
  CHECK(p.jobs[2].start_s == Approx(20));
  CHECK(p.jobs[2].end_s == Approx(30));  // alone again: the whole core
  // As many cores as devices: nothing is shared, and no job ends later than planned.
  std::mt19937_64 rng(test_seed() + 2);
  const std::vector<JobProfile> many = random_jobs(rng, 12, false);
  const Pool big{1, 4, 0, 0, 0, false, 4};
  const Schedule plan_big = plan_fast(many, big);
  const Schedule q = predict_shared_cores(plan_big, many, big);
  for (std::size_t j = 0; j < many.size(); ++j) CHECK(q.jobs[j].end_s <= plan_big.jobs[j].end_s * (1 + 1e-9));
  CHECK(q.makespan_s <= plan_big.makespan_s * (1 + 1e-9));
  CHECK_THROWS_WITH(predict_shared_cores(plan_big, many, Pool{1, 4}), Catch::Contains("no \"cores\""));
  CHECK_THROWS_WITH(parse_pool_json(R"({"nodes": 1, "devices_per_node": 2, "cores": -1})", "pool.json"),
                    Catch::Contains("\"cores\" = -1"));
}

TEST_CASE("planner: on devices that share cores plan keeps the cheapest plan priced with the sharing", "[planner]") {
  // Two devices alone run each job 1.5x faster than one; with one core shared by the four
  // devices, two one-device jobs side by side already fill the core.
  std::vector<JobProfile> jobs(4);
  for (int32_t j = 0; j < 4; ++j) {
    jobs[j].name = "j" + std::to_string(j);
    jobs[j].steps = 100 + 10 * j;
    jobs[j].step_time_s = {{1, 0.3}, {2, 0.2}};
  }
  const Pool shared{1, 4, 0, 0, 0, false, 1};
  const Pool own{1, 4};
  const Schedule s = plan(jobs, shared);
  validate_schedule(s, jobs, shared);
  CHECK_THAT(s.method, Catch::Contains("priced on 1 shared cores"));
  const double price = predict_shared_cores(s, jobs, shared).makespan_s;
  for (const Schedule& other : {plan_fast(jobs, own), baseline_sequential(jobs, shared), baseline_equal_split(jobs, shared),
                                baseline_requested(jobs, shared)})
    CHECK(price <= predict_shared_cores(other, jobs, shared).makespan_s * (1 + 1e-9));
}
