// Dominated strategies removed from the coarsened problem (model.hpp, prune_dominated): the
// exact method's program shrinks by the strategies no optimal plan needs. On XLA's graphs of a
// 3-D mesh many strategies are symmetric copies (the same split over two axes of one size),
// which this removes too.
#include <algorithm>
#include <numeric>

#include "model.hpp"

namespace tessel::autoshard::detail {

namespace {

// Whether strategy `t` of group g is at least as good as `s` everywhere (see model.hpp).
bool no_worse(const Problem& problem, const Coarse& c, int32_t g, int32_t t, int32_t s) {
  const Group& grp = c.groups[static_cast<std::size_t>(g)];
  if (grp.cost[static_cast<std::size_t>(t)] > grp.cost[static_cast<std::size_t>(s)]) return false;
  if (problem.usage_limit) {
    const std::size_t k = grp.members.size();
    for (std::size_t i = 0; i < k; ++i) {
      const Node& node = problem.nodes[static_cast<std::size_t>(grp.members[i])];
      if (node.live.empty()) continue;
      if (node.usage[static_cast<std::size_t>(grp.assign[static_cast<std::size_t>(t) * k + i])] >
          node.usage[static_cast<std::size_t>(grp.assign[static_cast<std::size_t>(s) * k + i])])
        return false;
    }
  }
  for (const Neighbor& nb : c.adj[static_cast<std::size_t>(g)]) {
    const PairEdge& e = c.pairs[static_cast<std::size_t>(nb.pair)];
    const int32_t sa = c.groups[static_cast<std::size_t>(e.a)].num_strategies;
    const int32_t sb = c.groups[static_cast<std::size_t>(e.b)].num_strategies;
    if (e.a == g) {
      const int64_t* rt = e.cost.data() + static_cast<std::ptrdiff_t>(t) * sb;
      const int64_t* rs = e.cost.data() + static_cast<std::ptrdiff_t>(s) * sb;
      for (int32_t j = 0; j < sb; ++j)
        if (rt[j] > rs[j]) return false;
    } else {
      for (int32_t i = 0; i < sa; ++i)
        if (e.cost[static_cast<std::size_t>(i) * sb + static_cast<std::size_t>(t)] >
            e.cost[static_cast<std::size_t>(i) * sb + static_cast<std::size_t>(s)])
          return false;
    }
  }
  return true;
}

// Keeps strategies `keep` (ascending) of group g, in the group and in every pair matrix it is in.
void restrict_group(Coarse& c, int32_t g, const std::vector<int32_t>& keep) {
  Group& grp = c.groups[static_cast<std::size_t>(g)];
  const std::size_t k = grp.members.size();
  std::vector<int32_t> assign;
  std::vector<int64_t> cost;
  for (int32_t s : keep) {
    cost.push_back(grp.cost[static_cast<std::size_t>(s)]);
    for (std::size_t i = 0; i < k; ++i) assign.push_back(grp.assign[static_cast<std::size_t>(s) * k + i]);
  }
  for (const Neighbor& nb : c.adj[static_cast<std::size_t>(g)]) {
    PairEdge& e = c.pairs[static_cast<std::size_t>(nb.pair)];
    const int32_t sa = c.groups[static_cast<std::size_t>(e.a)].num_strategies;
    const int32_t sb = c.groups[static_cast<std::size_t>(e.b)].num_strategies;
    std::vector<int64_t> m;
    if (e.a == g) {
      for (int32_t s : keep)
        m.insert(m.end(), e.cost.begin() + static_cast<std::ptrdiff_t>(s) * sb,
                 e.cost.begin() + static_cast<std::ptrdiff_t>(s + 1) * sb);
    } else {
      for (int32_t i = 0; i < sa; ++i)
        for (int32_t t : keep) m.push_back(e.cost[static_cast<std::size_t>(i) * sb + static_cast<std::size_t>(t)]);
    }
    e.cost = std::move(m);
  }
  grp.assign = std::move(assign);
  grp.cost = std::move(cost);
  grp.num_strategies = static_cast<int32_t>(keep.size());
}

}  // namespace

std::vector<std::vector<int32_t>> prune_dominated(const Problem& problem, Coarse& c) {
  const std::size_t ng = c.groups.size();
  // now[g][original strategy] -> its index in the current group (a removed one: its dominator's).
  std::vector<std::vector<int32_t>> now(ng);
  for (std::size_t g = 0; g < ng; ++g) {
    now[g].resize(static_cast<std::size_t>(c.groups[g].num_strategies));
    std::iota(now[g].begin(), now[g].end(), 0);
  }
  bool changed = true;
  while (changed) {
    changed = false;
    for (std::size_t g = 0; g < ng; ++g) {
      const int32_t S = c.groups[g].num_strategies;
      if (S < 2) continue;
      std::vector<int32_t> by(static_cast<std::size_t>(S), -1);  // the strategy that replaces s
      for (int32_t s = 0; s < S; ++s)
        for (int32_t t = 0; t < S && by[static_cast<std::size_t>(s)] < 0; ++t) {
          if (t == s || by[static_cast<std::size_t>(t)] >= 0) continue;  // a removed one replaces nothing
          if (!no_worse(problem, c, static_cast<int32_t>(g), t, s)) continue;
          // Mutual (equal everywhere): the lower index stays.
          if (t > s && no_worse(problem, c, static_cast<int32_t>(g), s, t)) continue;
          by[static_cast<std::size_t>(s)] = t;
        }
      std::vector<int32_t> keep, index(static_cast<std::size_t>(S), -1);
      for (int32_t s = 0; s < S; ++s)
        if (by[static_cast<std::size_t>(s)] < 0) {
          index[static_cast<std::size_t>(s)] = static_cast<int32_t>(keep.size());
          keep.push_back(s);
        }
      if (static_cast<int32_t>(keep.size()) == S) continue;
      // A removed strategy's replacement may itself have been removed later in this sweep only
      // if it was not kept; follow the chain to a kept one.
      for (int32_t s = 0; s < S; ++s) {
        int32_t r = s;
        while (by[static_cast<std::size_t>(r)] >= 0) r = by[static_cast<std::size_t>(r)];
        index[static_cast<std::size_t>(s)] = index[static_cast<std::size_t>(r)];
      }
      for (int32_t& v : now[g]) v = index[static_cast<std::size_t>(v)];
      restrict_group(c, static_cast<int32_t>(g), keep);
      changed = true;
    }
  }
  // A group left with one strategy has no choice: its pair matrices become costs of the other
  // side (as build_coarse folds such groups), so every pair joins two groups with a choice.
  std::vector<PairEdge> pairs;
  for (PairEdge& e : c.pairs) {
    Group& ga = c.groups[static_cast<std::size_t>(e.a)];
    Group& gb = c.groups[static_cast<std::size_t>(e.b)];
    if (ga.num_strategies > 1 && gb.num_strategies > 1) {
      pairs.push_back(std::move(e));
      continue;
    }
    const int32_t sb = gb.num_strategies;
    if (ga.num_strategies == 1) {
      for (int32_t t = 0; t < sb; ++t)
        gb.cost[static_cast<std::size_t>(t)] = add_cost(gb.cost[static_cast<std::size_t>(t)], e.cost[static_cast<std::size_t>(t)], c.clamped);
    } else {
      for (int32_t s = 0; s < ga.num_strategies; ++s)
        ga.cost[static_cast<std::size_t>(s)] = add_cost(ga.cost[static_cast<std::size_t>(s)], e.cost[static_cast<std::size_t>(s)], c.clamped);
    }
  }
  c.pairs = std::move(pairs);
  for (auto& a : c.adj) a.clear();
  for (std::size_t k = 0; k < c.pairs.size(); ++k) {
    c.adj[static_cast<std::size_t>(c.pairs[k].a)].push_back({c.pairs[k].b, static_cast<int32_t>(k)});
    c.adj[static_cast<std::size_t>(c.pairs[k].b)].push_back({c.pairs[k].a, static_cast<int32_t>(k)});
  }
  return now;
}

}  // namespace tessel::autoshard::detail
