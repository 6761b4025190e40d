// tessel/runtime/mpi/mpi_runtime.hpp — the multi-process runtime: processes launched by mpirun,
// each owning a block of the mesh's devices (threads of that process, as in ThreadRuntime),
// collectives across processes through MPI.
//
//   mpirun -np 2 build/bin/gpt --mesh data=2,model=2     # two devices per process
//
//   tessel::MpiRuntime rt;                          // MPI_Init_thread(MULTIPLE) if needed
//   tessel::LoadedExecutable prog = tessel::load(exe, rt);   // every process, same order
//   auto r = prog.run({prog.to_device("x", x), ...});        // SPMD: every process runs it
//   tessel::HostTensor y = prog.to_host(r.outputs[0]);       // the whole tensor everywhere
//
// Mesh <-> process map: by default process p owns the contiguous block of positions
// [p*k, (p+1)*k) with k = devices / world size (the world size must divide the device count:
// load throws RuntimeError naming both otherwise); MpiRuntimeOptions::process_of_device gives
// an explicit map. Groups whose members are all in one process use the in-process thread
// communicator; groups that span processes get an MPI communicator (MPI_Comm_split, at load)
// and exchange point-to-point nonblocking messages from each device's communication stream
// (MPI_THREAD_MULTIPLE). docs/runtime-mpi.md has the algorithms and the failure semantics.
//
// Failure: a device failing on one process aborts the run on every process (an abort
// message on a control communicator), and a collective waiting longer than the timeout for
// a peer (e.g. a killed process) fails naming the collective, the device and the rank it
// waits for, and aborts the others. After such a failure the runtime refuses further work
// (a failed multi-process job is restarted, not repaired) and MPI is not finalised (which
// could block on a dead peer): the process should exit with an error.
//
// No MPI header here: without TESSEL_WITH_MPI the class exists and its constructor throws.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {

// An MPI call that failed, with the call, MPI's error string and file:line.
class MpiError : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

// True when tessel was built with TESSEL_WITH_MPI.
bool mpi_compiled();

struct MpiRuntimeOptions {
  StreamMode stream_mode = StreamMode::Async;
  int kernel_threads = 1;
  // As ThreadRuntimeOptions::inline_max_comm_bytes, for this process's devices.
  int64_t inline_max_comm_bytes = 256 << 10;
  // A collective (or host exchange) waiting longer than this for its peers fails and aborts
  // every process. < 0: $TESSEL_MPI_TIMEOUT_S, else 300 s. 0 or infinity: no timeout.
  double timeout_s = -1;
  // A dead process on this host is noticed without waiting for the timeout: each process's
  // watcher checks, every half second, the peers on this host (same host name, boot id and PID
  // namespace) through /proc: one that is gone (no such process, a zombie, or its PID reused)
  // while it held a live MpiRuntime (its marker file in /dev/shm is still there) fails every
  // process, naming its rank, PID and host. A process whose runtimes all ended cleanly removed
  // its marker, so its exit is not taken for a death. Peers on other hosts are noticed by MPI's
  // transport (a closed connection fails the calls waiting on it) or at the timeout.
  // $TESSEL_MPI_WATCH_PEERS=0/1 overrides.
  bool watch_peers = true;
  // Explicit mesh <-> process map: process_of_device[position] = the rank owning it (every
  // rank must own at least one device). Empty: contiguous blocks.
  std::vector<int> process_of_device;
  // The processes of this runtime: MPI_COMM_WORLD ranks, in the order of their ranks here
  // (ranks[i] is rank i of the runtime; rank(), world_size(), process_of_device and the
  // checkpoint writers all count in it). Empty: every process of MPI_COMM_WORLD. Only the
  // processes listed construct it, and the constructor waits until all of them do
  // (MPI_Comm_create_group): several runtimes over disjoint sets of processes run side by side
  // (the pool runtime, planner/pool_runtime.hpp, runs one per job). Runtimes made concurrently
  // over overlapping sets need different group_tag values.
  std::vector<int> ranks;
  int group_tag = 0;
};

class MpiRuntime : public Runtime {
 public:
  // Initialises MPI with MPI_THREAD_MULTIPLE when nobody did (and finalises it at exit);
  // throws MpiError when MPI cannot give MPI_THREAD_MULTIPLE, RuntimeError without MPI.
  explicit MpiRuntime(MpiRuntimeOptions options = {});
  ~MpiRuntime() override;
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int rank() const;        // rank among the runtime's processes (MPI_COMM_WORLD's without ranks)
  int world_size() const;  // number of the runtime's processes
  int local_rank() const;  // rank among the processes of this node (MPI_COMM_TYPE_SHARED)
  double timeout_s() const;

  // The failure that stopped the runtime (empty while healthy).
  bool failed() const;
  std::string failure() const;
  // Aborts every process's runs with `reason` (as a failing device does).
  void abort(const std::string& reason);

  // Runtime
  std::string name() const override { return "mpi"; }
  int process_rank() const override { return rank(); }
  int process_count() const override { return world_size(); }
  std::vector<int64_t> devices_for(const Mesh& mesh) override;
  DeviceThreads& local() override;
  std::unique_ptr<CollectiveWorld> make_world(const Mesh& mesh, const std::vector<std::vector<std::string>>& axes,
                                              double timeout_s) override;
  std::vector<HostTensor> allgather_shards(const Mesh& mesh, std::vector<HostTensor> local) override;
  std::vector<std::string> allgather_host(const std::string& mine) override;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The tools choose between this runtime and the others with make_runtime
// (runtime/make_runtime.hpp), from the launcher's environment.

// For a program's error path under mpirun: ends every process of the job with `status`. It
// waits `grace_s` seconds first (the failure reaches the other processes through the abort
// channel or their own timeout, and they print their errors meanwhile: a failing process
// spends up to 5 s driving its abort messages out, so the default grace is longer), then calls
// MPI_Abort(MPI_COMM_WORLD, status), so the launcher exits non-zero whatever its flags: with
// Open MPI's `--mca orte_abort_on_non_zero_status 0 --enable-recovery`, mpirun otherwise exits
// 0 although every process exited non-zero. Returns at once when MPI is not initialised (or
// already finalised, or built without MPI) or runs a single process, so a tool may call it on
// every error path; otherwise it does not return.
void abort_job_on_error(int status, double grace_s = 8.0);

}  // namespace tessel
