// The device-packing relaxation of the joint schedule, shared by the branch and bound
// (exact_bnb.cpp: its bound) and the fast method (schedule.cpp: a start for small batches).
//
// A plan of makespan T puts, on every device, work that fits in what is left of [0, T] on it:
// a job on g devices for p seconds puts p on each of g devices of one node (k whole nodes when
// it spans). Forgetting that the g pieces run at the same time leaves a multi-bin packing,
// which Packer decides by a small search: jobs largest least area first, each mode, each node
// (nodes in the same state once), each choice of g devices up to devices of equal room (the
// smallest room that fits first), with a memo of failed states and a node budget. Out of
// budget is "unknown", which a bound must read as "fits".
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <unordered_set>
#include <vector>

#include "sgs.hpp"

namespace tessel::planner::detail {

// A job's way to run, as the search sees it: g devices for p seconds, on one node (span 1) or
// on `span` whole nodes; `index` is its place in the instance's (greedy) modes.
struct BMode {
  int32_t g = 0;
  double p = 0;
  int32_t span = 1;
  int32_t index = 0;
  double area() const { return g * p; }
};

// A job's modes without the dominated ones: a mode with at least as many devices and at least
// as long a runtime as another is never needed (the other runs on a subset of its devices and
// ends no later).
inline std::vector<BMode> useful_modes(const std::vector<Mode>& modes) {
  std::vector<BMode> out;
  for (std::size_t a = 0; a < modes.size(); ++a) {
    bool dominated = false;
    for (std::size_t b = 0; b < modes.size() && !dominated; ++b) {
      if (a == b) continue;
      const bool no_worse = modes[b].g <= modes[a].g && modes[b].p <= modes[a].p;
      const bool same = modes[b].g == modes[a].g && modes[b].p == modes[a].p;
      dominated = no_worse && (!same || b < a);
    }
    if (!dominated) out.push_back({modes[a].g, modes[a].p, modes[a].span(), static_cast<int32_t>(a)});
  }
  return out;
}

struct VecHash {
  std::size_t operator()(const std::vector<double>& v) const {
    uint64_t h = 1469598103934665603ULL;
    for (double x : v) {
      uint64_t b;
      std::memcpy(&b, &x, sizeof b);
      h = (h ^ b) * 1099511628211ULL;
      h ^= h >> 29;
    }
    return static_cast<std::size_t>(h);
  }
};

// The device-packing relaxation (the file comment). The room is one flat array, node after node,
// each node's devices in descending order; the buffers are kept across calls (the search runs
// it at every node of its own tree, so it must not allocate).
class Packer {
 public:
  enum class Result { fits, does_not_fit, unknown };

  Packer(const std::vector<std::vector<BMode>>& modes, int32_t nodes, int32_t devices_per_node)
      : modes_(modes), nodes_(nodes), dpn_(devices_per_node) {}

  // room[n * devices_per_node + d]: seconds left on device d of node n; jobs: the jobs to pack.
  Result check(const std::vector<double>& room, const std::vector<int32_t>& jobs, int64_t node_limit) {
    room_ = room;
    double top = 0;
    for (int32_t n = 0; n < nodes_; ++n) std::sort(node(n), node(n) + dpn_, std::greater<double>());
    for (double x : room_) top = std::max(top, x);
    eps_ = 1e-12 * std::max(1.0, top);
    items_ = jobs;
    std::sort(items_.begin(), items_.end(), [&](int32_t a, int32_t b) {
      const double aa = min_area(a), ab = min_area(b);
      if (aa != ab) return aa > ab;
      return a < b;
    });
    const std::size_t m = items_.size();
    area_left_.assign(m + 1, 0.0);
    min_p_left_.assign(m + 1, std::numeric_limits<double>::infinity());
    max_p_left_.assign(m + 1, 0.0);
    for (std::size_t k = m; k-- > 0;) {
      area_left_[k] = area_left_[k + 1] + min_area(items_[k]);
      min_p_left_[k] = std::min(min_p_left_[k + 1], min_p(items_[k]));
      max_p_left_[k] = std::max(max_p_left_[k + 1], min_p(items_[k]));
    }
    if (saved_.size() < m + 1) {
      saved_.resize(m + 1);
      groups_.resize(m + 1);
      take_.resize(m + 1);
    }
    pick_mode_.assign(m, nullptr);
    pick_nodes_.assign(m, {});
    failed_.clear();
    count_ = 0;
    limit_ = node_limit;
    out_of_budget_ = false;
    const bool ok = search(0);
    if (out_of_budget_) return Result::unknown;
    return ok ? Result::fits : Result::does_not_fit;
  }

 // After check() returned fits: job j's mode (g, p, span) and node(s) in the packing found.
  const BMode* mode_of(int32_t j) const {
    for (std::size_t k = 0; k < items_.size(); ++k)
      if (items_[k] == j) return pick_mode_[k];
    return nullptr;
  }
  const std::vector<int32_t>& nodes_of(int32_t j) const {
    static const std::vector<int32_t> none;
    for (std::size_t k = 0; k < items_.size(); ++k)
      if (items_[k] == j) return pick_nodes_[k];
    return none;
  }

 private:
  double* node(int32_t n) { return room_.data() + static_cast<std::ptrdiff_t>(n) * dpn_; }
  double min_area(int32_t j) const {
    double a = std::numeric_limits<double>::infinity();
    for (const BMode& m : modes_[j]) a = std::min(a, m.area());
    return a;
  }
  double min_p(int32_t j) const {
    double p = std::numeric_limits<double>::infinity();
    for (const BMode& m : modes_[j]) p = std::min(p, m.p);
    return p;
  }
  bool same_node(int32_t a, int32_t b) {
    return std::equal(node(a), node(a) + dpn_, node(b));
  }

  // The state up to the order of the nodes: k, then the nodes' rooms in lexicographic order.
  void make_key(std::size_t k) {
    key_.clear();
    key_.push_back(static_cast<double>(k));
    order_.resize(static_cast<std::size_t>(nodes_));
    std::iota(order_.begin(), order_.end(), 0);
    if (nodes_ > 1)
      std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
        return std::lexicographical_compare(node(a), node(a) + dpn_, node(b), node(b) + dpn_);
      });
    for (int32_t n : order_) key_.insert(key_.end(), node(n), node(n) + dpn_);
  }

  bool search(std::size_t k) {
    if (k == items_.size()) return true;
    if (++count_ > limit_) {
      out_of_budget_ = true;
      return true;  // unknown: let the caller treat it as fitting
    }
    // Room on a device too small for every job left is lost; the rest must hold their least
    // areas, and the longest of their shortest runtimes must fit some device.
    double usable = 0, top = 0;
    for (double x : room_) {
      if (x + eps_ >= min_p_left_[k]) usable += x;
      top = std::max(top, x);
    }
    if (usable + eps_ * static_cast<double>(room_.size()) < area_left_[k]) return false;
    if (max_p_left_[k] > top + eps_) return false;
    make_key(k);
    if (failed_.count(key_)) return false;
    const int32_t j = items_[k];
    for (const BMode& m : modes_[j]) {
      if (m.span == 1) {
        for (int32_t n = 0; n < nodes_; ++n) {
          bool seen = false;
          for (int32_t q = 0; q < n && !seen; ++q) seen = same_node(q, n);
          if (seen) continue;
          if (place_on_node(k, n, m) || out_of_budget_) return true;
        }
      } else if (place_spanning(k, m) || out_of_budget_) {
        return true;
      }
    }
    if (failed_.size() < 2000000) {
      make_key(k);
      failed_.insert(key_);
    }
    return false;
  }

  // Every choice of g devices of node n with room for p, up to devices of equal room, the
  // smallest room that fits first (best fit finds a packing sooner).
  bool place_on_node(std::size_t k, int32_t n, const BMode& m) {
    const double* r = node(n);  // descending
    int32_t fit = 0;
    while (fit < dpn_ && r[fit] + eps_ >= m.p) ++fit;
    if (fit < m.g) return false;
    auto& groups = groups_[k];  // (room, devices with it), smallest first
    groups.clear();
    for (int32_t d = fit - 1; d >= 0; --d) {
      if (!groups.empty() && groups.back().first == r[d]) ++groups.back().second;
      else groups.push_back({r[d], 1});
    }
    take_[k].assign(groups.size(), 0);
    return choose(k, n, m, 0, m.g);
  }

  bool choose(std::size_t k, int32_t n, const BMode& m, std::size_t gi, int32_t need) {
    const auto& groups = groups_[k];
    auto& take = take_[k];
    if (need == 0) {
      double* r = node(n);
      saved_[k].assign(r, r + dpn_);
      for (std::size_t q = 0; q < groups.size(); ++q)
        for (int32_t c = 0; c < take[q]; ++c) *std::find(r, r + dpn_, groups[q].first) -= m.p;
      std::sort(r, r + dpn_, std::greater<double>());
      pick_mode_[k] = &m;
      pick_nodes_[k] = {n};
      const bool ok = search(k + 1);
      std::copy(saved_[k].begin(), saved_[k].end(), node(n));
      return ok;
    }
    if (gi == groups.size()) return false;
    int32_t rest = 0;
    for (std::size_t q = gi; q < groups.size(); ++q) rest += groups[q].second;
    if (rest < need) return false;
    for (int32_t c = std::min(need, groups[gi].second); c >= 0; --c) {
      take[gi] = c;
      if (choose(k, n, m, gi + 1, need - c) || out_of_budget_) return true;
    }
    take[gi] = 0;
    return false;
  }

  // Every set of `span` nodes whose every device has room for p, up to nodes of equal room.
  bool place_spanning(std::size_t k, const BMode& m) {
    std::vector<int32_t> eligible;
    for (int32_t n = 0; n < nodes_; ++n)
      if (node(n)[dpn_ - 1] + eps_ >= m.p) eligible.push_back(n);
    const int32_t e = static_cast<int32_t>(eligible.size());
    if (e < m.span) return false;
    std::vector<int32_t> pick(static_cast<std::size_t>(m.span));
    std::iota(pick.begin(), pick.end(), 0);
    std::vector<std::vector<double>> tried;
    while (true) {
      std::vector<std::vector<double>> chosen;
      for (int32_t i : pick) chosen.emplace_back(node(eligible[i]), node(eligible[i]) + dpn_);
      std::sort(chosen.begin(), chosen.end());
      std::vector<double> flat;
      for (const auto& c : chosen) flat.insert(flat.end(), c.begin(), c.end());
      if (std::find(tried.begin(), tried.end(), flat) == tried.end()) {
        tried.push_back(flat);
        const std::vector<double> saved = room_;
        pick_mode_[k] = &m;
        pick_nodes_[k].clear();
        for (int32_t i : pick) {
          for (int32_t d = 0; d < dpn_; ++d) node(eligible[i])[d] -= m.p;
          pick_nodes_[k].push_back(eligible[i]);
        }
        const bool ok = search(k + 1);
        room_ = saved;
        if (ok || out_of_budget_) return true;
      }
      int32_t i = m.span - 1;
      while (i >= 0 && pick[i] == e - m.span + i) --i;
      if (i < 0) return false;
      ++pick[i];
      for (int32_t q = i + 1; q < m.span; ++q) pick[q] = pick[q - 1] + 1;
    }
  }

  const std::vector<std::vector<BMode>>& modes_;
  int32_t nodes_, dpn_;
  std::vector<double> room_;
  std::vector<int32_t> items_;
  std::vector<double> area_left_, min_p_left_, max_p_left_;
  std::vector<std::vector<double>> saved_;
  std::vector<std::vector<std::pair<double, int32_t>>> groups_;
  std::vector<std::vector<int32_t>> take_;
  std::vector<double> key_;
  std::vector<int32_t> order_;
  std::vector<const BMode*> pick_mode_;             // per depth: the mode and node(s) tried
  std::vector<std::vector<int32_t>> pick_nodes_;
  std::unordered_set<std::vector<double>, VecHash> failed_;
  double eps_ = 0;
  int64_t count_ = 0, limit_ = 0;
  bool out_of_budget_ = false;
};

}  // namespace tessel::planner::detail
