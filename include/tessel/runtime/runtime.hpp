// tessel/runtime/runtime.hpp — what load() needs from a runtime: which devices of the mesh
// this process owns, the threads/backends/streams that run them, the collective world the
// program's communicators come from, and the host exchange behind to_host.
//
// The contract names no backend. Three runtimes implement it: ThreadRuntime (runtime/cpu/:
// every device of the mesh is a thread of this process), MpiRuntime (runtime/mpi/: processes
// launched by mpirun, each owning a block of the mesh's devices, which are threads of that
// process) and CudaRuntime (runtime/cuda/: CUDA devices, one process or one per GPU,
// collectives on the GPU). All run their local devices on the same machinery, DeviceThreads
// (device_threads.hpp, local()); they differ only in the backends, where the devices live and
// how collectives cross devices and processes. make_runtime (runtime/make_runtime.hpp) picks
// one from a name and the launch environment.
//
// Lifetimes: a program loaded on a runtime (LoadedExecutable) holds the runtime's lifetime
// token, not the runtime. Destroying the runtime first waits for the runs and transfers in
// flight on it; from then on every use of a program loaded on it throws RuntimeError saying
// the runtime was destroyed (never a crash). Destroy the programs first, or load again on a
// live runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/mesh.hpp"
#include "tessel/runtime/communicator.hpp"
#include "tessel/runtime/device_threads.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {


namespace detail {
class RuntimeLifetime;
}

// The communicators of one loaded program (as a set of ncclComms made by ncclCommSplit at
// load), and the abort that stops every member of every group, in every process.
class CollectiveWorld {
 public:
  virtual ~CollectiveWorld() = default;
  // The communicator of the local device `position` for its group mesh.group(position, axes).
  virtual std::unique_ptr<Communicator> communicator(int64_t position, const std::vector<std::string>& axes) = 0;
  // Fails every pending and later collective of the world (the first reason wins); on a
  // multi-process runtime the other processes are told too.
  virtual void abort(std::string reason) = 0;
  virtual bool aborted() const = 0;
  // The reason given to the first abort(); empty while not aborted.
  virtual std::string abort_reason() const = 0;
  // How long (microseconds) a member may poll for its peers before blocking, for a program
  // that runs inline on the device threads (DeviceThreads::inline_spin_us); a world whose
  // members do not spin ignores it.
  virtual void set_wait_budget_us(int /*us*/) {}
};

class Runtime {
 public:
  Runtime();
  // A copy is another runtime: it gets a lifetime of its own.
  Runtime(const Runtime&);
  Runtime& operator=(const Runtime&) { return *this; }
  virtual ~Runtime();
  virtual std::string name() const = 0;  // "threads", "mpi"
  virtual int process_rank() const = 0;   // 0 on a single-process runtime
  virtual int process_count() const = 0;  // 1 on a single-process runtime

  // The mesh positions of this process's devices for programs on `mesh`: local device i
  // runs position devices_for(mesh)[i]. Throws RuntimeError naming the mesh and the runtime
  // when the runtime cannot run it (wrong device count, world size that does not divide it).
  virtual std::vector<int64_t> devices_for(const Mesh& mesh) = 0;
  // The local devices (threads, backends, streams), indexed by local device.
  virtual DeviceThreads& local() = 0;
  // A collective world for `mesh` with the communicators of every group of every entry of
  // `axes` created now (collective over the processes: every process calls it in the same
  // order). timeout_s > 0: a member waiting longer for its peers fails the collective.
  virtual std::unique_ptr<CollectiveWorld> make_world(const Mesh& mesh, const std::vector<std::vector<std::string>>& axes,
                                                      double timeout_s) = 0;
  // Every device's shard (position order) from this process's local shards (local order);
  // all shards have the same dtype and shape. Collective over the processes.
  virtual std::vector<HostTensor> allgather_shards(const Mesh& mesh, std::vector<HostTensor> local) = 0;
  // Every process's `mine`, in rank order: a small host exchange (a seed, a fingerprint).
  // Collective over the processes, with the runtime's deadline; a single-process runtime
  // returns {mine}.
  virtual std::vector<std::string> allgather_host(const std::string& mine);

  // Internal (load): the token the programs loaded on this runtime hold (see Lifetimes above).
  const std::shared_ptr<detail::RuntimeLifetime>& lifetime() const { return lifetime_; }

 protected:
  // Every runtime's destructor calls this first, while the runtime is whole: later uses
  // through the token throw, and the uses in flight (runs, transfers) are waited for.
  // `description` names the runtime in those errors. Idempotent; ~Runtime calls it too.
  void retire(const std::string& description) noexcept;

 private:
  std::shared_ptr<detail::RuntimeLifetime> lifetime_;
};

// The seed every process of a job uses: rank 0's. Each process may draw its own default seed
// (from the clock or std::random_device); SPMD programs need the same inputs everywhere, so
// the tools pass their seed through this before drawing anything. `runtime` nullptr or a
// single process: `seed` itself. Collective over the processes.
uint64_t agree_on_seed(Runtime* runtime, uint64_t seed);

}  // namespace tessel
