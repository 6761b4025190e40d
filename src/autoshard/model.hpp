// The solvers' view of a Problem (internal to src/autoshard/): edges between the same pair of
// nodes merged into one matrix (the contest adds them), adjacency lists, and time compressed
// into segments (the usage is constant between two consecutive interval boundaries, so one
// memory check per segment is one check per integer time step).
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/autoshard/problem.hpp"

namespace tessel::autoshard::detail {

// All edges joining nodes a and b, summed (saturating at kInfiniteCost); cost is
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
};

Model build_model(const Problem& problem);

// The plan of least usage per node (ties: least node cost). It minimises the usage at every time
// step at once, so it fits the limit exactly when some plan does.
Plan least_memory_plan(const Problem& problem);

// a + b, saturating at kInfiniteCost (sums of "infinite" entries stay infinite).
inline int64_t add_saturating(int64_t a, int64_t b) {
  if (a >= kInfiniteCost || b >= kInfiniteCost) return kInfiniteCost;
  const __int128 s = static_cast<__int128>(a) + b;
  return s >= kInfiniteCost ? kInfiniteCost : static_cast<int64_t>(s);
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
  std::vector<int64_t> cost;     // [num_strategies], saturating at kInfiniteCost
};

struct Coarse {
  std::vector<Group> groups;
  std::vector<int32_t> group_of;           // per original node
  std::vector<PairEdge> pairs;             // between groups (a < b), [S(a), S(b)]
  std::vector<std::vector<Neighbor>> adj;  // per group
};

Coarse build_coarse(const Problem& problem, const Model& model);

}  // namespace tessel::autoshard::detail
