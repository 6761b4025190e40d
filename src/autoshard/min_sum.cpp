// Min-sum message passing (TRW-S) over the coarse graph; see model.hpp.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "model.hpp"

namespace tessel::autoshard::detail {

namespace {
// Infinite entries (10^18) are capped here so that sums of them stay finite and ordered.
constexpr double kCap = 1e18;
}  // namespace

MinSum::MinSum(const Coarse& c) : c_(c) {
  const int32_t n = static_cast<int32_t>(c.groups.size());
  gamma_.assign(n, 1.0);
  for (int32_t v = 0; v < n; ++v) {
    int32_t before = 0, after = 0;
    for (const Neighbor& nb : c.adj[v]) (nb.node < v ? before : after)++;
    gamma_[v] = 1.0 / std::max<int32_t>(1, std::max(before, after));
  }
  reset();
}

void MinSum::reset() {
  msg_.assign(c_.pairs.size() * 2, {});
  for (std::size_t k = 0; k < c_.pairs.size(); ++k) {
    msg_[2 * k].assign(c_.groups[c_.pairs[k].b].num_strategies, 0.0);
    msg_[2 * k + 1].assign(c_.groups[c_.pairs[k].a].num_strategies, 0.0);
  }
}

double MinSum::decode_cost(const std::vector<std::vector<double>>& unary, const Plan& x) const {
  double cost = 0;
  for (std::size_t g = 0; g < c_.groups.size(); ++g) cost += unary[g][x[g]];
  for (const PairEdge& e : c_.pairs)
    cost += std::min(kCap, static_cast<double>(e.cost[static_cast<std::size_t>(x[e.a]) * c_.groups[e.b].num_strategies + x[e.b]]));
  return cost;
}

std::vector<std::vector<double>> group_costs(const Coarse& coarse) {
  std::vector<std::vector<double>> out(coarse.groups.size());
  for (std::size_t g = 0; g < coarse.groups.size(); ++g)
    for (int64_t c : coarse.groups[g].cost) out[g].push_back(std::min(kCap, static_cast<double>(c)));
  return out;
}

Plan expand_groups(const Problem& problem, const Coarse& coarse, const Plan& group_plan) {
  Plan plan(problem.nodes.size(), 0);
  for (std::size_t g = 0; g < coarse.groups.size(); ++g) {
    const Group& grp = coarse.groups[g];
    const std::size_t k = grp.members.size();
    for (std::size_t i = 0; i < k; ++i) plan[grp.members[i]] = grp.assign[group_plan[g] * k + i];
  }
  return plan;
}

long double MinSum::lower_bound(const std::vector<std::vector<double>>& unary) const {
  long double bound = 0;
  const int32_t n = static_cast<int32_t>(c_.groups.size());
  for (int32_t v = 0; v < n; ++v) {  // each group's reparametrised unary: its least entry
    const int32_t sv = c_.groups[v].num_strategies;
    long double lo = std::numeric_limits<long double>::infinity();
    for (int32_t s = 0; s < sv; ++s) {
      long double t = unary[v][s];
      for (const Neighbor& nb : c_.adj[v]) t += msg_[2 * nb.pair + (c_.pairs[nb.pair].a == v ? 1 : 0)][s];
      lo = std::min(lo, t);
    }
    bound += lo;
  }
  for (std::size_t k = 0; k < c_.pairs.size(); ++k) {  // each pair's matrix less both messages
    const PairEdge& e = c_.pairs[k];
    const int32_t sa = c_.groups[e.a].num_strategies, sb = c_.groups[e.b].num_strategies;
    const std::vector<double>& to_b = msg_[2 * k];      // a -> b, over S(b)
    const std::vector<double>& to_a = msg_[2 * k + 1];  // b -> a, over S(a)
    long double lo = std::numeric_limits<long double>::infinity();
    for (int32_t s = 0; s < sa; ++s)
      for (int32_t t = 0; t < sb; ++t) {
        const long double c = std::min(kCap, static_cast<double>(e.cost[static_cast<std::size_t>(s) * sb + t]));
        lo = std::min(lo, c - static_cast<long double>(to_b[t]) - static_cast<long double>(to_a[s]));
      }
    bound += lo;
  }
  return bound;
}

long double MinSum::diffusion_bound(const std::vector<std::vector<double>>& unary, int sweeps, long double tolerance,
                                    long double stop_at, const std::function<bool()>& out_of_time, Plan* decoded) const {
  using LD = long double;
  const int32_t n = static_cast<int32_t>(c_.groups.size());
  const std::size_t np = c_.pairs.size();
  // Each pair's matrix capped, in double, and per pair what it gave to each end's costs:
  // phi[2k] over S(a), phi[2k+1] over S(b). The moves are made in double; the bound is summed
  // in long double from the same numbers (any phi reparametrises: the bound holds whatever
  // rounding chose them).
  std::vector<std::vector<double>> mat(np), phi(np * 2);
  for (std::size_t k = 0; k < np; ++k) {
    const PairEdge& e = c_.pairs[k];
    mat[k].resize(e.cost.size());
    for (std::size_t i = 0; i < e.cost.size(); ++i) mat[k][i] = std::min(kCap, static_cast<double>(e.cost[i]));
    phi[2 * k].assign(static_cast<std::size_t>(c_.groups[e.a].num_strategies), 0.0);
    phi[2 * k + 1].assign(static_cast<std::size_t>(c_.groups[e.b].num_strategies), 0.0);
  }
  auto bound = [&] {
    LD b = 0;
    for (int32_t v = 0; v < n; ++v) {
      LD lo = std::numeric_limits<LD>::infinity();
      for (int32_t s = 0; s < c_.groups[v].num_strategies; ++s) {
        LD t = unary[v][s];
        for (const Neighbor& nb : c_.adj[v]) t += phi[2 * nb.pair + (c_.pairs[nb.pair].a == v ? 0 : 1)][s];
        lo = std::min(lo, t);
      }
      b += lo;
    }
    for (std::size_t k = 0; k < np; ++k) {
      const int32_t sa = c_.groups[c_.pairs[k].a].num_strategies, sb = c_.groups[c_.pairs[k].b].num_strategies;
      LD lo = std::numeric_limits<LD>::infinity();
      for (int32_t s = 0; s < sa; ++s)
        for (int32_t t = 0; t < sb; ++t)
          lo = std::min(lo, static_cast<LD>(mat[k][static_cast<std::size_t>(s) * sb + t]) - phi[2 * k][s] -
                                phi[2 * k + 1][t]);
      b += lo;
    }
    return b;
  };
  LD best = bound();
  std::vector<double> own, avg;
  std::vector<std::vector<double>> g;
  constexpr int kEvery = 4;  // sweeps between bounds (a bound costs about a sweep)
  LD last = best;
  for (int sweep = 1; sweep <= sweeps && best < stop_at; ++sweep) {
    if (out_of_time && out_of_time()) break;
    for (int32_t v = 0; v < n; ++v) {
      const int32_t sv = c_.groups[v].num_strategies;
      const std::size_t deg = c_.adj[v].size();
      if (deg == 0) continue;
      own.assign(unary[v].begin(), unary[v].end());
      for (const Neighbor& nb : c_.adj[v]) {
        const std::vector<double>& mine = phi[2 * nb.pair + (c_.pairs[nb.pair].a == v ? 0 : 1)];
        for (int32_t s = 0; s < sv; ++s) own[s] += mine[s];
      }
      if (g.size() < deg) g.resize(deg);
      for (std::size_t i = 0; i < deg; ++i) {  // each pair's least entry per strategy of v
        const Neighbor& nb = c_.adj[v][i];
        const PairEdge& e = c_.pairs[nb.pair];
        const bool v_is_a = e.a == v;
        const std::vector<double>& mine = phi[2 * nb.pair + (v_is_a ? 0 : 1)];
        const std::vector<double>& other = phi[2 * nb.pair + (v_is_a ? 1 : 0)];
        const std::vector<double>& m = mat[nb.pair];
        const int32_t sw = c_.groups[nb.node].num_strategies, sb = c_.groups[e.b].num_strategies;
        g[i].assign(static_cast<std::size_t>(sv), std::numeric_limits<double>::infinity());
        for (int32_t s = 0; s < sv; ++s) {
          double lo = std::numeric_limits<double>::infinity();
          for (int32_t t = 0; t < sw; ++t) {
            const double c = (v_is_a ? m[static_cast<std::size_t>(s) * sb + t] : m[static_cast<std::size_t>(t) * sb + s]) -
                             other[t];
            if (c < lo) lo = c;
          }
          g[i][s] = lo - mine[s];
        }
      }
      avg.assign(static_cast<std::size_t>(sv), 0.0);
      for (int32_t s = 0; s < sv; ++s) {
        double sum = own[s];
        for (std::size_t i = 0; i < deg; ++i) sum += g[i][s];
        avg[s] = sum / static_cast<double>(deg + 1);
      }
      for (std::size_t i = 0; i < deg; ++i) {
        const Neighbor& nb = c_.adj[v][i];
        std::vector<double>& mine = phi[2 * nb.pair + (c_.pairs[nb.pair].a == v ? 0 : 1)];
        for (int32_t s = 0; s < sv; ++s)
          if (std::isfinite(g[i][s]) && std::isfinite(avg[s])) mine[s] += g[i][s] - avg[s];
      }
    }
    if (sweep % kEvery != 0 && sweep != sweeps) continue;
    const LD b = bound();
    best = std::max(best, b);
    if (b - last < tolerance) break;  // (over kEvery sweeps)
    last = b;
  }
  if (decoded != nullptr) {  // each group's least strategy under the final reparametrisation
    decoded->assign(static_cast<std::size_t>(n), 0);
    for (int32_t v = 0; v < n; ++v) {
      double lo = std::numeric_limits<double>::infinity();
      for (int32_t s = 0; s < c_.groups[v].num_strategies; ++s) {
        double t = unary[v][s];
        for (const Neighbor& nb : c_.adj[v]) t += phi[2 * nb.pair + (c_.pairs[nb.pair].a == v ? 0 : 1)][s];
        if (t < lo) {
          lo = t;
          (*decoded)[v] = s;
        }
      }
    }
  }
  return best;
}

std::vector<double> segment_usage(const Problem& problem, const Model& model, const Coarse& coarse,
                                  const Plan& group_plan) {
  std::vector<double> usage(static_cast<std::size_t>(model.num_segments) + 1, 0.0);
  for (std::size_t g = 0; g < coarse.groups.size(); ++g) {
    const Group& grp = coarse.groups[g];
    const std::size_t k = grp.members.size();
    for (std::size_t i = 0; i < k; ++i) {
      const int32_t v = grp.members[i];
      const double u = static_cast<double>(problem.nodes[v].usage[grp.assign[group_plan[g] * k + i]]);
      usage[model.seg_lo[v]] += u;
      usage[model.seg_hi[v]] -= u;
    }
  }
  double run = 0;
  for (int32_t t = 0; t < model.num_segments; ++t) {
    run += usage[t];
    usage[t] = run;
  }
  usage.pop_back();
  return usage;
}

Plan MinSum::run(const std::vector<std::vector<double>>& unary, int passes) {
  const int32_t n = static_cast<int32_t>(c_.groups.size());
  Plan x(n, 0), best;
  double best_cost = std::numeric_limits<double>::infinity();
  std::vector<double> theta, tmp;
  for (int pass = 0; pass < passes; ++pass) {
    for (int dir = 0; dir < 2; ++dir) {
      const bool forward = dir == 0;
      for (int32_t step = 0; step < n; ++step) {
        const int32_t v = forward ? step : n - 1 - step;
        const int32_t sv = c_.groups[v].num_strategies;
        // theta = unary + all incoming messages.
        theta.assign(unary[v].begin(), unary[v].end());
        for (const Neighbor& nb : c_.adj[v]) {
          const bool v_is_a = c_.pairs[nb.pair].a == v;
          const std::vector<double>& in = msg_[2 * nb.pair + (v_is_a ? 1 : 0)];  // into v
          for (int32_t s = 0; s < sv; ++s) theta[s] += in[s];
        }
        if (forward) {  // decode: earlier neighbours fixed, later ones through their messages
          tmp.assign(unary[v].begin(), unary[v].end());
          for (const Neighbor& nb : c_.adj[v]) {
            const PairEdge& e = c_.pairs[nb.pair];
            const bool v_is_a = e.a == v;
            if (nb.node < v) {
              const int32_t sb = c_.groups[e.b].num_strategies;
              for (int32_t s = 0; s < sv; ++s)
                tmp[s] += std::min(kCap, static_cast<double>(v_is_a ? e.cost[static_cast<std::size_t>(s) * sb + x[nb.node]]
                                                                     : e.cost[static_cast<std::size_t>(x[nb.node]) * sb + s]));
            } else {
              const std::vector<double>& in = msg_[2 * nb.pair + (v_is_a ? 1 : 0)];
              for (int32_t s = 0; s < sv; ++s) tmp[s] += in[s];
            }
          }
          x[v] = static_cast<int32_t>(std::min_element(tmp.begin(), tmp.end()) - tmp.begin());
        }
        // Messages to the neighbours ahead in this direction.
        for (const Neighbor& nb : c_.adj[v]) {
          if (forward ? nb.node < v : nb.node > v) continue;
          const PairEdge& e = c_.pairs[nb.pair];
          const bool v_is_a = e.a == v;
          std::vector<double>& out = msg_[2 * nb.pair + (v_is_a ? 0 : 1)];  // v -> nb
          const std::vector<double>& back = msg_[2 * nb.pair + (v_is_a ? 1 : 0)];
          const int32_t sw = c_.groups[nb.node].num_strategies;
          const int32_t sb = c_.groups[e.b].num_strategies;
          std::fill(out.begin(), out.end(), std::numeric_limits<double>::infinity());
          for (int32_t s = 0; s < sv; ++s) {
            const double base = gamma_[v] * theta[s] - back[s];
            for (int32_t t = 0; t < sw; ++t) {
              const int64_t raw = v_is_a ? e.cost[static_cast<std::size_t>(s) * sb + t] : e.cost[static_cast<std::size_t>(t) * sb + s];
              const double val = base + std::min(kCap, static_cast<double>(raw));
              if (val < out[t]) out[t] = val;
            }
          }
          const double lo = *std::min_element(out.begin(), out.end());
          for (double& m : out) m = std::min(kCap, m - lo);
        }
      }
    }
    const double cost = decode_cost(unary, x);
    if (cost < best_cost || best.empty()) {  // (a NaN cost must not leave the plan empty)
      best_cost = cost;
      best = x;
    }
  }
  return best.empty() ? x : best;
}

}  // namespace tessel::autoshard::detail

namespace tessel::autoshard::detail {

LagrangianResult lagrangian_min_sum(const Problem& problem, const Model& model, const Coarse& coarse,
                                    const std::vector<double>& betas, int iterations, int passes, double price_base,
                                    const std::function<bool()>& out_of_time,
                                    const std::function<void(double, int64_t)>& on_improvement) {
  LagrangianResult r;
  const int32_t n = static_cast<int32_t>(coarse.groups.size());
  const int32_t segments = model.num_segments;
  const bool limited = problem.usage_limit.has_value();
  const double limit = limited ? static_cast<double>(*problem.usage_limit) : 0.0;
  std::vector<double> lambda(segments, 0.0), prefix(segments + 1, 0.0), usage(segments, 0.0);
  std::vector<std::vector<double>> unary(n);
  const std::vector<std::vector<double>> truth = group_costs(coarse);
  MinSum ms(coarse);
  r.best_cost = std::numeric_limits<double>::infinity();
  // The plan x's usage per segment (usage[t]); whether it fits; a candidate when it does.
  auto take = [&](const Plan& x, bool penalties) {
    usage = segment_usage(problem, model, coarse, x);
    bool fits = true;
    for (int32_t t = 0; t < segments && limited; ++t) fits &= usage[t] <= limit;
    const double cost = ms.cost_of(truth, x);
    if (!fits || cost >= kCap / 2) return;
    Plan& kind_best = penalties ? r.penalty_best : r.price_best;
    double& kind_cost = penalties ? r.penalty_best_cost : r.price_best_cost;
    if (cost < kind_cost) {
      kind_cost = cost;
      kind_best = x;
    }
    if (cost < r.best_cost) {
      r.best_cost = cost;
      r.best = x;
      r.found_at = r.iterations;
      if (on_improvement) on_improvement(cost, r.iterations);
    }
  };
  // unary = each group's cost plus, per member v, weight_of(v) x (its usage - zero_of(v)).
  auto price_unary = [&](auto&& weight_of, auto&& zero_of) {
    for (int32_t g = 0; g < n; ++g) {
      const Group& grp = coarse.groups[g];
      const std::size_t k = grp.members.size();
      unary[g] = truth[g];
      for (std::size_t i = 0; i < k; ++i) {
        const int32_t v = grp.members[i];
        const double w = weight_of(v);
        if (w == 0) continue;
        const int64_t zero = zero_of(v);
        for (int32_t s = 0; s < grp.num_strategies; ++s)
          unary[g][s] += w * static_cast<double>(problem.nodes[v].usage[grp.assign[s * k + i]] - zero);
      }
    }
  };
  // First, under a limit, penalty rounds: each node's own weight on its usage above its least,
  // searched per node by bisection (PenaltyWeights), up to `iterations` solves from cold
  // messages, ended early when a fifth of them in a row found no cheaper plan that fits (on
  // IOPDDL T the rounds after its 40th found nothing and held the prices back by 30 s).
  if (limited) {
    PenaltyWeights weights(problem, model, price_base);
    const int patience = std::max(10, iterations / 5);
    int since_better = 0;
    for (int it = 0; it < iterations && weights.at_risk() > 0 && since_better < patience; ++it) {
      if (out_of_time && out_of_time()) return r;
      ++r.iterations;
      const double before = r.penalty_best_cost;
      price_unary([&](int32_t v) { return weights.weight(v); }, [&](int32_t v) { return weights.least(v); });
      take(ms.run(unary, passes), true);
      weights.update(usage, limit);
      since_better = r.penalty_best_cost < before ? 0 : since_better + 1;
    }
  }
  for (double beta : betas) {
    std::fill(lambda.begin(), lambda.end(), 0.0);
    ms.reset();
    for (int it = 0; it < iterations; ++it) {
      if (out_of_time && out_of_time()) {
        if (it > 0) r.final_prices.push_back(lambda);
        return r;
      }
      ++r.iterations;
      prefix[0] = 0;
      for (int32_t t = 0; t < segments; ++t) prefix[t + 1] = prefix[t] + lambda[t];
      price_unary([&](int32_t v) { return prefix[model.seg_hi[v]] - prefix[model.seg_lo[v]]; },
                  [](int32_t) { return int64_t{0}; });
      const Plan x = ms.run(unary, passes);
      // Without a limit, the bound of the messages (with one, the messages' own bound of the
      // priced problem is far below its optimum after two passes a price: B's -2.6e9 against an
      // optimum of 5.3e5. lagrangian_bound takes the prices each step size ended at instead).
      const long double before = r.lower_bound;
      if (!limited && !coarse.clamped) r.lower_bound = std::max(r.lower_bound, ms.lower_bound(unary));
      take(x, false);
      if (!limited) {  // nothing to price: more passes only while they tighten the bound
        if (r.best.empty() || r.lower_bound >= static_cast<long double>(r.best_cost) - 0.5L ||
            r.lower_bound <= before + 1e-9L * std::fabs(static_cast<long double>(r.best_cost)))
          break;
        continue;
      }
      // (a limit of 0 prices by bytes over it, not by a ratio that would divide by zero)
      const double scale = limit > 0 ? limit : 1.0;
      for (int32_t t = 0; t < segments; ++t)
        lambda[t] = std::max(0.0, lambda[t] + beta * price_base * (usage[t] - limit) / scale);
    }
    if (!limited) break;
    r.final_prices.push_back(lambda);
  }
  return r;
}

long double lagrangian_bound(const Problem& problem, const Model& model, const Coarse& coarse,
                             const std::vector<double>& prices, double scale, int sweeps,
                             const std::function<bool()>& out_of_time, Plan* decoded) {
  if (!problem.usage_limit || coarse.clamped) return -std::numeric_limits<long double>::infinity();
  const int32_t n = static_cast<int32_t>(coarse.groups.size());
  const int32_t segments = model.num_segments;
  std::vector<long double> prefix(segments + 1, 0.0L);
  for (int32_t t = 0; t < segments; ++t) prefix[t + 1] = prefix[t] + std::max(0.0, scale * prices[t]);
  if (out_of_time && out_of_time()) return -std::numeric_limits<long double>::infinity();
  std::vector<std::vector<double>> unary = group_costs(coarse);
  long double magnitude = 0;  // of the priced costs, for the margin below
  std::vector<long double> priced_row;
  for (int32_t g = 0; g < n; ++g) {
    const Group& grp = coarse.groups[g];
    const std::size_t k = grp.members.size();
    // Summed in long double, rounded to a double once per entry.
    priced_row.assign(unary[g].begin(), unary[g].end());
    for (std::size_t i = 0; i < k; ++i) {
      const int32_t v = grp.members[i];
      const long double price = prefix[model.seg_hi[v]] - prefix[model.seg_lo[v]];
      if (price == 0) continue;
      for (int32_t s = 0; s < grp.num_strategies; ++s)
        priced_row[s] += price * static_cast<long double>(problem.nodes[v].usage[grp.assign[s * k + i]]);
    }
    for (int32_t s = 0; s < grp.num_strategies; ++s) unary[g][s] = static_cast<double>(priced_row[s]);
    long double most = 0;
    for (double u : unary[g])
      if (u < kCap / 2) most = std::max(most, static_cast<long double>(std::fabs(u)));  // (finite costs)
    magnitude += most;
  }
  const long double paid = static_cast<long double>(*problem.usage_limit) * prefix[segments];
  const MinSum ms(coarse);
  // (diffusion stops when 4 sweeps gain less than 1e-7 of the costs' magnitude)
  const long double priced = ms.diffusion_bound(unary, sweeps, 1e-7L * (magnitude + paid),
                                                std::numeric_limits<long double>::infinity(), out_of_time, decoded);
  // Each priced cost was rounded to a double once (a relative 2^-53) and the sums are in long
  // double: 1e-12 of the costs' magnitude covers both.
  return priced - paid - 1e-12L * (magnitude + paid);
}

}  // namespace tessel::autoshard::detail
