// Repeated structure: colour refinement and the tied problem (repeats.hpp).
#include "repeats.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>

namespace tessel::autoshard {

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64 of the combination: well spread, the same on every platform
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t hash_costs(const std::vector<int64_t>& v) {
  uint64_t h = 0x51ed270b27e5f1a3ULL ^ v.size();
  for (int64_t x : v) h = mix(h, static_cast<uint64_t>(x));
  return h;
}

}  // namespace

RepeatClasses repeat_classes(const Problem& p, std::vector<uint64_t> colors, int rounds) {
  const std::size_t n = p.nodes.size();
  std::vector<uint64_t> edge_hash(p.edges.size());
  std::vector<std::vector<std::pair<int32_t, std::size_t>>> touching(n);  // (+1 out / -1 in, edge)
  for (std::size_t k = 0; k < p.edges.size(); ++k) {
    edge_hash[k] = hash_costs(p.edges[k].cost);
    touching[static_cast<std::size_t>(p.edges[k].a)].push_back({+1, k});
    touching[static_cast<std::size_t>(p.edges[k].b)].push_back({-1, k});
  }
  for (std::size_t v = 0; v < n; ++v)
    colors[v] = mix(colors[v], static_cast<uint64_t>(p.nodes[v].num_strategies()));
  std::vector<uint64_t> next(n), sig;
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t v = 0; v < n; ++v) {
      sig.clear();
      for (const auto& [dir, k] : touching[v]) {
        const Edge& e = p.edges[k];
        const uint64_t other = colors[static_cast<std::size_t>(dir > 0 ? e.b : e.a)];
        sig.push_back(mix(mix(static_cast<uint64_t>(dir + 2), other), edge_hash[k]));
      }
      std::sort(sig.begin(), sig.end());
      uint64_t h = colors[v];
      for (uint64_t s : sig) h = mix(h, s);
      next[v] = h;
    }
    colors.swap(next);
  }
  RepeatClasses out;
  out.class_of.resize(n);
  std::unordered_map<uint64_t, int32_t> id;
  for (std::size_t v = 0; v < n; ++v) {
    auto [it, fresh] = id.emplace(colors[v], out.count);
    if (fresh) ++out.count;
    out.class_of[v] = it->second;
  }
  return out;
}

Problem tied_problem(const Problem& p, const RepeatClasses& c) {
  Problem t;
  t.name = p.name + " (tied)";
  t.nodes.resize(static_cast<std::size_t>(c.count));
  for (std::size_t v = 0; v < p.nodes.size(); ++v) {
    Node& tn = t.nodes[static_cast<std::size_t>(c.class_of[v])];
    const Node& node = p.nodes[v];
    if (tn.cost.empty()) {
      tn.cost.assign(node.cost.size(), 0);
      tn.usage.assign(node.cost.size(), 0);
      tn.live = {0, 0};  // no memory: the tied plan is checked on the whole problem
    }
    for (std::size_t s = 0; s < node.cost.size(); ++s)
      tn.cost[s] = std::min<int64_t>(kInfiniteCost, tn.cost[s] + node.cost[s]);
  }
  std::map<std::pair<int32_t, int32_t>, std::size_t> index;
  for (const Edge& e : p.edges) {
    const int32_t ca = c.class_of[static_cast<std::size_t>(e.a)], cb = c.class_of[static_cast<std::size_t>(e.b)];
    const std::size_t sb = p.nodes[static_cast<std::size_t>(e.b)].cost.size();
    if (ca == cb) {  // both ends take the class's strategy: the diagonal
      Node& tn = t.nodes[static_cast<std::size_t>(ca)];
      for (std::size_t s = 0; s < tn.cost.size(); ++s)
        tn.cost[s] = std::min<int64_t>(kInfiniteCost, tn.cost[s] + e.cost[s * sb + s]);
      continue;
    }
    auto [it, fresh] = index.emplace(std::make_pair(ca, cb), t.edges.size());
    if (fresh) {
      Edge te;
      te.a = ca;
      te.b = cb;
      te.cost.assign(e.cost.size(), 0);
      t.edges.push_back(std::move(te));
    }
    std::vector<int64_t>& m = t.edges[it->second].cost;
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::min<int64_t>(kInfiniteCost, m[i] + e.cost[i]);
  }
  return t;
}

Plan expand(const RepeatClasses& c, const Plan& tied_plan) {
  Plan plan(c.class_of.size());
  for (std::size_t v = 0; v < plan.size(); ++v) plan[v] = tied_plan[static_cast<std::size_t>(c.class_of[v])];
  return plan;
}

}  // namespace tessel::autoshard
