// tessel/planner/schedule.hpp — the joint schedule of many jobs on one pool (Saturn's problem):
// every job's device count, its devices and its start time, minimising the makespan (or, as an
// option, the sum of completion times).
//
// The model: a job j run on g devices takes runtime_s(g) seconds, on g devices of one node (or
// g / devices_per_node whole nodes when it may span), all starting together, not preempted.
// Within a node any g devices will do (the devices of a node are alike and all linked), so a
// node is a pool of interchangeable units: a schedule is feasible when, at every moment, the
// jobs on a node use at most devices_per_node; the device ids follow by a sweep (assign_devices).
//
// Methods (docs/planner.md):
//  - plan_fast: malleable list scheduling. Device counts from the dual approximation (for a
//    target makespan T, each job takes the count of least device-seconds that finishes within
//    T; also with a slack towards wider counts) and, on small batches, from a packing of the
//    jobs onto the devices; jobs placed in priority order by the serial schedule-generation
//    scheme (each at the earliest moment its devices are free, filling holes), then a local
//    search over the order and the counts, in restart rounds. Deterministic: the same input gives the same plan (an iteration budget,
//    not the clock, ends the search; time_limit_s only cuts it short).
//  - plan_exact: a mixed-integer program on CBC (one binary per job and device-count/node
//    choice, precedence binaries, a flow of devices of each node from job to job, the area
//    bound as a cut), warm-started from plan_fast. Proves optimality on small batches.
//  - plan_branch_and_bound: the makespan's exact optimum by a branch and bound over the serial
//    scheme's schedules in time order, pruned by a device-packing relaxation, symmetry and
//    left-shift rules (src/planner/exact_bnb.cpp). Reports "proven optimal" only when the
//    search finished; a time limit or node budget that stops it leaves the best plan found.
//  - plan_brute_force: every order x every choice through the same scheme (tests only; the
//    serial scheme over all orders reaches an optimal schedule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/planner/jobs.hpp"

namespace tessel::planner {

enum class Objective { makespan, sum_completion };

struct Placement {
  std::string job;
  int32_t job_index = 0;              // into the jobs given
  int32_t num_devices = 0;
  std::vector<int32_t> nodes;         // the node(s) it runs on
  std::vector<int32_t> devices;       // global device ids (Pool::device_id), ascending
  double start_s = 0;
  double end_s = 0;
};

struct Schedule {
  std::vector<Placement> jobs;        // in the order of the jobs given
  double makespan_s = 0;
  double sum_completion_s = 0;
  double lower_bound_s = 0;           // a bound on the best makespan (area, longest job, MILP)
  bool optimal = false;               // proven optimal for the objective (exact method)
  std::string method;
  double solve_seconds = 0;
  int64_t iterations = 0;
};

struct PlanOptions {
  Objective objective = Objective::makespan;
  double time_limit_s = 1.0;          // wall clock; 0 = no limit (the iteration budget only)
  // The fast method's budget, in schedule generations (its local search's unit of work; one
  // takes microseconds for a few jobs, ~20 us for 100); -1 = max(20000, 2,000,000 / jobs).
  int64_t max_iterations = -1;
  // plan_fast enumerates every order and count instead of searching when there are no more
  // schedules than its budget (a handful of jobs): the optimum, in milliseconds. false: always
  // the local search (to compare the search with the optimum).
  bool enumerate = true;
  uint64_t seed = 1;
  int32_t exact_max_jobs = 12;        // plan(): an exact method after the fast one up to this many jobs
  // plan_branch_and_bound: stop after this many search nodes (-1: no budget, the time limit
  // only); a search stopped early is reported as not proven.
  int64_t exact_max_nodes = -1;
  // plan_branch_and_bound starts from the fast plan, polished (true), or from each job alone one
  // after another, unpolished (false: the search alone has to find the optimum; tests).
  bool exact_warm_start = true;
  // Devices already busy (jobs running when a pool re-plans): device_free_at[d] is when global
  // device d becomes free (empty, or 0: free at time 0). plan_fast places the jobs around them,
  // and so does plan (which then runs the fast method only); plan_exact and
  // plan_branch_and_bound plan an idle pool and throw PlanError when it is given.
  std::vector<double> device_free_at;
};

// The fast method, the exact one, the choice of the two (plan: fast, then exact up to
// exact_max_jobs within the time limit, keeping the better; on a pool whose devices share cores,
// that plan, the baselines and every-job-on-one-count plans priced with predict_shared_cores,
// the cheapest kept), and brute force (at most 7 jobs).
Schedule plan_fast(const std::vector<JobProfile>& jobs, const Pool& pool, const PlanOptions& options = {});
Schedule plan_exact(const std::vector<JobProfile>& jobs, const Pool& pool, const PlanOptions& options = {});
Schedule plan(const std::vector<JobProfile>& jobs, const Pool& pool, const PlanOptions& options = {});
// The makespan's exact optimum (at most 64 jobs; objective makespan only), starting from the
// fast plan: optimal (Schedule::optimal) when the search finishes within the time limit and node
// budget; otherwise the best plan found, with lower_bound_s the device-packing bound.
Schedule plan_branch_and_bound(const std::vector<JobProfile>& jobs, const Pool& pool, const PlanOptions& options = {});
Schedule plan_brute_force(const std::vector<JobProfile>& jobs, const Pool& pool, Objective objective = Objective::makespan);

// Baselines (docs/planner.md): each job alone on all the devices it can use, one after
// another; an equal split of the pool into slices of pool / min(jobs, pool) devices (rounded
// down to a count every job can use), jobs longest first onto the first free slice; each job
// on the device count it requested (requested_devices, else 1), longest first, by the same
// list scheduling as plan_fast.
Schedule baseline_sequential(const std::vector<JobProfile>& jobs, const Pool& pool);
Schedule baseline_equal_split(const std::vector<JobProfile>& jobs, const Pool& pool);
Schedule baseline_requested(const std::vector<JobProfile>& jobs, const Pool& pool);

// A plan priced on a pool of CPU virtual devices that share pool.cores cores (pool.cores > 0):
// the plan run in each device's planned order (a job starts when the jobs planned before it on
// its devices have ended), every running job slowed while more device threads run than there
// are cores. A job of g devices, timed alone on min(g, cores) cores, runs at
// g x min(1, cores / busy) / min(g, cores) of its profiled speed, busy being the devices of all
// running jobs (processor sharing). Returns the plan with the starts and ends so predicted.
Schedule predict_shared_cores(const Schedule& plan, const std::vector<JobProfile>& jobs, const Pool& pool);

// max(total least device-seconds / devices, longest least runtime): no plan is shorter.
double makespan_lower_bound(const std::vector<JobProfile>& jobs, const Pool& pool);

// Throws PlanError naming the job(s) and devices if the schedule is not feasible: a count the
// job cannot use, a runtime that disagrees with its profile, devices outside the pool or across
// nodes when it may not span, two jobs on one device at once, a job missing.
void validate_schedule(const Schedule& s, const std::vector<JobProfile>& jobs, const Pool& pool);

}  // namespace tessel::planner
