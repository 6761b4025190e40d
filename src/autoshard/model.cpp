// The solvers' view of a Problem: see model.hpp.
#include "model.hpp"

#include <algorithm>
#include <map>
#include <utility>

namespace tessel::autoshard::detail {

Model build_model(const Problem& problem) {
  Model m;
  const std::size_t n = problem.nodes.size();
  m.adj.resize(n);
  std::map<std::pair<int32_t, int32_t>, int32_t> pair_of;
  for (const Edge& e : problem.edges) {
    const bool flip = e.a > e.b;
    const int32_t a = flip ? e.b : e.a, b = flip ? e.a : e.b;
    const std::size_t sa = problem.nodes[a].cost.size(), sb = problem.nodes[b].cost.size();
    auto [it, fresh] = pair_of.emplace(std::make_pair(a, b), static_cast<int32_t>(m.pairs.size()));
    if (fresh) {
      m.pairs.push_back({a, b, std::vector<int64_t>(sa * sb, 0)});
      m.adj[a].push_back({b, it->second});
      m.adj[b].push_back({a, it->second});
    }
    std::vector<int64_t>& dst = m.pairs[it->second].cost;
    // e.cost is [S(e.a), S(e.b)]; a flipped edge is added transposed.
    for (std::size_t i = 0; i < sa; ++i)
      for (std::size_t j = 0; j < sb; ++j) {
        const int64_t c = flip ? e.cost[j * sa + i] : e.cost[i * sb + j];
        dst[i * sb + j] = add_cost(dst[i * sb + j], c, m.clamped);
      }
  }
  for (const Node& node : problem.nodes)
    if (!node.live.empty()) {
      m.boundaries.push_back(node.live.start);
      m.boundaries.push_back(node.live.end);
    }
  std::sort(m.boundaries.begin(), m.boundaries.end());
  m.boundaries.erase(std::unique(m.boundaries.begin(), m.boundaries.end()), m.boundaries.end());
  m.num_segments = m.boundaries.empty() ? 0 : static_cast<int32_t>(m.boundaries.size()) - 1;
  m.seg_lo.assign(n, 0);
  m.seg_hi.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Interval& live = problem.nodes[i].live;
    if (live.empty()) continue;
    m.seg_lo[i] = static_cast<int32_t>(std::lower_bound(m.boundaries.begin(), m.boundaries.end(), live.start) -
                                       m.boundaries.begin());
    m.seg_hi[i] = static_cast<int32_t>(std::lower_bound(m.boundaries.begin(), m.boundaries.end(), live.end) -
                                       m.boundaries.begin());
  }
  return m;
}

Plan least_memory_plan(const Problem& problem) {
  Plan plan(problem.nodes.size(), 0);
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Node& node = problem.nodes[i];
    for (int32_t s = 1; s < node.num_strategies(); ++s) {
      const int32_t b = plan[i];
      if (node.usage[s] < node.usage[b] || (node.usage[s] == node.usage[b] && node.cost[s] < node.cost[b])) plan[i] = s;
    }
  }
  return plan;
}

}  // namespace tessel::autoshard::detail

namespace tessel::autoshard::detail {

namespace {

// The strategy of `b` that pair p allows at a finite cost when `a` takes sa, or -1 when none;
// `functional` is cleared when more than one is allowed.
int32_t follower(const Problem& problem, const PairEdge& p, int32_t a, int32_t sa, bool& functional) {
  const int32_t b = p.a == a ? p.b : p.a;
  const int32_t sb = problem.nodes[p.b].num_strategies();
  int32_t found = -1;
  for (int32_t t = 0; t < problem.nodes[b].num_strategies(); ++t) {
    const int64_t c = p.a == a ? p.cost[static_cast<std::size_t>(sa) * sb + t] : p.cost[static_cast<std::size_t>(t) * sb + sa];
    if (c >= kInfiniteCost) continue;
    if (found >= 0) {
      functional = false;
      return found;
    }
    found = t;
  }
  return found;
}

bool is_functional(const Problem& problem, const PairEdge& p, int32_t from) {
  bool functional = true;
  for (int32_t s = 0; s < problem.nodes[from].num_strategies() && functional; ++s)
    follower(problem, p, from, s, functional);
  return functional;
}

int32_t find(std::vector<int32_t>& uf, int32_t v) {
  while (uf[v] != v) v = uf[v] = uf[uf[v]];
  return v;
}

int64_t pair_entry(const Problem& problem, const PairEdge& p, int32_t sa, int32_t sb) {
  return p.cost[static_cast<std::size_t>(sa) * problem.nodes[p.b].num_strategies() + sb];
}

}  // namespace

Coarse build_coarse(const Problem& problem, const Model& model) {
  const int32_t n = static_cast<int32_t>(problem.nodes.size());
  // A forest of "follow" links: leader[b] = (a, pair) when b follows a.
  std::vector<int32_t> uf(n), leader(n, -1), leader_pair(n, -1);
  for (int32_t v = 0; v < n; ++v) uf[v] = v;
  for (std::size_t k = 0; k < model.pairs.size(); ++k) {
    const PairEdge& p = model.pairs[k];
    if (problem.nodes[p.a].num_strategies() == 1 || problem.nodes[p.b].num_strategies() == 1) continue;
    for (int dir = 0; dir < 2; ++dir) {
      const int32_t from = dir == 0 ? p.a : p.b, to = dir == 0 ? p.b : p.a;
      if (leader[to] >= 0 || find(uf, from) == find(uf, to) || !is_functional(problem, p, from)) continue;
      leader[to] = from;
      leader_pair[to] = static_cast<int32_t>(k);
      uf[find(uf, to)] = find(uf, from);
      break;
    }
  }
  Coarse c;
  c.clamped = model.clamped;
  c.group_of.assign(n, -1);
  std::vector<std::vector<int32_t>> children(n);
  std::vector<int32_t> position(n, 0);  // index of a node among its group's members
  for (int32_t v = 0; v < n; ++v)
    if (leader[v] >= 0) children[leader[v]].push_back(v);
  for (int32_t r = 0; r < n; ++r) {
    if (leader[r] >= 0) continue;
    Group g;
    g.members.push_back(r);
    for (std::size_t i = 0; i < g.members.size(); ++i)
      for (int32_t ch : children[g.members[i]]) g.members.push_back(ch);
    const int32_t id = static_cast<int32_t>(c.groups.size());
    for (std::size_t i = 0; i < g.members.size(); ++i) {
      c.group_of[g.members[i]] = id;
      position[g.members[i]] = static_cast<int32_t>(i);
    }
    g.num_strategies = problem.nodes[r].num_strategies();
    const std::size_t k = g.members.size();
    g.assign.assign(static_cast<std::size_t>(g.num_strategies) * k, 0);
    g.cost.assign(g.num_strategies, 0);
    for (int32_t s = 0; s < g.num_strategies; ++s) {
      int32_t* as = &g.assign[s * k];
      as[0] = s;
      bool dead = false;
      for (std::size_t i = 1; i < k; ++i) {
        const int32_t m = g.members[i], a = leader[m];
        const int32_t ai = position[a];
        bool functional = true;
        const int32_t t = follower(problem, model.pairs[leader_pair[m]], a, as[ai], functional);
        if (t < 0) dead = true;
        as[i] = std::max(t, 0);
      }
      int64_t cost = dead ? kInfiniteCost : 0;
      for (std::size_t i = 0; i < k; ++i) cost = add_cost(cost, problem.nodes[g.members[i]].cost[as[i]], c.clamped);
      g.cost[s] = cost;
    }
    c.groups.push_back(std::move(g));
  }
  // Member strategy of node v under its group's strategy gs.
  const std::vector<int32_t>& member_index = position;
  auto strategy_of = [&](int32_t v, int32_t gs) {
    const Group& g = c.groups[c.group_of[v]];
    return g.assign[static_cast<std::size_t>(gs) * g.members.size() + member_index[v]];
  };
  c.adj.resize(c.groups.size());
  std::map<std::pair<int32_t, int32_t>, int32_t> pair_of;
  for (const PairEdge& p : model.pairs) {
    const int32_t ga = c.group_of[p.a], gb = c.group_of[p.b];
    if (ga == gb) {  // inside a group: a cost of the group's strategy
      Group& g = c.groups[ga];
      for (int32_t s = 0; s < g.num_strategies; ++s)
        g.cost[s] = add_cost(g.cost[s], pair_entry(problem, p, strategy_of(p.a, s), strategy_of(p.b, s)), c.clamped);
      continue;
    }
    const int32_t sa = c.groups[ga].num_strategies, sb = c.groups[gb].num_strategies;
    if (sa == 1 || sb == 1) {  // one side is fixed: a cost of the other side's strategy
      const bool a_fixed = sa == 1;
      Group& g = c.groups[a_fixed ? gb : ga];
      for (int32_t s = 0; s < g.num_strategies; ++s)
        g.cost[s] = add_cost(g.cost[s],
                             a_fixed ? pair_entry(problem, p, strategy_of(p.a, 0), strategy_of(p.b, s))
                                     : pair_entry(problem, p, strategy_of(p.a, s), strategy_of(p.b, 0)),
                             c.clamped);
      continue;
    }
    const bool flip = ga > gb;
    const int32_t lo = flip ? gb : ga, hi = flip ? ga : gb;
    auto [it, fresh] = pair_of.emplace(std::make_pair(lo, hi), static_cast<int32_t>(c.pairs.size()));
    if (fresh) {
      c.pairs.push_back({lo, hi, std::vector<int64_t>(static_cast<std::size_t>(c.groups[lo].num_strategies) *
                                                          c.groups[hi].num_strategies, 0)});
      c.adj[lo].push_back({hi, it->second});
      c.adj[hi].push_back({lo, it->second});
    }
    PairEdge& q = c.pairs[it->second];
    const int32_t slo = c.groups[lo].num_strategies, shi = c.groups[hi].num_strategies;
    for (int32_t i = 0; i < slo; ++i)
      for (int32_t j = 0; j < shi; ++j) {
        const int32_t s_a = flip ? j : i, s_b = flip ? i : j;  // group strategies of ga, gb
        int64_t& dst = q.cost[static_cast<std::size_t>(i) * shi + j];
        dst = add_cost(dst, pair_entry(problem, p, strategy_of(p.a, s_a), strategy_of(p.b, s_b)), c.clamped);
      }
  }
  // A group of one strategy now has nothing left to choose; groups of one strategy on both
  // sides of a pair were folded above, so such groups have no neighbours.
  return c;
}

}  // namespace tessel::autoshard::detail
