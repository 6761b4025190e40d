// tessel/compiler/partition.hpp — the SPMD partitioner: per op, choose its factor sharding, reshard
// operands that disagree (reshard.hpp), emit the local op on local shapes. Partial results
// are reduced lazily: a partial value flows through linear ops (OpDef::partial_flow) and is
// reduced where a consumer needs it materialized — reduce-scatter when the consumer wants it
// sharded, all-reduce when it wants it replicated.
#pragma once

#include "tessel/core/cost.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/ir/program.hpp"
#include "tessel/compiler/propagate.hpp"

namespace tessel {

struct PartitionOptions {
  CostModel cost;
  // An output the user did not close (no annotation, not a sharding_constraint result) is
  // delivered where it is cheapest to produce: as computed, a partial result reduced by the
  // cheapest of all-reduce and reduce-scatter. false: in its propagated layout (open dims
  // replicated unless propagation split them), as before.
  bool open_outputs_cheapest = true;
  // When a value resharded for one op is reused by later ops that want the same layout, and
  // when it is resharded again so that the copy dies after its nearby uses (ZeRO-3/FSDP: a
  // weight gathered for the forward is not kept alive until its backward use, the trap XLA
  // falls into). Two rules, one per graph:
  //   by region: when the graph has regions (Graph::regions, Op::region: grad() records them
  //     when it rematerialises: one per segment's forward, one per segment's backward, and the
  //     update), an all-gathered copy and any copy of a program input (a parameter's gathered or
  //     re-laid-out block) is reused within the region of the op that made it and made again in
  //     any other: a weight is gathered once in its segment's forward and once in that
  //     segment's backward, however long the segment. (An input lives the whole step, so
  //     making its copy again keeps nothing alive longer: it costs the collective and frees the
  //     copy in between.) An op without a region belongs to the region of the op before it.
  //   by distance (the fallback: no regions, e.g. no rematerialisation, a hand-built or parsed
  //     graph, or regather_by_region false): an all-gathered copy is reused only while its last
  //     use is at most regather_distance instructions back. 0: always reuse.
  // Other reshards (slices, all-to-alls and reductions of intermediate values) are always reused.
  bool regather_by_region = true;
  int regather_distance = 32;
};

Program partition(const Graph& g, const Mesh& mesh, const PropagationResult& prop,
                  const PartitionOptions& opts = {});

}  // namespace tessel
