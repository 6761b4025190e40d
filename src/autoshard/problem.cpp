// The strategy-selection problem: validation and the contest's evaluator (see
// tessel/autoshard/problem.hpp).
#include "tessel/autoshard/problem.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include <fstream>

namespace tessel::autoshard {

void Problem::validate(const std::string& where) const {
  const int64_t n = static_cast<int64_t>(nodes.size());
  for (int64_t i = 0; i < n; ++i) {
    const Node& node = nodes[i];
    if (node.cost.empty())
      throw ProblemError(fmt::format("{}: node {} has no strategies (its cost list is empty); every node "
                                     "needs at least one", where, i));
    if (node.cost.size() != node.usage.size())
      throw ProblemError(fmt::format("{}: node {} has {} costs but {} usages; each strategy needs both",
                                     where, i, node.cost.size(), node.usage.size()));
    if (node.live.start < 0)
      throw ProblemError(fmt::format("{}: node {} has interval [{}, {}): time steps start at 0", where, i,
                                     node.live.start, node.live.end));
  }
  for (std::size_t k = 0; k < edges.size(); ++k) {
    const Edge& e = edges[k];
    if (e.a < 0 || e.a >= n || e.b < 0 || e.b >= n)
      throw ProblemError(fmt::format("{}: edge {} joins nodes [{}, {}] but the problem has {} nodes (0..{})",
                                     where, k, e.a, e.b, n, n - 1));
    if (e.a == e.b)
      throw ProblemError(fmt::format("{}: edge {} joins node {} to itself; a self edge is a node cost", where,
                                     k, e.a));
    const std::size_t want = nodes[e.a].cost.size() * nodes[e.b].cost.size();
    if (e.cost.size() != want)
      throw ProblemError(fmt::format("{}: edge {} [{}, {}] has {} costs, expected {} x {} = {} (row-major "
                                     "over the strategies of node {} then node {})",
                                     where, k, e.a, e.b, e.cost.size(), nodes[e.a].cost.size(),
                                     nodes[e.b].cost.size(), want, e.a, e.b));
  }
  if (usage_limit && *usage_limit < 0)
    throw ProblemError(fmt::format("{}: usage_limit is {}; it must be >= 0", where, *usage_limit));
}

Evaluation evaluate(const Problem& problem, const Plan& plan) {
  if (plan.size() != problem.nodes.size())
    throw ProblemError(fmt::format("plan has {} strategies but problem '{}' has {} nodes", plan.size(),
                                   problem.name, problem.nodes.size()));
  Evaluation ev;
  // Usage changes at interval boundaries only, so the total is constant between two
  // consecutive boundaries: a sweep over (time, delta) events gives the value at every
  // integer time step without a per-step array (the largest instances span ~10^5 steps).
  std::vector<std::pair<int64_t, int64_t>> events;
  events.reserve(2 * plan.size());
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Node& node = problem.nodes[i];
    const int32_t s = plan[i];
    if (s < 0 || s >= node.num_strategies())
      throw ProblemError(fmt::format("plan gives node {} strategy {} but it has {} (0..{})", i, s,
                                     node.num_strategies(), node.num_strategies() - 1));
    ev.cost += node.cost[s];
    if (node.cost[s] >= kInfiniteCost) ev.uses_infinite = true;
    if (!node.live.empty()) {
      events.emplace_back(node.live.start, node.usage[s]);
      events.emplace_back(node.live.end, -node.usage[s]);
    }
  }
  for (const Edge& e : problem.edges) {
    const int64_t c = e.cost[static_cast<std::size_t>(plan[e.a]) * problem.nodes[e.b].cost.size() + plan[e.b]];
    ev.cost += c;
    if (c >= kInfiniteCost) ev.uses_infinite = true;
  }
  std::sort(events.begin(), events.end());
  __int128 total = 0, peak = 0;
  bool first = true;
  for (std::size_t k = 0; k < events.size();) {
    const int64_t t = events[k].first;
    for (; k < events.size() && events[k].first == t; ++k) total += events[k].second;
    // The total now holds on [t, next boundary): a non-empty span of integer steps.
    if (k < events.size() && (first || total > peak)) {
      peak = total;
      ev.peak_time = t;
      first = false;
    }
  }
  if (problem.usage_limit) ev.within_memory = peak <= *problem.usage_limit;
  // Saturated for the report only; the verdict above used the exact sum.
  const __int128 max64 = std::numeric_limits<int64_t>::max();
  ev.peak_usage = static_cast<int64_t>(std::min(std::max(peak, -max64), max64));
  return ev;
}

std::string format_plan(const Plan& plan) {
  std::string out = "[";
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(plan[i]);
  }
  return out + "]";
}

std::string format_iopddl(const Problem& problem) {
  std::string out;
  auto list = [&](const std::vector<int64_t>& v) {
    out += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(v[i]);
    }
    out += ']';
  };
  std::string name;  // a JSON string: quotes, backslashes and control characters escaped
  for (char ch : problem.name) {
    if (ch == '"' || ch == '\\') {
      name += '\\';
      name += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      name += fmt::format("\\u{:04x}", static_cast<int>(ch));
    } else {
      name += ch;
    }
  }
  out += "{\"problem\": {\"name\": \"" + name + "\",\n\"nodes\": {\"intervals\": [";
  for (std::size_t i = 0; i < problem.nodes.size(); ++i) {
    if (i) out += ',';
    list({problem.nodes[i].live.start, problem.nodes[i].live.end});
  }
  out += "],\n\"costs\": [";
  for (std::size_t i = 0; i < problem.nodes.size(); ++i) {
    if (i) out += ',';
    list(problem.nodes[i].cost);
  }
  out += "],\n\"usages\": [";
  for (std::size_t i = 0; i < problem.nodes.size(); ++i) {
    if (i) out += ',';
    list(problem.nodes[i].usage);
  }
  out += "]},\n\"edges\": {\"nodes\": [";
  for (std::size_t k = 0; k < problem.edges.size(); ++k) {
    if (k) out += ',';
    list({problem.edges[k].a, problem.edges[k].b});
  }
  out += "],\n\"costs\": [";
  for (std::size_t k = 0; k < problem.edges.size(); ++k) {
    if (k) out += ',';
    list(problem.edges[k].cost);
  }
  out += "]}";
  if (problem.usage_limit) out += ",\n\"usage_limit\": " + std::to_string(*problem.usage_limit);
  out += "}}\n";
  return out;
}

void write_iopddl(const Problem& problem, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  f << format_iopddl(problem);
  if (!f.flush()) throw ProblemError(fmt::format("cannot write the problem to '{}'", path));
}

std::string cost_str(TotalCost cost) {
  if (cost == 0) return "0";
  const bool negative = cost < 0;
  unsigned __int128 v = negative ? -static_cast<unsigned __int128>(cost) : static_cast<unsigned __int128>(cost);
  std::string digits;
  while (v > 0) {
    digits.push_back(static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  if (negative) digits.push_back('-');
  return std::string(digits.rbegin(), digits.rend());
}

}  // namespace tessel::autoshard
