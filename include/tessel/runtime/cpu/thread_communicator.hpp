// tessel/runtime/cpu/thread_communicator.hpp — the in-process communicator of the CPU backend.
//
// Every device of a mesh is one thread of one process. A ThreadWorld is created once for the
// mesh and shared by all device threads; each thread asks it for the Communicator of its own
// axis groups. Collectives move each byte once: members publish their buffer pointers in the
// group's shared slots, meet at a barrier, and each copies (or reduces) straight from its
// peers' buffers into its own — no staging buffer and no ring of hops (see
// docs/runtime-communicator.md).
//
// Stream order: the communicators enqueue each call on the caller's CPU backend stream
// (make_cpu_backend); the publish/meet/copy protocol runs when the stream's worker reaches it
// (at once on an eager stream). A communicator must outlive the work enqueued with it.
//
// Failure: ThreadWorld::abort(reason) marks the world failed; every thread blocked in any
// collective of the world, and every later call, throws RuntimeError naming the reason. The
// executor calls it when a kernel throws on one device so that the others stop instead of
// hanging. A mismatch between members (different sizes, kinds or roots for the same call)
// and an optional timeout abort the world too.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/runtime/communicator.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {

// A simulated interconnect for the thread communicator (off by default): every collective
// takes at least alpha + wire_bytes / bandwidth of wall time from the moment its stream starts
// it, waiting the rest of that time asleep, so that a transfer costs time without occupying a
// core — as a real link does (the in-process copy itself is a memcpy that does occupy one).
// wire_bytes is what one member sends or receives on its busiest link under a ring schedule:
// all-gather / reduce-scatter / all-to-all (n-1)·block, all-reduce 2(n-1)/n·buffer, permute,
// send, recv, broadcast the buffer. Calls of one group (group_start..group_end) are concurrent
// on separate links (bytes to the same peer share one): the group takes the busiest link's time. For benchmarks of overlap
// (docs/collective-matmul.md), never for correctness.
struct LinkModel {
  double alpha_s = 0;    // seconds per call
  double bandwidth = 0;  // bytes per second per link; 0: the model is off
  bool on() const { return bandwidth > 0; }
  double seconds(double wire_bytes) const { return on() ? alpha_s + wire_bytes / bandwidth : 0.0; }
  // TESSEL_LINK_MODEL="alpha_us=5,gbps=10" (GB/s = 1e9 bytes/s); unset or empty: off.
  // Throws RuntimeError naming the variable and the bad entry.
  static LinkModel from_env();
  static LinkModel parse(const std::string& spec);  // the same syntax
};

struct ThreadWorldOptions {
  // > 0: a member that waits longer than this for its peers aborts the world with a
  // RuntimeError naming the collective, the group and the ranks that have not arrived.
  // 0 (the default) or infinity: wait forever (until abort()); a timeout beyond the clock's
  // range (centuries) also means forever. NaN or negative: the constructor throws
  // RuntimeError naming timeout_seconds.
  double timeout_seconds = 0.0;
  // Microseconds a member waiting for its peers busy-waits before blocking on a condition
  // variable (0: block at once). -1: automatic — the environment variable TESSEL_SPIN_US when
  // set, else 20 us when the machine has at least as many hardware threads as the mesh has
  // devices, else 0 (spinning with more threads than cores only steals time from the peers
  // being waited on). ThreadRuntime sets it from its own thread count.
  int spin_us = -1;
  LinkModel link_model;  // off by default (see LinkModel)
};

namespace detail {
struct ThreadGroupState;
}

class ThreadWorld : public CollectiveWorld {
 public:
  explicit ThreadWorld(const Mesh& mesh, ThreadWorldOptions options = {});
  ~ThreadWorld() override;
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  const Mesh& mesh() const { return mesh_; }
  const ThreadWorldOptions& options() const { return options_; }

  // The communicator of device `position` for its axis group mesh.group(position, axes):
  // rank = index in that group, size = group size. Thread-safe; the shared state of a group
  // is created on first request. The communicator must not outlive the world. Throws
  // MeshError for an unknown axis or a position out of range, RuntimeError when aborted.
  std::unique_ptr<Communicator> communicator(int64_t position,
                                             const std::vector<std::string>& axes) override;

  // Marks the world failed (the first reason wins) and wakes every blocked member.
  void abort(std::string reason) override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  // The reason given to the first abort(); empty while not aborted.
  std::string abort_reason() const override;

  // Internal: throws RuntimeError when aborted (used by the communicators).
  void check_not_aborted(const char* what) const;

  // The spin budget of the communicators made from now on (microseconds, >= 0): load() gives
  // a program that runs inline on the device threads the budget of those threads alone
  // (DeviceThreads::inline_spin_us), where the runtime's own counts its stream workers too.
  void set_spin_us(int spin_us);
  void set_wait_budget_us(int us) override { set_spin_us(us); }

 private:
  Mesh mesh_;
  ThreadWorldOptions options_;
  int spin_us_ = 0;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;  // guards groups_ and reason_
  std::string reason_;
  // Keyed by (axes in the order given, members in rank order).
  std::map<std::pair<std::vector<std::string>, std::vector<int64_t>>,
           std::shared_ptr<detail::ThreadGroupState>>
      groups_;
};

// The virtual-device protocol of the CUDA backend's one-process world (make_cuda_virtual_world:
// host rendezvous, ready/done events, each member pulling from its peers' buffers on its own
// stream; src/runtime/virtual_world.hpp) run on CPU streams: the same code, so that its event
// ordering is checked on any machine — a missing wait is a data race TSan reports — and against
// the thread communicator's tests. Members enqueue on CPU streams (async or eager) of any CPU
// backend; timeout_seconds > 0: a member waiting longer for its peers aborts the world. Not
// the CPU runtimes' world (ThreadWorld is): a test vehicle for the GPU path's protocol.
std::unique_ptr<CollectiveWorld> make_cpu_virtual_world(const Mesh& mesh, double timeout_seconds = 0);

}  // namespace tessel
