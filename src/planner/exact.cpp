// The exact method of the joint schedule: a mixed-integer program on CBC
// (tessel/planner/schedule.hpp, docs/planner.md).
//
// For jobs j with modes c (device count and node(s), runtime p_jc, q_jcn devices on node n):
//   x_jc in {0,1}, sum_c x_jc = 1                                  a mode per job
//   o_ij in {0,1}: j starts after i ends;  o_ij + o_ji <= 1
//   S_j >= S_i + sum_c p_ic x_ic - M (1 - o_ij)                    precedence
//   f_nij >= 0: devices of node n handed from i to j when i ends (i may be the source: the
//     node at time 0; j may be the sink), f_nij <= D o_ij between jobs;
//     sum_i f_nij = sum_c q_jcn x_jc = sum_k f_njk                  each job's devices come
//     sum_j f_n,src,j = D                                            from somewhere, go on
//   C >= S_j + sum_c p_jc x_jc;  K C >= sum_jc g_c p_jc x_jc;  D C >= sum_jc q_jcn p_jc x_jc
// A flow of devices between jobs ordered in time is exactly a feasible use of a node's D
// interchangeable devices (the resource-flow formulation of project scheduling), with no
// binary per device, so the program is free of the devices' symmetry. The area rows are cuts
// (implied by the rest) that give the relaxation the area bound. M is the fast plan's makespan
// (no better plan ends later) or, for the sum of completion times, the sum of the longest
// runtimes (an active schedule leaves no gap before its end). CBC starts from the fast plan.
#include <Cbc_C_Interface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "sgs.hpp"
#include "tessel/core/common.hpp"
#include "tessel/planner/schedule.hpp"

namespace tessel::planner {

namespace {

struct CbcDeleter {
  void operator()(Cbc_Model* m) const { Cbc_deleteModel(m); }
};

}  // namespace

Schedule plan_exact(const std::vector<JobProfile>& jobs, const Pool& pool, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!options.device_free_at.empty())
    throw PlanError("the exact program (CBC) plans an idle pool; with devices still busy "
                    "(PlanOptions::device_free_at) use plan_fast");
  const detail::Instance inst = detail::make_instance(jobs, pool, detail::NodeModes::explicit_nodes);
  const int32_t n = static_cast<int32_t>(jobs.size());
  const int32_t nodes = pool.nodes, D = pool.devices_per_node;

  // The warm start and the big M.
  PlanOptions fast_options = options;
  if (options.time_limit_s > 0) fast_options.time_limit_s = 0.2 * options.time_limit_s;
  const Schedule warm = plan_fast(jobs, pool, fast_options);
  double M = 0;
  if (options.objective == Objective::makespan) {
    M = warm.makespan_s;
  } else {
    for (const auto& modes : inst.modes) {
      double longest = 0;
      for (const detail::Mode& m : modes) longest = std::max(longest, m.p);
      M += longest;
    }
  }

  // The program's columns: a mode binary per job and mode, a start per job, the makespan, an
  // order binary per ordered pair, and per node a flow per pair of jobs it can hold (with the
  // source and the sink). Past kMaxColumns it is not built at all: its index tables alone
  // (n^2 entries, and (n+1)^2 per node) took a time-limited run over its limit to allocate and
  // free (20,000 jobs: 1.6 GB of order indices, 5.7 s against 3 s), and CBC proves nothing on
  // programs a fraction that size.
  {
    int64_t columns = static_cast<int64_t>(n) * (n - 1) + n + 1;
    for (const auto& modes : inst.modes) columns += static_cast<int64_t>(modes.size());
    columns += static_cast<int64_t>(nodes) * (static_cast<int64_t>(n) + 1) * (static_cast<int64_t>(n) + 1);
    constexpr int64_t kMaxColumns = 10'000'000;
    if (columns > kMaxColumns) {
      Schedule out = warm;
      out.method = fmt::format("exact (CBC): its program for {} jobs would have up to {} columns, over the {} it "
                               "builds (CBC proves little past a dozen jobs); the fast method's plan",
                               n, columns, kMaxColumns);
      out.lower_bound_s = std::max(warm.lower_bound_s, makespan_lower_bound(jobs, pool));
      out.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return out;
    }
  }

  std::unique_ptr<Cbc_Model, CbcDeleter> model(Cbc_newModel());
  Cbc_Model* cm = model.get();
  // The program has O(n^2 x nodes) columns and rows, and building it takes time before CBC's
  // own clock starts (200 jobs: over 120 s): the time limit covers the building too (issue 37
  // D3). Past it, the warm start (the fast method's plan) is the answer, and says why.
  struct OutOfTime {};
  int64_t calls = 0;
  auto check_time = [&] {
    if (options.time_limit_s > 0 && ++calls % 1024 == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > options.time_limit_s)
      throw OutOfTime{};
  };
  int32_t cols = 0;
  auto add_col = [&](double lb, double ub, double obj, bool integer) {
    check_time();
    Cbc_addCol(cm, "", lb, ub, obj, integer ? 1 : 0, 0, nullptr, nullptr);
    return cols++;
  };
  try {
    const bool makespan = options.objective == Objective::makespan;
    std::vector<std::vector<int>> x(n);
    for (int32_t j = 0; j < n; ++j)
      for (std::size_t c = 0; c < inst.modes[j].size(); ++c)  // sum of completions: S_j + p_j
        x[j].push_back(add_col(0, 1, makespan ? 0.0 : inst.modes[j][c].p, true));
    std::vector<int> S(n);
    for (int32_t j = 0; j < n; ++j) S[j] = add_col(0, M, makespan ? 0.0 : 1.0, false);
    const int C = add_col(0, makespan ? M : 1e30, makespan ? 1.0 : 0.0, false);
    std::vector<std::vector<int>> o(n, std::vector<int>(n, -1));
    for (int32_t i = 0; i < n; ++i)
      for (int32_t j = 0; j < n; ++j)
        if (i != j) o[i][j] = add_col(0, 1, 0, true);
    // f[node][i][j], i in 0..n (n = the source), j in 0..n (n = the sink); only where the node
    // can hold both ends.
    auto on_node = [&](int32_t j, int32_t node) {
      for (const detail::Mode& m : inst.modes[j])
        if (std::find(m.nodes.begin(), m.nodes.end(), node) != m.nodes.end()) return true;
      return false;
    };
    std::vector<std::vector<std::vector<int>>> f(nodes, std::vector<std::vector<int>>(n + 1, std::vector<int>(n + 1, -1)));
    for (int32_t node = 0; node < nodes; ++node)
      for (int32_t i = 0; i <= n; ++i)
        for (int32_t j = 0; j <= n; ++j) {
          if (i == j && i < n) continue;
          if ((i < n && !on_node(i, node)) || (j < n && !on_node(j, node))) continue;
          f[node][i][j] = add_col(0, D, 0, false);
        }

    std::vector<int> rc;
    std::vector<double> rv;
    auto row = [&](char sense, double rhs) {
      check_time();
      Cbc_addRow(cm, "", static_cast<int>(rc.size()), rc.data(), rv.data(), sense, rhs);
      rc.clear();
      rv.clear();
    };
    auto term = [&](int col, double v) {
      rc.push_back(col);
      rv.push_back(v);
    };
    auto per_node = [&](const detail::Mode& m, int32_t node) {
      if (std::find(m.nodes.begin(), m.nodes.end(), node) == m.nodes.end()) return 0;
      return m.span() == 1 ? m.g : D;
    };
    for (int32_t j = 0; j < n; ++j) {
      for (int col : x[j]) term(col, 1);
      row('E', 1);
      // C >= S_j + p_j
      term(C, 1);
      term(S[j], -1);
      for (std::size_t c = 0; c < x[j].size(); ++c) term(x[j][c], -inst.modes[j][c].p);
      row('G', 0);
    }
    for (int32_t i = 0; i < n; ++i)
      for (int32_t j = 0; j < n; ++j) {
        if (i == j) continue;
        // S_j - S_i - p_i - M o_ij >= -M
        term(S[j], 1);
        term(S[i], -1);
        for (std::size_t c = 0; c < x[i].size(); ++c) term(x[i][c], -inst.modes[i][c].p);
        term(o[i][j], -M);
        row('G', -M);
        if (i < j) {
          term(o[i][j], 1);
          term(o[j][i], 1);
          row('L', 1);
        }
        for (int32_t node = 0; node < nodes; ++node)
          if (f[node][i][j] >= 0) {
            term(f[node][i][j], 1);
            term(o[i][j], -D);
            row('L', 0);
          }
      }
    for (int32_t node = 0; node < nodes; ++node) {
      for (int32_t j = 0; j < n; ++j) {
        if (!on_node(j, node)) continue;
        for (int32_t i = 0; i <= n; ++i)  // into j
          if (f[node][i][j] >= 0) term(f[node][i][j], 1);
        for (std::size_t c = 0; c < x[j].size(); ++c)
          if (per_node(inst.modes[j][c], node) > 0) term(x[j][c], -per_node(inst.modes[j][c], node));
        row('E', 0);
        for (int32_t k = 0; k <= n; ++k)  // out of j (k = n: the sink)
          if (k != j && f[node][j][k] >= 0) term(f[node][j][k], 1);
        for (std::size_t c = 0; c < x[j].size(); ++c)
          if (per_node(inst.modes[j][c], node) > 0) term(x[j][c], -per_node(inst.modes[j][c], node));
        row('E', 0);
      }
      for (int32_t j = 0; j <= n; ++j)
        if (f[node][n][j] >= 0) term(f[node][n][j], 1);
      row('E', D);
      // D C >= the node's area
      term(C, D);
      for (int32_t j = 0; j < n; ++j)
        for (std::size_t c = 0; c < x[j].size(); ++c)
          if (per_node(inst.modes[j][c], node) > 0)
            term(x[j][c], -per_node(inst.modes[j][c], node) * inst.modes[j][c].p);
      row('G', 0);
    }
    term(C, pool.num_devices());
    for (int32_t j = 0; j < n; ++j)
      for (std::size_t c = 0; c < x[j].size(); ++c) term(x[j][c], -inst.modes[j][c].g * inst.modes[j][c].p);
    row('G', 0);

    // The warm start: the fast plan's modes, starts, order and the devices' hand-overs.
    {
      std::vector<double> start_values(static_cast<std::size_t>(cols), 0.0);
      for (int32_t j = 0; j < n; ++j) {
        const Placement& p = warm.jobs[j];
        for (std::size_t c = 0; c < inst.modes[j].size(); ++c)
          if (inst.modes[j][c].g == p.num_devices && inst.modes[j][c].nodes == p.nodes) start_values[x[j][c]] = 1;
        start_values[S[j]] = p.start_s;
        for (int32_t i = 0; i < n; ++i)
          if (i != j && warm.jobs[i].end_s <= p.start_s) start_values[o[i][j]] = 1;
      }
      start_values[C] = makespan ? warm.makespan_s : 0;
      for (int32_t d = 0; d < pool.num_devices(); ++d) {
        std::vector<int32_t> on;
        for (int32_t j = 0; j < n; ++j)
          if (std::binary_search(warm.jobs[j].devices.begin(), warm.jobs[j].devices.end(), d)) on.push_back(j);
        std::sort(on.begin(), on.end(), [&](int32_t a, int32_t b) { return warm.jobs[a].start_s < warm.jobs[b].start_s; });
        const int32_t node = d / D;
        int32_t prev = n;  // the source
        for (int32_t j : on) {
          start_values[f[node][prev][j]] += 1;
          prev = j;
        }
        start_values[f[node][prev][n]] += 1;  // to the sink (source to sink if unused)
      }
      std::vector<int> idx(static_cast<std::size_t>(cols));
      std::iota(idx.begin(), idx.end(), 0);
      Cbc_setMIPStartI(cm, cols, idx.data(), start_values.data());
    }

    Cbc_setLogLevel(cm, 0);
    Cbc_setParameter(cm, "threads", "1");  // deterministic
    Cbc_setParameter(cm, "randomSeed", fmt::format("{}", options.seed % 2147483647 + 1).c_str());
    Cbc_setAllowableGap(cm, 1e-7 * std::max(1.0, M));
    Cbc_setAllowableFractionGap(cm, 1e-9);
    if (options.time_limit_s > 0) {
      const double left = options.time_limit_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      Cbc_setMaximumSeconds(cm, std::max(0.05, left));
    }
    Cbc_solve(cm);
    const bool proven = Cbc_isProvenOptimal(cm) != 0;
    const double* sol = Cbc_getColSolution(cm);
    const double bound = Cbc_getBestPossibleObjValue(cm);

    Schedule out = warm;
    if (sol != nullptr && Cbc_getObjValue(cm) < 1e300) {
      // The program's modes and order, placed again by the serial scheme: every start moves no
      // later (schedule.hpp), and the times become exact sums of runtimes.
      std::vector<int32_t> mode_of(n, 0);
      std::vector<double> start(n);
      for (int32_t j = 0; j < n; ++j) {
        for (std::size_t c = 0; c < x[j].size(); ++c)
          if (sol[x[j][c]] > 0.5) mode_of[j] = static_cast<int32_t>(c);
        start[j] = sol[S[j]];
      }
      const detail::Timeline t = detail::serial_sgs(inst, detail::order_by_start(start), mode_of);
      Schedule mine = detail::make_schedule(inst, t, mode_of, jobs, pool, "exact (CBC)");
      const bool better = makespan ? mine.makespan_s <= warm.makespan_s : mine.sum_completion_s <= warm.sum_completion_s;
      if (better) out = mine;
    }
    out.method = proven ? "exact (CBC, proven optimal)" : "exact (CBC, time limit: best found)";
    out.optimal = proven;
    out.lower_bound_s = makespan_lower_bound(jobs, pool);
    // CBC reports min(its bound, its incumbent), its bound infinite until the root LP is solved:
    // a value not below the incumbent is a bound only when CBC proved optimality.
    if (makespan && std::isfinite(bound) && (proven || bound < Cbc_getObjValue(cm) - 1e-9 * std::max(1.0, M)))
      out.lower_bound_s = std::max(out.lower_bound_s, bound);
    out.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  } catch (const OutOfTime&) {
    Schedule out = warm;
    out.method = fmt::format("exact (CBC): its program for {} jobs was not built within the time limit of {} s; the "
                             "fast method's plan",
                             n, options.time_limit_s);
    out.lower_bound_s = std::max(warm.lower_bound_s, makespan_lower_bound(jobs, pool));
    out.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
}

}  // namespace tessel::planner
