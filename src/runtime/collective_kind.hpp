// collective_kind.hpp (private) — the kinds of collective a communicator call makes, and the
// name each goes by in error messages ("all_gather of device 3 ...", "rank 1 called
// all_reduce(bytes=...)"): one list for the thread communicator (cpu/thread_group_state.hpp)
// and the virtual-device world (virtual_world.cpp), so both name a call alike.
#pragma once

namespace tessel::detail {

enum class CollectiveKind : int {
  None,
  AllGather,
  ReduceScatter,
  AllReduce,
  AllToAll,
  Permute,
  Broadcast,
  Barrier,
  P2P,  // a send / recv pair
};

inline const char* collective_kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::None: return "none";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllToAll: return "all_to_all";
    case CollectiveKind::Permute: return "collective_permute";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::Barrier: return "barrier";
    case CollectiveKind::P2P: return "send/recv";
  }
  return "?";
}

}  // namespace tessel::detail
