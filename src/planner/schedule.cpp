// The fast method, brute force, the baselines and the checks of the joint schedule
// (tessel/planner/schedule.hpp). The exact method is in exact.cpp.
#include "tessel/planner/schedule.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <cmath>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "packing.hpp"
#include "sgs.hpp"
#include "tessel/core/common.hpp"

namespace tessel::planner {

using detail::Instance;
using detail::Mode;
using detail::Timeline;

namespace {

// splitmix64: the search's random numbers, the same on every platform.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  int32_t below(int32_t n) { return static_cast<int32_t>(next() % static_cast<uint64_t>(n)); }
};

double elapsed(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The mode of least device-seconds among those finishing within T (ties: the shorter); the
// fastest mode when none does. The dual approximation of malleable scheduling. With slack > 0,
// the mode of most devices (then the shorter) among those within (1 + slack) x that least area:
// a job that scales almost linearly then takes a wide count, and wide jobs one after another
// on a node leave no holes.
int32_t mode_for_target(const std::vector<Mode>& modes, double target, double slack = 0) {
  int32_t best = -1;
  for (int32_t m = 0; m < static_cast<int32_t>(modes.size()); ++m) {
    if (modes[m].p > target) continue;
    if (best < 0) {
      best = m;
      continue;
    }
    const double a = modes[m].g * modes[m].p, b = modes[best].g * modes[best].p;
    if (a < b || (a == b && modes[m].p < modes[best].p)) best = m;
  }
  if (best < 0) {
    for (int32_t m = 0; m < static_cast<int32_t>(modes.size()); ++m)
      if (best < 0 || modes[m].p < modes[best].p) best = m;
    return best;
  }
  if (slack > 0) {
    const double least = modes[best].g * modes[best].p;
    for (int32_t m = 0; m < static_cast<int32_t>(modes.size()); ++m) {
      if (modes[m].p > target || modes[m].g * modes[m].p > least * (1 + slack)) continue;
      if (modes[m].g > modes[best].g || (modes[m].g == modes[best].g && modes[m].p < modes[best].p)) best = m;
    }
  }
  return best;
}

// Longest first for the makespan, shortest first for the sum of completion times.
std::vector<int32_t> priority_order(const Instance& inst, const std::vector<int32_t>& mode_of, Objective o) {
  std::vector<int32_t> order(inst.modes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const Mode& ma = inst.modes[a][mode_of[a]];
    const Mode& mb = inst.modes[b][mode_of[b]];
    if (o == Objective::makespan) return ma.p > mb.p || (ma.p == mb.p && ma.g > mb.g);
    return ma.p * ma.g < mb.p * mb.g;
  });
  return order;
}

// What the search minimises: the objective, then (a small weight) the other one, so moves that
// pack the rest of the jobs earlier without changing the makespan are taken.
double score(const Timeline& t, Objective o, std::size_t n) {
  if (o == Objective::makespan) return t.makespan + 1e-3 * t.sum_completion / static_cast<double>(n);
  return t.sum_completion + 1e-3 * t.makespan;
}

Schedule sequential_modes(const std::vector<JobProfile>& jobs, const Pool& pool, const Instance& inst,
                          const std::vector<int32_t>& mode_of, const std::string& method) {
  // One after another in the given order: the SGS with every job after the previous one is the
  // same as the SGS here only when each takes the whole pool, so the starts are set directly.
  Timeline t;
  t.start.resize(jobs.size());
  t.nodes.resize(jobs.size());
  double at = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const Mode& m = inst.modes[j][mode_of[j]];
    t.start[j] = at;
    for (int32_t k = 0; k < m.span(); ++k) t.nodes[j].push_back(k);
    at += m.p;
    t.sum_completion += at;
  }
  t.makespan = at;
  return detail::make_schedule(inst, t, mode_of, jobs, pool, method);
}


// n! x the product of the jobs' mode counts: what enumerate_all tries.
double enumeration_size(const Instance& inst) {
  double combos = 1;
  for (std::size_t j = 0; j < inst.modes.size(); ++j)
    combos *= static_cast<double>(inst.modes[j].size()) * static_cast<double>(j + 1);
  return combos;
}

struct Enumerated {
  Timeline timeline;
  std::vector<int32_t> mode_of;
  int64_t generations = 0;
};

// Every order of the jobs with every choice of modes through the serial scheme: with a mode
// per node set (NodeModes::explicit_nodes or both), the optimum of either objective, since
// some order generates an optimal schedule (the left-shift argument in docs/planner.md).
Enumerated enumerate_all(const Instance& inst, Objective objective) {
  const std::size_t n = inst.modes.size();
  std::vector<int32_t> mode_of(n, 0);
  Enumerated best;
  double best_value = -1;
  while (true) {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    do {
      Timeline t = detail::serial_sgs(inst, order, mode_of);
      ++best.generations;
      const double v = detail::objective_value(t, objective);
      if (best_value < 0 || v < best_value) {
        best_value = v;
        best.timeline = std::move(t);
        best.mode_of = mode_of;
      }
    } while (std::next_permutation(order.begin(), order.end()));
    std::size_t j = 0;
    while (j < n && ++mode_of[j] == static_cast<int32_t>(inst.modes[j].size())) mode_of[j++] = 0;
    if (j == n) break;
  }
  return best;
}

}  // namespace

double makespan_lower_bound(const std::vector<JobProfile>& jobs, const Pool& pool) {
  // A makespan T is possible only if (1) every job has a mode of runtime <= T, (2) the least
  // device-seconds of those modes fit in K x T, and (3) the jobs whose every such mode runs
  // longer than T / 2 (each is running at the moment T / 2, whatever its start) fit in K devices
  // at once, each on the fewest devices of those modes. Each condition only changes where T
  // crosses a runtime or twice one, so the least T meeting all three is found by a scan over
  // those breakpoints (within an interval, (1) and (3) are fixed and (2) holds from
  // area / K on). Conditions (2) and (3) choose their modes separately: a relaxation, so the
  // result is a lower bound. It is at least the area bound and the longest least runtime.
  const Instance inst = detail::make_instance(jobs, pool, detail::NodeModes::greedy);
  const double k = pool.num_devices();
  std::vector<double> breaks{0.0};
  for (const std::vector<Mode>& modes : inst.modes)
    for (const Mode& m : modes) {
      breaks.push_back(m.p);
      breaks.push_back(2 * m.p);
    }
  std::sort(breaks.begin(), breaks.end());
  breaks.erase(std::unique(breaks.begin(), breaks.end()), breaks.end());
  breaks.push_back(std::numeric_limits<double>::infinity());
  // The bound of interval b, or a negative number when no T in it meets the three conditions.
  auto bound_in = [&](std::size_t b) {
    // In (breaks[b], breaks[b+1]) every comparison with a runtime is decided; probe the middle
    // (or just past the last breakpoint).
    const double lo = breaks[b], hi = breaks[b + 1];
    const double probe = std::isinf(hi) ? lo * 1.5 + 1 : 0.5 * (lo + hi);
    double area = 0, midpoint_devices = 0;
    for (const std::vector<Mode>& modes : inst.modes) {
      double a = -1;
      int32_t fewest = 0;
      bool short_mode = false;
      for (const Mode& m : modes) {
        if (m.p > probe) continue;
        a = a < 0 ? m.g * m.p : std::min(a, m.g * m.p);
        if (m.p <= probe / 2) short_mode = true;
        fewest = fewest == 0 ? m.g : std::min(fewest, m.g);
      }
      if (a < 0) return -1.0;
      area += a;
      if (!short_mode) midpoint_devices += fewest;
    }
    if (midpoint_devices > k) return -1.0;
    // Condition (2) within this interval: T >= area / K. The interval's own ends: a T equal to
    // lo belongs to the interval below (already rejected), so the bound is above lo.
    const double t = std::max(lo, area / k);
    return t < hi ? t : -1.0;
  };
  // Each condition only gets easier as T grows (more modes fit, the least area falls, fewer
  // jobs must run at T / 2), so the intervals that hold a bound are a suffix: the first is found
  // by bisection, in O(log breakpoints) passes over the jobs (a scan of every interval took
  // 2.5 s for 10,000 jobs; issue 37 D8).
  const std::size_t intervals = breaks.size() - 1;
  if (bound_in(intervals - 1) < 0) throw PlanError("internal: no makespan bound found");
  std::size_t first = 0, last = intervals - 1;  // the first interval with a bound is in [first, last]
  while (first < last) {
    const std::size_t mid = first + (last - first) / 2;
    if (bound_in(mid) >= 0) last = mid;
    else first = mid + 1;
  }
  return bound_in(first);
}

Schedule plan_fast(const std::vector<JobProfile>& jobs, const Pool& pool, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  Instance inst = detail::make_instance(jobs, pool, pool.nodes <= 4 ? detail::NodeModes::both : detail::NodeModes::greedy);
  if (!options.device_free_at.empty()) {
    if (static_cast<int32_t>(options.device_free_at.size()) != pool.num_devices())
      throw PlanError(fmt::format("PlanOptions::device_free_at has {} entries for a pool of {} devices",
                                  options.device_free_at.size(), pool.num_devices()));
    inst.device_free_at = options.device_free_at;
  }
  const std::size_t n = jobs.size();
  const Objective obj = options.objective;
  const double lb = makespan_lower_bound(jobs, pool);
  const int64_t budget = options.max_iterations >= 0
                             ? options.max_iterations
                             : std::max<int64_t>(20000, 2000000 / static_cast<int64_t>(std::max<std::size_t>(n, 1)));

  // A batch small enough that every order and count fits the budget is enumerated: the optimum
  // (when each node set has its own mode), for less work than the search would spend.
  if (options.enumerate && enumeration_size(inst) <= static_cast<double>(budget)) {
    const Enumerated e = enumerate_all(inst, obj);
    Schedule s = detail::make_schedule(inst, e.timeline, e.mode_of, jobs, pool, "fast (all orders and counts)");
    s.iterations = e.generations;
    s.solve_seconds = elapsed(t0);
    s.optimal = pool.nodes <= 4 || (obj == Objective::makespan && s.makespan_s <= lb * (1 + 1e-12));
    return s;
  }

  // Start: for each target T (the bound and every runtime above it), the dual approximation's
  // modes in priority order; the best of these.
  std::set<double> all_targets{lb};
  for (const auto& modes : inst.modes)
    for (const Mode& m : modes)
      if (m.p >= lb) all_targets.insert(m.p);
  // At most kMaxTargets of them, evenly spaced in their order (the bound and the largest
  // kept): 10,000 jobs have some 30,000 runtimes, and building a start per target overran a
  // 1 s limit 3.5-17x before the clock was first read (issue 37 D8).
  constexpr std::size_t kMaxTargets = 64;
  std::vector<double> targets(all_targets.begin(), all_targets.end());
  if (targets.size() > kMaxTargets) {
    std::vector<double> kept;
    for (std::size_t i = 0; i < kMaxTargets; ++i) kept.push_back(targets[i * (targets.size() - 1) / (kMaxTargets - 1)]);
    targets = std::move(kept);
  }
  std::vector<int32_t> best_mode, best_order;
  Timeline best;
  double best_score = 0;
  std::set<std::vector<int32_t>> seen;
  // Also every job on the same count where it can (its largest usable count up to it): the
  // whole-pool plans a sum of completion times often wants, which the targets need not give.
  std::vector<std::vector<int32_t>> starts;
  for (double slack : {0.0, 0.02, 0.1})
    for (double target : targets) {
      std::vector<int32_t> mode_of(n);
      for (std::size_t j = 0; j < n; ++j) mode_of[j] = mode_for_target(inst.modes[j], target, slack);
      starts.push_back(std::move(mode_of));
    }
  for (int32_t g = 1; g <= pool.num_devices(); g *= 2) {
    std::vector<int32_t> mode_of(n, 0);
    for (std::size_t j = 0; j < n; ++j)
      for (int32_t m = 0; m < static_cast<int32_t>(inst.modes[j].size()); ++m)
        if (inst.modes[j][m].g <= g && inst.modes[j][m].g > inst.modes[j][mode_of[j]].g) mode_of[j] = m;
    starts.push_back(std::move(mode_of));
  }
  // Each start also with its whole-node jobs pinned to node 0 (where nodes have their own
  // modes): one after another there they leave no holes, where the earliest free node would
  // spread them over the nodes and hold every node back for them.
  if (pool.nodes > 1 && pool.nodes <= 4) {
    const std::size_t count = starts.size();
    for (std::size_t s = 0; s < count; ++s) {
      std::vector<int32_t> pinned = starts[s];
      for (std::size_t j = 0; j < n; ++j) {
        const Mode& m = inst.modes[j][pinned[j]];
        if (m.g != pool.devices_per_node || !m.nodes.empty()) continue;
        for (int32_t c = 0; c < static_cast<int32_t>(inst.modes[j].size()); ++c)
          if (inst.modes[j][c].g == m.g && inst.modes[j][c].nodes == std::vector<int32_t>{0}) pinned[j] = c;
      }
      starts.push_back(std::move(pinned));
    }
  }
  auto try_start = [&](const std::vector<int32_t>& mode_of) {
    std::vector<int32_t> order = priority_order(inst, mode_of, obj);
    // and widest first (then longest): the whole-node jobs together at the start
    std::vector<int32_t> wide = order;
    std::stable_sort(wide.begin(), wide.end(), [&](int32_t a, int32_t b) {
      return inst.modes[a][mode_of[a]].g > inst.modes[b][mode_of[b]].g;
    });
    for (std::vector<int32_t>* o : {&order, &wide}) {
      Timeline t = detail::serial_sgs(inst, *o, mode_of);
      const double sc = score(t, obj, n);
      if (best_order.empty() || sc < best_score) {
        best = t;
        best_score = sc;
        best_mode = mode_of;
        best_order = *o;
      }
    }
  };
  for (std::vector<int32_t>& mode_of : starts) {
    if (!seen.insert(mode_of).second) continue;
    try_start(mode_of);
    if (options.time_limit_s > 0 && elapsed(t0) > 0.25 * options.time_limit_s) break;
  }
  // A start from the device packing (small batches on up to 4 nodes, empty at 0): each job on
  // the count and node(s) of a packing of its pieces onto the devices within the least T found
  // (packing.hpp; a bisection with a node budget per check, so no clock). Where those pieces
  // can run side by side, as on Gavel's 16- and 20-job subsets, this is a plan near the optimum
  // that moves of one job at a time do not reach.
  if (obj == Objective::makespan && pool.nodes <= 4 && n <= 24 && inst.device_free_at.empty()) {
    std::vector<std::vector<Mode>> counts(n);  // each job's modes with the node chosen at placement
    std::vector<std::vector<detail::BMode>> packed(n);
    for (std::size_t j = 0; j < n; ++j) {
      for (const Mode& m : inst.modes[j])
        if (m.nodes.empty()) counts[j].push_back(m);
      packed[j] = detail::useful_modes(counts[j]);
    }
    detail::Packer packer(packed, pool.nodes, pool.devices_per_node);
    std::vector<int32_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    const std::vector<double> empty(static_cast<std::size_t>(pool.num_devices()), 0.0);
    auto packs = [&](double T) {
      std::vector<double> room = empty;
      for (double& r : room) r = T;
      return packer.check(room, all, 5000) == detail::Packer::Result::fits;
    };
    double lo = lb, hi = best.makespan;
    if (packs(hi)) {
      for (int32_t step = 0; step < 12; ++step) {
        const double mid = 0.5 * (lo + hi);
        if (packs(mid)) hi = mid;
        else lo = mid;
      }
      packs(hi);  // the packing at hi, for its modes and nodes
      std::vector<int32_t> mode_of(n, -1);
      for (std::size_t j = 0; j < n; ++j) {
        const detail::BMode* m = packer.mode_of(static_cast<int32_t>(j));
        const std::vector<int32_t>& on = packer.nodes_of(static_cast<int32_t>(j));
        for (int32_t c = 0; m != nullptr && c < static_cast<int32_t>(inst.modes[j].size()); ++c) {
          const Mode& mode = inst.modes[j][c];
          if (mode.g == m->g && (mode.nodes == on || (pool.nodes == 1 && mode.nodes.empty()))) mode_of[j] = c;
        }
      }
      if (std::find(mode_of.begin(), mode_of.end(), -1) == mode_of.end() && seen.insert(mode_of).second)
        try_start(mode_of);
    }
  }

  // Local search over the order and the modes. Moves: re-insert one job (half the time one
  // that ends last) at its best place and device count among all (or, past 24 jobs, 24 sampled)
  // places; swap two jobs; give one job another count at a random place. A move is kept when it
  // does not make the score worse (so the search walks plateaus); after a long walk without a
  // better plan it returns to the best. The budget counts schedule generations, the search's
  // only cost, so it bounds the time and keeps the plan independent of the clock.
  Rng rng{options.seed * 0x2545F4914F6CDD1DULL + 7};
  std::vector<int32_t> cur_order = best_order, cur_mode = best_mode;
  Timeline cur = best;
  double cur_score = best_score;
  int64_t it = 0, since_best = 0;
  // Restarts: the budget in kRounds rounds, each a walk from the best start with the threshold
  // falling from 1% to 0 over the round (independent walks find different packings; the best
  // of them is kept).
  constexpr int64_t kRounds = 4;
  const std::vector<int32_t> start_order = best_order, start_mode = best_mode;
  const Timeline start_plan = best;
  const double start_score = best_score;
  const int64_t round_len = std::max<int64_t>(1, budget / kRounds);
  int64_t round_start = 0;
  // Threshold accepting: a move may make the score worse by a fraction that falls from 1% to 0
  // over the budget, so the search can leave a local optimum that needs several jobs to change
  // together (all of it deterministic: the threshold follows the budget, not the clock).
  auto consider = [&](std::vector<int32_t> order, std::vector<int32_t> mode_of, const Timeline& t) {
    const double sc = score(t, obj, n);
    const double threshold =
        0.01 * std::max(0.0, 1.0 - static_cast<double>(it - round_start) / static_cast<double>(round_len));
    if (sc > cur_score * (1 + threshold)) return false;
    cur_score = sc;
    cur = t;
    cur_order = std::move(order);
    cur_mode = std::move(mode_of);
    if (sc < best_score) {
      best_score = sc;
      best = t;
      best_order = cur_order;
      best_mode = cur_mode;
      since_best = 0;
    }
    return true;
  };
  const int32_t nn = static_cast<int32_t>(n);
  while (it < budget && n > 1) {
    if (options.time_limit_s > 0 && elapsed(t0) > options.time_limit_s) break;
    if (obj == Objective::makespan && best.makespan <= lb) break;  // at the bound: optimal
    const int64_t before = it;
    const int32_t kind = rng.below(6);
    if (kind <= 1) {
      int32_t pos = rng.below(nn);
      if (kind == 0) {  // the job that ends last
        double last = -1;
        for (int32_t q = 0; q < nn; ++q) {
          const double end = cur.start[cur_order[q]] + inst.modes[cur_order[q]][cur_mode[cur_order[q]]].p;
          if (end > last) last = end, pos = q;
        }
      }
      const int32_t job = cur_order[pos];
      std::vector<int32_t> rest = cur_order;
      rest.erase(rest.begin() + pos);
      std::vector<int32_t> places;
      if (nn <= 24) {
        for (int32_t q = 0; q < nn; ++q) places.push_back(q);
      } else {
        for (int32_t q = 0; q < 24; ++q) places.push_back(rng.below(nn));
      }
      double best_sc = 0;
      std::vector<int32_t> pick_order, pick_mode;
      Timeline pick;
      bool out_of_time = false;
      for (int32_t m = 0; m < static_cast<int32_t>(inst.modes[job].size()) && !out_of_time; ++m)
        for (int32_t q : places) {
          // Each place is a whole schedule generation (10,000 jobs: milliseconds): the clock is
          // read before each, so one move cannot run far past the limit.
          if (options.time_limit_s > 0 && elapsed(t0) > options.time_limit_s) {
            out_of_time = true;
            break;
          }
          if (q == pos && m == cur_mode[job]) continue;  // the plan as it is
          std::vector<int32_t> order = rest;
          order.insert(order.begin() + q, job);
          std::vector<int32_t> mode_of = cur_mode;
          mode_of[job] = m;
          Timeline t = detail::serial_sgs(inst, order, mode_of);
          ++it;
          const double sc = score(t, obj, n);
          if (pick_order.empty() || sc < best_sc) {
            best_sc = sc;
            pick = std::move(t);
            pick_order = std::move(order);
            pick_mode = std::move(mode_of);
          }
        }
      if (!pick_order.empty()) consider(std::move(pick_order), std::move(pick_mode), pick);
    } else {
      std::vector<int32_t> order = cur_order, mode_of = cur_mode;
      if (kind == 2) {  // a job that ends last (or any) to a random earlier place
        int32_t pos = rng.below(nn);
        if (rng.below(2) == 0) {
          double last = -1;
          for (int32_t q = 0; q < nn; ++q) {
            const double end = cur.start[order[q]] + inst.modes[order[q]][mode_of[order[q]]].p;
            if (end > last) last = end, pos = q;
          }
        }
        if (pos == 0) continue;
        const int32_t job = order[pos];
        order.erase(order.begin() + pos);
        order.insert(order.begin() + rng.below(pos), job);
      } else if (kind == 3) {
        const int32_t x = rng.below(nn), y = rng.below(nn);
        if (x == y) continue;
        std::swap(order[x], order[y]);
      } else {  // another device count, in place
        const int32_t j = rng.below(nn);
        const int32_t count = static_cast<int32_t>(inst.modes[j].size());
        if (count < 2) continue;
        int32_t m = rng.below(count - 1);
        if (m >= mode_of[j]) ++m;
        mode_of[j] = m;
      }
      const Timeline t = detail::serial_sgs(inst, order, mode_of);
      ++it;
      consider(std::move(order), std::move(mode_of), t);
    }
    since_best += it - before;
    if (it - round_start >= round_len && it < budget) {  // the next round
      round_start = it;
      cur_order = start_order;
      cur_mode = start_mode;
      cur = start_plan;
      cur_score = start_score;
      since_best = 0;
    }
    if (since_best > 20 * round_len / 100 + 1) {  // a long walk without a better plan: back to the best
      cur_order = best_order;
      cur_mode = best_mode;
      cur = best;
      cur_score = best_score;
      since_best = 0;
    }
  }
  Schedule s = detail::make_schedule(inst, best, best_mode, jobs, pool, "fast (list scheduling + local search)");
  s.iterations = it;
  s.solve_seconds = elapsed(t0);
  s.optimal = obj == Objective::makespan && s.makespan_s <= lb * (1 + 1e-12);
  return s;
}

Schedule plan_brute_force(const std::vector<JobProfile>& jobs, const Pool& pool, Objective objective) {
  const Instance inst = detail::make_instance(jobs, pool, detail::NodeModes::explicit_nodes);
  const std::size_t n = jobs.size();
  const double combos = enumeration_size(inst);
  if (n > 7 || combos > 5e7)
    throw PlanError(fmt::format("brute force over {} jobs would try {:.3g} schedules: it is for tests of at most 7 "
                                "small jobs; use plan_exact",
                                n, combos));
  const Enumerated e = enumerate_all(inst, objective);
  Schedule s = detail::make_schedule(inst, e.timeline, e.mode_of, jobs, pool, "brute force");
  s.optimal = true;
  s.iterations = e.generations;
  return s;
}

Schedule baseline_sequential(const std::vector<JobProfile>& jobs, const Pool& pool) {
  const Instance inst = detail::make_instance(jobs, pool, detail::NodeModes::greedy);
  std::vector<int32_t> mode_of(jobs.size());
  for (std::size_t j = 0; j < jobs.size(); ++j) mode_of[j] = mode_for_target(inst.modes[j], 0);  // the fastest
  return sequential_modes(jobs, pool, inst, mode_of, "each alone on all it can use, one after another");
}

Schedule baseline_equal_split(const std::vector<JobProfile>& jobs, const Pool& pool) {
  const Instance inst = detail::make_instance(jobs, pool, detail::NodeModes::greedy);
  const int32_t k = pool.num_devices();
  const int32_t share = std::max<int32_t>(1, k / std::min<int32_t>(static_cast<int32_t>(jobs.size()), k));
  // The largest slice of at most `share` devices that every job can use (each job's own largest
  // count within the share if there is no common one).
  int32_t slice = 0;
  for (int32_t g = std::min(share, pool.devices_per_node); g >= 1 && slice == 0; --g) {
    bool all = true;
    for (const auto& modes : inst.modes)
      all = all && std::any_of(modes.begin(), modes.end(), [&](const Mode& m) { return m.g == g; });
    if (all) slice = g;
  }
  std::vector<int32_t> mode_of(jobs.size());
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    int32_t pick = 0;
    for (int32_t m = 0; m < static_cast<int32_t>(inst.modes[j].size()); ++m)
      if (inst.modes[j][m].g <= (slice > 0 ? slice : share)) pick = m;
    mode_of[j] = pick;
  }
  const Timeline t = detail::serial_sgs(inst, priority_order(inst, mode_of, Objective::makespan), mode_of);
  return detail::make_schedule(inst, t, mode_of, jobs, pool,
                               fmt::format("equal split (slices of {} devices, longest first)", slice > 0 ? slice : share));
}

Schedule baseline_requested(const std::vector<JobProfile>& jobs, const Pool& pool) {
  const Instance inst = detail::make_instance(jobs, pool, detail::NodeModes::greedy);
  std::vector<int32_t> mode_of(jobs.size());
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const int32_t want = std::max(1, jobs[j].requested_devices);
    int32_t pick = 0;  // the largest usable count within the request (else the smallest)
    for (int32_t m = 0; m < static_cast<int32_t>(inst.modes[j].size()); ++m)
      if (inst.modes[j][m].g <= want) pick = m;
    mode_of[j] = pick;
  }
  const Timeline t = detail::serial_sgs(inst, priority_order(inst, mode_of, Objective::makespan), mode_of);
  return detail::make_schedule(inst, t, mode_of, jobs, pool, "requested device counts, longest first");
}

Schedule plan(const std::vector<JobProfile>& jobs, const Pool& pool, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanOptions fast_options = options;
  // The exact methods plan an idle pool: with devices still busy only the fast method runs.
  const bool try_exact =
      static_cast<int32_t>(jobs.size()) <= options.exact_max_jobs && options.device_free_at.empty();
  if (try_exact && options.time_limit_s > 0) fast_options.time_limit_s = 0.2 * options.time_limit_s;
  Schedule best = plan_fast(jobs, pool, fast_options);
  if (try_exact && !best.optimal) {
    PlanOptions exact_options = options;
    if (options.time_limit_s > 0) exact_options.time_limit_s = std::max(0.05, options.time_limit_s - elapsed(t0));
    // The makespan: the branch and bound (it proves what CBC only brackets); the sum of
    // completion times: CBC.
    Schedule exact = options.objective == Objective::makespan ? plan_branch_and_bound(jobs, pool, exact_options)
                                                              : plan_exact(jobs, pool, exact_options);
    const bool better = options.objective == Objective::makespan ? exact.makespan_s < best.makespan_s
                                                                 : exact.sum_completion_s < best.sum_completion_s;
    if (better || exact.optimal) {
      exact.lower_bound_s = std::max(exact.lower_bound_s, best.lower_bound_s);
      best = exact;
    } else {
      best.lower_bound_s = std::max(exact.lower_bound_s, best.lower_bound_s);
      best.method += options.objective == Objective::makespan ? "; branch and bound found no better plan in its time"
                                                               : "; CBC found no better plan in its time";
    }
  }
  if (pool.cores > 0 && options.objective == Objective::makespan) {
    // Devices that share cores: the schedule above assumes each computes on its own. Price it
    // and the other natural plans (the baselines, every job on one count where it can) with the
    // sharing, and keep the cheapest (docs/planner.md, "Devices that share cores").
    std::vector<Schedule> candidates{best, baseline_equal_split(jobs, pool), baseline_requested(jobs, pool),
                                     baseline_sequential(jobs, pool)};
    std::set<int32_t> counts;
    for (const JobProfile& j : jobs)
      for (const auto& [g, t] : j.step_time_s) counts.insert(g);
    for (int32_t g : counts) {
      std::vector<JobProfile> one = jobs;
      for (JobProfile& j : one) {
        int32_t pick = -1;  // g, else the largest count below it, else the smallest
        for (const auto& [c, t] : j.step_time_s)
          if (c <= g) pick = c;
        if (pick < 0) pick = j.step_time_s.begin()->first;
        const double t = j.step_time_s.at(pick);
        j.step_time_s = {{pick, t}};
      }
      PlanOptions uo = options;
      uo.time_limit_s = 0;
      uo.max_iterations = 2000;
      try {
        Schedule u = plan_fast(one, pool, uo);
        u.method = fmt::format("every job on {} device(s) where it can", g);
        candidates.push_back(std::move(u));
      } catch (const PlanError&) {
        // a count some job cannot use in this pool
      }
    }
    double best_price = -1;
    std::size_t pick = 0;
    for (std::size_t c = 0; c < candidates.size(); ++c) {
      const double price = predict_shared_cores(candidates[c], jobs, pool).makespan_s;
      if (best_price < 0 || price < best_price) best_price = price, pick = c;
    }
    if (pick != 0) {
      const double lb = best.lower_bound_s;
      best = candidates[pick];
      best.lower_bound_s = lb;
      best.optimal = false;
    }
    best.method += fmt::format(" (the cheapest of {} plans priced on {} shared cores)", candidates.size(), pool.cores);
  }
  best.solve_seconds = elapsed(t0);
  return best;
}

void validate_schedule(const Schedule& s, const std::vector<JobProfile>& jobs, const Pool& pool) {
  if (s.jobs.size() != jobs.size())
    throw PlanError(fmt::format("the schedule places {} jobs, the batch has {}", s.jobs.size(), jobs.size()));
  struct Use {
    double start, end;
    int32_t job;
  };
  std::vector<std::vector<Use>> per_device(static_cast<std::size_t>(pool.num_devices()));
  double makespan = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const Placement& p = s.jobs[j];
    const JobProfile& job = jobs[j];
    if (p.job != job.name) throw PlanError(fmt::format("placement {} is for '{}', the job is '{}'", j, p.job, job.name));
    const std::vector<int32_t> counts = usable_counts(job, pool);
    if (std::find(counts.begin(), counts.end(), p.num_devices) == counts.end())
      throw PlanError(fmt::format("job '{}' is placed on {} devices, which it cannot use in this pool", job.name,
                                  p.num_devices));
    if (static_cast<int32_t>(p.devices.size()) != p.num_devices)
      throw PlanError(fmt::format("job '{}' has {} device ids for {} devices", job.name, p.devices.size(), p.num_devices));
    const double want = job.runtime_s(p.num_devices);
    if (std::abs((p.end_s - p.start_s) - want) > 1e-9 * std::max(1.0, want) || p.start_s < 0)
      throw PlanError(fmt::format("job '{}' runs [{}, {}) s; on {} devices it takes {} s", job.name, p.start_s, p.end_s,
                                  p.num_devices, want));
    std::set<int32_t> nodes;
    for (int32_t d : p.devices) {
      if (d < 0 || d >= pool.num_devices())
        throw PlanError(fmt::format("job '{}' is on device {}, outside the pool of {}", job.name, d, pool.num_devices()));
      nodes.insert(d / pool.devices_per_node);
      per_device[d].push_back({p.start_s, p.end_s, static_cast<int32_t>(j)});
    }
    if (std::set<int32_t>(p.devices.begin(), p.devices.end()).size() != p.devices.size())
      throw PlanError(fmt::format("job '{}' names a device twice", job.name));
    if (nodes.size() > 1 && !(job.may_span_nodes || pool.allow_spanning))
      throw PlanError(fmt::format("job '{}' spans {} nodes but may not span nodes", job.name, nodes.size()));
    makespan = std::max(makespan, p.end_s);
  }
  for (std::size_t d = 0; d < per_device.size(); ++d) {
    auto& uses = per_device[d];
    std::sort(uses.begin(), uses.end(), [](const Use& a, const Use& b) { return a.start < b.start; });
    for (std::size_t k = 1; k < uses.size(); ++k)
      if (uses[k].start < uses[k - 1].end - 1e-9 * std::max(1.0, uses[k - 1].end))
        throw PlanError(fmt::format("device {}: jobs '{}' [{}, {}) and '{}' [{}, {}) overlap", d,
                                    jobs[uses[k - 1].job].name, uses[k - 1].start, uses[k - 1].end,
                                    jobs[uses[k].job].name, uses[k].start, uses[k].end));
  }
  if (std::abs(makespan - s.makespan_s) > 1e-9 * std::max(1.0, makespan))
    throw PlanError(fmt::format("the schedule says its makespan is {} s, its jobs end at {} s", s.makespan_s, makespan));
}

}  // namespace tessel::planner

namespace tessel::planner {

Schedule predict_shared_cores(const Schedule& plan, const std::vector<JobProfile>& jobs, const Pool& pool) {
  if (pool.cores <= 0) throw PlanError("predict_shared_cores: the pool has no \"cores\" (its devices do not share cores)");
  if (plan.jobs.size() != jobs.size())
    throw PlanError(fmt::format("predict_shared_cores: a plan of {} jobs for {} jobs", plan.jobs.size(), jobs.size()));
  const std::size_t n = jobs.size();
  const double cores = pool.cores;
  // Each job waits for the jobs planned before it on any of its devices (the pool runtime's order).
  std::vector<std::vector<std::size_t>> before(n);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      if (i == j) continue;
      const Placement &a = plan.jobs[i], &b = plan.jobs[j];
      const bool earlier = a.start_s < b.start_s || (a.start_s == b.start_s && i < j);
      if (!earlier) continue;
      for (int32_t d : a.devices)
        if (std::find(b.devices.begin(), b.devices.end(), d) != b.devices.end()) {
          before[j].push_back(i);
          break;
        }
    }
  enum { waiting, running, done };
  std::vector<int> phase(n, waiting);
  std::vector<double> work(n);  // seconds left at the profiled (alone) speed
  for (std::size_t j = 0; j < n; ++j) work[j] = jobs[j].runtime_s(plan.jobs[j].num_devices);
  Schedule out = plan;
  out.method = plan.method + ", priced on " + std::to_string(pool.cores) + " shared cores";
  double t = 0;
  std::size_t finished = 0;
  while (finished < n) {
    for (std::size_t j = 0; j < n; ++j)
      if (phase[j] == waiting &&
          std::all_of(before[j].begin(), before[j].end(), [&](std::size_t i) { return phase[i] == done; })) {
        phase[j] = running;
        out.jobs[j].start_s = t;
      }
    double busy = 0;
    for (std::size_t j = 0; j < n; ++j)
      if (phase[j] == running) busy += plan.jobs[j].num_devices;
    if (busy == 0) throw PlanError("predict_shared_cores: no job can start (the plan's order has a cycle)");
    std::vector<double> speed(n, 0);
    double step = -1;
    for (std::size_t j = 0; j < n; ++j) {
      if (phase[j] != running) continue;
      const double g = plan.jobs[j].num_devices;
      speed[j] = g * std::min(1.0, cores / busy) / std::min(g, cores);
      const double left = work[j] / speed[j];
      step = step < 0 ? left : std::min(step, left);
    }
    t += step;
    for (std::size_t j = 0; j < n; ++j) {
      if (phase[j] != running) continue;
      work[j] -= step * speed[j];
      if (work[j] <= 1e-12 * std::max(1.0, jobs[j].runtime_s(plan.jobs[j].num_devices))) {
        phase[j] = done;
        out.jobs[j].end_s = t;
        ++finished;
      }
    }
  }
  out.makespan_s = 0;
  out.sum_completion_s = 0;
  for (const Placement& p : out.jobs) {
    out.makespan_s = std::max(out.makespan_s, p.end_s);
    out.sum_completion_s += p.end_s;
  }
  return out;
}

}  // namespace tessel::planner
