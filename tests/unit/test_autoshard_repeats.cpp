// Repeated structure in strategy-selection problems (src/autoshard/repeats.hpp): colour
// refinement puts the alike nodes of repeated layers in one class, and the tied problem prices
// every plan that gives a class one strategy exactly as the whole problem does.
#include <algorithm>
#include <random>

#include <catch2/catch.hpp>

#include "../../src/autoshard/repeats.hpp"
#include "tessel/autoshard/problem.hpp"
#include "tessel/autoshard/solver.hpp"
#include "test_util.hpp"

using namespace tessel::autoshard;

namespace {

// A stack of `layers` copies of one random layer of `width` nodes (a chain inside the layer,
// plus a random extra edge), each layer's last node feeding the next layer's first; a head node
// and a tail node of their own.
Problem stacked(std::mt19937_64& rng, int layers, int width, int s) {
  std::uniform_int_distribution<int64_t> cost(0, 100);
  Problem p;
  auto node = [&](const std::vector<int64_t>& c) {
    Node n;
    n.cost = c;
    n.usage.assign(c.size(), 1);
    n.live = {0, 1};
    p.nodes.push_back(n);
    return static_cast<int32_t>(p.nodes.size() - 1);
  };
  auto matrix = [&] {
    std::vector<int64_t> m(static_cast<std::size_t>(s * s));
    for (int64_t& x : m) x = cost(rng);
    return m;
  };
  std::vector<std::vector<int64_t>> layer_costs(static_cast<std::size_t>(width));
  for (auto& c : layer_costs) {
    c.resize(static_cast<std::size_t>(s));
    for (int64_t& x : c) x = cost(rng);
  }
  std::vector<std::vector<int64_t>> inner(static_cast<std::size_t>(width)), link = {matrix()}, extra = {matrix()};
  for (auto& m : inner) m = matrix();
  std::vector<int64_t> head_costs(static_cast<std::size_t>(s)), tail_costs(static_cast<std::size_t>(s));
  for (int64_t& x : head_costs) x = cost(rng) + 1000;  // unlike any layer node
  for (int64_t& x : tail_costs) x = cost(rng) + 2000;
  int32_t prev = node(head_costs);
  for (int l = 0; l < layers; ++l) {
    std::vector<int32_t> ids;
    for (int w = 0; w < width; ++w) ids.push_back(node(layer_costs[static_cast<std::size_t>(w)]));
    p.edges.push_back({prev, ids[0], link[0]});
    for (int w = 0; w + 1 < width; ++w) p.edges.push_back({ids[static_cast<std::size_t>(w)], ids[static_cast<std::size_t>(w) + 1], inner[static_cast<std::size_t>(w)]});
    p.edges.push_back({ids[0], ids.back(), extra[0]});
    prev = ids.back();
  }
  p.edges.push_back({prev, node(tail_costs), link[0]});
  return p;
}

std::vector<uint64_t> first_colors(const Problem& p) {
  std::vector<uint64_t> c;
  for (const Node& n : p.nodes) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t x : n.cost) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ULL;
    c.push_back(h);
  }
  return c;
}

}  // namespace

TEST_CASE("autoshard repeats: the layers of a stack fall into shared classes", "[autoshard]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("autoshard repeats: classes", seed, 10);
  std::mt19937_64 rng(seed);
  for (int c = 0; c < 10; ++c) {
    const int layers = 12, width = 3 + c % 3;
    const Problem p = stacked(rng, layers, width, 3);
    const RepeatClasses rc = repeat_classes(p, first_colors(p), 2);
    INFO("case " << c);
    REQUIRE(rc.class_of.size() == p.nodes.size());
    // Far from the ends (2 rounds reach 2 edges), layer l's w-th node and layer 6's share a class.
    for (int l = 3; l < layers - 3; ++l)
      for (int w = 0; w < width; ++w)
        CHECK(rc.class_of[static_cast<std::size_t>(1 + l * width + w)] ==
              rc.class_of[static_cast<std::size_t>(1 + 6 * width + w)]);
    // Nodes of different costs never share one.
    for (std::size_t a = 0; a < p.nodes.size(); ++a)
      for (std::size_t b = 0; b < p.nodes.size(); ++b)
        if (rc.class_of[a] == rc.class_of[b]) CHECK(p.nodes[a].cost == p.nodes[b].cost);
    CHECK(rc.count < static_cast<int32_t>(p.nodes.size()) / 2);
  }
}

TEST_CASE("autoshard repeats: the tied problem prices tied plans as the whole problem does", "[autoshard]") {
  const uint64_t seed = tessel_test::seed() + 1;
  tessel_test::announce("autoshard repeats: tied costs", seed, 10);
  std::mt19937_64 rng(seed);
  for (int c = 0; c < 10; ++c) {
    const Problem p = stacked(rng, 8, 3, 3);
    const RepeatClasses rc = repeat_classes(p, first_colors(p), 2);
    const Problem t = tied_problem(p, rc);
    t.validate("tied");
    REQUIRE(static_cast<int32_t>(t.nodes.size()) == rc.count);
    INFO("case " << c << ", " << rc.count << " classes");
    // Every tied plan (enumerated when there are few classes, else random ones) costs the same
    // in both problems; the best of them is what the exact solver finds on the tied problem.
    TotalCost best = -1;
    std::uniform_int_distribution<int32_t> pick(0, 2);
    double combos = 1;
    for (int k = 0; k < rc.count; ++k) combos *= 3;
    const bool all = combos <= 20000;
    Plan tp(static_cast<std::size_t>(rc.count), 0);
    for (int trial = 0; trial < (all ? static_cast<int>(combos) : 2000); ++trial) {
      if (all) {
        int x = trial;
        for (auto& s : tp) s = x % 3, x /= 3;
      } else {
        for (auto& s : tp) s = pick(rng);
      }
      const TotalCost whole = evaluate(p, expand(rc, tp)).cost;
      CHECK(whole == evaluate(t, tp).cost);
      if (best < 0 || whole < best) best = whole;
    }
    SolveOptions o;
    o.time_limit_s = 30;
    const SolveResult r = solve_exact(t, o);
    REQUIRE(r.status == SolveStatus::optimal);
    CHECK(evaluate(p, expand(rc, r.plan)).cost <= best);
    if (all) CHECK(evaluate(p, expand(rc, r.plan)).cost == best);
  }
}
