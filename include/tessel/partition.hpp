// tessel/partition.hpp — the SPMD partitioner: per op, choose its factor sharding, reshard
// operands that disagree (reshard.hpp), emit the local op on local shapes. Partial results
// are reduced lazily: a partial value flows through linear ops (OpDef::partial_flow) and is
// reduced where a consumer needs it materialized — reduce-scatter when the consumer wants it
// sharded, all-reduce when it wants it replicated.
#pragma once

#include "tessel/cost.hpp"
#include "tessel/graph.hpp"
#include "tessel/mesh.hpp"
#include "tessel/program.hpp"
#include "tessel/propagate.hpp"

namespace tessel {

struct PartitionOptions {
  CostModel cost;
};

Program partition(const Graph& g, const Mesh& mesh, const PropagationResult& prop,
                  const PartitionOptions& opts = {});

}  // namespace tessel
