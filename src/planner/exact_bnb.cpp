// The exact method by branch and bound over the serial scheme's schedules, for the makespan
// (tessel/planner/schedule.hpp, docs/planner.md "The exact method by branch and bound").
//
// The search builds a schedule in time order. At a decision time t it either starts one more
// job at t (a job, a device count, a node), or closes t and moves to the next moment a job ends.
// Every start is then 0 or the end of a job: the active schedules, among which one is optimal.
// What keeps the tree small:
//  - jobs started at the same t are started in index order (a set, not its orderings);
//  - of two identical jobs (the same counts and runtimes), the lower index starts first;
//  - of two nodes in the same state, only the first is tried;
//  - left shift: after t is closed, a job may start at the next moment t' on a node only if it
//    did not fit there during [t, t') (it would otherwise start at t in a schedule as good:
//    some optimal schedule has no job that can start earlier alone, and it is generated);
//  - a state reached twice (same time, same jobs left, same device free times and the same
//    room during the last interval, up to the order of the nodes) is searched once;
//  - bounds against the best plan known (the fast plan first): the latest end already fixed,
//    each job's earliest end, the area, and the device packing (packing.hpp: each job's g
//    pieces on g devices of one node, their simultaneity dropped), the bound that does the work.
// It starts from the fast plan, polished (Polisher below: pairwise swaps), polishes every plan it
// finds, and stops as soon as a plan meets the packing bound of the whole batch.
//
// Nothing here reads the clock except to stop at the time limit, which leaves the plan
// unproven; the node budget (PlanOptions::exact_max_nodes) stops it the same way.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <unordered_set>

#include <fmt/format.h>

#include "packing.hpp"
#include "sgs.hpp"
#include "tessel/core/common.hpp"
#include "tessel/planner/schedule.hpp"

namespace tessel::planner {

namespace {

using detail::BMode;
using detail::Packer;
using detail::VecHash;
using detail::useful_modes;

// What counts as better: a makespan at least this fraction below the best known. Runtimes
// are sums of doubles; a plan within rounding of the best is not a better plan.
constexpr double kBetter = 1e-9;

// Pairwise swaps in a plan's order by start, and single changes of a job's count or node, each
// through the serial scheme on the instance with a mode per node (set), kept when the makespan
// falls, until none does. Cheap (n^2 schedule generations a pass), and it finds what a
// depth-first search reaches late: two jobs of almost the same runtime exchanged, so that the
// shorter one ends last.
class Polisher {
 public:
  Polisher(const detail::Instance& greedy, const detail::Instance& per_node) : greedy_(greedy), per_node_(per_node) {}

  // t, mode_of (indices into the greedy instance's modes): a plan, replaced by a shorter one
  // when the swaps find it.
  void polish(detail::Timeline& t, std::vector<int32_t>& mode_of) const {
    const std::size_t n = mode_of.size();
    std::vector<int32_t> modes(n, -1);
    for (std::size_t j = 0; j < n; ++j) {
      const int32_t g = greedy_.modes[j][mode_of[j]].g;
      for (std::size_t c = 0; c < per_node_.modes[j].size(); ++c)
        if (per_node_.modes[j][c].g == g && per_node_.modes[j][c].nodes == t.nodes[j]) modes[j] = static_cast<int32_t>(c);
      if (modes[j] < 0) return;  // (not a plan of this instance: left as it is)
    }
    std::vector<int32_t> order = detail::order_by_start(t.start);
    detail::Timeline cur = detail::serial_sgs(per_node_, order, modes);
    auto better = [&](const detail::Timeline& x) { return x.makespan < cur.makespan * (1 - kBetter); };
    for (int32_t pass = 0; pass < 100; ++pass) {
      bool improved = false;
      for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = a + 1; b < n; ++b) {
          std::swap(order[a], order[b]);
          detail::Timeline x = detail::serial_sgs(per_node_, order, modes);
          if (better(x)) {
            cur = std::move(x);
            improved = true;
          } else {
            std::swap(order[a], order[b]);
          }
        }
      for (std::size_t j = 0; j < n; ++j)
        for (int32_t c = 0; c < static_cast<int32_t>(per_node_.modes[j].size()); ++c) {
          if (c == modes[j]) continue;
          const int32_t was = modes[j];
          modes[j] = c;
          detail::Timeline x = detail::serial_sgs(per_node_, order, modes);
          if (better(x)) {
            cur = std::move(x);
            improved = true;
          } else {
            modes[j] = was;
          }
        }
      if (!improved) break;
    }
    if (!(cur.makespan < t.makespan)) return;
    t = cur;
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t c = 0; c < greedy_.modes[j].size(); ++c)
        if (greedy_.modes[j][c].g == per_node_.modes[j][modes[j]].g) mode_of[j] = static_cast<int32_t>(c);
  }

 private:
  const detail::Instance& greedy_;
  const detail::Instance& per_node_;
};

class BranchAndBound {
 public:
  BranchAndBound(const detail::Instance& inst, const Polisher& polisher, int64_t max_nodes, double time_limit_s,
                 std::chrono::steady_clock::time_point t0)
      : polisher_(polisher),
        n_(static_cast<int32_t>(inst.modes.size())),
        nodes_(inst.nodes),
        dpn_(inst.devices_per_node),
        max_nodes_(max_nodes),
        time_limit_s_(time_limit_s),
        t0_(t0) {
    // The search's own job order: largest least area first, so that a depth-first search
    // starting jobs in index order places the big ones first (longest first, as list
    // scheduling does) and finds good plans early.
    for (const auto& modes : inst.modes) modes_.push_back(useful_modes(modes));
    perm_.resize(static_cast<std::size_t>(n_));
    std::iota(perm_.begin(), perm_.end(), 0);
    auto least = [&](int32_t j) {
      double a = std::numeric_limits<double>::infinity();
      for (const BMode& m : modes_[j]) a = std::min(a, m.area());
      return a;
    };
    std::stable_sort(perm_.begin(), perm_.end(), [&](int32_t a, int32_t b) { return least(a) > least(b); });
    std::vector<std::vector<BMode>> by_search_order;
    for (int32_t j : perm_) by_search_order.push_back(modes_[j]);
    modes_ = std::move(by_search_order);
    twin_.assign(static_cast<std::size_t>(n_), -1);
    for (int32_t j = 0; j < n_; ++j)
      for (int32_t i = j - 1; i >= 0 && twin_[j] < 0; --i) {
        bool same = modes_[i].size() == modes_[j].size();
        for (std::size_t c = 0; same && c < modes_[j].size(); ++c)
          same = modes_[i][c].g == modes_[j][c].g && modes_[i][c].p == modes_[j][c].p;
        if (same) twin_[j] = i;
      }
    packer_ = std::make_unique<Packer>(modes_, nodes_, dpn_);
  }

  // The incumbent: a plan's makespan, modes (as instance indices), starts and nodes.
  void set_incumbent(double makespan, const detail::Timeline& t, const std::vector<int32_t>& mode_of) {
    best_ = makespan;
    best_timeline_ = t;
    best_mode_ = mode_of;
  }

  // The least T (within a relative 1e-6) at which the jobs pack on the pool, searched between
  // lo and hi; never above hi. A packing check out of budget counts as fitting.
  double packing_bound(double lo, double hi, int64_t check_limit) {
    auto fits = [&](double T) { return root_packs_within(T, check_limit) != Packer::Result::does_not_fit; };
    if (fits(lo)) return lo;
    while (hi - lo > 1e-6 * hi) {
      const double mid = 0.5 * (lo + hi);
      if (fits(mid)) hi = mid;
      else lo = mid;
    }
    return lo;
  }

  // Do all the jobs pack on the empty pool within T?
  Packer::Result root_packs_within(double T, int64_t check_limit) {
    std::vector<int32_t> all(static_cast<std::size_t>(n_));
    std::iota(all.begin(), all.end(), 0);
    const std::vector<double> room(static_cast<std::size_t>(nodes_) * dpn_, T);
    return packer_->check(room, all, check_limit);
  }

  // Searches for a plan shorter than the incumbent; returns whether the incumbent is proven
  // optimal (the search finished, or a plan it found meets the packing bound).
  bool run() {
    if (root_packs_within(target(), 1000000) == Packer::Result::does_not_fit) {
      proven_by_bound_ = true;
      return true;
    }
    free_.assign(static_cast<std::size_t>(nodes_), std::vector<double>(static_cast<std::size_t>(dpn_), 0.0));
    left_ = n_ == 64 ? ~0ULL : ((1ULL << n_) - 1);
    start_.assign(static_cast<std::size_t>(n_), 0.0);
    mode_.assign(static_cast<std::size_t>(n_), 0);
    where_.assign(static_cast<std::size_t>(n_), {});
    std::vector<int32_t> prevfree(static_cast<std::size_t>(nodes_), 0);
    search(0.0, -1, prevfree);
    return !aborted_ || proven_by_bound_;
  }

  bool improved() const { return improved_; }
  double best() const { return best_; }
  const detail::Timeline& best_timeline() const { return best_timeline_; }
  const std::vector<int32_t>& best_mode() const { return best_mode_; }
  int64_t nodes_searched() const { return count_; }
  bool stopped_by_clock() const { return clock_stop_; }
  bool proven_by_bound() const { return proven_by_bound_; }

 private:
  struct StateKey {
    double t;
    uint64_t left;
    std::vector<double> nodes;  // per node (in a canonical order): the room of the last interval, then free times
    bool operator==(const StateKey& o) const { return t == o.t && left == o.left && nodes == o.nodes; }
  };
  struct StateHash {
    std::size_t operator()(const StateKey& k) const {
      return VecHash{}(k.nodes) ^ (std::hash<uint64_t>{}(k.left) * 31) ^ std::hash<double>{}(k.t);
    }
  };

  double target() const { return best_ * (1 - kBetter); }

  bool stop() {
    if (aborted_) return true;
    ++count_;
    if (max_nodes_ >= 0 && count_ > max_nodes_) aborted_ = true;
    if (time_limit_s_ > 0 && (count_ & 255) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count() > time_limit_s_) {
      aborted_ = true;
      clock_stop_ = true;
    }
    return aborted_;
  }

  // No plan from this state ends by the target?
  bool hopeless(double t) {
    const double T = target();
    double area = 0;
    for (const auto& f : free_)
      for (double x : f) {
        if (x > T) return true;
        area += std::max(t, x);
      }
    std::vector<int32_t> jobs;
    for (int32_t j = 0; j < n_; ++j) {
      if (!(left_ >> j & 1)) continue;
      jobs.push_back(j);
      double end = std::numeric_limits<double>::infinity(), least = end;
      for (const BMode& m : modes_[j]) {
        least = std::min(least, m.area());
        double at = std::numeric_limits<double>::infinity();
        if (m.span == 1) {
          for (const auto& f : free_) at = std::min(at, f[static_cast<std::size_t>(m.g - 1)]);
        } else {
          std::vector<double> whole;
          for (const auto& f : free_) whole.push_back(f.back());
          std::sort(whole.begin(), whole.end());
          at = whole[static_cast<std::size_t>(m.span - 1)];
        }
        end = std::min(end, std::max(at, t) + m.p);
      }
      if (end > T) return true;
      area += least;
    }
    if (area > static_cast<double>(nodes_) * dpn_ * T) return true;
    room_.clear();
    for (const auto& f : free_)
      for (double x : f) room_.push_back(T - std::max(t, x));
    return packer_->check(room_, jobs, inner_limit_) == Packer::Result::does_not_fit;
  }

  StateKey key(double t, const std::vector<int32_t>& prevfree) const {
    std::vector<std::vector<double>> per(static_cast<std::size_t>(nodes_));
    for (int32_t n = 0; n < nodes_; ++n) {
      per[n].push_back(prevfree[n]);
      per[n].insert(per[n].end(), free_[n].begin(), free_[n].end());
    }
    std::sort(per.begin(), per.end());
    StateKey k{t, left_, {}};
    for (const auto& p : per) k.nodes.insert(k.nodes.end(), p.begin(), p.end());
    return k;
  }

  int32_t free_at(int32_t n, double t) const {
    const auto& f = free_[n];
    return static_cast<int32_t>(std::upper_bound(f.begin(), f.end(), t) - f.begin());
  }

  void search(double t, int32_t last, const std::vector<int32_t>& prevfree) {
    if (stop()) return;
    if (left_ == 0) {
      double makespan = 0;
      for (const auto& f : free_) makespan = std::max(makespan, f.back());
      if (makespan <= target()) {
        improved_ = true;
        const std::size_t n = static_cast<std::size_t>(n_);
        best_timeline_.start.assign(n, 0.0);
        best_timeline_.nodes.assign(n, {});
        best_mode_.assign(n, 0);
        best_timeline_.makespan = makespan;
        best_timeline_.sum_completion = 0;
        for (int32_t i = 0; i < n_; ++i) {
          const int32_t j = perm_[i];
          best_timeline_.start[j] = start_[i];
          best_timeline_.nodes[j] = where_[i];
          best_mode_[j] = modes_[i][mode_[i]].index;
          best_timeline_.sum_completion += start_[i] + modes_[i][mode_[i]].p;
        }
        polisher_.polish(best_timeline_, best_mode_);
        best_ = best_timeline_.makespan;
        // The new plan may meet the packing bound of the whole batch: then it is optimal.
        if (root_packs_within(target(), 1000000) == Packer::Result::does_not_fit) {
          proven_by_bound_ = true;
          aborted_ = true;
        }
      }
      return;
    }
    if (hopeless(t)) return;
    StateKey memo_key;
    if (last < 0) {
      memo_key = key(t, prevfree);
      if (seen_.count(memo_key)) return;
    }
    // Start one more job at t.
    for (int32_t j = last + 1; j < n_; ++j) {
      if (!(left_ >> j & 1)) continue;
      if (twin_[j] >= 0 && (left_ >> twin_[j] & 1)) continue;
      for (int32_t c = 0; c < static_cast<int32_t>(modes_[j].size()); ++c) {
        const BMode& m = modes_[j][c];
        if (m.span == 1) {
          for (int32_t n = 0; n < nodes_; ++n) {
            if (free_at(n, t) < m.g || prevfree[n] >= m.g) continue;
            bool same = false;
            for (int32_t q = 0; q < n && !same; ++q) same = prevfree[q] == prevfree[n] && free_[q] == free_[n];
            if (same) continue;
            place(j, c, t, {n});
            search(t, j, prevfree);
            unplace(j, {n});
            if (aborted_) return;
          }
        } else {
          start_spanning(j, c, t, prevfree);
          if (aborted_) return;
        }
      }
    }
    // Close t: the next moment a job ends.
    double next = std::numeric_limits<double>::infinity();
    for (const auto& f : free_)
      for (double x : f)
        if (x > t) next = std::min(next, x);
    if (std::isfinite(next)) {
      std::vector<int32_t> room(static_cast<std::size_t>(nodes_));
      for (int32_t n = 0; n < nodes_; ++n) room[n] = free_at(n, t);
      const std::vector<std::vector<double>> saved = free_;
      for (auto& f : free_)
        for (double& x : f) x = std::max(x, next);
      search(next, -1, room);
      free_ = saved;
    }
    if (last < 0 && !aborted_ && seen_.size() < 4000000) seen_.insert(std::move(memo_key));
  }

  // A spanning mode: every set of span nodes wholly free at t, not all of which had room during
  // the last interval, up to nodes in the same state.
  void start_spanning(int32_t j, int32_t c, double t, const std::vector<int32_t>& prevfree) {
    const BMode& m = modes_[j][c];
    std::vector<int32_t> eligible;
    for (int32_t n = 0; n < nodes_; ++n)
      if (free_at(n, t) == dpn_) eligible.push_back(n);
    const int32_t e = static_cast<int32_t>(eligible.size());
    if (e < m.span) return;
    std::vector<int32_t> pick(static_cast<std::size_t>(m.span));
    std::iota(pick.begin(), pick.end(), 0);
    std::vector<std::vector<int32_t>> tried;
    while (true) {
      std::vector<int32_t> set, sig;
      bool all_had_room = true;
      for (int32_t i : pick) {
        set.push_back(eligible[i]);
        sig.push_back(prevfree[eligible[i]]);
        all_had_room = all_had_room && prevfree[eligible[i]] == dpn_;
      }
      std::sort(sig.begin(), sig.end());  // wholly free nodes differ only in their last room
      if (!all_had_room && std::find(tried.begin(), tried.end(), sig) == tried.end()) {
        tried.push_back(sig);
        place(j, c, t, set);
        search(t, j, prevfree);
        unplace(j, set);
        if (aborted_) return;
      }
      int32_t i = m.span - 1;
      while (i >= 0 && pick[i] == e - m.span + i) --i;
      if (i < 0) return;
      ++pick[i];
      for (int32_t q = i + 1; q < m.span; ++q) pick[q] = pick[q - 1] + 1;
    }
  }

  void place(int32_t j, int32_t c, double t, const std::vector<int32_t>& nodes) {
    const BMode& m = modes_[j][c];
    const int32_t per_node = m.span == 1 ? m.g : dpn_;
    for (int32_t n : nodes) {
      auto& f = free_[n];
      // the first per_node devices are free at t (free times ascending); they end at t + p
      for (int32_t d = 0; d < per_node; ++d) f[d] = t + m.p;
      std::sort(f.begin(), f.end());
    }
    left_ &= ~(1ULL << j);
    start_[j] = t;
    mode_[j] = c;
    where_[j] = nodes;
  }

  void unplace(int32_t j, const std::vector<int32_t>& nodes) {
    const BMode& m = modes_[j][mode_[j]];
    const int32_t per_node = m.span == 1 ? m.g : dpn_;
    const double end = start_[j] + m.p;
    for (int32_t n : nodes) {
      auto& f = free_[n];
      // per_node devices end at `end`; they were free at the start (now: the start)
      int32_t undone = 0;
      for (double& x : f)
        if (undone < per_node && x == end) {
          x = start_[j];
          ++undone;
        }
      std::sort(f.begin(), f.end());
    }
    left_ |= 1ULL << j;
  }

  const Polisher& polisher_;
  int32_t n_, nodes_, dpn_;
  int64_t max_nodes_;
  double time_limit_s_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<std::vector<BMode>> modes_;  // in the search's order: job i is perm_[i]
  std::vector<int32_t> perm_;
  std::vector<int32_t> twin_;
  std::unique_ptr<Packer> packer_;
  std::vector<double> room_;
  // The packing check's budget at each node of the search: enough to settle most states, small
  // enough not to dominate (a check out of budget prunes nothing; the search goes on).
  int64_t inner_limit_ = 2000;
  // the state
  std::vector<std::vector<double>> free_;  // per node, ascending: when each device is free
  uint64_t left_ = 0;
  std::vector<double> start_;
  std::vector<int32_t> mode_;
  std::vector<std::vector<int32_t>> where_;
  std::unordered_set<StateKey, StateHash> seen_;
  // the incumbent
  double best_ = 0;
  detail::Timeline best_timeline_;
  std::vector<int32_t> best_mode_;
  bool improved_ = false;
  int64_t count_ = 0;
  bool aborted_ = false, clock_stop_ = false, proven_by_bound_ = false;
};

}  // namespace

Schedule plan_branch_and_bound(const std::vector<JobProfile>& jobs, const Pool& pool, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.objective != Objective::makespan)
    throw PlanError("branch and bound minimises the makespan; for the sum of completion times use plan_exact (CBC)");
  if (jobs.size() > 64)
    throw PlanError(fmt::format("branch and bound takes at most 64 jobs, this batch has {}: use plan_fast",
                                jobs.size()));
  if (!options.device_free_at.empty())
    throw PlanError("branch and bound plans an idle pool (its devices are interchangeable per node); with devices "
                    "still busy (PlanOptions::device_free_at) use plan_fast");
  const detail::Instance inst = detail::make_instance(jobs, pool, detail::NodeModes::greedy);

  // The incumbent: the fast plan (or, without the warm start, each job alone one after another).
  PlanOptions fast_options = options;
  if (options.time_limit_s > 0) fast_options.time_limit_s = 0.2 * options.time_limit_s;
  const Schedule fast = options.exact_warm_start ? plan_fast(jobs, pool, fast_options) : baseline_sequential(jobs, pool);
  std::vector<int32_t> mode_of(jobs.size(), -1);
  detail::Timeline t;
  t.start.resize(jobs.size());
  t.nodes.resize(jobs.size());
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    for (std::size_t c = 0; c < inst.modes[j].size(); ++c)
      if (inst.modes[j][c].g == fast.jobs[j].num_devices) mode_of[j] = static_cast<int32_t>(c);
    t.start[j] = fast.jobs[j].start_s;
    t.nodes[j] = fast.jobs[j].nodes;
  }
  t.makespan = fast.makespan_s;
  t.sum_completion = fast.sum_completion_s;

  const detail::Instance per_node = detail::make_instance(jobs, pool, detail::NodeModes::explicit_nodes);
  const Polisher polisher(inst, per_node);
  if (options.exact_warm_start) polisher.polish(t, mode_of);
  BranchAndBound bnb(inst, polisher, options.exact_max_nodes, options.time_limit_s, t0);
  bnb.set_incumbent(t.makespan, t, mode_of);
  const double simple = makespan_lower_bound(jobs, pool);
  const double bound = std::max(simple, bnb.packing_bound(simple, t.makespan, 1000000));
  const bool at_bound = bound >= t.makespan * (1 - kBetter);
  const bool proven = at_bound || bnb.run();

  Schedule out = detail::make_schedule(inst, bnb.best_timeline(), bnb.best_mode(), jobs, pool, "");
  out.optimal = proven;
  out.lower_bound_s = proven ? out.makespan_s : bound;
  out.iterations = bnb.nodes_searched();
  const std::string how = at_bound || bnb.proven_by_bound() ? "it meets the packing bound" : "the search finished";
  out.method = proven ? fmt::format("exact (branch and bound, proven optimal: {}; {} nodes)", how, bnb.nodes_searched())
                      : fmt::format("exact (branch and bound, stopped by the {}: best found; {} nodes)",
                                    bnb.stopped_by_clock() ? "time limit" : "node budget", bnb.nodes_searched());
  out.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessel::planner
