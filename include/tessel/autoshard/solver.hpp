// tessel/autoshard/solver.hpp — choosing one strategy per node (problem.hpp) at least cost
// within the usage limit.
//
// Two methods, one result type:
//  - solve_exact: the integer program of Alpa / XLA's auto-sharding (a 0/1 variable per node
//    strategy, a linearised product per edge entry, one memory row per time segment) on CBC.
//    Proves optimality on small problems; given a time limit it returns its best plan so far.
//  - solve_anytime: for large graphs. First a Lagrangian relaxation of the memory limit (a
//    price per time segment, moved by subgradient steps) whose priced problem is solved by
//    min-sum message passing (TRW-S); the cheapest decoded plan that fits is then improved
//    until the time limit with exact dynamic programming over trees of the graph (a block of
//    nodes re-chosen jointly with the rest fixed), keeping every accepted plan within the
//    limit. When no decoded plan fits, the search starts from the plan of least memory
//    (feasible whenever any plan is) and from the cheapest one (docs/auto-sharding.md).
//    Deterministic: the same problem, options and iteration count give the same plan; a
//    time limit can only cut the sequence short.
// solve() picks: for a program of at most exact_max_variables, a short anytime run (a feasible
// plan fast) then CBC for the rest of the time, keeping the better; anytime otherwise.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessel/autoshard/problem.hpp"

namespace tessel::autoshard {

enum class SolveStatus {
  optimal,     // proven optimal (exact method)
  feasible,    // a plan within memory and without an infinite cost; maybe not optimal
  infeasible,  // no plan fits: the plan returned is the one of least peak memory
  unknown,     // the method stopped (time limit) before it found a feasible plan
};
const char* status_name(SolveStatus s);

// One point of the best-plan trace: when a better feasible plan was found.
struct TracePoint {
  double seconds = 0;  // since the solve began
  TotalCost cost = 0;
  int64_t iteration = 0;
};

struct SolveOptions {
  double time_limit_s = 10.0;  // wall clock for the whole solve
  // Anytime: the most improvement steps (block moves); -1 = until the time limit. With a
  // budget the plan depends only on the problem, the seed and this count.
  int64_t max_iterations = -1;
  uint64_t seed = 1;
  // solve(): CBC is tried when the integer program (over the coarsened problem) has at most
  // this many variables. CBC checks its time limit only between steps of its search, and on a
  // program of 1.7 million variables (IOPDDL's K) its first steps took minutes: larger
  // problems stay with the anytime method.
  int64_t exact_max_variables = 300000;
  // Called (from the solving thread) whenever the anytime method records a better plan.
  std::function<void(const TracePoint&)> on_improvement;
  // The anytime method returns its best plan soon after this becomes true (e.g. set by another
  // thread whose exact method proved optimality). Not read by the exact method.
  const std::atomic<bool>* stop = nullptr;
  // The anytime method under a usage limit, without a step budget: the Lagrangian dual's bound on
  // a thread beside the search (SolveResult::lower_bound; docs/auto-sharding.md). Off: no bound
  // under a limit, and no second thread (a caller that only wants a plan, e.g. a warm start).
  // With a step budget there is never one (its work would depend on the clock, and the plan on
  // whether it proved optimality in time).
  bool bound_under_limit = true;
  // The exact method: a plan (one strategy per node) to start CBC from when it is feasible
  // (its cost bounds the search from the start); ignored when empty, infeasible, or not a
  // plan the coarsened program can express. Not read by the anytime method.
  Plan warm_start;
};

struct SolveResult {
  Plan plan;
  Evaluation evaluation;  // evaluate(problem, plan), exact
  SolveStatus status = SolveStatus::unknown;
  std::string method;     // "exact (CBC)" or "anytime"
  double seconds = 0;     // wall time of the solve
  double first_feasible_s = -1;  // when the first feasible plan was known (-1: never)
  int64_t iterations = 0;        // anytime: block moves made; exact: 0
  std::vector<TracePoint> trace;  // anytime: every recorded improvement, in order
  // A lower bound on the optimum the method proved (solve_wcsp: the Lagrangian dual's best
  // value; its cost when optimal); -1: none.
  double lower_bound = -1;
};

SolveResult solve_exact(const Problem& problem, const SolveOptions& options);
SolveResult solve_anytime(const Problem& problem, const SolveOptions& options);
SolveResult solve(const Problem& problem, const SolveOptions& options);

// The Lagrangian relaxation of the usage limit with an exact weighted-constraint solver for the
// priced problem (toulbar2, Debian's package, run as a program): prices per time segment moved
// by subgradient steps; each priced optimum gives a lower bound on the optimum (the dual's
// value, result.lower_bound) and a plan, kept when it fits. Optimal when the bound reaches the
// best plan's cost (always without a usage limit, when toulbar2 finishes). For problems with
// few groups but many strategies, whose integer program is too large for CBC (IOPDDL V).
// Under a limit every other priced solve is a penalty round instead: each node's usage above its
// least weighted by a weight of its own, searched by bisection (no bound; its plans steer towards
// the limit: on V they reach the optimum the prices per segment did not). The trace's iteration
// is the priced solve that found the plan (0: the warm start).
// Reads options.time_limit_s, max_iterations (priced solves), warm_start (the first best plan),
// stop and on_improvement. Throws Error when toulbar2 is not installed (wcsp_available()).
// $TESSEL_WCSP_LOG set: a line per priced solve on stderr (its optimum, the bound, the plan).
SolveResult solve_wcsp(const Problem& problem, const SolveOptions& options);
bool wcsp_available();  // toulbar2 on PATH, or $TESSEL_TOULBAR2

// Variables of the exact integer program over the coarsened problem (strategies of groups
// that have a choice + entries of their pairs' edge matrices): what solve() compares with
// exact_max_variables.
int64_t exact_program_size(const Problem& problem);
// The same with the groups of the coarsened problem that have a choice, in one pass (both
// counted before solve_exact's dominance pruning, which removes little on the contest's graphs).
struct ExactProgramShape {
  int64_t variables = 0;
  int64_t groups = 0;
};
ExactProgramShape exact_program_shape(const Problem& problem);

}  // namespace tessel::autoshard
