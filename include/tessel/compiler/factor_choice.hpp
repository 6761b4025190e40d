// tessel/compiler/factor_choice.hpp — the one policy for an op's factor sharding: which mesh
// axes each factor of the op's rule (ops/registry.hpp, OpRule) is split over. Propagation, the
// partitioner and automatic sharding all go through it (docs/propagation.md, "One factor
// policy"):
//
//  * factor_may_split: which factors may take axes at all (Pass and Reduction; Combined only
//    when the op has a distributed form and one result; Replicated never).
//  * factor_axes_problem: whether a factor sharding is one the op can compute (axes known and
//    each used once, sizes divisible, every operand and result dim made of exactly its
//    factors' axes, a minor factor split only under a whole major one).
//  * choose_factor_axes: from the tensors' wishes (their layouts projected onto the factors),
//    the factor sharding, strongest wish first (stronger priority, then the larger tensor,
//    then the lower value id): a wish extends a factor whose axes are a prefix of its own,
//    a conflicting weaker wish is dropped, and an axis wanted by two factors goes to the one
//    whose wish for that axis (the wish that added it) is stronger; the other keeps the axes
//    before it. The result does not depend on the order of the wishes.
//  * make_realizable: the minor factors of a dim dropped until the major ones are whole.
//
// Where the three users differ, and why (each tested in tests/unit/test_factor_choice.cpp):
//  * propagation takes every tensor's wish as Extend and only writes dims back where the
//    chosen axes extend them; it chooses layouts of values, not how the op computes;
//  * the partitioner builds two candidates, the result's layout first (its wishes Exact: the
//    op computes where the value is wanted) and the operands' first (the results FillEmpty),
//    made realizable, and prices them on this op's collectives alone;
//  * automatic sharding enumerates every factor sharding that factor_axes_problem accepts
//    (pruned by which dims may share an axis) and prices them over the whole program.
#pragma once

#include <climits>
#include <functional>
#include <string>
#include <vector>

#include "tessel/core/mesh.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel {

// Per factor of an OpRule: the mesh axes it is split over, major to minor.
using FactorAxes = std::vector<std::vector<std::string>>;

// Whether factor f of op's rule may be split over mesh axes.
bool factor_may_split(const Op& op, const OpRule& rule, int f);

// Why `fs` is not a factor sharding `op` can compute on `mesh`; empty when it is. Factors that
// may not split (factor_may_split) must have no axes.
std::string factor_axes_problem(const Mesh& mesh, const Op& op, const OpRule& rule, const FactorAxes& fs);
// factor_axes_problem(...).empty(), without writing the text.
bool factor_axes_valid(const Mesh& mesh, const Op& op, const OpRule& rule, const FactorAxes& fs);

// A tensor's wish for an op's factors: its layout projected onto them (project_onto_factors).
struct FactorWish {
  enum class Reach {
    Extend,     // sets a free factor, or extends one whose axes are a prefix of its own
    Exact,      // like Extend, and no other wish may extend the factors it set
    FillEmpty,  // only sets factors no other wish set
  };
  int value = -1;              // the tensor (graph value id; ties between equal wishes)
  int priority = INT_MAX;      // priority its layout derives from (lower is stronger)
  double bytes = 0;            // the tensor's bytes (the larger tensor stays put)
  Reach reach = Reach::Extend;
  FactorAxes axes;             // per factor (empty: no wish for it)
};

// Which of two wishes wins a conflict: Exact before the rest, FillEmpty after the rest; then
// the stronger (lower) priority, the larger tensor, the lower value id.
bool stronger_wish(const FactorWish& a, const FactorWish& b);

// A dropped wish, for decision lines (propagation's --why): per factor, `loser`'s axes lost to
// `winner`'s (indices into the wishes). With `axis` set, the factor `factor` lost that axis
// (added by `loser`) to factor `holder`, where `winner` added it.
struct FactorConflict {
  int factor = -1;
  int winner = -1;
  int loser = -1;
  std::string axis;
  int holder = -1;
};

struct FactorChoice {
  FactorAxes axes;                    // per factor
  std::vector<std::vector<int>> by;   // per factor, per axis: the wish that added it
  std::vector<int> source;            // per factor: the wish that added its last axis (-1: none)
  std::vector<int> rank;              // per factor: the wish that added its first axis (-1: none)
};

// The factor sharding from the wishes (see the header comment). Replicated factors and
// factors that may not split are left empty when `op` is given.
FactorChoice choose_factor_axes(const OpRule& rule, const std::vector<FactorWish>& wishes,
                                const std::function<void(const FactorConflict&)>& on_conflict = {},
                                const Op* op = nullptr);

// The minor factors of every operand and result dim cleared until each dim's major factors are
// split whole (a minor factor cannot be split under a partly split major one).
void make_realizable(const Mesh& mesh, const OpRule& rule, FactorAxes& fs);

}  // namespace tessel
