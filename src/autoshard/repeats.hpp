// Repeated structure in a strategy-selection problem (problem.hpp): the nodes of a model's
// repeated layers (a transformer's blocks, forward and backward) look alike, and one decision
// per kind of node, shared by every repeat, is how Alpa and autoparallel keep large graphs
// tractable. Used by auto_shard (auto_shard.cpp) beside the search over the whole problem.
//
// repeat_classes colours the nodes by refinement (Weisfeiler-Lehman): a node's first colour is
// given (e.g. its op kind, shapes and cost vector); each round a node's colour becomes a hash of
// its colour and the sorted list of (direction, neighbour's colour, the edge matrix's hash) over
// its edges. Nodes of the same colour after the rounds are a class: same strategies, same costs,
// same neighbourhood up to `rounds` edges away. Layers in the middle of a stack fall into the
// same classes; the first and last layers, whose neighbourhoods differ, get their own.
//
// tied_problem is the problem where every class takes one strategy: a node per class (its
// members' costs summed, plus the diagonal of edges inside the class), the edges between
// classes summed per pair; without memory (every span empty). expand turns its plan back into
// a plan of the whole problem.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/autoshard/problem.hpp"

namespace tessel::autoshard {

struct RepeatClasses {
  std::vector<int32_t> class_of;  // per node
  int32_t count = 0;
};

// `colors`: the first colour of each node (nodes of different strategy counts must differ).
RepeatClasses repeat_classes(const Problem& p, std::vector<uint64_t> colors, int rounds);
Problem tied_problem(const Problem& p, const RepeatClasses& c);
Plan expand(const RepeatClasses& c, const Plan& tied_plan);

}  // namespace tessel::autoshard
