// tessel/compiler/propagate.hpp — sharding propagation: from a few annotations to a sharding for
// every value, through every op's factor rule (ops.hpp), to a fixed point.
//
// Policy (deterministic, documented in docs/propagation.md):
//  * Annotated values (Graph::annotations, sharding_constraint results) start with their
//    sharding; their closed dims never change.
//  * Priorities: round p (ascending over the priorities present) propagates only from
//    values whose sharding derives from annotations of priority <= p. A stronger (lower)
//    priority therefore claims values first, and a weaker annotation cannot take them back.
//  * Per op, each tensor's dim shardings are projected onto the rule's factors. Per factor,
//    compatible candidates (one a prefix of the other) merge to the longest; conflicting
//    candidates are resolved in favour of the stronger priority the candidate's layout
//    derives from, then of the *larger* tensor (bytes; ties: lower value id), which keeps the
//    larger tensor stationary and reshards the smaller one. An axis claimed by two factors
//    goes to the factor whose wish for that axis (the tensor that added it) wins by the same
//    order. Replicated factors get
//    no axes. The merge is the one factor policy (compiler/factor_choice.hpp), taken
//    strongest first, so its result does not depend on the order of the op's tensors. The merged factor shardings are written back to open dims when they extend
//    the dim's current axes.
//  * Forward pass over ops, then backward pass, repeated until nothing changes; every change
//    appends at least one axis to a dim, so it terminates within (values x axes) changes.
#pragma once

#include <string>
#include <vector>

#include "tessel/ir/graph.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"

namespace tessel {

// Why a dim of a value has its axes.
struct DimProvenance {
  int op = -1;          // op that wrote it (-1: the value's own annotation, or never set)
  int from_value = -1;  // tensor of that op the factor sharding came from
  int origin = -1;      // annotated value the sharding derives from (-1: none)
  int round = -1;       // priority round in which it was set
};

struct PropagationOptions {
  int max_passes = 1000;  // safety bound; exceeding it throws PartitionError
};

struct PropagationResult {
  std::vector<Sharding> shardings;               // per value
  std::vector<std::vector<DimProvenance>> why;   // per value, per dim
  std::vector<int> source_priority;              // per value (INT_MAX: no source)
  std::vector<std::string> decisions;            // conflicts resolved, in order
  int passes = 0;
  // Multi-line explanation of why `value` has its sharding, following the chain back to
  // the annotations it came from.
  std::string explain(const Graph& g, int value) const;
};

// Validates every annotation against the mesh (ShardingError naming the value) and runs
// propagation. The mesh is `mesh` (the graph's own mesh is ignored here).
PropagationResult propagate(const Graph& g, const Mesh& mesh, const PropagationOptions& opts = {});

// Projection of one tensor's sharding onto an op rule's factors: per factor the axes it is
// split over. Axes that cannot be expressed on the factors (a dim without factors, or axes
// that do not divide a compound dim's major factor) are dropped.
std::vector<std::vector<std::string>> project_onto_factors(const Mesh& mesh,
                                                           const std::vector<DimFactors>& dims,
                                                           const std::vector<Factor>& factors,
                                                           const Sharding& s);
// The axes of one tensor dim given factor shardings: concatenation over its factors,
// stopping after a factor that is not fully split (a minor factor cannot be split then).
std::vector<std::string> compose_dim(const Mesh& mesh, const DimFactors& dim,
                                     const std::vector<Factor>& factors,
                                     const std::vector<std::vector<std::string>>& fs);

}  // namespace tessel
