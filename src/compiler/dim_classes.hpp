// src/compiler/dim_classes.hpp — union-find over the dims of a graph's values, (value, dim) pairs:
// the passes that follow a dim through the ops' factors (uneven padding, auto_shard's axis
// restrictions) join the dims an op's factor links and ask which class a dim is in.
#pragma once

#include <cstddef>
#include <numeric>
#include <vector>

#include "tessel/ir/graph.hpp"

namespace tessel {

struct DimClasses {
  std::vector<int> parent;
  std::vector<int> base;  // first node of each value
  explicit DimClasses(const Graph& g) {
    int n = 0;
    for (const Value& v : g.values) {
      base.push_back(n);
      n += static_cast<int>(v.shape.size());
    }
    parent.resize(static_cast<std::size_t>(n));
    std::iota(parent.begin(), parent.end(), 0);
  }
  int node(int v, std::size_t d) const { return base[static_cast<std::size_t>(v)] + static_cast<int>(d); }
  int find(int x) {
    while (parent[static_cast<std::size_t>(x)] != x)
      x = parent[static_cast<std::size_t>(x)] = parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(x)])];
    return x;
  }
  void unite(int a, int b) { parent[static_cast<std::size_t>(find(a))] = find(b); }
};

}  // namespace tessel
