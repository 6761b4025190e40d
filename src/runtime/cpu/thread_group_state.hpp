// thread_group_state.hpp (private) — the state that the members of one axis group of a
// ThreadWorld share: the kind of collective each member is making, its published slot (the
// buffers of the call), the point-to-point channels and the group's barrier. ThreadWorld
// (thread_world.cpp) creates one per group and wakes its waiters on abort; the
// ThreadCommunicator of every member (thread_communicator.cpp, which explains the protocol)
// reads and writes it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../comm_call.hpp"
#include "tessel/runtime/cpu/thread_communicator.hpp"

namespace tessel {
namespace detail {

using Kind = CommCall;
inline const char* kind_name(Kind k) { return comm_call_name(k); }

// What one member publishes for one call.
struct alignas(64) ThreadSlot {
  Kind kind = Kind::None;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t bytes = 0;  // per-block bytes (all_gather, all_to_all, permute, broadcast) or
                          // count·elem_size (reduce_scatter: the recv block; all_reduce)
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::Sum;
  int peer_a = -1;  // broadcast root; permute send_to
  int peer_b = -1;  // permute recv_from
};

// A send/recv rendezvous from one rank to another.
struct P2PChannel {
  enum State { Empty, Posted, Taken, Done };
  State state = Empty;
  const void* ptr = nullptr;
  std::size_t bytes = 0;
};

struct ThreadGroupState {
  ThreadGroupState(std::vector<std::string> axes_, std::vector<int64_t> members_)
      : axes(std::move(axes_)), members(std::move(members_)),
        n(static_cast<int>(members.size())),
        arrived(static_cast<std::size_t>(n), 0),
        call_seq(static_cast<std::size_t>(n), 0),
        p2p(static_cast<std::size_t>(n) * static_cast<std::size_t>(n)) {
    slots[0].resize(static_cast<std::size_t>(n));
    slots[1].resize(static_cast<std::size_t>(n));
  }

  std::string describe() const {
    std::ostringstream os;
    os << "group {";
    for (std::size_t i = 0; i < axes.size(); ++i) os << (i ? "," : "") << axes[i];
    os << "} devices [";
    for (std::size_t i = 0; i < members.size(); ++i) os << (i ? "," : "") << members[i];
    os << "]";
    return os.str();
  }

  const std::vector<std::string> axes;
  const std::vector<int64_t> members;
  const int n;

  std::mutex mu;
  std::condition_variable cv;
  // Barrier: members arrived at the current phase, and the number of completed phases.
  int count = 0;                       // guarded by mu
  std::atomic<uint64_t> gen{0};        // written under mu, read lock-free by spinners
  std::vector<uint64_t> arrived;       // guarded by mu: last phase each rank arrived at
  // Per rank, only touched by that rank's thread: number of collective calls made.
  std::vector<uint64_t> call_seq;
  std::vector<ThreadSlot> slots[2];    // [call parity][rank]
  std::vector<P2PChannel> p2p;         // [from * n + to], guarded by mu
};

// The communicator of member `rank` of `group` (thread_communicator.cpp): what
// ThreadWorld::communicator returns.
std::unique_ptr<Communicator> make_thread_communicator(ThreadWorld* world,
                                                       std::shared_ptr<ThreadGroupState> group,
                                                       int rank, int spin_us, LinkModel link);

}  // namespace detail
}  // namespace tessel
