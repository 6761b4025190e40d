// The IOPDDL reader and the contest's evaluator (tessel/autoshard/problem.hpp): the contest's
// reference values on example.json, a memory-infeasible plan, the infinite-cost sentinel,
// parallel edges, and the errors for bad input (each naming the file and the item).
#include <cstdio>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "tessel/autoshard/problem.hpp"

using namespace tessel::autoshard;

namespace {

std::string bench_dir() { return std::string(TESSEL_SOURCE_DIR) + "/../shared/benchmarks/iopddl"; }

// example.json's problem with a replaceable part, for the error cases.
const char* kExample = R"({"problem": {"name": "example",
  "nodes": {"intervals": [[30, 70], [40, 70], [50, 120], [110, 140], [110, 150]],
            "costs": [[15], [55, 65], [25, 45, 35], [85, 75], [95]],
            "usages": [[10], [25, 25], [15, 20, 15], [10, 10], [15]]},
  "edges": {"nodes": [[0, 1], [0, 2], [1, 3], [2, 4], [3, 4]],
            "costs": [[30, 40], [50, 10, 40], [90, 10, 20, 80], [60, 20, 30], [70, 60]]},
  "usage_limit": 50}})";

std::string replaced(const std::string& from, const std::string& to) {
  std::string s = kExample;
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("autoshard: the evaluator reproduces the contest's values on example.json", "[autoshard]") {
  const Problem p = read_iopddl(bench_dir() + "/example.json");
  REQUIRE(p.nodes.size() == 5);
  REQUIRE(p.edges.size() == 5);
  REQUIRE(p.usage_limit == 50);
  CHECK(p.name == "example");
  const Evaluation best = evaluate(p, {0, 0, 2, 1, 0});
  CHECK(cost_str(best.cost) == "445");
  CHECK(best.feasible());
  CHECK(best.peak_usage == 50);
  const Evaluation other = evaluate(p, {0, 1, 2, 0, 0});
  CHECK(cost_str(other.cost) == "495");
  CHECK(other.feasible());
  // Strategy 1 of node 2 uses 20, not 15: at t = 50..69 nodes 0, 1, 2 hold 10 + 25 + 20 = 55.
  const Evaluation over = evaluate(p, {0, 0, 1, 1, 0});
  CHECK_FALSE(over.within_memory);
  CHECK_FALSE(over.feasible());
  CHECK(over.peak_usage == 55);
  CHECK(over.peak_time == 50);
  CHECK(cost_str(over.cost) == "415");
  // The same file parsed from text gives the same problem.
  const Problem q = parse_iopddl(kExample, "inline");
  CHECK(cost_str(evaluate(q, {0, 0, 2, 1, 0}).cost) == "445");
  CHECK(format_plan({0, 0, 2, 1, 0}) == "[0, 0, 2, 1, 0]");
}

TEST_CASE("autoshard: memory at every time step and parallel edges that add and the 10^18 sentinel", "[autoshard]") {
  Problem p;
  p.nodes = {{{0, 3}, {1, 2}, {5, 9}}, {{3, 5}, {1, 1}, {4, 4}}, {{2, 2}, {7}, {100}}};  // node 2: empty span
  p.edges = {{0, 1, {1, 2, 3, 4}}, {1, 0, {10, 20, 30, 40}}};  // (1,0) is transposed: [s1][s0]
  p.usage_limit = 9;
  p.validate("test");
  // t = 0..2: node 0 alone; t = 3..4: node 1 alone; the spans touch but never overlap.
  const Evaluation a = evaluate(p, {1, 1, 0});
  CHECK(a.within_memory);
  CHECK(a.peak_usage == 9);
  // Cost: nodes 2 + 1 + 7, edges (0,1)[1][1] = 4 and (1,0)[1][1] = 40.
  CHECK(cost_str(a.cost) == "54");
  p.usage_limit = 8;
  CHECK_FALSE(evaluate(p, {1, 1, 0}).within_memory);
  CHECK(evaluate(p, {0, 1, 0}).within_memory);
  // The sentinel: legal, counted in 128 bits, but not feasible.
  p.nodes[2].cost = {kInfiniteCost};
  p.edges[0].cost = {kInfiniteCost, kInfiniteCost, kInfiniteCost, kInfiniteCost};
  const Evaluation inf = evaluate(p, {0, 0, 0});
  CHECK(inf.uses_infinite);
  CHECK_FALSE(inf.feasible());
  CHECK(cost_str(inf.cost) == "2000000000000000012");
  CHECK_THROWS_WITH(evaluate(p, {0, 2, 0}), Catch::Contains("node 1") && Catch::Contains("strategy 2"));
  CHECK_THROWS_WITH(evaluate(p, {0, 0}), Catch::Contains("2 strategies") && Catch::Contains("3 nodes"));
}

TEST_CASE("autoshard: the reader reads the gzipped contest instances", "[autoshard]") {
  const Problem b = read_iopddl(bench_dir() + "/asplos-2025-iopddl-B.json.gz");
  CHECK(b.nodes.size() == 816);
  CHECK(b.edges.size() == 1096);
  REQUIRE(b.usage_limit);
  Plan least(b.nodes.size(), 0);
  for (std::size_t i = 0; i < least.size(); ++i)
    for (int32_t s = 1; s < b.nodes[i].num_strategies(); ++s)
      if (b.nodes[i].usage[s] < b.nodes[i].usage[least[i]]) least[i] = s;
  CHECK(evaluate(b, least).within_memory);
}

TEST_CASE("autoshard: bad IOPDDL input gets an error naming the file and the item", "[autoshard]") {
  CHECK_THROWS_WITH(read_iopddl("/nonexistent/p.json"), Catch::Contains("/nonexistent/p.json") && Catch::Contains("no such file"));
  CHECK_THROWS_WITH(parse_iopddl("{\"problem\": {\"nodes\": ", "t.json"),
                    Catch::Contains("t.json") && Catch::Contains("invalid JSON"));
  CHECK_THROWS_WITH(parse_iopddl(replaced("[[0, 1], [0, 2]", "[[0, 1], [0, 7]"), "t.json"),
                    Catch::Contains("t.json") && Catch::Contains("edge 1") && Catch::Contains("[0, 7]") &&
                        Catch::Contains("5 nodes"));
  CHECK_THROWS_WITH(parse_iopddl(replaced("[50, 10, 40]", "[50, 10]"), "t.json"),
                    Catch::Contains("edge 1") && Catch::Contains("has 2 costs, expected 1 x 3 = 3"));
  CHECK_THROWS_WITH(parse_iopddl(replaced("[[10], [25, 25]", "[[10], [25]"), "t.json"),
                    Catch::Contains("node 1") && Catch::Contains("2 costs but 1 usages"));
  CHECK_THROWS_WITH(parse_iopddl(replaced("[30, 70]", "[30, 70, 80]"), "t.json"),
                    Catch::Contains("nodes.intervals[0]") && Catch::Contains("more than 2"));
  CHECK_THROWS_WITH(parse_iopddl(replaced("[15], [55, 65]", "[15], [55, 6.5]"), "t.json"),
                    Catch::Contains("nodes.costs[1]") && Catch::Contains("expected an integer"));
  CHECK_THROWS_WITH(parse_iopddl(replaced("[[15],", "[[],"), "t.json"), Catch::Contains("node 0 has no strategies"));
  CHECK_THROWS_WITH(parse_iopddl("{\"other\": 1}", "t.json"), Catch::Contains("no \"problem\" object"));
  // Unknown fields are skipped; usage_limit is optional.
  const Problem p = parse_iopddl(replaced("\"usage_limit\": 50", "\"extra\": {\"x\": [1, [2]]}"), "t.json");
  CHECK_FALSE(p.usage_limit);
  // A gzip file cut short: zlib's complaint, with the file name.
  const std::string cut = std::string(TESSEL_BINARY_DIR) + "/autoshard_truncated.json.gz";
  {
    std::ifstream in(bench_dir() + "/asplos-2025-iopddl-B.json.gz", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(cut, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  CHECK_THROWS_WITH(read_iopddl(cut), Catch::Contains(cut));
  std::remove(cut.c_str());
}

TEST_CASE("autoshard: a problem written in the contest's form reads back equal with and without a usage limit",
          "[autoshard]") {
  Problem p = parse_iopddl(kExample, "inline");
  p.name = "a \"quoted\" name\\ with\ta tab";
  auto same = [](const Problem& a, const Problem& b) {
    REQUIRE(a.nodes.size() == b.nodes.size());
    REQUIRE(a.edges.size() == b.edges.size());
    CHECK(a.name == b.name);
    CHECK(a.usage_limit == b.usage_limit);
    for (std::size_t i = 0; i < a.nodes.size(); ++i) {
      CHECK(a.nodes[i].live.start == b.nodes[i].live.start);
      CHECK(a.nodes[i].live.end == b.nodes[i].live.end);
      CHECK(a.nodes[i].cost == b.nodes[i].cost);
      CHECK(a.nodes[i].usage == b.nodes[i].usage);
    }
    for (std::size_t k = 0; k < a.edges.size(); ++k) {
      CHECK(a.edges[k].a == b.edges[k].a);
      CHECK(a.edges[k].b == b.edges[k].b);
      CHECK(a.edges[k].cost == b.edges[k].cost);
    }
  };
  same(parse_iopddl(format_iopddl(p), "formatted"), p);
  p.usage_limit.reset();
  p.nodes[2].cost[1] = kInfiniteCost;  // the sentinel survives
  p.edges.push_back(p.edges[0]);       // a parallel edge stays one of two
  const std::string path = std::string(TESSEL_BINARY_DIR) + "/written_problem.json";
  write_iopddl(p, path);
  same(read_iopddl(path), p);
  std::remove(path.c_str());
  CHECK_THROWS_WITH(write_iopddl(p, std::string(TESSEL_BINARY_DIR) + "/no/such/dir/p.json"),
                    Catch::Contains("cannot write the problem to"));
}
