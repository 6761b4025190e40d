// tessel/autoshard/problem.hpp — the strategy-selection problem behind automatic sharding.
//
// Alpa's intra-operator search, XLA's auto-sharding pass and the IOPDDL contest (ASPLOS/EuroSys
// 2025) all reduce "which layout for every op" to the same problem: every node (an op or value)
// has a few strategies, each with a cost (compute, the op's own collectives) and a memory usage;
// every edge between two nodes has a cost matrix (the reshard between the two chosen layouts);
// every node is live over a half-open span of time steps; at every integer time step the
// usages of the live nodes must sum to at most the usage limit. Choose one strategy per node so
// that the total cost is minimal. The solvers (solver.hpp) take this problem; tessel's own
// graphs and the IOPDDL benchmark files are two ways of filling it.
//
// Contest rules, followed exactly by evaluate(): the total is summed in 128-bit integers; a cost
// of 10^18 is an "infinite" sentinel (legal, but a plan using one is a failure); several edges
// between the same pair of nodes add; an empty or reversed span uses no memory but still costs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/common.hpp"

namespace tessel::autoshard {

// A total cost: node and edge costs summed without overflow (the contest's TotalCost).
using TotalCost = __int128;

// The contest's "infinite" cost: choosing a strategy or an edge entry of this cost is legal but
// the plan counts as failed.
inline constexpr int64_t kInfiniteCost = 1'000'000'000'000'000'000;

// The half-open span [start, end) of time steps where a node is live.
struct Interval {
  int64_t start = 0;
  int64_t end = 0;
  bool empty() const { return end <= start; }
};

struct Node {
  Interval live;
  std::vector<int64_t> cost;   // [S]: cost of each strategy
  std::vector<int64_t> usage;  // [S]: memory of each strategy while live
  int32_t num_strategies() const { return static_cast<int32_t>(cost.size()); }
};

// An edge from node a to node b; cost is the |S(a)| x |S(b)| matrix, row-major:
// cost[s_a * |S(b)| + s_b].
struct Edge {
  int32_t a = 0;
  int32_t b = 0;
  std::vector<int64_t> cost;
};

struct Problem {
  std::string name;
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  std::optional<int64_t> usage_limit;  // absent: no memory constraint

  // Throws ProblemError naming `where` (a file name, or "problem") and the first bad item: a
  // node without strategies, cost and usage lists of different lengths, a negative start
  // time, an edge naming a missing node or a self loop, a cost matrix of the wrong size.
  void validate(const std::string& where) const;
};

// A malformed problem (bad file, bad JSON, inconsistent sizes): the message names the file and
// the item (node i, edge k) and what was expected.
class ProblemError : public Error {
 public:
  using Error::Error;
};

// One strategy index per node, in node order: the contest's answer.
using Plan = std::vector<int32_t>;

struct Evaluation {
  TotalCost cost = 0;          // node + edge costs of the plan, 128-bit
  bool uses_infinite = false;  // some chosen node or edge cost is >= kInfiniteCost
  bool within_memory = true;   // usage <= limit at every integer time step (true without a limit)
  int64_t peak_usage = 0;      // the largest total usage over time (0 with no live node)
  int64_t peak_time = 0;       // the first time step where peak_usage is reached
  // The contest's verdict: memory fits and no infinite cost was chosen.
  bool feasible() const { return within_memory && !uses_infinite; }
};

// Evaluates `plan` exactly as the contest's evaluator does. Throws ProblemError when the plan
// has the wrong length or a strategy index out of range (naming the node).
Evaluation evaluate(const Problem& problem, const Plan& plan);

// "[0, 2, 1]": the contest's answer line.
std::string format_plan(const Plan& plan);
// Decimal text of a 128-bit cost.
std::string cost_str(TotalCost cost);

// Reads an IOPDDL contest file (JSON with a "problem" object; gzipped or plain, detected from
// the content) with a streaming parser: memory is the problem's own arrays, never a JSON
// document of the file. Throws ProblemError naming `path` and the item for a missing file, bad
// JSON (with its byte offset), a missing "problem" or "nodes" object, a value of the wrong
// kind, or inconsistent sizes. Unknown fields are skipped; "edges" and "usage_limit" may be
// absent.
Problem read_iopddl(const std::string& path);
// The same from text in memory; `where` names it in errors.
Problem parse_iopddl(std::string_view json, const std::string& where);

// The problem in the contest's JSON form ({"problem": {"name", "nodes": {"intervals", "costs",
// "usages"}, "edges": {"nodes", "costs"}, "usage_limit"}}, usage_limit only when there is one):
// what read_iopddl reads back to an equal problem. Every edge is written as it is (parallel
// edges stay parallel).
std::string format_iopddl(const Problem& problem);
// format_iopddl into `path` (plain JSON). Throws ProblemError naming the path when it cannot be
// written.
void write_iopddl(const Problem& problem, const std::string& path);

}  // namespace tessel::autoshard
