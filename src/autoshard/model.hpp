// The solvers' view of a Problem (internal to src/autoshard/): edges between the same pair of
// nodes merged into one matrix (the contest adds them), adjacency lists, and time compressed
// into segments (the usage is constant between two consecutive interval boundaries, so one
// memory check per segment is one check per integer time step).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "tessel/autoshard/problem.hpp"
#include "tessel/autoshard/solver.hpp"

namespace tessel::autoshard::detail {

// All edges joining nodes a and b, summed (add_cost); cost is
// [S(a), S(b)] row-major, with a < b.
struct PairEdge {
  int32_t a = 0;
  int32_t b = 0;
  std::vector<int64_t> cost;
};

struct Neighbor {
  int32_t node;
  int32_t pair;  // index into Model::pairs
};

struct Model {
  std::vector<PairEdge> pairs;
  std::vector<std::vector<Neighbor>> adj;  // per node, distinct neighbours
  std::vector<int64_t> boundaries;         // sorted distinct interval boundaries
  int32_t num_segments = 0;                // [boundaries[k], boundaries[k+1]) for k < num_segments
  std::vector<int32_t> seg_lo, seg_hi;     // node i is live on segments [seg_lo[i], seg_hi[i])
  bool clamped = false;                    // some merged edge's finite sum was clamped (add_cost)
};

Model build_model(const Problem& problem);

// The plan of least usage per node (ties: least node cost). It minimises the usage at every time
// step at once, so it fits the limit exactly when some plan does.
Plan least_memory_plan(const Problem& problem);

// a + b: kInfiniteCost when either is "infinite"; a sum of finite costs stays finite, clamped
// at kInfiniteCost - 1 (setting `clamped`: the sum is then not exact, and a solver that proves
// optimality over such costs must not say so). Summing finite costs into "infinite" forbade
// finite strategies and called a worse plan optimal (issue 37 D12).
inline int64_t add_cost(int64_t a, int64_t b, bool& clamped) {
  if (a >= kInfiniteCost || b >= kInfiniteCost) return kInfiniteCost;
  const __int128 s = static_cast<__int128>(a) + b;
  if (s >= kInfiniteCost) {
    clamped = true;
    return kInfiniteCost - 1;
  }
  return static_cast<int64_t>(s);
}

}  // namespace tessel::autoshard::detail

namespace tessel::autoshard::detail {

// The anytime solver's coarsened problem. An edge (a, b) is *functional* when every strategy
// of a leaves at most one strategy of b at a finite cost (XLA's "follow" edges: b's layout is
// a function of a's): in any plan without an infinite cost, b's strategy is fixed by a's. Such
// nodes are merged into groups (a forest of functional edges, each member following its
// parent), whose strategies are the root's; the group's cost per strategy holds the members'
// costs and the edges inside it. Groups of one strategy are folded into their neighbours'
// costs. Merging removes the cycles of "follow" edges that no move changing a tree at a time
// could leave.
struct Group {
  std::vector<int32_t> members;  // original nodes; members[0] is the root
  int32_t num_strategies = 0;    // the root's
  std::vector<int32_t> assign;   // [num_strategies][members]: each member's strategy
  std::vector<int64_t> cost;     // [num_strategies], summed with add_cost
};

struct Coarse {
  std::vector<Group> groups;
  std::vector<int32_t> group_of;           // per original node
  std::vector<PairEdge> pairs;             // between groups (a < b), [S(a), S(b)]
  std::vector<std::vector<Neighbor>> adj;  // per group
  bool clamped = false;                    // some cost here is a clamped finite sum (add_cost)
};

Coarse build_coarse(const Problem& problem, const Model& model);

// Each group's cost per strategy in double, the infinite sentinel capped at 10^18 (what message
// passing sums), and a plan over the groups as a plan over the original nodes.
std::vector<std::vector<double>> group_costs(const Coarse& coarse);
Plan expand_groups(const Problem& problem, const Coarse& coarse, const Plan& group_plan);

// Removes dominated group strategies (dominance.cpp): strategy s of a group goes when another
// strategy s' of the same group costs no more, uses no more memory in any member (with a usage
// limit), and costs no more in every row of every pair matrix the group is in (exact ties:
// the lower index stays). Any plan choosing s is then matched by one choosing s', no worse in
// cost or in usage at any time, so an optimal plan survives. Repeated until nothing changes
// (removing a strategy shrinks the neighbours' matrices, which can make more dominated).
// Returns, per group, each original strategy's index after pruning (a removed one: its
// dominator's), for mapping plans onto the pruned problem; coarse.adj stays valid.
std::vector<std::vector<int32_t>> prune_dominated(const Problem& problem, Coarse& coarse);

// The anytime method's block moves (solver_anytime.cpp) from `group_plan` (a strategy per group
// of `coarse`, which build_coarse made from `problem`; it may exceed the limit: the moves then
// repair it first), for options.time_limit_s or options.max_iterations.
SolveResult search_from(const Problem& problem, const SolveOptions& options, const Model& model, const Coarse& coarse,
                        const Plan& group_plan);

}  // namespace tessel::autoshard::detail

namespace tessel::autoshard::detail {

// Min-sum message passing over the coarse graph: sequential tree-reweighted message passing
// (TRW-S, Kolmogorov 2006) on the pairwise problem "group unary cost + pair matrices". Each
// pass visits the groups in order and then in reverse, sends messages along the edges to
// later (earlier) groups, and decodes a plan on the way forward: each group takes its best
// strategy given the strategies already chosen for earlier neighbours and the messages from
// later ones. Exact on a forest (the messages are then the dynamic program's tables); on
// graphs with cycles a heuristic whose plans are usually far better than a local search's
// (IOPDDL P, unconstrained: see docs/auto-sharding.md). Messages persist between calls, so a
// change of the unary costs (memory prices) warm-starts from the last messages.
class MinSum {
 public:
  explicit MinSum(const Coarse& c);
  // Runs `passes` forward+backward passes with the given unary costs ([group][strategy]) and
  // returns the cheapest plan decoded (by the true cost: unary + pairs, in double).
  Plan run(const std::vector<std::vector<double>>& unary, int passes);
  // Drops the messages (the next run starts cold).
  void reset();
  // The plan's cost by the true unary costs given to the last run (capped infinities summed).
  double cost_of(const std::vector<std::vector<double>>& unary, const Plan& x) const { return decode_cost(unary, x); }
  // A lower bound on min over plans of (unary + pairs), from the current messages: they
  // reparametrise the problem (each message added to its group's unary costs and taken from
  // its pair's matrix leaves every plan's cost as it was), and the sum of each reparametrised
  // term's least value is at most any plan's cost. The dual of the LP relaxation that
  // message passing climbs; equal to the optimum where the relaxation is tight.
  long double lower_bound(const std::vector<std::vector<double>>& unary) const;
  // A tighter bound by min-sum diffusion (Kovalevsky and Koval; Werner 2007): a reparametrisation
  // of its own, started from zero, repeatedly moved so that at each group every pair's least
  // row entry and the group's own cost agree (block-coordinate ascent of the LP dual: the bound
  // never falls). Up to `sweeps` sweeps over the groups, until a sweep gains less than
  // `tolerance` or `stop_at` is reached (a plan's cost: nothing above it is needed) or
  // out_of_time() holds. Returns the best bound; `decoded` (when given) gets each group's least
  // strategy under the final reparametrisation (a plan near the relaxation's optimum).
  long double diffusion_bound(const std::vector<std::vector<double>>& unary, int sweeps, long double tolerance,
                              long double stop_at, const std::function<bool()>& out_of_time,
                              Plan* decoded = nullptr) const;

 private:
  double decode_cost(const std::vector<std::vector<double>>& unary, const Plan& x) const;
  const Coarse& c_;
  std::vector<std::vector<double>> msg_;  // per pair: [0] a->b over S(b), [1] b->a over S(a)
  std::vector<double> gamma_;
};

}  // namespace tessel::autoshard::detail

namespace tessel::autoshard::detail {

// Lagrangian relaxation of the usage limit solved by min-sum message passing (IOPDDL's
// winners turned memory into penalties the same way and solved the rest with a complete
// weighted-constraint solver). Each time segment t has a price lambda_t >= 0; a group
// strategy's unary cost is its cost plus the usage of each member times the sum of the prices
// of the segments where the member is live. One iteration runs `passes` TRW-S passes (warm),
// decodes a plan, and moves every price by a subgradient step:
//   lambda_t <- max(0, lambda_t + beta * price_base * (usage_t - limit) / limit).
// The step size that works differs by instance (IOPDDL K wants beta ~0.1, Q ~0.5), so each beta
// of `betas` gets `iterations` iterations from zero prices and cold messages. Before them,
// under a limit, `iterations` penalty rounds: the unary costs raised by per-node weights on the
// usage above each node's least, searched by bisection (PenaltyWeights); on IOPDDL R they found
// plans fitting the limit at 0.99x the best known where the prices per segment ended at 1.13x.
// Every decoded plan that fits the limit and has no infinite cost is a candidate; the cheapest
// is kept.
// Deterministic (no random choices); `out_of_time` is polled once per iteration.
struct LagrangianResult {
  Plan best;                  // group plan; empty when no decoded plan fitted
  double best_cost = 0;       // its cost (double)
  // Without a usage limit, the best lower bound on the coarse problem's optimum
  // (MinSum::lower_bound after each iteration; solve_anytime tightens it by diffusion_bound);
  // -inf: none (a usage limit: see lagrangian_bound; or a clamped cost in the coarse problem).
  long double lower_bound = -std::numeric_limits<long double>::infinity();
  int64_t iterations = 0;     // iterations run
  int64_t found_at = -1;      // iteration that found best
  // The best plan of each kind of round (empty: none fitted): the search polishes both when
  // they differ (the cheaper start is not always the better one to polish: IOPDDL K).
  Plan penalty_best, price_best;
  double penalty_best_cost = std::numeric_limits<double>::infinity();
  double price_best_cost = std::numeric_limits<double>::infinity();
  // Under a limit, the prices per segment each step size ended at (the last one's possibly cut
  // short by the time): where lagrangian_bound looks for the dual's value.
  std::vector<std::vector<double>> final_prices;
};
LagrangianResult lagrangian_min_sum(const Problem& problem, const Model& model, const Coarse& coarse,
                                    const std::vector<double>& betas, int iterations, int passes, double price_base,
                                    const std::function<bool()>& out_of_time,
                                    const std::function<void(double cost, int64_t iteration)>& on_improvement);

// The Lagrangian dual's value at scale x `prices` (one per time segment, each >= 0): the least cost of
// the priced problem (each group strategy's cost plus, per member, its usage times the sum of
// the prices over its live segments), bounded from below by min-sum diffusion from zero for up
// to `sweeps` sweeps (fewer once 4 gain under 1e-7 of the costs) or until out_of_time(), less
// limit x (sum of the prices), less a margin for
// rounding. A lower bound on the coarse problem's optimum within the usage limit whatever the
// prices (weak duality), on the coarse costs (a plan's own cost differs by a constant). -inf
// without a limit or over clamped costs. (The messages' own bound after two passes a price,
// MinSum::lower_bound, is useless here: -2.6e9 on IOPDDL B, whose optimum is 5.3e5.)
long double lagrangian_bound(const Problem& problem, const Model& model, const Coarse& coarse,
                             const std::vector<double>& prices, double scale, int sweeps,
                             const std::function<bool()>& out_of_time, Plan* decoded = nullptr);

// A group plan's usage per time segment (model.num_segments entries).
std::vector<double> segment_usage(const Problem& problem, const Model& model, const Coarse& coarse,
                                  const Plan& group_plan);

}  // namespace tessel::autoshard::detail

namespace tessel::autoshard::detail {

// Per-node penalty weights for the usage limit (penalties.cpp), searched per node by bisection:
// IOPDDL's first-place entry turned the limit into such penalties and solved the priced problem
// again and again. Strategy s of node v costs w_v * (usage_v(s) - least usage of v) on top of
// its cost. A node live only where even the largest usages of everything live fit the limit is
// never at risk and keeps w_v = 0; the others start at `base` (a typical cost per unit of
// usage). After each solve, update() takes the plan's usage per segment: a node live on a
// segment over the limit had too little weight (its lower bracket rises to it), any other had
// enough (its upper bracket falls to it); the next weight is the middle of the bracket, or
// twice the last while there is no upper bracket. A bracket that closed on a weight still too
// low opens again upwards. Unlike the Lagrangian prices, the weights bound nothing: they steer
// the priced solves towards plans that fit (IOPDDL V: the optimum, where the prices per
// segment left plans 1.17x it; docs/auto-sharding.md, "Penalty rounds").
class PenaltyWeights {
 public:
  PenaltyWeights(const Problem& problem, const Model& model, double base);
  double weight(int32_t v) const { return weight_[static_cast<std::size_t>(v)]; }
  int64_t least(int32_t v) const { return least_[static_cast<std::size_t>(v)]; }  // least finite usage
  // What strategy s of node v pays: weight x usage above the node's least.
  double penalty(const Problem& problem, int32_t v, int32_t s) const {
    const double w = weight_[static_cast<std::size_t>(v)];
    return w == 0 ? 0.0
                  : w * static_cast<double>(problem.nodes[static_cast<std::size_t>(v)].usage[static_cast<std::size_t>(s)] -
                                            least_[static_cast<std::size_t>(v)]);
  }
  // segment_usage[t]: the solved plan's usage on segment t (num_segments entries).
  void update(const std::vector<double>& segment_usage, double limit);
  int64_t at_risk() const { return at_risk_count_; }  // nodes with a weight

 private:
  const Model& model_;
  std::vector<double> weight_, lo_, hi_;  // hi_ < 0: no upper bracket yet
  std::vector<int64_t> least_;
  std::vector<char> at_risk_;
  int64_t at_risk_count_ = 0;
  double base_ = 1.0;
};

// A typical cost per unit of usage: the median over nodes of (cost spread / usage spread) among
// finite-cost strategies; 1 when no node trades one for the other (the scale of the Lagrangian
// prices and of the penalty weights).
double median_price_ratio(const Problem& problem);

}  // namespace tessel::autoshard::detail
