// Per-node penalty weights for the usage limit, searched by bisection (see model.hpp).
#include <algorithm>
#include <limits>

#include "model.hpp"

namespace tessel::autoshard::detail {

double median_price_ratio(const Problem& p) {
  std::vector<double> ratios;
  for (const Node& node : p.nodes) {
    int64_t cmin = std::numeric_limits<int64_t>::max(), cmax = 0, umin = std::numeric_limits<int64_t>::max(),
            umax = std::numeric_limits<int64_t>::min();
    for (int32_t s = 0; s < node.num_strategies(); ++s) {
      if (node.cost[static_cast<std::size_t>(s)] >= kInfiniteCost) continue;
      cmin = std::min(cmin, node.cost[static_cast<std::size_t>(s)]);
      cmax = std::max(cmax, node.cost[static_cast<std::size_t>(s)]);
      umin = std::min(umin, node.usage[static_cast<std::size_t>(s)]);
      umax = std::max(umax, node.usage[static_cast<std::size_t>(s)]);
    }
    if (umax > umin && cmax > cmin) ratios.push_back(static_cast<double>(cmax - cmin) / static_cast<double>(umax - umin));
  }
  if (ratios.empty()) return 1.0;
  std::nth_element(ratios.begin(), ratios.begin() + static_cast<std::ptrdiff_t>(ratios.size() / 2), ratios.end());
  return ratios[ratios.size() / 2];
}

PenaltyWeights::PenaltyWeights(const Problem& problem, const Model& model, double base)
    : model_(model), base_(base > 0 ? base : 1.0) {
  const std::size_t n = problem.nodes.size();
  const auto T = static_cast<std::size_t>(std::max(model.num_segments, 0));
  weight_.assign(n, 0.0);
  lo_.assign(n, 0.0);
  hi_.assign(n, -1.0);
  least_.assign(n, 0);
  at_risk_.assign(n, 0);
  if (!problem.usage_limit.has_value() || T == 0) return;
  const double limit = static_cast<double>(*problem.usage_limit);
  // The most each segment could hold: every live node at its largest finite usage.
  std::vector<double> most(T + 1, 0.0);
  for (std::size_t v = 0; v < n; ++v) {
    const Node& node = problem.nodes[v];
    int64_t umin = std::numeric_limits<int64_t>::max(), umax = 0;
    for (int32_t s = 0; s < node.num_strategies(); ++s) {
      if (node.cost[static_cast<std::size_t>(s)] >= kInfiniteCost) continue;
      umin = std::min(umin, node.usage[static_cast<std::size_t>(s)]);
      umax = std::max(umax, node.usage[static_cast<std::size_t>(s)]);
    }
    if (umin > umax) umin = umax = 0;  // no finite strategy
    least_[v] = umin;
    most[static_cast<std::size_t>(model.seg_lo[v])] += static_cast<double>(umax);
    most[static_cast<std::size_t>(model.seg_hi[v])] -= static_cast<double>(umax);
  }
  std::vector<int32_t> risky(T + 1, 0);  // prefix count of segments that could overflow
  double run = 0;
  for (std::size_t t = 0; t < T; ++t) {
    run += most[t];
    risky[t + 1] = risky[t] + (run > limit ? 1 : 0);
  }
  for (std::size_t v = 0; v < n; ++v) {
    if (risky[static_cast<std::size_t>(model.seg_hi[v])] == risky[static_cast<std::size_t>(model.seg_lo[v])]) continue;
    at_risk_[v] = 1;
    weight_[v] = base_;
    ++at_risk_count_;
  }
}

void PenaltyWeights::update(const std::vector<double>& segment_usage, double limit) {
  const std::size_t T = static_cast<std::size_t>(std::max(model_.num_segments, 0));
  std::vector<int32_t> over(T + 1, 0);  // prefix count of segments over the limit
  for (std::size_t t = 0; t < T; ++t) over[t + 1] = over[t] + (segment_usage[t] > limit ? 1 : 0);
  for (std::size_t v = 0; v < weight_.size(); ++v) {
    if (!at_risk_[v]) continue;
    if (over[static_cast<std::size_t>(model_.seg_hi[v])] > over[static_cast<std::size_t>(model_.seg_lo[v])]) {
      lo_[v] = weight_[v];
      if (hi_[v] >= 0 && hi_[v] - lo_[v] <= 0.01 * hi_[v]) hi_[v] = -1;  // closed too low: open upwards
      weight_[v] = hi_[v] < 0 ? 2 * std::max(weight_[v], base_) : 0.5 * (lo_[v] + hi_[v]);
    } else {
      hi_[v] = weight_[v];
      weight_[v] = 0.5 * (lo_[v] + hi_[v]);
    }
  }
}

}  // namespace tessel::autoshard::detail
