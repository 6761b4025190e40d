// tessel/compiler/reshard.hpp — the reshard planner: any sharding A -> any sharding B of one value
// on a mesh, as a sequence of local slices (free), reduce-scatter, all-reduce, all-to-all,
// all-gather and collective-permute. Several candidate plans are built (greedy with
// all-to-all, greedy gather-then-slice, one permute) and the cheapest by the cost model wins.
// "Slice early, gather late": free slices run first, reductions before gathers.
#pragma once

#include <vector>

#include "tessel/core/cost.hpp"
#include "tessel/ir/program.hpp"
#include "tessel/core/sharding.hpp"

namespace tessel {

struct ReshardStep {
  InstrKind kind = InstrKind::Collective;  // Collective or ShardSlice
  CollectiveKind collective = CollectiveKind::AllGather;
  std::vector<std::string> axes;
  int dim = -1, dim2 = -1;
  std::vector<std::pair<int64_t, int64_t>> pairs;
  Sharding after;      // layout after this step
  int64_t bytes = 0;   // nccl-tests buffer size per device
  double seconds = 0;
};

struct ReshardPlan {
  std::vector<ReshardStep> steps;
  double seconds = 0;
  std::string to_string() const;
};

// Throws PartitionError naming the shardings when B is invalid for the shape. `to` must
// not be partial unless it equals `from`'s partial axes.
ReshardPlan plan_reshard(const Mesh& mesh, const Shape& global, DType dtype,
                         const Sharding& from, const Sharding& to, const CostModel& cost);

}  // namespace tessel
