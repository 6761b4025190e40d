// The Lagrangian relaxation of the usage limit with an exact weighted-constraint solver for the
// priced problem (tessel/autoshard/solver.hpp, solve_wcsp). The strongest IOPDDL entries turned
// the limit into prices and solved the rest with toulbar2; here toulbar2 (Debian's package, run
// as a program on a file in its WCSP format) solves the coarsened, pruned problem (model.hpp,
// dominance.cpp) with every group strategy's cost raised by its members' usage times the sum of
// the prices of the segments where each is live, rounded down. The optimum of that priced
// problem, less the prices times the limit, is a lower bound on the true optimum for any prices
// (weak duality; rounding down only lowers it). Each priced optimum decodes to a plan: one that
// fits is a candidate; the best is proven optimal when the bound reaches its cost. The prices
// move by Polyak subgradient steps towards the best plan's cost.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "model.hpp"
#include "tessel/autoshard/solver.hpp"

namespace tessel::autoshard {

namespace {

using Clock = std::chrono::steady_clock;

std::string toulbar2_path() {
  const char* env = std::getenv("TESSEL_TOULBAR2");
  if (env != nullptr && *env != '\0') return env;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string d; std::getline(dirs, d, ':');) {
    const std::filesystem::path p = std::filesystem::path(d.empty() ? "." : d) / "toulbar2";
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

// One toulbar2 run on `wcsp`: the solution (a value per variable) and the priced problem's
// optimum, or (cut by the time) its lower bound; `solved` says which.
struct WcspAnswer {
  std::vector<int32_t> values;
  long long lower = 0;  // a lower bound on the priced optimum (the optimum when proven)
  bool proven = false;
};

WcspAnswer run_toulbar2(const std::string& exe, const std::string& wcsp, const std::string& sol, double seconds) {
  std::remove(sol.c_str());
  const int limit = std::max(1, static_cast<int>(std::floor(seconds)));
  // toulbar2's own limit is whole seconds of CPU time (at most `seconds`); the wall clock is cut
  // a quarter second after `seconds` (a loaded machine), and under a second at `seconds` itself:
  // a small problem is often proven in a fraction of a second (the GPT-3 layer's forward on
  // data=2,model=4,seq=4: 36 groups, 0.25 s), and a run cut there leaves the solutions it wrote.
  const double wall = seconds < 1 ? std::max(0.05, seconds) : seconds + 0.25;
  const std::string cmd =
      fmt::format("timeout -k 1 {:.3f} '{}' '{}' -timer={} -w='{}' 2>&1", wall, exe, wcsp, limit, sol);
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) throw Error(fmt::format("solve_wcsp: cannot run {}", exe));
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
  pclose(f);
  WcspAnswer a;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "Optimum: %lld", &lo) == 1) {
      a.lower = lo;
      a.proven = true;
    } else if (std::sscanf(line.c_str(), "Optimality gap: [%lld, %lld]", &lo, &hi) == 2 && !a.proven) {
      a.lower = std::max(a.lower, lo);
    }
  }
  std::ifstream in(sol);
  std::string last, l;
  while (std::getline(in, l))
    if (!l.empty()) last = l;
  std::istringstream vals(last);
  for (int32_t v; vals >> v;) a.values.push_back(v);
  return a;
}

}  // namespace

bool wcsp_available() { return !toulbar2_path().empty(); }

SolveResult solve_wcsp(const Problem& problem, const SolveOptions& options) {
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const std::string exe = toulbar2_path();
  if (exe.empty())
    throw Error("solve_wcsp: toulbar2 is not installed (scripts/deps installs Debian's toulbar2; or set "
                "TESSEL_TOULBAR2 to its path)");
  SolveResult result;
  result.method = "Lagrangian + WCSP (toulbar2)";
  const detail::Model m = detail::build_model(problem);
  // Not pruned: the block moves that repair the priced plans search this same coarse problem
  // (pruning removes little where this method is used: V's program loses 0.01%).
  const detail::Coarse c = detail::build_coarse(problem, m);
  const std::size_t ng = c.groups.size();
  const int32_t T = m.num_segments;
  const bool limited = problem.usage_limit.has_value() && T > 0;
  const double limit = limited ? static_cast<double>(*problem.usage_limit) : 0.0;

  // The best feasible plan so far: the warm start's, if given.
  Plan best;
  TotalCost best_cost = 0;
  auto consider = [&](const Plan& plan) {
    const Evaluation ev = evaluate(problem, plan);
    if (!ev.feasible() || (!best.empty() && ev.cost >= best_cost)) return false;
    best = plan;
    best_cost = ev.cost;
    result.trace.push_back({elapsed(), ev.cost, result.iterations});  // the priced solve that found it (0: the warm start)
    if (result.first_feasible_s < 0) result.first_feasible_s = elapsed();
    if (options.on_improvement) options.on_improvement(result.trace.back());
    return true;
  };
  if (!options.warm_start.empty() && options.warm_start.size() == problem.nodes.size()) consider(options.warm_start);

  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("tessel-wcsp-{}-{}", getpid(), Clock::now().time_since_epoch().count());
  std::filesystem::create_directories(dir);
  const std::string wcsp = (dir / "p.wcsp").string(), sol = (dir / "p.sol").string();
  // Each pair's largest finite entry (the upper bound of a file counts them).
  std::vector<int64_t> pair_max(c.pairs.size(), 0);
  for (std::size_t p = 0; p < c.pairs.size(); ++p)
    for (int64_t x : c.pairs[p].cost)
      if (x < kInfiniteCost) pair_max[p] = std::max(pair_max[p], x);
  std::vector<double> price(static_cast<std::size_t>(std::max(T, 0)), 0.0);
  // Penalty rounds (every other priced solve under a limit): each node's own weight on its usage
  // above its least, searched per node by bisection (detail::PenaltyWeights).
  detail::PenaltyWeights weights(problem, m, detail::median_price_ratio(problem));
  double best_lower = -std::numeric_limits<double>::infinity();
  double beta = 1.0;
  int since_better = 0;
  double write_s = 0;  // the last problem file's writing
  bool optimal = false;
  for (int64_t it = 0; options.max_iterations < 0 || it < options.max_iterations; ++it) {
    if (options.stop != nullptr && options.stop->load()) break;
    const double left = options.time_limit_s - elapsed();
    // Another file, its reading by toulbar2 and a search: the last file's writing twice over
    // (written, then read) and a tenth of a second (the 51-MB file of a GPT training step on
    // data=2,model=4,seq=4 took about 0.3 s to write).
    if (left < 0.1 + 2 * write_s) break;
    // Round 0 is the problem without prices; then, under a limit, penalty rounds and Lagrangian
    // rounds take turns.
    const bool penalty_round = limited && it % 2 == 1 && weights.at_risk() > 0;
    // Each member's price: the sum of the prices over its live segments (a Lagrangian round),
    // or its own weight on its usage above its least (a penalty round).
    std::vector<double> prefix(static_cast<std::size_t>(T) + 1, 0.0);
    for (int32_t t = 0; t < T; ++t) prefix[static_cast<std::size_t>(t) + 1] = prefix[static_cast<std::size_t>(t)] + price[static_cast<std::size_t>(t)];
    std::vector<std::vector<long long>> unary(ng);
    for (std::size_t g = 0; g < ng; ++g) {
      const detail::Group& grp = c.groups[g];
      const std::size_t k = grp.members.size();
      for (int32_t s = 0; s < grp.num_strategies; ++s) {
        double extra = 0;
        for (std::size_t i = 0; i < k; ++i) {
          const int32_t v = grp.members[i];
          const int32_t vs = grp.assign[static_cast<std::size_t>(s) * k + i];
          if (penalty_round) {
            extra += std::ceil(weights.penalty(problem, v, vs));
            continue;
          }
          const double lam = prefix[static_cast<std::size_t>(m.seg_hi[static_cast<std::size_t>(v)])] -
                             prefix[static_cast<std::size_t>(m.seg_lo[static_cast<std::size_t>(v)])];
          if (lam > 0)
            extra += static_cast<double>(problem.nodes[static_cast<std::size_t>(v)].usage[static_cast<std::size_t>(vs)]) * lam;
        }
        const int64_t base = grp.cost[static_cast<std::size_t>(s)];
        const long long u = base >= kInfiniteCost ? kInfiniteCost
                                                  : base + static_cast<long long>(std::min(std::floor(extra), 1e17));
        unary[g].push_back(std::min<long long>(u, kInfiniteCost));
      }
    }
    // The file's upper bound: above every plan of finite cost (each group's and pair's largest
    // finite entry, summed); an infinite entry gets it, which the solver reads as forbidden.
    const double write_start = elapsed();
    long double sum = 1;
    for (std::size_t g = 0; g < ng; ++g) {
      long long mx = 0;
      for (long long u : unary[g])
        if (u < kInfiniteCost) mx = std::max(mx, u);
      sum += mx;
    }
    for (int64_t x : pair_max) sum += x;
    long long ub = static_cast<long long>(std::min<long double>(sum, 4e17L));
    // Without a limit the file is the problem itself: the best plan so far (the warm start's)
    // bounds it from above, and toulbar2 prunes every branch that cannot beat it (the GPT
    // training step on data=2,model=4,seq=4, 260 groups: proven 1.46 s into a 5-s limit, 1.73 s
    // without; about 0.3 s of it writing its 51-MB file, 0.34 s toulbar2 reading and solving it).
    if (!limited && !best.empty() && best_cost + 1 < static_cast<TotalCost>(ub)) ub = static_cast<long long>(best_cost + 1);
    {
      std::ofstream f(wcsp);
      int32_t maxd = 1;
      for (const detail::Group& grp : c.groups) maxd = std::max(maxd, grp.num_strategies);
      f << "tessel " << ng << " " << maxd << " " << ng + c.pairs.size() << " " << ub << "\n";
      for (const detail::Group& grp : c.groups) f << grp.num_strategies << " ";
      f << "\n";
      for (std::size_t g = 0; g < ng; ++g) {
        f << "1 " << g << " 0 " << unary[g].size() << "\n";
        for (std::size_t s = 0; s < unary[g].size(); ++s) f << s << " " << std::min(unary[g][s], ub) << "\n";
      }
      std::string line;
      for (std::size_t p = 0; p < c.pairs.size(); ++p) {
        const detail::PairEdge& e = c.pairs[p];
        const int32_t sb = c.groups[static_cast<std::size_t>(e.b)].num_strategies;
        int64_t nz = 0;
        for (int64_t x : e.cost) nz += x != 0;
        f << "2 " << e.a << " " << e.b << " 0 " << nz << "\n";
        for (std::size_t k = 0; k < e.cost.size(); ++k)
          if (e.cost[k] != 0)
            f << static_cast<int64_t>(k) / sb << " " << static_cast<int64_t>(k) % sb << " "
              << std::min<long long>(e.cost[k], ub) << "\n";
      }
      if (!f.flush()) throw Error(fmt::format("solve_wcsp: cannot write {}", wcsp));
    }
    write_s = elapsed() - write_start;
    // What is left but a margin for the answer's repair and the caller (half a second, or a
    // fifth of a short limit).
    const WcspAnswer a = run_toulbar2(exe, wcsp, sol, left - std::min(0.5, 0.2 * left));
    ++result.iterations;
    double slack_priced = 0;  // sum over segments of price x limit
    for (double p : price) slack_priced += p * limit;
    // A penalty round's optimum bounds nothing; a Lagrangian round's, less the prices times the
    // limit, bounds the optimum from below (weak duality).
    const double lower = penalty_round ? -std::numeric_limits<double>::infinity() : static_cast<double>(a.lower) - slack_priced;
    if (!penalty_round && lower > best_lower + 1e-9) {
      best_lower = lower;
      since_better = 0;
    } else if (!penalty_round && ++since_better >= 3) {
      beta *= 0.5;
      since_better = 0;
    }
    if (a.values.size() != ng) break;  // no solution within the time
    for (std::size_t g = 0; g < ng; ++g)
      if (a.values[g] < 0 || a.values[g] >= c.groups[g].num_strategies) throw Error("solve_wcsp: toulbar2's solution is out of range");
    const Plan plan = detail::expand_groups(problem, c, a.values);
    consider(plan);
    // A priced plan over the limit: the block moves repair it into the limit and polish it,
    // briefly (a tenth of what is left, at most 5 s); a better plan that fits is kept.
    if (limited && !evaluate(problem, plan).within_memory) {
      SolveOptions po = options;
      po.time_limit_s = std::min(5.0, 0.1 * (options.time_limit_s - elapsed()));
      po.max_iterations = options.max_iterations < 0 ? -1 : 2000;
      po.on_improvement = nullptr;
      po.warm_start.clear();
      if (po.time_limit_s > 0.2 || po.max_iterations > 0) {
        const SolveResult rep = detail::search_from(problem, po, m, c, a.values);
        if (rep.evaluation.feasible()) consider(rep.plan);
      }
    }
    if (std::getenv("TESSEL_WCSP_LOG") != nullptr) {
      const Evaluation ev = evaluate(problem, plan);
      std::fprintf(stderr,
                   "wcsp %lld%s at %.2f s: priced %lld%s, bound %.0f (best %.0f), plan %s peak %lld (limit %.0f), best plan %s, "
                   "beta %g\n",
                   static_cast<long long>(it), penalty_round ? " (penalties)" : "", elapsed(), a.lower,
                   a.proven ? " (optimum)" : "", lower, best_lower,
                   cost_str(ev.cost).c_str(), static_cast<long long>(ev.peak_usage), limit,
                   best.empty() ? "none" : cost_str(best_cost).c_str(), beta);
    }
    if (!best.empty() && a.proven && best_lower >= static_cast<double>(best_cost) - 0.5) {
      optimal = true;
      break;
    }
    if (!limited) {
      optimal = a.proven && !best.empty();
      break;
    }
    // The subgradient: each segment's usage over the limit under the priced plan.
    std::vector<double> usage(static_cast<std::size_t>(T) + 1, 0.0);
    for (std::size_t v = 0; v < problem.nodes.size(); ++v) {
      const double u = static_cast<double>(problem.nodes[v].usage[static_cast<std::size_t>(plan[v])]);
      usage[static_cast<std::size_t>(m.seg_lo[v])] += u;
      usage[static_cast<std::size_t>(m.seg_hi[v])] -= u;
    }
    double run = 0, norm = 0;
    std::vector<double> grad(static_cast<std::size_t>(T));
    for (int32_t t = 0; t < T; ++t) {
      run += usage[static_cast<std::size_t>(t)];
      grad[static_cast<std::size_t>(t)] = run - limit;
      norm += grad[static_cast<std::size_t>(t)] * grad[static_cast<std::size_t>(t)];
    }
    if (penalty_round) {
      std::vector<double> seg(static_cast<std::size_t>(T));
      for (int32_t t = 0; t < T; ++t) seg[static_cast<std::size_t>(t)] = grad[static_cast<std::size_t>(t)] + limit;
      weights.update(seg, limit);
      continue;
    }
    if (norm <= 0) break;
    const double target = best.empty() ? std::max(1.0, 1.5 * std::fabs(lower)) : static_cast<double>(best_cost);
    const double step = beta * std::max(target - lower, 1e-9 * std::fabs(target) + 1.0) / norm;
    for (int32_t t = 0; t < T; ++t)
      price[static_cast<std::size_t>(t)] = std::max(0.0, price[static_cast<std::size_t>(t)] + step * grad[static_cast<std::size_t>(t)]);
    if (beta < 1e-6) break;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  // (over clamped sums the priced problems' costs are not the problem's: no bound then)
  result.lower_bound = std::isfinite(best_lower) && !c.clamped ? best_lower : -1;
  if (best.empty()) {
    result.plan = detail::least_memory_plan(problem);
    result.evaluation = evaluate(problem, result.plan);
    result.status = SolveStatus::unknown;
  } else {
    result.plan = best;
    result.evaluation = evaluate(problem, best);
    result.status = optimal && !c.clamped ? SolveStatus::optimal : SolveStatus::feasible;
    if (result.status == SolveStatus::optimal) result.lower_bound = static_cast<double>(best_cost);
  }
  result.seconds = elapsed();
  return result;
}

}  // namespace tessel::autoshard
