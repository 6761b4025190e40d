// The exact method: the strategy-selection integer program on CBC (see
// tessel/autoshard/solver.hpp).
//
//   min  sum_v sum_s c[v][s] x[v][s] + sum_(a,b) sum_(s,t) E[a,b][s][t] y[a,b][s][t]
//   s.t. sum_s x[v][s] = 1                                  for every node v
//        sum_t y[a,b][s][t] = x[a][s],  sum_s y[a,b][s][t] = x[b][t]   for every pair, s, t
//        sum_(v live on k) sum_s u[v][s] x[v][s] <= limit  for every time segment k
//        x binary, 0 <= y <= 1
// With x integral, the two marginal rows leave exactly one y entry at 1, so y need not be
// integer (the usual linearisation, as in Alpa). Entries of "infinite" cost get an upper bound
// of 0: the program finds the best plan without them, or proves there is none.
#include <Cbc_C_Interface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <tuple>

#include <fmt/format.h>

#include "model.hpp"
#include "tessel/autoshard/solver.hpp"

namespace tessel::autoshard {

namespace {

struct CbcDeleter {
  void operator()(Cbc_Model* m) const { Cbc_deleteModel(m); }
};

}  // namespace

ExactProgramShape exact_program_shape(const Problem& problem) {
  // Before the dominance pruning (solve_exact prunes; it removes little on the contest's graphs
  // and takes time on groups of many strategies, which a decision should not spend).
  const detail::Model m = detail::build_model(problem);
  const detail::Coarse c = detail::build_coarse(problem, m);
  ExactProgramShape out;
  for (const detail::Group& g : c.groups)
    if (g.num_strategies > 1) {
      out.variables += g.num_strategies;
      ++out.groups;
    }
  for (const detail::PairEdge& p : c.pairs) out.variables += static_cast<int64_t>(p.cost.size());
  return out;
}

int64_t exact_program_size(const Problem& problem) { return exact_program_shape(problem).variables; }

SolveResult solve_exact(const Problem& problem, const SolveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  // The program is written over the coarsened problem (model.hpp): nodes that follow another
  // through a functional edge are one variable group, which loses no plan of finite cost and
  // makes the program several times smaller on XLA's graphs.
  const detail::Model m = detail::build_model(problem);
  detail::Coarse coarse = detail::build_coarse(problem, m);
  // The warm start's group strategies, read before pruning (the members' strategies as the
  // coarsening assigns them), then mapped onto the pruned groups.
  const int32_t ng = static_cast<int32_t>(coarse.groups.size());
  std::vector<int32_t> warm_group;
  if (!options.warm_start.empty() && options.warm_start.size() == problem.nodes.size() &&
      evaluate(problem, options.warm_start).feasible()) {
    warm_group.assign(static_cast<std::size_t>(ng), 0);
    bool consistent = true;
    for (int32_t g = 0; g < ng && consistent; ++g) {
      const detail::Group& grp = coarse.groups[g];
      const std::size_t k = grp.members.size();
      warm_group[g] = options.warm_start[grp.members[0]];
      for (std::size_t i = 0; i < k; ++i)
        consistent &= options.warm_start[grp.members[i]] == grp.assign[warm_group[g] * k + i];
    }
    if (!consistent) warm_group.clear();
  }
  // Strategies no optimal plan needs are dropped (dominance.cpp); the warm start moves to the
  // strategies that replaced them (no worse in cost or memory).
  const std::vector<std::vector<int32_t>> kept_as = detail::prune_dominated(problem, coarse);
  for (int32_t g = 0; g < static_cast<int32_t>(warm_group.size()); ++g) warm_group[g] = kept_as[g][warm_group[g]];

  // Columns: x[g][s] first (x_col[g] + s; groups of one strategy have none), then y of each
  // pair (y_col[p] + s*S(b) + t).
  std::vector<int> x_col(ng, -1);
  int num_cols = 0;
  for (int32_t g = 0; g < ng; ++g)
    if (coarse.groups[g].num_strategies > 1) {
      x_col[g] = num_cols;
      num_cols += coarse.groups[g].num_strategies;
    }
  std::vector<int> y_col(coarse.pairs.size());
  for (std::size_t p = 0; p < coarse.pairs.size(); ++p) {
    y_col[p] = num_cols;
    num_cols += static_cast<int>(coarse.pairs[p].cost.size());
  }
  // Rows: one per group, S(a) + S(b) per pair, one per time segment with a limit.
  std::vector<std::tuple<int, int, double>> entries;  // (col, row, value)
  std::vector<double> row_lb, row_ub;
  auto add_row = [&](double lb, double ub) {
    row_lb.push_back(lb);
    row_ub.push_back(ub);
    return static_cast<int>(row_lb.size()) - 1;
  };
  for (int32_t g = 0; g < ng; ++g) {
    if (x_col[g] < 0) continue;
    const int r = add_row(1, 1);
    for (int32_t s = 0; s < coarse.groups[g].num_strategies; ++s) entries.emplace_back(x_col[g] + s, r, 1.0);
  }
  for (std::size_t p = 0; p < coarse.pairs.size(); ++p) {
    const detail::PairEdge& e = coarse.pairs[p];
    const int32_t sa = coarse.groups[e.a].num_strategies, sb = coarse.groups[e.b].num_strategies;
    for (int32_t s = 0; s < sa; ++s) {
      const int r = add_row(0, 0);
      entries.emplace_back(x_col[e.a] + s, r, -1.0);
      for (int32_t t = 0; t < sb; ++t) entries.emplace_back(y_col[p] + s * sb + t, r, 1.0);
    }
    for (int32_t t = 0; t < sb; ++t) {
      const int r = add_row(0, 0);
      entries.emplace_back(x_col[e.b] + t, r, -1.0);
      for (int32_t s = 0; s < sa; ++s) entries.emplace_back(y_col[p] + s * sb + t, r, 1.0);
    }
  }
  if (problem.usage_limit) {
    // With usages >= 0, segment k's row is implied by k+1's when no node ends between them
    // (k's live set is a subset of k+1's), and by k-1's when none starts: only segments
    // where something starts before and something ends after need a row. On the contest's
    // graphs this keeps a small fraction of the rows.
    bool nonnegative = true;
    for (const Node& node : problem.nodes)
      for (int64_t u : node.usage) nonnegative &= u >= 0;
    std::vector<char> starts(m.num_segments + 1, 0), ends(m.num_segments + 1, 0);
    for (std::size_t v = 0; v < problem.nodes.size(); ++v)
      if (m.seg_lo[v] < m.seg_hi[v]) {
        starts[m.seg_lo[v]] = 1;
        ends[m.seg_hi[v]] = 1;
      }
    std::vector<int32_t> kept;  // segments with a row
    for (int32_t k = 0; k < m.num_segments; ++k)
      if (!nonnegative || (starts[k] && ends[k + 1])) kept.push_back(k);
    // Per kept segment: a constant (each member's least usage over its group's strategies;
    // exactly one strategy is chosen) plus, per group strategy, the members' usage above it.
    std::vector<double> fixed(kept.size(), 0.0);
    std::vector<std::tuple<int, int, double>> usage_terms;  // (col, kept row, usage)
    for (int32_t g = 0; g < ng; ++g) {
      const detail::Group& grp = coarse.groups[g];
      const std::size_t k = grp.members.size();
      for (std::size_t i = 0; i < k; ++i) {
        const int32_t v = grp.members[i];
        const auto lo = std::lower_bound(kept.begin(), kept.end(), m.seg_lo[v]) - kept.begin();
        const auto hi = std::lower_bound(kept.begin(), kept.end(), m.seg_hi[v]) - kept.begin();
        if (lo >= hi) continue;
        int64_t umin = problem.nodes[v].usage[grp.assign[i]];
        for (int32_t s = 1; s < grp.num_strategies; ++s) umin = std::min(umin, problem.nodes[v].usage[grp.assign[s * k + i]]);
        for (auto r = lo; r < hi; ++r) fixed[r] += static_cast<double>(umin);
        if (x_col[g] < 0) continue;
        for (int32_t s = 0; s < grp.num_strategies; ++s) {
          const int64_t extra = problem.nodes[v].usage[grp.assign[s * k + i]] - umin;
          if (extra == 0) continue;
          for (auto r = lo; r < hi; ++r) usage_terms.emplace_back(x_col[g] + s, static_cast<int>(r), static_cast<double>(extra));
        }
      }
    }
    std::sort(usage_terms.begin(), usage_terms.end());
    std::vector<int> row_of(kept.size());
    for (std::size_t r = 0; r < kept.size(); ++r)
      row_of[r] = add_row(-1e300, static_cast<double>(*problem.usage_limit) - fixed[r]);
    for (std::size_t i = 0; i < usage_terms.size();) {
      const auto [col, r, u] = usage_terms[i];
      double sum = 0;
      for (; i < usage_terms.size() && std::get<0>(usage_terms[i]) == col && std::get<1>(usage_terms[i]) == r; ++i)
        sum += std::get<2>(usage_terms[i]);
      entries.emplace_back(col, row_of[r], sum);
    }
  }
  std::sort(entries.begin(), entries.end());
  std::vector<CoinBigIndex> start(num_cols + 1, 0);
  std::vector<int> index(entries.size());
  std::vector<double> value(entries.size());
  for (std::size_t k = 0; k < entries.size(); ++k) {
    ++start[std::get<0>(entries[k]) + 1];
    index[k] = std::get<1>(entries[k]);
    value[k] = std::get<2>(entries[k]);
  }
  for (int c = 0; c < num_cols; ++c) start[c + 1] += start[c];
  std::vector<double> col_lb(num_cols, 0.0), col_ub(num_cols, 1.0), obj(num_cols, 0.0);
  bool fixed_infinite = false;  // a group of one strategy that costs the sentinel
  for (int32_t g = 0; g < ng; ++g) {
    const detail::Group& grp = coarse.groups[g];
    if (x_col[g] < 0) {
      fixed_infinite |= grp.cost[0] >= kInfiniteCost;
      continue;
    }
    for (int32_t s = 0; s < grp.num_strategies; ++s) {
      if (grp.cost[s] >= kInfiniteCost) col_ub[x_col[g] + s] = 0;
      else obj[x_col[g] + s] = static_cast<double>(grp.cost[s]);
    }
  }
  for (std::size_t p = 0; p < coarse.pairs.size(); ++p)
    for (std::size_t k = 0; k < coarse.pairs[p].cost.size(); ++k) {
      const int64_t c = coarse.pairs[p].cost[k];
      if (c >= kInfiniteCost) col_ub[y_col[p] + k] = 0;
      else obj[y_col[p] + k] = static_cast<double>(c);
    }

  SolveResult result;
  result.method = "exact (CBC)";
  bool proven_infeasible = false, proven_optimal = true;
  long double cbc_bound = -1;  // CBC's, on the problem's costs (-1: none)
  const double* sol = nullptr;
  std::unique_ptr<Cbc_Model, CbcDeleter> model;
  if (num_cols > 0) {  // else every group has one strategy: nothing to choose
    model.reset(Cbc_newModel());
    Cbc_loadProblem(model.get(), num_cols, static_cast<int>(row_lb.size()), start.data(), index.data(), value.data(),
                    col_lb.data(), col_ub.data(), obj.data(), row_lb.data(), row_ub.data());
    for (int32_t g = 0; g < ng; ++g)
      if (x_col[g] >= 0)
        for (int32_t s = 0; s < coarse.groups[g].num_strategies; ++s) Cbc_setInteger(model.get(), x_col[g] + s);
    // A warm start: the columns of a feasible plan whose group strategies are consistent
    // (every member follows its group's root as the coarsening says).
    if (!warm_group.empty()) {
      const std::vector<int32_t>& gs = warm_group;
      std::vector<double> start_value(num_cols, 0.0);
      for (int32_t g = 0; g < ng; ++g)
        if (x_col[g] >= 0) start_value[x_col[g] + gs[g]] = 1.0;
      for (std::size_t p = 0; p < coarse.pairs.size(); ++p) {
        const detail::PairEdge& e = coarse.pairs[p];
        start_value[y_col[p] + gs[e.a] * coarse.groups[e.b].num_strategies + gs[e.b]] = 1.0;
      }
      std::vector<int> cols(num_cols);
      for (int c = 0; c < num_cols; ++c) cols[c] = c;
      Cbc_setMIPStartI(model.get(), num_cols, cols.data(), start_value.data());
    }
    Cbc_setLogLevel(model.get(), 0);
    // Costs are integers: a gap below 1 proves optimality; no relative gap is allowed.
    Cbc_setAllowableGap(model.get(), 0.5);
    Cbc_setAllowableFractionGap(model.get(), 0.0);
    Cbc_setParameter(model.get(), "threads", "1");  // deterministic
    // CBC 2.10 (Debian's) can crash in CglPreProcess::postProcess when the time limit stops a
    // preprocessed solve (seen 1 run in 3-6 of tessel-iopddl on instance B at 5 s, SIGSEGV in
    // libCgl): the model is solved without CBC's preprocessing.
    Cbc_setParameter(model.get(), "preprocess", "off");
    Cbc_setParameter(model.get(), "randomSeed", fmt::format("{}", options.seed % 2147483647).c_str());
    const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Cbc_setMaximumSeconds(model.get(), std::max(0.1, options.time_limit_s - setup_s));
    Cbc_solve(model.get());
    proven_infeasible = Cbc_isProvenInfeasible(model.get()) != 0;
    proven_optimal = Cbc_isProvenOptimal(model.get()) != 0;
    // Read back whatever CBC holds unless it proved infeasibility, and keep it only when the
    // exact evaluation says it is feasible (a time limit may leave a non-integral vector).
    if (!proven_infeasible) sol = Cbc_getColSolution(model.get());
    // CBC's best bound (its search tree's least open node; the LP's value at the root) bounds
    // the program's optimum; the program leaves out the costs of groups without a choice (pairs
    // with them were folded into the other side), a constant added back. Over clamped sums
    // (add_cost) the program's objective is not the problem's: no bound then.
    // CBC reports min(its bound, its incumbent) and starts its bound at +infinity until the root
    // LP is solved: a value not below the incumbent proves nothing unless CBC proved optimality,
    // and a search abandoned for numerical trouble proves nothing at all.
    const double best_possible = Cbc_getBestPossibleObjValue(model.get());
    const int cbc_status = Cbc_status(model.get());
    if (!proven_infeasible && !proven_optimal && !coarse.clamped && (cbc_status == 0 || cbc_status == 1) &&
        Cbc_isAbandoned(model.get()) == 0 && std::isfinite(best_possible) && std::fabs(best_possible) < 1e300 &&
        best_possible < Cbc_getObjValue(model.get()) - 0.5) {
      long double constant = 0;
      for (int32_t g = 0; g < ng; ++g)
        if (x_col[g] < 0) constant += static_cast<long double>(coarse.groups[g].cost[0]);
      const long double lb = static_cast<long double>(best_possible) + constant;
      // (costs are integers; CBC's own tolerances on the LP allow a margin)
      cbc_bound = std::ceil(lb - 0.5L - 1e-9L * std::fabs(lb));
    }
  }
  bool have_plan = false;
  if (sol != nullptr || num_cols == 0) {
    result.plan.assign(problem.nodes.size(), 0);
    for (int32_t g = 0; g < ng; ++g) {
      const detail::Group& grp = coarse.groups[g];
      int32_t best = 0;
      if (x_col[g] >= 0)
        for (int32_t s = 1; s < grp.num_strategies; ++s)
          if (sol[x_col[g] + s] > sol[x_col[g] + best]) best = s;
      for (std::size_t i = 0; i < grp.members.size(); ++i)
        result.plan[grp.members[i]] = grp.assign[best * grp.members.size() + i];
    }
    result.evaluation = evaluate(problem, result.plan);
    have_plan = result.evaluation.feasible();
    // Over clamped sums (add_cost) the program's objective is not the problem's: CBC's proof
    // does not carry over.
    result.status = proven_optimal && !coarse.clamped ? SolveStatus::optimal : SolveStatus::feasible;
  }
  if (!have_plan) {
    result.plan = detail::least_memory_plan(problem);
    result.evaluation = evaluate(problem, result.plan);
    result.status = proven_infeasible || fixed_infinite || num_cols == 0 ? SolveStatus::infeasible : SolveStatus::unknown;
  }
  if (result.status == SolveStatus::optimal) result.lower_bound = static_cast<double>(result.evaluation.cost);
  else if (cbc_bound >= 0 && !fixed_infinite) result.lower_bound = static_cast<double>(cbc_bound);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result.evaluation.feasible()) {
    result.first_feasible_s = result.seconds;
    result.trace.push_back({result.seconds, result.evaluation.cost, 0});
  }
  return result;
}

}  // namespace tessel::autoshard
