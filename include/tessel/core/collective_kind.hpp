// tessel/core/collective_kind.hpp — the collectives a device program can hold, as one table:
// every place that names, spells, prices, parses or verifies a collective reads its row here
// (the cost model, the program's text form and verifier, the partitioner's reports and the
// runtime's communicator errors), so a new collective is one enum value and one row.
//
//   kind               name                text                 result shape    attributes
//   AllGather          all-gather          all_gather           dim grows ×n    axes dim
//   AllReduce          all-reduce          all_reduce           same            axes [op]
//   ReduceScatter      reduce-scatter      reduce_scatter       dim shrinks ÷n  axes dim [op]
//   AllToAll           all-to-all          all_to_all           split ÷n cat ×n axes split_dim concat_dim
//   CollectivePermute  collective-permute  collective_permute   same            pairs
//
// Ring factors (bytes moved per device per byte of `bytes`, as nccl-tests counts them):
// all-reduce 2(n−1)/n, all-gather / reduce-scatter / all-to-all (n−1)/n, collective-permute 1.
#pragma once

#include <cstdint>
#include <string_view>

namespace tessel {

enum class CollectiveKind { AllGather, AllReduce, ReduceScatter, AllToAll, CollectivePermute };

// How the verifier derives a collective's local result shape from its operand's.
enum class CollectiveShape {
  Same,        // all-reduce, collective-permute
  GatherDim,   // dim × group size
  ScatterDim,  // dim ÷ group size (must divide)
  AllToAll,    // split_dim ÷ group size, concat_dim × group size
};

struct CollectiveInfo {
  CollectiveKind kind;
  const char* name;       // "all-gather": reports, explain, the cost model
  const char* text;       // "all_gather": the program text's instruction, the runtime's call names
  CollectiveShape shape;  // the result shape rule (and so which dim attributes it takes)
  bool reduces;           // takes op=sum|max
  bool over_pairs;        // a permutation of positions (pairs=[a->b, ...]) instead of an axis group
  double ring_scale;      // ring factor = ring_scale × (n−1)/n; 0: moves `bytes` once whatever n
};

// Every row, in enum order.
inline constexpr CollectiveInfo kCollectiveTable[] = {
    {CollectiveKind::AllGather, "all-gather", "all_gather", CollectiveShape::GatherDim, false, false, 1},
    {CollectiveKind::AllReduce, "all-reduce", "all_reduce", CollectiveShape::Same, true, false, 2},
    {CollectiveKind::ReduceScatter, "reduce-scatter", "reduce_scatter", CollectiveShape::ScatterDim, true, false, 1},
    {CollectiveKind::AllToAll, "all-to-all", "all_to_all", CollectiveShape::AllToAll, false, false, 1},
    {CollectiveKind::CollectivePermute, "collective-permute", "collective_permute", CollectiveShape::Same, false, true,
     0},
};

inline constexpr const CollectiveInfo& collective_info(CollectiveKind k) {
  return kCollectiveTable[static_cast<int>(k)];
}
inline constexpr const char* collective_name(CollectiveKind k) { return collective_info(k).name; }
inline constexpr const char* collective_text(CollectiveKind k) { return collective_info(k).text; }

// The row whose text form is `text` ("all_gather", ...), or nullptr.
inline const CollectiveInfo* find_collective(std::string_view text) {
  for (const CollectiveInfo& c : kCollectiveTable)
    if (text == c.text) return &c;
  return nullptr;
}

// Bytes moved per device per byte of the collective's `bytes` over a group of n (0 for n <= 1).
inline double collective_ring_factor(CollectiveKind k, int64_t n) {
  if (n <= 1) return 0;
  const CollectiveInfo& c = collective_info(k);
  if (c.ring_scale == 0) return 1;
  return c.ring_scale * static_cast<double>(n - 1) / static_cast<double>(n);
}

}  // namespace tessel
