// The serial schedule-generation scheme over per-node usage profiles (sgs.hpp).
//
// Each node is a pool of devices_per_node interchangeable devices; its usage over time is a
// step function. A job in mode (g, p) goes at the earliest t where usage + g <= capacity on
// all of [t, t + p): one left-to-right pass over the steps (a step that does not fit moves the
// candidate past it, so every step is looked at a bounded number of times). The candidate
// starts are 0 and the moments usage drops, so start times are sums of runtimes, exactly as
// the ends that other jobs see: no tolerance is needed when comparing them.
#include "sgs.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "tessel/core/common.hpp"

namespace tessel::planner::detail {

int32_t Mode::span() const { return g > devices_per_node ? g / devices_per_node : 1; }

namespace {

class NodeProfile {
 public:
  explicit NodeProfile(int32_t capacity) : capacity_(capacity) {}

  // Earliest t >= from where usage + g <= capacity on [t, t + p).
  double earliest(double p, int32_t g, double from = 0) const {
    std::size_t k = segment_at(from);
    double t = from;
    while (true) {
      std::size_t m = k;
      bool fits = true;
      while (m < times_.size() && (m == k || times_[m] < t + p)) {
        if (used_[m] + g > capacity_) {
          fits = false;
          break;
        }
        ++m;
      }
      if (fits) return t;
      k = m + 1;  // the step at m is too full: the next candidate is where it ends
      t = times_[k];
    }
  }

  bool fits(double t, double p, int32_t g) const {
    for (std::size_t m = segment_at(t); m < times_.size() && (times_[m] < t + p || times_[m] <= t); ++m)
      if (used_[m] + g > capacity_) return false;
    return true;
  }

  void add(double t, double p, int32_t g) {
    const std::size_t a = split(t);
    const std::size_t b = split(t + p);
    for (std::size_t m = a; m < b; ++m) used_[m] += g;
  }

  const std::vector<double>& times() const { return times_; }

 private:
  // The step holding time x (the last whose start is <= x).
  std::size_t segment_at(double x) const {
    auto it = std::upper_bound(times_.begin(), times_.end(), x);
    return static_cast<std::size_t>(it - times_.begin()) - 1;
  }
  std::size_t split(double x) {
    auto it = std::lower_bound(times_.begin(), times_.end(), x);
    const std::size_t i = static_cast<std::size_t>(it - times_.begin());
    if (i < times_.size() && times_[i] == x) return i;
    times_.insert(times_.begin() + static_cast<std::ptrdiff_t>(i), x);
    used_.insert(used_.begin() + static_cast<std::ptrdiff_t>(i), used_[i - 1]);
    return i;
  }

  int32_t capacity_;
  std::vector<double> times_{0.0};  // step k covers [times_[k], times_[k+1]); the last is open
  std::vector<int32_t> used_{0};
};

}  // namespace

Instance make_instance(const std::vector<JobProfile>& jobs, const Pool& pool, NodeModes node_modes) {
  if (jobs.empty()) throw PlanError("the planner was given no jobs");
  if (pool.nodes <= 0 || pool.devices_per_node <= 0)
    throw PlanError(fmt::format("the pool has {} nodes of {} devices: both must be positive", pool.nodes,
                                pool.devices_per_node));
  Instance inst;
  inst.nodes = pool.nodes;
  inst.devices_per_node = pool.devices_per_node;
  for (const JobProfile& job : jobs) {
    if (job.steps <= 0) throw PlanError(fmt::format("job '{}' has {} steps: it needs at least one", job.name, job.steps));
    std::vector<Mode> modes;
    for (int32_t g : usable_counts(job, pool)) {
      Mode m;
      m.g = g;
      m.p = job.runtime_s(g);
      m.devices_per_node = pool.devices_per_node;
      if (!(m.p > 0) || !std::isfinite(m.p))
        throw PlanError(fmt::format("job '{}' on {} devices runs {} s: a runtime must be positive and finite", job.name,
                                    g, m.p));
      if (node_modes != NodeModes::explicit_nodes) modes.push_back(m);
      // (one node: the greedy mode is the explicit one)
      if (node_modes == NodeModes::greedy || (node_modes == NodeModes::both && pool.nodes == 1)) continue;
      const int32_t k = m.span();
      // every set of k nodes (k = 1: each node)
      std::vector<int32_t> pick(static_cast<std::size_t>(k));
      std::iota(pick.begin(), pick.end(), 0);
      while (true) {
        Mode e = m;
        e.nodes = pick;
        modes.push_back(e);
        int32_t i = k - 1;
        while (i >= 0 && pick[i] == pool.nodes - k + i) --i;
        if (i < 0) break;
        ++pick[i];
        for (int32_t q = i + 1; q < k; ++q) pick[q] = pick[q - 1] + 1;
      }
    }
    if (modes.empty()) {
      std::string counts;
      for (const auto& [g, t] : job.step_time_s) {
        (void)t;
        counts += fmt::format("{}{}", counts.empty() ? "" : ", ", g);
      }
      throw PlanError(fmt::format(
          "job '{}' can use none of its device counts ({}) in a pool of {} node(s) x {} devices{}: a job fits one "
          "node unless it may span nodes (then whole nodes){}; give it a smaller count or a larger pool",
          job.name, counts, pool.nodes, pool.devices_per_node,
          pool.memory_bytes > 0 ? fmt::format(" with {:.3g} bytes per device", pool.memory_bytes) : "",
          pool.memory_bytes > 0 ? ", and its peak bytes must fit a device" : ""));
    }
    inst.modes.push_back(std::move(modes));
  }
  return inst;
}

Timeline serial_sgs(const Instance& inst, const std::vector<int32_t>& order, const std::vector<int32_t>& mode_of) {
  const std::size_t n = inst.modes.size();
  std::vector<NodeProfile> prof(static_cast<std::size_t>(inst.nodes), NodeProfile(inst.devices_per_node));
  for (std::size_t d = 0; d < inst.device_free_at.size(); ++d)  // devices still busy at 0
    if (inst.device_free_at[d] > 0)
      prof[d / static_cast<std::size_t>(inst.devices_per_node)].add(0, inst.device_free_at[d], 1);
  Timeline out;
  out.start.assign(n, 0);
  out.nodes.assign(n, {});
  for (int32_t j : order) {
    const Mode& m = inst.modes[j][mode_of[j]];
    double t = 0;
    std::vector<int32_t> chosen;
    if (m.span() == 1) {
      if (!m.nodes.empty()) {
        chosen = m.nodes;
        t = prof[m.nodes[0]].earliest(m.p, m.g);
      } else {
        double best = -1;
        for (int32_t node = 0; node < inst.nodes; ++node) {
          const double e = prof[node].earliest(m.p, m.g);
          if (best < 0 || e < best) {
            best = e;
            chosen = {node};
          }
        }
        t = best;
      }
    } else {
      // Whole nodes: the earliest candidate moment (0 or a step of any node) at which enough
      // of the allowed nodes are free for the whole runtime.
      std::vector<double> cand{0.0};
      for (const NodeProfile& p : prof) cand.insert(cand.end(), p.times().begin(), p.times().end());
      std::sort(cand.begin(), cand.end());
      cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
      bool placed = false;
      for (double c : cand) {
        std::vector<int32_t> free_nodes;
        if (!m.nodes.empty()) {
          bool all = true;
          for (int32_t node : m.nodes) all = all && prof[node].fits(c, m.p, inst.devices_per_node);
          if (all) free_nodes = m.nodes;
        } else {
          for (int32_t node = 0; node < inst.nodes && static_cast<int32_t>(free_nodes.size()) < m.span(); ++node)
            if (prof[node].fits(c, m.p, inst.devices_per_node)) free_nodes.push_back(node);
          if (static_cast<int32_t>(free_nodes.size()) < m.span()) free_nodes.clear();
        }
        if (!free_nodes.empty()) {
          t = c;
          chosen = free_nodes;
          placed = true;
          break;
        }
      }
      if (!placed) throw PlanError("internal: a spanning job found no moment with its nodes free");
    }
    const int32_t per_node = m.span() == 1 ? m.g : inst.devices_per_node;
    for (int32_t node : chosen) prof[node].add(t, m.p, per_node);
    out.start[j] = t;
    out.nodes[j] = chosen;
    const double end = t + m.p;
    out.makespan = std::max(out.makespan, end);
    out.sum_completion += end;
  }
  return out;
}

std::vector<int32_t> order_by_start(const std::vector<double>& start) {
  std::vector<int32_t> order(start.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return start[a] < start[b]; });
  return order;
}

double objective_value(const Timeline& t, Objective o) {
  return o == Objective::makespan ? t.makespan : t.sum_completion;
}

Schedule make_schedule(const Instance& inst, const Timeline& t, const std::vector<int32_t>& mode_of,
                       const std::vector<JobProfile>& jobs, const Pool& pool, const std::string& method) {
  const std::size_t n = jobs.size();
  Schedule s;
  s.method = method;
  s.jobs.resize(n);
  std::vector<double> busy_until(static_cast<std::size_t>(pool.num_devices()), 0.0);
  for (std::size_t d = 0; d < inst.device_free_at.size() && d < busy_until.size(); ++d)
    busy_until[d] = inst.device_free_at[d];
  for (int32_t j : order_by_start(t.start)) {
    const Mode& m = inst.modes[j][mode_of[j]];
    Placement& p = s.jobs[j];
    p.job = jobs[j].name;
    p.job_index = j;
    p.num_devices = m.g;
    p.nodes = t.nodes[j];
    p.start_s = t.start[j];
    p.end_s = t.start[j] + m.p;
    const int32_t per_node = m.span() == 1 ? m.g : pool.devices_per_node;
    for (int32_t node : p.nodes) {
      int32_t taken = 0;
      for (int32_t d = 0; d < pool.devices_per_node && taken < per_node; ++d) {
        const int32_t id = pool.device_id(node, d);
        if (busy_until[id] <= p.start_s) {
          busy_until[id] = p.end_s;
          p.devices.push_back(id);
          ++taken;
        }
      }
      if (taken < per_node)
        throw PlanError(fmt::format("internal: node {} has {} free devices at {} s for job '{}', which needs {}", node,
                                    taken, p.start_s, p.job, per_node));
    }
    std::sort(p.devices.begin(), p.devices.end());
    s.makespan_s = std::max(s.makespan_s, p.end_s);
    s.sum_completion_s += p.end_s;
  }
  s.lower_bound_s = makespan_lower_bound(jobs, pool);
  return s;
}

}  // namespace tessel::planner::detail
