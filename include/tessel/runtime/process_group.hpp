// tessel/runtime/process_group.hpp — the processes of one multi-process job, as far as
// bootstrapping needs them: who am I (rank, size, rank on my node), and one host exchange of a
// few bytes (the NCCL unique id of a CudaRuntime, the shards of a small output for to_host).
//
// Two ways to get one, as issue 8 item 4b asks: under mpirun (MPI_COMM_WORLD; MPI is
// initialised with MPI_THREAD_MULTIPLE when nobody did, as MpiRuntime does) or under a
// launcher that sets RANK, WORLD_SIZE and LOCAL_RANK (torchrun, SLURM wrappers, a shell loop),
// with a rendezvous through files in a directory every process can see (a shared file
// system for several nodes). Neither carries tensors of a step: that is NCCL's job. No MPI
// header here; without TESSEL_WITH_MPI, mpi_process_group() throws RuntimeError.
//
//   auto pg = tessel::process_group_from_env();        // mpirun, or RANK/WORLD_SIZE + a dir
//   tessel::CudaRuntimeOptions o; o.processes = pg;     // one process per GPU (cuda.hpp)
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tessel {

// What a process told the others when it aborted (ProcessGroup::post_abort).
struct AbortNotice {
  int rank = -1;
  std::string reason;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual std::string name() const = 0;  // "mpi", "file"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // rank among the processes of this node (picks the GPU)
  // Every process's bytes, in rank order. Collective: every process calls it the same number
  // of times, in the same order. Throws RuntimeError when a peer does not arrive in time
  // (file rendezvous) or MPI fails.
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;

  // The abort channel (a CudaRuntime's NCCL watchdog uses it, so an error on one process
  // aborts every process's communicators instead of leaving them to their own timeouts).
  // post_abort tells every other process that this one aborted, and why; poll_abort returns
  // a notice from another process not yet returned here (never this process's own), or
  // nothing. Neither is collective nor blocks on peers; both may be called from a watchdog
  // thread beside allgather. Default (a group of your own): no channel, nothing is sent or
  // received.
  virtual void post_abort(const std::string& reason) { (void)reason; }
  virtual std::optional<AbortNotice> poll_abort() { return std::nullopt; }

  // Point-to-point host messages (the pool runtime's coordinator and its workers,
  // planner/pool_runtime.hpp): send queues `bytes` for process `rank` (itself included) under
  // `tag` (0 <= tag < 16384) and returns at once; try_recv returns the oldest message with that
  // tag not yet returned, from any process, or nothing. Neither is collective; messages from one
  // sender with one tag arrive in order; one thread per tag may receive while others send.
  // Default: RuntimeError (the file group has no such channel; use mpirun).
  struct Message {
    int rank = -1;
    std::string bytes;
  };
  virtual void send(int rank, int tag, const std::string& bytes);
  virtual std::optional<Message> try_recv(int tag);
};

// MPI_COMM_WORLD (a duplicate of it). Throws RuntimeError when tessel was built without MPI.
std::shared_ptr<ProcessGroup> mpi_process_group();
// Some of MPI_COMM_WORLD's processes: ranks[i] is rank i of the group (its local rank counts
// the group's processes on this node). Only those processes call it, and it returns once all
// of them have (MPI_Comm_create_group with `tag`: groups made concurrently over overlapping
// processes need distinct tags). RuntimeError for a rank listed twice or out of range, or
// when this process is not listed.
std::shared_ptr<ProcessGroup> mpi_process_group(const std::vector<int>& ranks, int tag);

struct FileRendezvousOptions {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  // A directory every process sees (a shared file system for several nodes); empty:
  // $TESSEL_RENDEZVOUS_DIR.
  std::string dir;
  // The job's name in that directory: the k-th allgather meets in <dir>/<key>.k/ (file_rendezvous
  // of launch.hpp, which checks every file's rank and world size). Use a fresh key per job (e.g.
  // the launcher's job id): a directory left by an earlier job of the same world size and key
  // would be read as this job's. The files stay (the launcher removes them).
  std::string key = "tessel";
  double timeout_s = 300;  // a peer missing for longer fails allgather, naming the peer
  // Abort notices are files <dir>/<key>.abort/<rank>.<n> (post_abort; n counts this rank's
  // notices); poll_abort lists that directory.
};
// A process group whose allgather is file_rendezvous (launch.hpp). Throws RuntimeError for a
// bad rank/size or key.
std::shared_ptr<ProcessGroup> file_process_group(const FileRendezvousOptions& options);

// The process group of this process's launcher (detect_launch(), launch.hpp), or nullptr for a
// single-process job (world size 1):
//  - an MPI launcher (mpirun, PMI): mpi_process_group();
//  - RANK/WORLD_SIZE (torchrun style): a file rendezvous in $TESSEL_RENDEZVOUS_DIR (required:
//    RuntimeError naming it when missing) with key $TESSEL_RENDEZVOUS_KEY (default "tessel") and
//    timeout $TESSEL_RENDEZVOUS_TIMEOUT (seconds, default 300: a peer missing that long fails).
// Defined by the runtime factory (tessel::factory: it knows every backend, MPI included).
std::shared_ptr<ProcessGroup> process_group_from_env();

}  // namespace tessel
