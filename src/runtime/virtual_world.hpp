// virtual_world.hpp (private) — the virtual-device collective protocol, written against the
// Backend/Stream/Event contract (runtime/backend.hpp) so that one implementation serves the
// CUDA backend's one-process world (make_cuda_virtual_world: several virtual devices per GPU,
// no NCCL) and the CPU backend's streams (make_cpu_virtual_world), where ThreadSanitizer and
// the communicator tests check its ordering without a GPU.
//
// One collective = two host rendezvous of the members' enqueuing threads, and events:
//   1. each member records its `ready` event on its stream and posts its buffer pointers; at
//      the first rendezvous every member learns the others' pointers and events;
//   2. each member's stream waits for every peer's `ready`, then *pulls*: copies from the
//      peers' buffers (all-gather, all-to-all, permute, broadcast, send/recv) or one reduction
//      over all members' buffers in member order (all-reduce, reduce-scatter: the same order
//      on every member, so replicas agree bit for bit);
//   3. each member records `done`; at the second rendezvous every member's stream waits for
//      every peer's `done`, so no member reuses a buffer that a peer is still reading.
// A member whose result overlaps its own input (in place) writes to scratch first and copies
// it over after step 3. Events belong to a channel (the group, or a pair of members for send
// and receive) and are re-recorded only at the channel's next use, which every peer reaches
// only after it has enqueued its waits on them.
//
// The host blocks at the rendezvous (as NCCL may block a thread until its peers arrive), so
// every member must issue the same calls in the same order from its own thread. abort() and
// the timeout fail every blocked and later call of the world.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/mesh.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {
namespace detail {

// What the protocol needs of the device behind a stream beyond the contract's events: copies
// between device pointers of any two members (peer access), the member-order reduction and
// stream-ordered scratch. Every call is enqueued on `s`, a stream of the calling member.
class VirtualDeviceOps {
 public:
  virtual ~VirtualDeviceOps() = default;
  virtual std::string name() const = 0;  // in error messages: "cuda virtual communicator"
  // A new event of the device that runs s.
  virtual std::unique_ptr<Event> create_event(Stream& s) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes, Stream& s) = 0;
  // dst = srcs[0] op srcs[1] op ... in that order, count elements of dtype (bf16 and f16
  // accumulated in f32 and rounded once).
  virtual void reduce(const std::vector<const void*>& srcs, void* dst, DType dtype, ReduceOp op, std::size_t count,
                      Stream& s) = 0;
  virtual void* scratch(std::size_t bytes, Stream& s) = 0;
  virtual void free_scratch(void* p, Stream& s) = 0;
  // Before a member enqueues a collective's work (CUDA: the debug delay that widens races).
  virtual void before_collective(Stream& s) { (void)s; }
  // The most members one reduction reads (0: no limit); a larger group is refused.
  virtual int max_group_size() const { return 0; }
};

std::unique_ptr<CollectiveWorld> make_virtual_world(const Mesh& mesh, double timeout_seconds,
                                                    std::shared_ptr<VirtualDeviceOps> ops);

}  // namespace detail
}  // namespace tessel
