// comm_call.hpp (private) — the kinds of call a communicator takes, and the name each goes by
// in error messages ("all_gather of device 3 ...", "rank 1 called all_reduce(bytes=...)"):
// one list for the thread communicator (cpu/thread_group_state.hpp) and the virtual-device
// world (virtual_world.cpp). The five collectives of a program are named by their row of the
// collective table (tessel/core/collective_kind.hpp: their program-text spelling); the others
// are the communicator's own (broadcast, barrier, point-to-point).
#pragma once

#include "tessel/core/collective_kind.hpp"

namespace tessel::detail {

enum class CommCall : int {
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

inline const char* comm_call_name(CommCall k) {
  switch (k) {
    case CommCall::None: return "none";
    case CommCall::AllGather: return collective_text(CollectiveKind::AllGather);
    case CommCall::ReduceScatter: return collective_text(CollectiveKind::ReduceScatter);
    case CommCall::AllReduce: return collective_text(CollectiveKind::AllReduce);
    case CommCall::AllToAll: return collective_text(CollectiveKind::AllToAll);
    case CommCall::Permute: return collective_text(CollectiveKind::CollectivePermute);
    case CommCall::Broadcast: return "broadcast";
    case CommCall::Barrier: return "barrier";
    case CommCall::P2P: return "send/recv";
  }
  return "?";
}

}  // namespace tessel::detail
